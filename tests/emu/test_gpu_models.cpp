// GPUs other than the H100: the emulator pretends to be another model (ULYSSES_EMU_GPU) built
// for some architectures (ULYSSES_EMU_KERNEL_ARCHS), so what a user of an A100, an L40S or a V100
// meets is checked here: the start-up refusals and their fixes, the kernel-image rule they rest
// on, and a training run on a GPU whose blocks hold 99 KiB of shared memory (the attention kernels
// on one: tests/emu/test_attention_cuda.cpp).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "emu/cuda_cases_util.h"
#include "emu/emu_gpu.h"
#include "engine/cuda_emu/gpu_models.h"
#include "engine/cuda_runtime.h"
#include "layers/attention.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::EmuGpu;

TEST_CASE("emulator: a build runs on a GPU by CUDA's rules (SASS within a major, PTX forward)", "[emu]") {
  using ul_emu::has_kernel_image;
  CHECK(has_kernel_image("", 7, 0));        // unset: every GPU
  CHECK(has_kernel_image("90", 9, 0));
  CHECK(has_kernel_image("90", 10, 0));     // compute_90 PTX, compiled by the driver for a B200
  CHECK(has_kernel_image("90", 12, 0));
  CHECK_FALSE(has_kernel_image("90", 8, 0));  // no older GPU
  CHECK_FALSE(has_kernel_image("90", 8, 9));
  CHECK_FALSE(has_kernel_image("90-real", 10, 0));  // SASS only: not across a major
  CHECK(has_kernel_image("80-real", 8, 9));   // sm_80 SASS runs on 8.6 and 8.9
  CHECK_FALSE(has_kernel_image("89-real", 8, 0));
  CHECK_FALSE(has_kernel_image("89", 8, 6));    // nor on a lower minor, as PTX either
  CHECK(has_kernel_image("80-virtual", 9, 0));
  CHECK(has_kernel_image("75;80,90", 8, 6));
  CHECK_FALSE(has_kernel_image("90;100", 8, 0));
  CHECK(has_kernel_image("90a", 9, 0));  // arch-specific: that capability alone, as SASS or PTX
  CHECK_FALSE(has_kernel_image("90a", 10, 0));
  CHECK_FALSE(has_kernel_image("90a-virtual", 10, 0));
  CHECK(has_kernel_image("100f", 10, 3));  // family-specific: 10.x
  CHECK_FALSE(has_kernel_image("100f", 12, 0));
  CHECK_FALSE(has_kernel_image("100a-real", 10, 3));
  CHECK_THROWS_WITH(has_kernel_image("native", 9, 0), Catch::Contains("cannot read 'native'"));
  CHECK_THROWS_WITH(has_kernel_image("90-fake", 9, 0), Catch::Contains("cannot read '90-fake'"));
  EmuGpu gpu("tesla-p100", "");
  CHECK_THROWS_WITH(ul_emu::emulated_gpu(), Catch::Contains("ULYSSES_EMU_GPU=tesla-p100") &&
                                                Catch::Contains("a100") && Catch::Contains("l40s"));
}

TEST_CASE("the CUDA start-up check refuses a GPU older than sm_80, or one the build has no kernels for, naming the fix", "[emu]") {
  ul::init_cuda_backend();
  {
    EmuGpu gpu("", "");
    CHECK(ul::cuda_device_problem().empty());  // the emulator's H100
  }
  for (const char* old : {"v100", "t4"}) {
    EmuGpu gpu(old, "");
    const std::string p = ul::cuda_device_problem();
    INFO(p);
    CHECK_THAT(p, Catch::Contains("GPU 0 (Tesla") && Catch::Contains("is too old") &&
                      Catch::Contains("compute capability 8.0 or newer"));
  }
  {
    EmuGpu gpu("a100", "90");
    const std::string p = ul::cuda_device_problem();
    INFO(p);
    CHECK_THAT(p, Catch::Contains("no kernels for GPU 0 (NVIDIA A100-SXM4-80GB (emulated), compute capability 8.0)") &&
                      Catch::Contains("built for 90 (CMAKE_CUDA_ARCHITECTURES)") &&
                      Catch::Contains("rebuild with -DCMAKE_CUDA_ARCHITECTURES=80 (or native"));
    // Without the check, the first kernel launched is where it would surface (copies still work).
    cuda_cases::DeviceBuffer<float> qkv(3 * 32), out(32), lse(1);
    qkv.set(std::vector<float>(3 * 32, 0.5f));
    CHECK_THROWS_WITH(ul::cuda::attention_forward(out.p, lse.p, qkv.p, nullptr, 0, nullptr, 1, 1, 1, 1, 32, nullptr),
                      Catch::Contains("no kernel image is available"));
  }
  {
    EmuGpu gpu("rtx4090", "90");
    CHECK_THAT(ul::cuda_device_problem(), Catch::Contains("-DCMAKE_CUDA_ARCHITECTURES=89 "));
  }
  {
    EmuGpu gpu("b200", "90");  // compute_90 PTX: the driver compiles it for sm_100
    CHECK(ul::cuda_device_problem().empty());
  }
  {
    EmuGpu gpu("b200", "90-real");
    CHECK_THAT(ul::cuda_device_problem(), Catch::Contains("-DCMAKE_CUDA_ARCHITECTURES=100 "));
  }
  {
    EmuGpu gpu("l40s", "80;90");  // sm_80 SASS runs on sm_89
    CHECK(ul::cuda_device_problem().empty());
  }
}

