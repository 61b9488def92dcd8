// The NCCL communicator (parallel/comm_nccl.cpp) on the emulated NCCL (engine/cuda_emu/nccl.h):
// every collective against its definition, on host and device buffers and past one round of the
// shared slots; splits; train --comm nccl against --comm local (over --nccl-id-file, and under
// mpirun where the build has MPI); a rank that dies ends the other's run with an error at once, one
// that hangs at --comm-timeout; the all-to-all of a build against NCCL before 2.28 (grouped
// send/recv), and the emulation's refusals of sends and receives that do not pair up.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/cuda_emu/nccl.h"
#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#include "parallel/comm_nccl.h"
#include "run_cmd.h"
#include "stream_order.h"
#include "temp_dir.h"

namespace ul {
// tests/emu/comm_nccl_pre_2_28.cpp: the communicator as built against NCCL before 2.28.
std::unique_ptr<Comm> nccl_world_from_file_pre_2_28(const std::string& id_file, int rank, int size, int device,
                                                    double timeout_s);
}  // namespace ul

namespace {

using ul::DType;
using ul::ReduceOp;
using ul_test::CmdResult;
using ul_test::run_cmd;
using ul_test::train_cmd;

using WorldFromFile = std::unique_ptr<ul::Comm> (*)(const std::string&, int, int, int, double);

// Runs f(rank, world) on `size` threads, each a rank of one NCCL communicator bootstrapped through
// a file. Returns what went wrong on each rank: Catch2's checks are not thread-safe.
std::vector<std::string> on_ranks(int size, const std::function<void(int, ul::Comm&, std::ostringstream&)>& f,
                                  WorldFromFile world_from = ul::nccl_world_from_file) {
  ul_test::TempDir dir;
  std::vector<std::string> problems(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; r++)
    ranks.emplace_back([&, r] {
      std::ostringstream bad;
      try {
        auto world = world_from(dir / "nccl_id", r, size, 0, 60);
        f(r, *world, bad);
        UL_CUDA_CHECK(cudaDeviceSynchronize());
      } catch (const std::exception& e) {
        bad << "threw: " << e.what() << "\n";
      }
      problems[r] = bad.str();
    });
  for (auto& t : ranks) t.join();
  return problems;
}

// Runs f(rank, comm) on two threads, each a rank of one raw emulated-NCCL communicator, with the
// collectives run at issue (their result is the call's); ncclCommDestroy after.
void on_two_raw_ranks(const std::function<void(int, ncclComm_t)>& f) {
  ul_test::StreamOrderScope scope(ul_emu::StreamOrder::late_side);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw std::runtime_error("ncclGetUniqueId failed");
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; r++)
    ranks.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess) return;
      f(r, c);
      ncclCommDestroy(c);
    });
  for (auto& t : ranks) t.join();
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    UL_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    UL_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    UL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

template <class T>
void expect(std::ostringstream& bad, const char* what, const std::vector<T>& got, const std::function<T(size_t)>& want) {
  for (size_t i = 0; i < got.size(); i++)
    if (!(got[i] == want(i))) {
      bad << what << ": element " << i << " is " << got[i] << ", not " << want(i) << "\n";
      return;
    }
}

// The loss and gradient norm of each step, and the run's last line.
std::vector<std::string> losses(const std::string& out) {
  std::vector<std::string> r;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("step ", 0) == 0) {
      const size_t at = line.find("| loss");
      const size_t lr = line.find("| lr");
      if (at != std::string::npos && lr != std::string::npos) r.push_back(line.substr(at, lr - at));
    }
    if (line.rfind("done |", 0) == 0) r.push_back(line);
  }
  return r;
}

const std::string kSmallRun = "--device cuda --seq 64 --batch 2 --eval-every 0 --eval-batches 1 --threads 1";

}  // namespace

