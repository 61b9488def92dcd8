// The emulator's two stream orders (engine/cuda_emu/runtime.h: StreamOrder). In each, one of the
// legacy stream and a non-blocking stream runs late, so a wait the program leaves out between
// them shows as stale data in one order or the other; with its waits, a program gives the same
// bits in both. Also what the real runtime does with pageable host memory in an async copy: read
// at issue (staged), written before the call returns.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#include "engine/device.h"
#include "engine/gemm.h"
#include "run_cmd.h"
#include "stream_order.h"

namespace {

using ul_emu::StreamOrder;
using ul_test::StreamOrderScope;

// out[i] = value: one block of n <= 1024 threads.
__global__ void fill_kernel(float* out, float value, int n) {
  if (int(threadIdx.x) < n) out[threadIdx.x] = value;
}

constexpr int kN = 64;

struct Buffers {
  float* dev = nullptr;
  float* pinned = nullptr;
  cudaStream_t side = nullptr;
  cudaEvent_t mark = nullptr;
  Buffers() {
    UL_CUDA_CHECK(cudaMalloc(&dev, kN * sizeof(float)));
    UL_CUDA_CHECK(cudaMemset(dev, 0, kN * sizeof(float)));
    UL_CUDA_CHECK(cudaDeviceSynchronize());  // a memset of device memory is queued in late-main
    UL_CUDA_CHECK(cudaMallocHost(&pinned, kN * sizeof(float)));
    UL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    UL_CUDA_CHECK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
    for (int i = 0; i < kN; i++) pinned[i] = -1.f;
  }
  ~Buffers() {
    cudaEventDestroy(mark);
    cudaStreamDestroy(side);
    cudaFreeHost(pinned);
    cudaFree(dev);
  }
  void fill(float v) { ul::launch("fill", fill_kernel, dim3(1), dim3(kN), 0, nullptr, dev, v, kN); }
  // dev -> pinned on the side stream, after the legacy stream's work when `wait`.
  void save(bool wait) {
    if (wait) {
      UL_CUDA_CHECK(cudaEventRecord(mark, nullptr));
      UL_CUDA_CHECK(cudaStreamWaitEvent(side, mark, 0));
    }
    UL_CUDA_CHECK(cudaMemcpyAsync(pinned, dev, kN * sizeof(float), cudaMemcpyDeviceToHost, side));
  }
  float host_after_sync() {
    UL_CUDA_CHECK(cudaDeviceSynchronize());
    return pinned[0];
  }
};

// A block's output saved to the host on the side stream, then overwritten by the next kernel: the
// save must wait for the kernel before it, and the overwrite for the save.
float save_then_overwrite(bool save_waits, bool overwrite_waits) {
  Buffers b;
  cudaEvent_t saved;
  UL_CUDA_CHECK(cudaEventCreateWithFlags(&saved, cudaEventDisableTiming));
  b.fill(1.f);
  b.save(save_waits);
  UL_CUDA_CHECK(cudaEventRecord(saved, b.side));
  if (overwrite_waits) UL_CUDA_CHECK(cudaStreamWaitEvent(nullptr, saved, 0));
  b.fill(2.f);
  const float got = b.host_after_sync();
  cudaEventDestroy(saved);
  return got;
}

}  // namespace

TEST_CASE("emu streams: with its waits, a save-then-overwrite gives the same bits in both orders", "[emu]") {
  for (StreamOrder o : {StreamOrder::late_side, StreamOrder::late_main}) {
    StreamOrderScope scope(o);
    CHECK(save_then_overwrite(true, true) == 1.f);
  }
}

TEST_CASE("emu streams: late-side shows an overwrite that does not wait for the side stream's copy", "[emu]") {
  StreamOrderScope scope(StreamOrder::late_side);
  CHECK(save_then_overwrite(true, false) == 2.f);  // the copy ran after the overwrite
  CHECK(save_then_overwrite(false, true) == 1.f);  // this order cannot see the other missing wait
}