TEST_CASE("train --device cuda on an emulated V100 or a wrong build: the refusal, and no run", "[emu]") {
  const std::string run = ul_test::train_cmd("--device cuda --steps 1 --seq 32 --batch 2 --eval-every 0 --quiet");
  const ul_test::CmdResult v100 = ul_test::run_cmd("ULYSSES_EMU_GPU=v100 " + run);
  INFO(v100.out);
  CHECK(v100.code != 0);
  CHECK_THAT(v100.out, Catch::Contains("Tesla V100-SXM2-32GB (emulated), compute capability 7.0) is too old"));
  CHECK(v100.out.find("step") == std::string::npos);
  const ul_test::CmdResult a100 = ul_test::run_cmd("ULYSSES_EMU_GPU=a100 ULYSSES_EMU_KERNEL_ARCHS=90 " + run);
  INFO(a100.out);
  CHECK(a100.code != 0);
  CHECK_THAT(a100.out, Catch::Contains("rebuild with -DCMAKE_CUDA_ARCHITECTURES=80"));
}

TEST_CASE("train --device cuda --precision bf16 at head dim 128 on an emulated L40S: the H100's losses, bit for bit", "[emu]") {
  // One layer of a llama with two heads of 128, two steps: every kernel forward and backward, the
  // dk/dv pass with one stage on the L40S and two on the H100. The log holds each loss and norm
  // to 17 digits.
  ul_test::TempDir dir;
  auto run = [&](const char* gpu) {
    const std::string log = dir.file(std::string(gpu) + ".jsonl");
    const ul_test::CmdResult r = ul_test::run_cmd(
        "ULYSSES_EMU_GPU=" + std::string(gpu) + " " +
        ul_test::train_cmd("--device cuda --precision bf16 --model llama --layers 1 --dim 256 --heads 2 "
                           "--kv-heads 1 --steps 2 --seq 64 --batch 1 --eval-every 0 --eval-batches 1 --quiet --log " +
                           log));
    INFO(gpu << ": " << r.out);
    REQUIRE(r.code == 0);
    std::ifstream in(log);
    std::vector<std::string> fields;
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"type\":\"step\"") == std::string::npos) continue;
      for (const char* key : {"\"loss\":", "\"grad_norm\":"}) {
        const size_t at = line.find(key);
        REQUIRE(at != std::string::npos);
        fields.push_back(line.substr(at, line.find(',', at) - at));
      }
    }
    return fields;
  };
  const std::vector<std::string> l40s = run("l40s"), h100 = run("h100");
  // The device line names the GPU (and what it had free: the emulator's 44 GiB, less nothing yet).
  const ul_test::CmdResult line = ul_test::run_cmd(
      "ULYSSES_EMU_GPU=l40s " + ul_test::train_cmd("--device cuda --steps 1 --seq 32 --batch 2 --eval-every 0 --eval-batches 1"));
  CHECK_THAT(line.out, Catch::Contains("| GPU 0 (NVIDIA L40S (emulated), compute capability 8.9, 44.0 of 44.0 GiB free)"));
  CHECK(l40s.size() == 4);
  CHECK(l40s == h100);
}

TEST_CASE("the start-up free memory is measured again after NCCL's warm-up, not before", "[emu]") {
  // The trainer's NCCL warm-up (engine/trainer.cpp: hosts_of) allocates what NCCL connects at its
  // first collectives, then measures again: the figure the memory check uses moves with it.
  ul::init_cuda_backend();
  const size_t before = ul::cuda_gpu_at_start().free;
  void* held = nullptr;
  REQUIRE(cudaMalloc(&held, size_t(64) << 20) == cudaSuccess);
  CHECK(ul::cuda_gpu_at_start().free == before);  // the figure of the start, until measured again
  ul::cuda_remeasure_free_memory();
  CHECK(ul::cuda_gpu_at_start().free <= before - (size_t(64) << 20));
  REQUIRE(cudaFree(held) == cudaSuccess);
  ul::cuda_remeasure_free_memory();
  CHECK(ul::cuda_gpu_at_start().free == before);
}

TEST_CASE("train --device cuda refuses a run larger than the GPU's free memory before allocating it", "[emu]") {
  // Llama 3.2 1B at 64K on a 24 GB card: its plan is past 24 GiB. The refusal names the GPU, what it
  // had free and what to shrink, and comes before the first large cudaMalloc (which failed bare).
  const ul_test::CmdResult r = ul_test::run_cmd(
      "ULYSSES_EMU_GPU=rtx4090 " +
      ul_test::train_cmd("--device cuda --model llama-3.2-1B --seq 65536 --batch 1 --steps 1 --recompute "
                         "--mlp-chunks 8 --eval-every 0 --quiet"));
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("of GPU memory per rank (weights ") &&
                        Catch::Contains("but GPU 0 (NVIDIA GeForce RTX 4090 (emulated)) had 24576 MiB free when the run "
                                        "started") &&
                        Catch::Contains("`train --plan --memory 23.5G`"));
  CHECK(r.out.find("cudaMalloc") == std::string::npos);
}