TEST_CASE("emu nccl: every collective on 3 ranks, host and device buffers, past one round of the slots", "[emu]") {
  const int P = 3;
  const std::vector<std::string> problems = on_ranks(P, [&](int r, ul::Comm& c, std::ostringstream& bad) {
    if (c.rank() != r || c.size() != P || std::string(c.backend()) != "nccl") bad << "wrong rank, size or backend\n";

    // f32 sum on the device, over two rounds of the 4 MiB slots.
    const size_t big = (size_t(1) << 20) + 1000;
    std::vector<float> x(big);
    for (size_t i = 0; i < big; i++) x[i] = float((i % 97) * (r + 1));
    Dev<float> dx(x);
    c.all_reduce(dx.p, big, DType::f32, ReduceOp::sum);
    expect<float>(bad, "f32 all_reduce", dx.get(), [](size_t i) { return float((i % 97) * 6); });

    // i32 max on the host (staged), bf16 sum on the device.
    std::vector<int32_t> m = {r, 10 - r, 5};
    c.all_reduce(m.data(), 3, DType::i32, ReduceOp::max);
    expect<int32_t>(bad, "i32 max", m, [](size_t i) { return std::vector<int32_t>{2, 10, 5}[i]; });
    std::vector<__nv_bfloat16> b(10);
    for (int i = 0; i < 10; i++) b[i] = __float2bfloat16(float(i + r));
    Dev<__nv_bfloat16> db(b);
    c.all_reduce(db.p, 10, DType::bf16, ReduceOp::sum);
    std::vector<float> bsum;
    for (__nv_bfloat16 v : db.get()) bsum.push_back(__bfloat162float(v));
    expect<float>(bad, "bf16 all_reduce", bsum, [](size_t i) { return float(3 * i + 3); });

    // all_gather from and to the host.
    std::vector<int32_t> mine = {10 * r, 10 * r + 1}, all(2 * P, -1);
    c.all_gather(mine.data(), all.data(), 2, DType::i32);
    expect<int32_t>(bad, "all_gather", all, [](size_t i) { return int32_t(10 * (i / 2) + i % 2); });

    // all_gather in place (rank r's part of the output is its input), past one round of the slots.
    const size_t part = (size_t(1) << 20) + 7;
    std::vector<float> whole(P * part, -1.f);
    for (size_t i = 0; i < part; i++) whole[r * part + i] = float(r * 1000 + i % 101);
    Dev<float> dwhole(whole);
    c.all_gather(dwhole.p + r * part, dwhole.p, part, DType::f32);
    expect<float>(bad, "all_gather (in place)", dwhole.get(), [part](size_t i) { return float(i / part * 1000 + i % part % 101); });

    // all_to_all: block j of rank r goes to rank j, as block r there. On the device and the host.
    std::vector<float> s(2 * P);
    for (int j = 0; j < P; j++)
      for (int k = 0; k < 2; k++) s[j * 2 + k] = float(100 * r + 10 * j + k);
    auto want_a2a = [r](size_t i) { return float(100 * (i / 2) + 10 * r + i % 2); };
    Dev<float> ds(s), dr(std::vector<float>(2 * P, -1.f));
    c.all_to_all(ds.p, dr.p, 2, DType::f32);
    expect<float>(bad, "all_to_all (device)", dr.get(), want_a2a);
    std::vector<float> hr(2 * P, -1.f);
    c.all_to_all(s.data(), hr.data(), 2, DType::f32);
    expect<float>(bad, "all_to_all (host)", hr, want_a2a);

    // reduce_scatter: rank r gets the sum of every rank's block r; 400,000 floats a block is more
    // than one round (4 MiB / (4 bytes x 3 ranks) = 349,525).
    const size_t count = 400000;
    std::vector<float> rs(P * count);
    for (int j = 0; j < P; j++)
      for (size_t i = 0; i < count; i++) rs[j * count + i] = float(i % 13 + j + r);
    Dev<float> drs(rs), dout(std::vector<float>(count, -1.f));
    c.reduce_scatter(drs.p, dout.p, count, DType::f32, ReduceOp::sum);
    expect<float>(bad, "reduce_scatter (device)", dout.get(), [r](size_t i) { return float(3 * (i % 13) + 3 * r + 3); });
    std::vector<float> hout(4, -1.f);
    std::vector<float> hsend(P * 4);
    for (size_t i = 0; i < hsend.size(); i++) hsend[i] = float(i + r);
    c.reduce_scatter(hsend.data(), hout.data(), 4, DType::f32, ReduceOp::max);
    expect<float>(bad, "reduce_scatter (host, max)", hout, [r](size_t i) { return float(4 * r + i + 2); });

    // broadcast: from rank 2 on the host, from rank 1 on the device.
    std::vector<int32_t> h = r == 2 ? std::vector<int32_t>{7, 8, 9} : std::vector<int32_t>{0, 0, 0};
    c.broadcast(h.data(), 3, DType::i32, 2);
    expect<int32_t>(bad, "broadcast (host)", h, [](size_t i) { return int32_t(7 + i); });
    Dev<float> dbc(std::vector<float>(5, r == 1 ? 4.5f : 0.f));
    c.broadcast(dbc.p, 5, DType::f32, 1);
    expect<float>(bad, "broadcast (device)", dbc.get(), [](size_t) { return 4.5f; });

    // split by color r % 2, ordered by key -r: {2, 0} and {1}.
    auto sub = c.split(r % 2, -r);
    if (!sub || sub->rank() != std::vector<int>{1, 0, 0}[r] || sub->size() != (r % 2 ? 1 : 2)) {
      bad << "split: wrong rank or size\n";
    } else {
      float v = float(r + 1);
      sub->all_reduce(&v, 1, DType::f32, ReduceOp::sum);
      if (v != (r % 2 ? 2.f : 4.f)) bad << "split: all_reduce gave " << v << "\n";
    }
    auto none = c.split(r == 1 ? -1 : 0, r);  // no color: no communicator
    if ((r == 1) != (none == nullptr)) bad << "split without a color\n";
    if (none && none->size() != 2) bad << "split: size " << none->size() << ", not 2\n";
    c.barrier();
  });
  for (int r = 0; r < P; r++) {
    INFO("rank " << r);
    CHECK(problems[r] == "");
  }
}

