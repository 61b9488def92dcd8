// A kernel's fault on the emulated device is sticky, as a GPU's is (engine/cuda_emu/runtime.h), and
// ULYSSES_EMU_FAULT injects one into a chosen launch: what a program does with a GPU's fault
// (every later call failing) can be tested without a GPU, down to `train` mid-run.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/cuda_emu/nccl.h"
#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#include "run_cmd.h"
#include "stream_order.h"
#include "temp_dir.h"

namespace {

__global__ void count_kernel(int* out) { atomicAdd(out, 1); }

// The faults injected for a scope; none, and a fresh device, after it.
struct Injected {
  Injected(const char* kernel, long nth) { ul_emu::inject_fault(kernel, nth); }
  ~Injected() {
    ul_emu::inject_fault("", 0);
    ul_emu::clear_device_fault();
  }
};

std::string last_line(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

TEST_CASE("emu: an injected fault hits the chosen launch and stays, as a GPU's illegal address", "[emu]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch
  int* count = nullptr;
  UL_CUDA_CHECK(cudaMalloc(&count, sizeof(int)));
  UL_CUDA_CHECK(cudaMemset(count, 0, sizeof(int)));
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
  {
    Injected second("counted", 2);
    ul::launch("counted", count_kernel, dim3(1), dim3(32), 0, nullptr, count);
    ul::launch("other", count_kernel, dim3(1), dim3(32), 0, nullptr, count);  // another name: not counted
    CHECK(ul_emu::device_fault() == cudaSuccess);
    CHECK_THROWS_WITH(ul::launch("counted", count_kernel, dim3(1), dim3(32), 0, nullptr, count),
                      Catch::Contains("'counted' faulted: injected (ULYSSES_EMU_FAULT)"));
    // From here on every call that touches the device fails with the fault, as on a GPU.
    CHECK(ul_emu::device_fault() == cudaErrorIllegalAddress);
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    int host = -1;
    CHECK_THROWS_WITH(UL_CUDA_CHECK(cudaMemcpy(&host, count, sizeof(int), cudaMemcpyDeviceToHost)),
                      Catch::Contains("an illegal memory access was encountered") &&
                          Catch::Contains("CUDA_LAUNCH_BLOCKING=1"));
    CHECK(host == -1);
    CHECK_THROWS_WITH(ul::launch("later", count_kernel, dim3(1), dim3(32), 0, nullptr, count),
                      Catch::Contains("launching kernel 'later'") && Catch::Contains("illegal memory access"));
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // not reset
    // NCCL's launches fail too, and so does a new communicator (its init allocates device memory).
    CHECK(ncclAllReduce(count, count, 1, ncclInt32, ncclSum, c, nullptr) == ncclUnhandledCudaError);
    ncclComm_t late = nullptr;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(ncclCommInitRank(&late, 1, id, 0) == ncclUnhandledCudaError);
    CHECK(ncclCommAbort(c) == ncclSuccess);
  }
  // A fresh device (tests only): the counter saw the two launches that ran, not the faulted one.
  int host = 0;
  UL_CUDA_CHECK(cudaMemcpy(&host, count, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(host == 2 * 32);
  cudaFree(count);
}

TEST_CASE("train --device cuda: a kernel's fault mid-run ends it with the error, and the checkpoints before it resume",
          "[emu]") {
  // The third optimizer step's update faults. Whichever stream runs late (CI runs both orders),
  // the run stops at step 3 with a non-zero status: at the launch, naming the kernel, or at the
  // next call that waits for the device, with how to find the kernel. Steps 1 and 2 were saved
  // whole, the log says why it stopped, and a resume without the fault finishes the run.
  ul_test::TempDir dir;
  const std::string save = dir / "run";
  const std::string base = "--device cuda --steps 4 --seq 32 --batch 2 --eval-every 0 --eval-batches 1 --threads 1";
  const std::string run = base + " --save-dir " + save + " --save-every 1";
  const ul_test::CmdResult r = ul_test::run_cmd("ULYSSES_EMU_FAULT=adamw_update:3 " + ul_test::train_cmd(run));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK((r.out.find("emulated kernel 'adamw_update' faulted: injected") != std::string::npos ||
         r.out.find("an illegal memory access was encountered (a kernel launched before this point faulted") !=
             std::string::npos));
  CHECK(r.out.find("step     2/4") != std::string::npos);
  CHECK(r.out.find("step     3/4") == std::string::npos);
  CHECK(std::filesystem::is_directory(save + "/step_00000002"));
  CHECK_FALSE(std::filesystem::exists(save + "/step_00000003"));
  const std::string err = last_line(save + "/log.jsonl");
  CHECK(err.find("\"type\":\"error\",\"step\":3") != std::string::npos);
  const ul_test::CmdResult resumed = ul_test::run_cmd(ul_test::train_cmd(run + " --resume"));
  INFO(resumed.out);
  CHECK(resumed.code == 0);
  CHECK(resumed.out.find("step     3/4") != std::string::npos);
  CHECK(resumed.out.find("step     4/4") != std::string::npos);

  // Two ranks in one process, each its own emulated device: one faults (the fifth update is a
  // rank's third step), and the run still ends at once with the error, no step 3 saved.
  const std::string save2 = dir / "ranks";
  const ul_test::CmdResult two = ul_test::run_cmd(
      "ULYSSES_EMU_FAULT=adamw_update:5 timeout 300 " +
      ul_test::train_cmd(base + " --ranks 2 --save-dir " + save2 + " --save-every 1"));
  INFO(two.out);
  CHECK(two.code == 1);
  CHECK(two.out.find("adamw_update") != std::string::npos);
  CHECK(std::filesystem::is_directory(save2 + "/step_00000002"));
  CHECK_FALSE(std::filesystem::exists(save2 + "/step_00000003"));

  // A fault in a kernel that runs inside an arena scope, with the arena poisoned on release
  // (ULYSSES_POISON_ARENA=1, as CI runs): the scope's release meets the fault in its poisoning
  // memset while the fault unwinds, and must not end the program (std::terminate, status 134)
  // before the fault is said. Once in a step, once in an eval.
  for (const std::string& at : {std::string("softmax_cross_entropy:2"), std::string("embedding_check:3")}) {
    INFO(at);
    const ul_test::CmdResult scoped = ul_test::run_cmd(
        "ULYSSES_POISON_ARENA=1 ULYSSES_EMU_FAULT=" + at + " " +
        ul_test::train_cmd(base + " --eval-every 1 --save-dir " + (dir / at) +
                           " --save-every 1"));
    INFO(scoped.out);
    CHECK(scoped.code == 1);
    CHECK(scoped.out.find("train: error: ") != std::string::npos);
    CHECK(scoped.out.find("terminate called") == std::string::npos);
    CHECK(last_line(dir / (at + "/log.jsonl")).find("\"type\":\"error\"") != std::string::npos);
  }

  // A spec that names no launch is refused by name, before anything runs.
  const ul_test::CmdResult bad =
      ul_test::run_cmd("ULYSSES_EMU_FAULT=adamw_update:0 " + ul_test::train_cmd(base));
  INFO(bad.out);
  CHECK(bad.code == 1);
  CHECK(bad.out.find("ULYSSES_EMU_FAULT=adamw_update:0: want KERNEL or KERNEL:N (N >= 1)") != std::string::npos);
}