TEST_CASE("emu streams: late-main shows a side-stream copy that does not wait for the kernel before it", "[emu]") {
  StreamOrderScope scope(StreamOrder::late_main);
  CHECK(save_then_overwrite(false, true) == 0.f);  // the copy ran before the kernel: the buffer's first zeros
  CHECK(save_then_overwrite(true, false) == 1.f);   // this order cannot see the other missing wait
}

TEST_CASE("emu streams: late-main queues the legacy stream until something observes it", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  b.fill(3.f);
  float* raw = b.dev;  // emulated device memory is host memory: look behind the runtime's back
  CHECK(raw[0] == 0.f);  // the kernel has not run
  cudaEvent_t e;
  UL_CUDA_CHECK(cudaEventCreate(&e));
  UL_CUDA_CHECK(cudaEventRecord(e, nullptr));
  b.fill(4.f);
  UL_CUDA_CHECK(cudaEventSynchronize(e));  // runs what the event covers, not what came after
  CHECK(raw[0] == 3.f);
  float back = 0.f;  // a blocking copy runs the rest first
  UL_CUDA_CHECK(cudaMemcpy(&back, b.dev, sizeof back, cudaMemcpyDeviceToHost));
  CHECK(back == 4.f);
  cudaEventDestroy(e);

  // A memset and an async copy into pageable memory: the copy returns with the data.
  UL_CUDA_CHECK(cudaMemsetAsync(b.dev, 0, kN * sizeof(float), nullptr));
  CHECK(raw[0] == 4.f);
  std::vector<float> host(kN, -5.f);
  UL_CUDA_CHECK(cudaMemcpyAsync(host.data(), b.dev, kN * sizeof(float), cudaMemcpyDeviceToHost, nullptr));
  CHECK(host == std::vector<float>(kN, 0.f));

  // From pageable memory: staged at issue, so the caller may reuse its buffer at once.
  std::vector<float> src(kN, 6.f);
  UL_CUDA_CHECK(cudaMemcpyAsync(b.dev, src.data(), kN * sizeof(float), cudaMemcpyHostToDevice, nullptr));
  src.assign(kN, 7.f);
  UL_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  CHECK(raw[0] == 6.f);
  CHECK(raw[kN - 1] == 6.f);

  // From pinned memory: read when the copy runs, as a DMA would.
  for (int i = 0; i < kN; i++) b.pinned[i] = 8.f;
  UL_CUDA_CHECK(cudaMemcpyAsync(b.dev, b.pinned, kN * sizeof(float), cudaMemcpyHostToDevice, nullptr));
  for (int i = 0; i < kN; i++) b.pinned[i] = 9.f;
  UL_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  CHECK(raw[0] == 9.f);
}

TEST_CASE("emu streams: late-main queues a memset or copy within device memory (the GPU returns at once)", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b, c, d;
  UL_CUDA_CHECK(cudaMemset(b.dev, 0xff, kN * sizeof(float)));
  CHECK(b.dev[0] == 0.f);
  b.fill(1.f);
  UL_CUDA_CHECK(cudaMemcpy(c.dev, b.dev, kN * sizeof(float), cudaMemcpyDeviceToDevice));
  UL_CUDA_CHECK(cudaMemcpy(d.dev, c.dev, kN * sizeof(float), cudaMemcpyDefault));  // device to device too
  CHECK(c.dev[0] == 0.f);
  CHECK(d.dev[0] == 0.f);
  std::vector<float> back(kN, -1.f);  // to the host: done, after what came before, when it returns
  UL_CUDA_CHECK(cudaMemcpy(back.data(), d.dev, kN * sizeof(float), cudaMemcpyDefault));
  CHECK(back == std::vector<float>(kN, 1.f));
}