TEST_CASE("emu nccl: a collective polled while its peer is late leaves no 'not ready' for the next launch", "[emu]") {
  // Main streams run late: the collective runs when finish() polls it, answering cudaErrorNotReady
  // until rank 1 comes. The emulator leaves that answer for cudaGetLastError (a GPU may): had
  // finish() not taken it back, the launch check of the next kernel (ul::launch) would have thrown
  // "device not ready" naming that kernel.
  ul_test::StreamOrderScope scope(ul_emu::StreamOrder::late_main);
  const std::vector<std::string> problems = on_ranks(2, [&](int r, ul::Comm& c, std::ostringstream& bad) {
    Dev<float> x(std::vector<float>(1000, float(r + 1)));
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.all_reduce(x.p, 1000, DType::f32, ReduceOp::sum);
    const cudaError_t pending = cudaPeekAtLastError();
    if (pending != cudaSuccess) bad << "after the all_reduce, pending: " << cudaGetErrorString(pending) << "\n";
    expect<float>(bad, "all_reduce", x.get(), [](size_t) { return 3.f; });
  });
  for (int r = 0; r < 2; r++) {
    INFO("rank " << r << ": " << problems[size_t(r)]);
    CHECK(problems[size_t(r)].empty());
  }
}

TEST_CASE("emu nccl: built against NCCL before 2.28, all_to_all is grouped send/recv with the same blocks", "[emu]") {
  const int P = 3;
  for (ul_emu::StreamOrder order : {ul_emu::StreamOrder::late_side, ul_emu::StreamOrder::late_main}) {
    ul_test::StreamOrderScope scope(order);
    const std::vector<std::string> problems = on_ranks(P, [&](int r, ul::Comm& c, std::ostringstream& bad) {
      // 400,000 floats a block is more than one round (4 MiB / 3 peers = 1,398,101 bytes a pair).
      for (size_t count : {size_t(2), size_t(400000)}) {
        std::vector<float> s(P * count);
        for (int j = 0; j < P; j++)
          for (size_t k = 0; k < count; k++) s[j * count + k] = float(100 * r + 10 * j + k % 7);
        auto want = [r, count](size_t i) { return float(100 * (i / count) + 10 * r + i % count % 7); };
        Dev<float> ds(s), dr(std::vector<float>(P * count, -1.f));
        c.all_to_all(ds.p, dr.p, count, DType::f32);
        expect<float>(bad, "all_to_all (device)", dr.get(), want);
        std::vector<float> hr(P * count, -1.f);
        c.all_to_all(s.data(), hr.data(), count, DType::f32);
        expect<float>(bad, "all_to_all (host)", hr, want);
      }
      c.barrier();
    }, ul::nccl_world_from_file_pre_2_28);
    for (int r = 0; r < P; r++) {
      INFO("rank " << r << ", " << (order == ul_emu::StreamOrder::late_main ? "late-main" : "late-side"));
      CHECK(problems[r] == "");
    }
  }
}

TEST_CASE("emu nccl: send and receive must pair up within a group", "[emu]") {
  std::vector<ncclResult_t> got[2];
  std::vector<float> received[2];
  on_two_raw_ranks([&](int r, ncclComm_t c) {
    float *out = nullptr, *in = nullptr;
    UL_CUDA_CHECK(cudaMalloc(&out, 8 * sizeof(float)));
    UL_CUDA_CHECK(cudaMalloc(&in, 8 * sizeof(float)));
    std::vector<float> mine(8, float(r + 1));
    UL_CUDA_CHECK(cudaMemcpy(out, mine.data(), sizeof(float) * 8, cudaMemcpyHostToDevice));
    const int peer = 1 - r;
    auto group = [&](size_t send_count, size_t recv_count, bool send, bool recv) {
      ncclGroupStart();
      ncclResult_t e = ncclSuccess;
      if (send && e == ncclSuccess) e = ncclSend(out, send_count, ncclFloat32, peer, c, nullptr);
      if (recv && e == ncclSuccess) e = ncclRecv(in, recv_count, ncclFloat32, peer, c, nullptr);
      const ncclResult_t end = ncclGroupEnd();
      return e != ncclSuccess ? e : end;
    };
    got[r].push_back(group(4, r == 0 ? 4 : 5, true, true));  // rank 1 receives 5 where 4 are sent
    got[r].push_back(group(4, 4, true, r == 0));             // rank 1 posts no receive
    ncclGroupStart();  // two sends to one peer in a group: the emulation takes one
    ncclSend(out, 1, ncclFloat32, peer, c, nullptr);
    got[r].push_back(ncclSend(out, 1, ncclFloat32, peer, c, nullptr));
    got[r].push_back(ncclGroupEnd());  // its one send has no receive: refused on both ranks alike
    got[r].push_back(ncclGroupEnd());  // no group open
    got[r].push_back(group(8, 8, true, true));  // a matching exchange works
    UL_CUDA_CHECK(cudaDeviceSynchronize());
    received[r].resize(8);
    UL_CUDA_CHECK(cudaMemcpy(received[r].data(), in, sizeof(float) * 8, cudaMemcpyDeviceToHost));
    // Outside a group, a send and its receive are each a group of one.
    got[r].push_back(r == 0 ? ncclSend(out, 2, ncclFloat32, 1, c, nullptr)
                            : ncclRecv(in, 2, ncclFloat32, 0, c, nullptr));
    UL_CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(out);
    cudaFree(in);
  });
  for (int r = 0; r < 2; r++) {
    INFO("rank " << r);
    CHECK(got[r] == std::vector<ncclResult_t>{ncclInvalidUsage, ncclInvalidUsage, ncclInvalidUsage, ncclInvalidUsage,
                                              ncclInvalidUsage, ncclSuccess, ncclSuccess});
    CHECK(received[r] == std::vector<float>(8, float(2 - r)));
  }
}

TEST_CASE("emu nccl: a rank claimed twice, or told another world size, is refused at the init", "[emu]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  // In turn, with no timing: two threads ask for rank 0 of 2 (one wins), then one for rank 1 of 3
  // while the init is open, then one for rank 1 of 2; the two right ones make a communicator that works.
  struct Rank {
    std::promise<ncclResult_t> init;
    float sum = 0;
    std::thread t;
  } ranks[3];
  auto start = [&](Rank& r, int rank) {
    r.t = std::thread([&r, &id, rank] {
      ncclComm_t c = nullptr;
      const ncclResult_t e = ncclCommInitRank(&c, 2, id, rank);
      r.init.set_value(e);
      if (e != ncclSuccess) return;
      float* v = nullptr;
      UL_CUDA_CHECK(cudaMalloc(&v, sizeof(float)));
      const float one = 1.f;
      UL_CUDA_CHECK(cudaMemcpy(v, &one, sizeof one, cudaMemcpyHostToDevice));
      if (ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, c, nullptr) == ncclSuccess)
        UL_CUDA_CHECK(cudaMemcpy(&r.sum, v, sizeof(float), cudaMemcpyDeviceToHost));
      cudaFree(v);
      ncclCommDestroy(c);
    });
  };
  std::future<ncclResult_t> first = ranks[0].init.get_future(), second = ranks[1].init.get_future(),
                            third = ranks[2].init.get_future();
  start(ranks[0], 0);
  start(ranks[1], 0);
  // The one refused returns at once; the winner waits for rank 1.
  const auto both = [&] { return first.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready ||
                                 second.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready; };
  while (!both()) {
  }
  ncclComm_t wrong = nullptr;
  CHECK(ncclCommInitRank(&wrong, 3, id, 1) == ncclInvalidUsage);  // the world has 2 ranks
  start(ranks[2], 1);
  const ncclResult_t a = first.get(), b = second.get();
  CHECK(((a == ncclSuccess && b == ncclInvalidUsage) || (a == ncclInvalidUsage && b == ncclSuccess)));
  CHECK(third.get() == ncclSuccess);
  for (Rank& r : ranks) r.t.join();
  CHECK(ranks[2].sum == 2.f);
  CHECK(std::max(ranks[0].sum, ranks[1].sum) == 2.f);
}