TEST_CASE("emu streams: late-main lands a blocking copy from pageable memory later, from its staged bytes", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  std::vector<float> src(kN, 3.f);
  UL_CUDA_CHECK(cudaMemcpy(b.dev, src.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  src.assign(kN, 4.f);  // the call has returned: the caller may reuse its buffer
  CHECK(b.dev[0] == 0.f);  // not landed yet: a side-stream copy that does not wait for it reads this
  UL_CUDA_CHECK(cudaMemcpy(b.pinned, b.dev, kN * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(b.pinned[kN - 1] == 3.f);
  // From pinned memory the blocking copy is synchronous; so is an async copy between host buffers.
  for (int i = 0; i < kN; i++) b.pinned[i] = 5.f;
  UL_CUDA_CHECK(cudaMemcpy(b.dev, b.pinned, kN * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(b.dev[0] == 5.f);
  src.assign(kN, 6.f);
  UL_CUDA_CHECK(cudaMemcpyAsync(b.pinned, src.data(), kN * sizeof(float), cudaMemcpyHostToHost, nullptr));
  CHECK(b.pinned[0] == 6.f);
}

TEST_CASE("emu streams: a blocking stream shares the legacy stream's queue", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  cudaStream_t blocking;
  UL_CUDA_CHECK(cudaStreamCreate(&blocking));
  Buffers other;
  b.fill(1.f);
  ul::launch("fill", fill_kernel, dim3(1), dim3(kN), 0, blocking, other.dev, 2.f, kN);
  CHECK(b.dev[0] == 0.f);
  CHECK(other.dev[0] == 0.f);
  UL_CUDA_CHECK(cudaStreamSynchronize(blocking));  // its work came after the legacy stream's: both done
  CHECK(b.dev[0] == 1.f);
  CHECK(other.dev[0] == 2.f);
  UL_CUDA_CHECK(cudaStreamDestroy(blocking));
}

TEST_CASE("emu streams: switching the order finishes the queued work first", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  const StreamOrder before = ul_emu::stream_order();  // late-side, unless ULYSSES_EMU_STREAMS says otherwise
  {
    StreamOrderScope eager(StreamOrder::late_side);
    Buffers b;
    {
      StreamOrderScope scope(StreamOrder::late_main);
      b.fill(5.f);
      CHECK(b.dev[0] == 0.f);
    }
    CHECK(b.dev[0] == 5.f);
  }
  CHECK(ul_emu::stream_order() == before);
}

// The lines of train's output that carry numbers a stream order could change.
std::string losses(const std::string& out) {
  std::istringstream in(out);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.rfind("step ", 0) == 0) kept += line.substr(0, line.find(" | lr")) + "\n";  // loss and norm, not times
    if (line.rfind("eval ", 0) == 0 || line.rfind("done ", 0) == 0) kept += line + "\n";
  }
  return kept;
}

TEST_CASE("emu streams: train --device cuda: the same numbers in both orders, and a bad order refused", "[emu]") {
  const std::string run = ul_test::train_cmd(
      "--device cuda --steps 3 --seq 32 --batch 2 --layers 4 --recompute --offload --grad-accum 2 --eval-every 2 "
      "--eval-batches 1 --threads 1 --sp 2 --ranks 2");
  const ul_test::CmdResult side = ul_test::run_cmd("ULYSSES_EMU_STREAMS=late-side " + run);
  const ul_test::CmdResult main = ul_test::run_cmd("ULYSSES_EMU_STREAMS=late-main " + run);
  INFO(side.out);
  INFO(main.out);
  REQUIRE(side.code == 0);
  REQUIRE(main.code == 0);
  CHECK(losses(side.out).find("step     3/3 | loss") != std::string::npos);
  CHECK(losses(main.out) == losses(side.out));

  const ul_test::CmdResult bad = ul_test::run_cmd("ULYSSES_EMU_STREAMS=sideways " + run);
  CHECK(bad.code != 0);
  CHECK(bad.out.find("ULYSSES_EMU_STREAMS=sideways: not a stream order") != std::string::npos);
  CHECK(bad.out.find("step ") == std::string::npos);
}

namespace {
__global__ void fault_kernel(float* out) {
  if (threadIdx.x == 0) throw std::runtime_error("a planned fault");
  out[threadIdx.x] = 1.f;
}
}  // namespace

TEST_CASE("emu streams: queued work that fails is reported by the call that runs it, as a GPU's async error", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  ul::launch("fault", fault_kernel, dim3(1), dim3(32), 0, nullptr, b.dev);  // queued: no error yet
  b.fill(2.f);                                                             // dropped with the fault
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(b.dev[0] == 0.f);  // the work queued after the fault was dropped
  // Sticky, as a GPU's fault: every later call fails with it, and cudaGetLastError does not reset it.
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  float* spare = nullptr;
  CHECK(cudaMalloc(&spare, 4) == cudaErrorLaunchFailure);
  CHECK(cudaMemset(b.dev, 0, 4) == cudaErrorLaunchFailure);
  CHECK(cudaFree(nullptr) == cudaErrorLaunchFailure);
  CHECK_THROWS_WITH(b.fill(3.f), Catch::Contains("launching kernel 'fill'") &&
                                     Catch::Contains("a kernel launched before this point faulted"));
  float x = 0.f;
  auto gemm_1x1 = [&] { ul::cuda::gemm<float, float>(&x, &x, &x, nullptr, 1, 1, 1, false, false, false, "after the fault", nullptr); };
  CHECK_THROWS_WITH(gemm_1x1(), Catch::Contains("after the fault") && Catch::Contains("unspecified launch failure"));
  CHECK(b.dev[0] == 0.f);

  ul_emu::clear_device_fault();  // tests only: the device as a fresh process finds it
  b.fill(3.f);
  CHECK(cudaFree(nullptr) == cudaSuccess);  // a free runs the queue: nothing failed this time
  CHECK(b.dev[0] == 3.f);
  ul::launch("fault", fault_kernel, dim3(1), dim3(32), 0, nullptr, b.dev);
  UL_CUDA_CHECK(cudaMalloc(&spare, 4));  // queued fault, not run yet
  CHECK(cudaFree(spare) == cudaErrorLaunchFailure);  // in a destructor: an error code, not a throw
  CHECK(cudaFree(spare) == cudaErrorLaunchFailure);  // and the memory stays (the device is in error)
  ul_emu::clear_device_fault();
  CHECK(cudaFree(spare) == cudaSuccess);
}

TEST_CASE("emu streams: a kernel's fault found by a later call says how to find the kernel", "[emu]") {
  // On a GPU a fault is reported by the first call after it that waits for the device (sticky),
  // which cannot name the kernel; a later launch's own check must not be blamed either.
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  ul::launch("fault", fault_kernel, dim3(1), dim3(32), 0, nullptr, b.dev);  // queued
  CHECK_THROWS_WITH(UL_CUDA_CHECK(cudaDeviceSynchronize()),
                    Catch::Contains("unspecified launch failure (a kernel launched before this point faulted: "
                                    "rerun with CUDA_LAUNCH_BLOCKING=1"));
  CHECK_THROWS_WITH(UL_CUDA_CHECK(cudaErrorInvalidValue), !Catch::Contains("CUDA_LAUNCH_BLOCKING"));
  // What the launch check on a GPU says (engine/cuda_launch.h: ul::launch's nvcc path).
  const dim3 grid(2), block(32);
  const std::string later = ul::launch_error("gelu_forward", grid, block, 0, cudaErrorIllegalAddress, false);
  CHECK(later == "launching kernel 'gelu_forward' (grid 2x1x1, block 32x1x1, 0 bytes shared): an illegal memory "
                 "access was encountered" + std::string(ul::kernel_fault_hint()));
  CHECK(ul::launch_error("gelu_forward", grid, block, 0, cudaErrorIllegalAddress, true) ==
        "kernel 'gelu_forward' (grid 2x1x1, block 32x1x1, 0 bytes shared) faulted: an illegal memory access was "
        "encountered");
  const std::string config = ul::launch_error("gelu_forward", grid, block, 65536, cudaErrorInvalidValue, false);
  CHECK(config == "launching kernel 'gelu_forward' (grid 2x1x1, block 32x1x1, 65536 bytes shared): invalid argument");
  ul_emu::clear_device_fault();
}

TEST_CASE("emu streams: a device buffer freed while an error unwinds leaves that error to be said", "[emu]") {
  // A GPU's fault is sticky: every free after it fails. A destructor that threw then would end the
  // program before the error that unwinds reached the user.
  ul::init_cuda_backend();
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  struct Owner {
    void* p = ul::device_alloc(ul::Device::cuda, 256);
    ~Owner() { ul::device_free(ul::Device::cuda, p); }
  };
  try {
    Owner owner;
    ul::launch("fault", fault_kernel, dim3(1), dim3(32), 0, nullptr, b.dev);  // queued: the free runs it
    throw std::runtime_error("the first error");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()) == "the first error");
  }
  CHECK(ul_emu::device_fault() == cudaErrorLaunchFailure);
  ul_emu::clear_device_fault();  // tests only, for the second half
  // Not unwinding, a failed free is an error as before.
  void* p = ul::device_alloc(ul::Device::cuda, 256);
  ul::launch("fault", fault_kernel, dim3(1), dim3(32), 0, nullptr, b.dev);
  CHECK_THROWS_WITH(ul::device_free(ul::Device::cuda, p), Catch::Contains("unspecified launch failure"));
  ul_emu::clear_device_fault();
}

TEST_CASE("emu: a launch fails with the error an earlier call left pending, as <<<>>>'s check does on a GPU", "[emu]") {
  Buffers b;
  float x = 0;
  CHECK(cudaMemcpy(nullptr, &x, sizeof x, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // left for cudaGetLastError
  CHECK_THROWS_WITH(b.fill(1.f), Catch::Contains("launching kernel 'fill'") && Catch::Contains("invalid argument"));
  CHECK(cudaGetLastError() == cudaSuccess);  // the launch took it
  b.fill(2.f);  // and the next one runs
  UL_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("emu streams: cudaStreamQuery runs work that waits on other processes beside the host", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  // ul_emu::on_stream_polled: how an emulated NCCL collective lets comm_nccl's deadline fire.
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  std::promise<void> peers;
  std::shared_future<void> peers_here = peers.get_future().share();
  std::atomic<int> runs{0};
  b.fill(1.f);
  ul_emu::on_stream_polled(nullptr, [&] {
    peers_here.wait();
    runs++;
  });
  b.fill(2.f);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  // Not ready is no error, but left for cudaGetLastError (the stricter reading of CUDA, which
  // does not say): a poller takes it back (comm_nccl's finish), or its next launch check fails.
  CHECK(cudaPeekAtLastError() == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(b.dev[0] == 1.f);  // the work before it ran, the work after it waits
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  CHECK(runs == 0);
  // Polls until the work has ended, for at most 30 s (a broken poll fails here, not at ctest's
  // timeout), taking back each "not ready" as comm_nccl's finish() does (else the next launch, the
  // fill below, fails with it).
  auto polled = [] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    cudaError_t q = cudaErrorNotReady;
    while (q == cudaErrorNotReady && std::chrono::steady_clock::now() < until) {
      q = cudaStreamQuery(nullptr);
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    }
    return q;
  };
  peers.set_value();
  CHECK(polled() == cudaSuccess);
  CHECK(runs == 1);
  CHECK(b.dev[0] == 2.f);
  // Any other call that runs the stream waits for it, started or not.
  std::promise<void> later;
  ul_emu::on_stream_polled(nullptr, [&, f = later.get_future().share()] {
    f.wait();
    runs++;
  });
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  CHECK(cudaGetLastError() == cudaErrorNotReady);  // taken back (the fill below would fail with it)
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    later.set_value();
  });
  CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(runs == 2);
  release.join();
  ul_emu::on_stream_polled(nullptr, [&] { runs++; });
  CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(runs == 3);
  // Its failure is queued work's failure, whoever collects it.
  ul_emu::on_stream_polled(nullptr, [] { throw std::runtime_error("a peer exited"); });
  b.fill(4.f);
  CHECK(polled() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(b.dev[0] == 2.f);  // dropped with the failure
  // On a stream that runs at issue, it runs at issue.
  StreamOrderScope side(StreamOrder::late_side);
  ul_emu::on_stream_polled(nullptr, [&] { runs++; });
  CHECK(runs == 4);
}

TEST_CASE("emu streams: an event on a thread's legacy stream outlives the thread", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  StreamOrderScope scope(StreamOrder::late_main);
  Buffers b;
  cudaEvent_t e;
  UL_CUDA_CHECK(cudaEventCreate(&e));
  std::thread rank([&] {
    b.fill(7.f);
    UL_CUDA_CHECK(cudaEventRecord(e, nullptr));
    UL_CUDA_CHECK(cudaDeviceSynchronize());  // a thread ends with nothing queued (else the emulator aborts)
  });
  rank.join();
  CHECK(cudaEventSynchronize(e) == cudaSuccess);  // its stream is gone: nothing left to run
  CHECK(cudaStreamWaitEvent(nullptr, e, 0) == cudaSuccess);
  CHECK(b.dev[0] == 7.f);

  // A new thread's legacy stream may take the ended one's address (glibc reuses thread stacks, and
  // thread-locals with them): the event must not run the new stream's work, on this thread.
  std::promise<void> queued, checked;
  std::thread next([&] {
    b.fill(8.f);
    queued.set_value();
    checked.get_future().wait();
    CHECK(b.dev[0] == 7.f);  // still queued: the event did not cover it
    UL_CUDA_CHECK(cudaDeviceSynchronize());
  });
  queued.get_future().wait();
  CHECK(cudaEventSynchronize(e) == cudaSuccess);
  checked.set_value();
  next.join();
  CHECK(b.dev[0] == 8.f);
  cudaEventDestroy(e);
}

TEST_CASE("emu streams: an event's time is when the work before it ran, also on a stream that runs late", "[emu]") {
  // --profile (engine/gpu_profile.h) times each op with two events: an event stamped at its record
  // would time the op's issue on a late stream, and a queued op's issue takes no time.
  using namespace std::chrono_literals;
  ul_test::in_each_stream_order([](const char* order) {
    cudaStream_t side;
    UL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (cudaStream_t s : {cudaStream_t(nullptr), side}) {
      INFO(order << " order, " << (s ? "side" : "legacy") << " stream");
      cudaEvent_t begin, end;
      UL_CUDA_CHECK(cudaEventCreate(&begin));
      UL_CUDA_CHECK(cudaEventCreate(&end));
      UL_CUDA_CHECK(cudaEventRecord(begin, s));
      ul_emu::on_stream(s, [] { std::this_thread::sleep_for(30ms); });
      UL_CUDA_CHECK(cudaEventRecord(end, s));
      float ms = -1.f;
      const bool late = (ul_emu::stream_order() == StreamOrder::late_main) == (s == nullptr);
      CHECK(cudaEventElapsedTime(&ms, begin, end) == (late ? cudaErrorNotReady : cudaSuccess));
      cudaGetLastError();
      UL_CUDA_CHECK(cudaEventSynchronize(end));
      UL_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
      CHECK(ms >= 29.9f);
      cudaEventDestroy(begin);
      cudaEventDestroy(end);
    }
    cudaEvent_t untimed;
    UL_CUDA_CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    UL_CUDA_CHECK(cudaEventRecord(untimed, side));
    UL_CUDA_CHECK(cudaStreamSynchronize(side));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, untimed, untimed) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    cudaEventDestroy(untimed);
    cudaStreamDestroy(side);
  });
}