TEST_CASE("emu nccl: the emulated NCCL refuses host memory, overlapping all_to_all buffers, a bad root and an aborted communicator", "[emu]") {
  // The communicator stages host buffers; NCCL takes device (or registered host) memory only.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
  float host[4] = {1, 2, 3, 4};
  CHECK(ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, c, nullptr) == ncclInvalidArgument);
  float* dev = nullptr;
  UL_CUDA_CHECK(cudaMalloc(&dev, sizeof host));
  CHECK(ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, c, nullptr) == ncclSuccess);
  CHECK(ncclAlltoAll(dev, dev, 4, ncclFloat32, c, nullptr) == ncclInvalidArgument);  // overlapping buffers
  CHECK(ncclBroadcast(dev, dev, 4, ncclFloat32, 1, c, nullptr) == ncclInvalidArgument);  // no rank 1
  UL_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  // An aborted communicator takes no more work (its object stays: an abort ends the job).
  ncclComm_t aborted = nullptr;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclCommInitRank(&aborted, 1, id, 0) == ncclSuccess);
  CHECK(ncclCommAbort(aborted) == ncclSuccess);
  CHECK(ncclAllReduce(dev, dev, 4, ncclFloat32, ncclSum, aborted, nullptr) == ncclInvalidUsage);
  cudaFree(dev);
}

TEST_CASE("emu nccl: ranks that call different collectives are told so, not left to hang or read wrong data", "[emu]") {
  std::vector<ncclResult_t> got[2];
  on_two_raw_ranks([&](int r, ncclComm_t c) {
    float* buf = nullptr;
    UL_CUDA_CHECK(cudaMalloc(&buf, 8 * sizeof(float)));
    // Another collective, another count, another root; then the same call on both, which works.
    got[r].push_back(r == 0 ? ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, nullptr)
                            : ncclBroadcast(buf, buf, 4, ncclFloat32, 0, c, nullptr));
    got[r].push_back(ncclAllReduce(buf, buf, r == 0 ? 4 : 5, ncclFloat32, ncclSum, c, nullptr));
    got[r].push_back(ncclBroadcast(buf, buf, 4, ncclFloat32, r, c, nullptr));
    got[r].push_back(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclMax, c, nullptr));
    UL_CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(buf);
  });
  for (int r = 0; r < 2; r++) {
    INFO("rank " << r);
    CHECK(got[r] == std::vector<ncclResult_t>{ncclInvalidUsage, ncclInvalidUsage, ncclInvalidUsage, ncclSuccess});
  }
}

TEST_CASE("emu nccl: train --comm nccl over --nccl-id-file gives --comm local's numbers, and a killed rank fails the other", "[emu]") {
  ul_test::TempDir dir;
  const std::string run = kSmallRun + " --model gpt2 --sp 2 --steps 4";
  const std::string rank = "env RANK=%R WORLD_SIZE=2 LOCAL_RANK=%R ULYSSES_JOB_ID=emu-nccl-test ";
  auto as_rank = [&](int r, const std::string& args) {
    std::string env = rank;
    for (size_t at; (at = env.find("%R")) != std::string::npos;) env.replace(at, 2, std::to_string(r));
    return env + train_cmd(args + " --comm nccl --nccl-id-file " + (dir / "id"));
  };
  const CmdResult local = run_cmd(train_cmd(run + " --ranks 2"));
  REQUIRE(local.code == 0);
  // Braces: `cd D && A &` would put the cd in the background job too (and $! would be its shell's).
  const CmdResult nccl = run_cmd("cd " + dir.path.string() + " && { " + as_rank(1, run) + " > rank1.log 2>&1 & " +
                                 as_rank(0, run) + "; s=$?; wait $!; echo \"rank 1: $?\"; exit $s; }");
  INFO(nccl.out);
  CHECK(nccl.code == 0);
  CHECK(nccl.out.find("rank 1: 0") != std::string::npos);
  CHECK(nccl.out.find("(nccl)") != std::string::npos);
  CHECK(losses(nccl.out).size() == 5);
  CHECK(losses(nccl.out) == losses(local.out));

  // Rank 1 killed after rank 0's third step: rank 0 stops at its next collective, with the reason.
  const std::string long_run = kSmallRun + " --model gpt2 --sp 2 --steps 100000";
  const CmdResult killed = run_cmd(
      "cd " + dir.path.string() + " && rm -f id && { " + as_rank(1, long_run) + " > rank1.log 2>&1 & p1=$!; " +
      as_rank(0, long_run) + " > rank0.log 2>&1 & p0=$!; " +
      "for i in $(seq 600); do grep -q '^step     3' rank0.log && break; sleep 0.1; done; kill -9 $p1; "
      "s=$(date +%s); wait $p0; echo \"rank 0: $? after $(( $(date +%s) - s )) s\"; cat rank0.log; }");
  INFO(killed.out);
  CHECK(killed.out.find("rank 0: 1 after") != std::string::npos);
  CHECK(killed.out.find("has exited") != std::string::npos);  // seen at once, not at --comm-timeout
  CHECK(killed.out.find("train: error: nccl: ") != std::string::npos);
  CHECK(killed.out.find("CUDA_LAUNCH_BLOCKING") == std::string::npos);  // NCCL's error, not a kernel's fault
}

TEST_CASE("emu nccl: a ZeRO shard damaged inside stops both processes at once, said once by rank 0", "[emu]") {
  // Over --nccl-id-file there is no MPI_Abort: before the ranks agreed on a resume's reads, rank 0
  // (which does not read rank 1's shard) waited in a collective until --comm-timeout. And without
  // MPI, a JobError was printed by every process: now by the launcher's rank 0 alone.
  ul_test::TempDir dir;
  const std::string run = kSmallRun + " --model gpt2 --zero 1 --steps 3 --quiet --save-dir " + (dir / "run");
  auto as_rank = [&](int r, const std::string& args) {
    // (RANK and WORLD_SIZE alone, as train's own message suggests without a launcher: no
    // launcher's name to tell a job of several, yet rank 1 must stay silent)
    return "env RANK=" + std::to_string(r) + " WORLD_SIZE=2 ULYSSES_JOB_ID=emu-nccl-shard " +
           train_cmd(args + " --comm nccl --nccl-id-file " + (dir / "id"));
  };
  auto both = [&](const std::string& args) {
    return run_cmd("cd " + dir.path.string() + " && rm -f id && { " + as_rank(1, args) + " > rank1.log 2>&1 & p1=$!; " +
                   as_rank(0, args) + " > rank0.log 2>&1; s0=$?; wait $p1; s1=$?; echo \"status $s0 $s1\"; "
                   "echo '-- rank 0'; cat rank0.log; echo '-- rank 1'; cat rank1.log; }");
  };
  const CmdResult saved = both(run + " --stop-after 2");
  INFO(saved.out);
  REQUIRE(saved.out.find("status 0 0") != std::string::npos);
  ul_test::flip_byte_from_end(dir / "run/step_00000002/optim_rank_1.bin", 7);  // in rank 1's range alone
  const auto start = std::chrono::steady_clock::now();
  const CmdResult r = both(run + " --resume --comm-timeout 60");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out);
  CHECK(r.out.find("status 1 1") != std::string::npos);
  CHECK(took < 30);  // not --comm-timeout's 60 s
  const std::string zero = r.out.substr(0, r.out.find("-- rank 1")), one = r.out.substr(r.out.find("-- rank 1"));
  CHECK(zero.find("train: error: rank 1: ") != std::string::npos);
  CHECK(zero.find("optim_rank_1.bin: checksum mismatch") != std::string::npos);
  CHECK(one.find("train: error") == std::string::npos);
}

TEST_CASE("emu nccl: a rank whose device faults ends its run with the fault, and the other's at once", "[emu]") {
  // Each process is a GPU of its own. Rank 1's third update faults (ULYSSES_EMU_FAULT): its
  // CUDA and NCCL calls fail from there on and it exits with the fault; rank 0 finds it gone at
  // its next collective, not at --comm-timeout (600 s by default).
  ul_test::TempDir dir;
  const std::string run = kSmallRun + " --model gpt2 --sp 2 --steps 6";
  auto as_rank = [&](int r) {
    return std::string("env ") + (r == 1 ? "ULYSSES_EMU_FAULT=adamw_update:3 " : "") + "RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) + " ULYSSES_JOB_ID=emu-nccl-fault-test " +
           train_cmd(run + " --comm nccl --nccl-id-file " + (dir / "id"));
  };
  const CmdResult r = run_cmd("cd " + dir.path.string() + " && { " + as_rank(1) + " > rank1.log 2>&1 & p1=$!; " +
                              "s=$(date +%s); " + as_rank(0) + " > rank0.log 2>&1; " +
                              "echo \"rank 0: $? after $(( $(date +%s) - s )) s\"; wait $p1; echo \"rank 1: $?\"; " +
                              "cat rank1.log rank0.log; }");
  INFO(r.out);
  CHECK(r.out.find("rank 1: 1") != std::string::npos);
  CHECK(r.out.find("emulated kernel 'adamw_update' faulted: injected") != std::string::npos);
  CHECK(r.out.find("rank 0: 1 after") != std::string::npos);
  CHECK(r.out.find("has exited") != std::string::npos);
  CHECK(r.out.find("train: error: nccl: ") != std::string::npos);
  const size_t after = r.out.find("rank 0: 1 after ");
  REQUIRE(after != std::string::npos);
  CHECK(std::stol(r.out.substr(after + 16)) < 120);
}

namespace {

// Two ranks of `train --comm nccl --sp 2 --comm-timeout 8` in the emulator's stream order `order`;
// rank 1 stopped (alive, never coming) once rank 0 has logged step 3. Returns rank 0's log, and
// how long after the stop it exited (-1: it did not exit 1).
std::pair<std::string, long> stopped_peer(const std::string& order, const std::string& job) {
  ul_test::TempDir dir;
  // 8 s: every wait of the run has this deadline (the id file, the init, each step's collectives),
  // and none but the stop may reach it on a loaded machine.
  // --heartbeat 2: rank 0 says what it waits for every 2 s of the wait (parallel/wait_notice.h).
  const std::string run = kSmallRun + " --model gpt2 --sp 2 --steps 100000 --comm-timeout 8 --heartbeat 2";
  auto as_rank = [&](int r) {
    return "env ULYSSES_EMU_STREAMS=" + order + " RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" +
           std::to_string(r) + " ULYSSES_JOB_ID=" + job + " " +
           train_cmd(run + " --comm nccl --nccl-id-file " + (dir / "id"));
  };
  const CmdResult hung = run_cmd(
      "cd " + dir.path.string() + " && { " + as_rank(1) + " > rank1.log 2>&1 & p1=$!; " + as_rank(0) +
      " > rank0.log 2>&1 & p0=$!; " +
      "for i in $(seq 600); do grep -q '^step     3' rank0.log && break; sleep 0.1; done; kill -STOP $p1; "
      "s=$(date +%s%N); wait $p0; echo \"rank 0: $? after $(( ($(date +%s%N) - s) / 1000000 )) ms\"; kill -9 $p1; "
      "wait $p1; cat rank0.log; }");
  const size_t after = hung.out.find("rank 0: 1 after ");
  return {hung.out, after == std::string::npos ? -1 : std::stol(hung.out.substr(after + 16))};
}

}  // namespace

// A peer that is alive but never comes (stopped): comm_nccl's own deadline (--comm-timeout) ends
// the run. The legacy stream runs late here whatever the order CI set, so the collective is polled
// by cudaStreamQuery (finish()'s clock; run at issue, the call itself waits: the next case).
TEST_CASE("emu nccl: a rank alive but stopped ends the other's run at --comm-timeout", "[emu]") {
  const auto [out, ms] = stopped_peer("late-main", "emu-nccl-hang-test");
  INFO(out);
  CHECK(out.find(" timed out after 8 s (--comm-timeout) on rank 0: a peer died or hangs") != std::string::npos);
  CHECK(out.find("has exited") == std::string::npos);
  CHECK(out.find("  ...   waiting 2.") != std::string::npos);  // said before the deadline
  CHECK(out.find(" for the other ranks (--comm-timeout 8 s)") != std::string::npos);
  // Rank 0's wait began at most the log poll's 0.1 s (and a step) before the stop.
  CHECK(ms >= 6000);   // not before the deadline: a stopped peer is no dead one
  CHECK(ms <= 60000);  // and not at the emulator's own 10-minute wait
}

// Where a collective runs at its call (the late-side stream order: the emulated NCCL then waits for
// the peers inside the call, as a real one does when it first connects to them), a stopped peer
// holds the call itself, past finish()'s clock: the call's own guard ends the run at --comm-timeout.
TEST_CASE("emu nccl: a peer stopped while a call waits inside NCCL ends the run at --comm-timeout", "[emu]") {
  const auto [out, ms] = stopped_peer("late-side", "emu-nccl-in-call-test");
  INFO(out);
  CHECK(out.find("train: error: nccl: rank 0 of 2 waited 8 s (--comm-timeout) inside NCCL's ") != std::string::npos);
  CHECK(ms >= 6000);   // not before the deadline
  CHECK(ms <= 60000);  // and not at the emulator's own 10-minute wait
}

// NCCL_COMM_BLOCKING=0 makes NCCL's calls return before their work is queued: the communicator,
// which waits on the stream after each call, refuses to start under it.
TEST_CASE("emu nccl: NCCL_COMM_BLOCKING=0 in the environment is refused before the init", "[emu]") {
  ::setenv("NCCL_COMM_BLOCKING", "0", 1);
  const std::vector<std::string> problems = on_ranks(1, [](int, ul::Comm&, std::ostringstream&) {});
  ::unsetenv("NCCL_COMM_BLOCKING");
  CHECK(problems[0].find("threw: nccl: NCCL_COMM_BLOCKING=0 in the environment") != std::string::npos);
  ::setenv("NCCL_COMM_BLOCKING", "1", 1);  // blocking, as asked: taken
  const std::vector<std::string> fine = on_ranks(1, [](int, ul::Comm&, std::ostringstream&) {});
  ::unsetenv("NCCL_COMM_BLOCKING");
  CHECK(fine[0].empty());
}

// --nccl-id-file's rank and world size from the environment: one out of range, or not a number, is
// named as such (both once read as "no rank and world size from a launcher").
TEST_CASE("emu nccl: --nccl-id-file refuses a rank past the world size and a world size that is no number", "[emu]") {
  ul_test::TempDir dir;
  const std::string run = " " + train_cmd(kSmallRun + " --comm nccl --nccl-id-file " + (dir / "id"));
  CmdResult r = run_cmd("RANK=2 WORLD_SIZE=2" + run);
  CHECK(r.code == 1);
  CHECK(r.out.find("--nccl-id-file: rank 2 is not below the world size 2 (RANK and WORLD_SIZE: read RANK, "
                   "WORLD_SIZE)") != std::string::npos);
  r = run_cmd("RANK=0 WORLD_SIZE=2x" + run);
  CHECK(r.code == 1);
  CHECK(r.out.find("RANK and WORLD_SIZE (and LOCAL_RANK) to numbers; read RANK, WORLD_SIZE, which are unset, not "
                   "numbers, or below 0 (the rank) or 1 (the world size)") != std::string::npos);
}

#ifdef ULYSSES_MPIRUN_CMD
TEST_CASE("emu nccl: train --comm nccl under mpirun (dp 2 x sp 2, bf16, ZeRO-1) gives --comm local's numbers", "[emu]") {
  const std::string run = kSmallRun + " --model llama --sp 2 --steps 3 --precision bf16 --zero 1";
  const CmdResult local = run_cmd(train_cmd(run + " --ranks 4"));
  REQUIRE(local.code == 0);
  const CmdResult nccl = run_cmd(std::string(ULYSSES_MPIRUN_CMD) + " " + train_cmd(run + " --comm nccl"));
  INFO(nccl.out);
  CHECK(nccl.code == 0);
  CHECK(nccl.out.find("dp 2 x sp 2 (nccl)") != std::string::npos);
  CHECK(losses(nccl.out).size() == 4);
  CHECK(losses(nccl.out) == losses(local.out));
}
#endif
