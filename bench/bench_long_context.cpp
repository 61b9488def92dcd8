// The planner's answers for long-context training (bench/RESULTS.md, "Long context on the CPU"):
//   1. activation memory per rank: sp = 4 against sp = 1 at equal T (target: <= 1 / 3.5), and the
//      activations recompute keeps per token per layer (target: <= 2 C bytes-per-element);
//   2. the longest T that fits this kind of machine (24 GiB, shared by the ranks of one host), for
//      GPT-2 124M and a llama ~1B shape, at sp = 1, 2, 4;
//   3. the longest T on H200s (141 GB each, bf16): 1 GPU, 8 GPUs (one node), 32 GPUs (4 nodes), for
//      those two and the Llama 3.1 8B and Qwen 2.5 7B shapes.
// The planner walks the same allocations as the run (held byte-exact to the arena by
// tests/cpu/test_memory_features.cpp and, for the CUDA backend, tests/emu/test_memory_cuda.cpp);
// it allocates nothing, so this runs in a second.
//   ./build/bench_long_context --help   prints the flags and their defaults (the usage string below is the one list)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_args.h"
#include "engine/options.h"
#include "engine/planner.h"

using namespace ul;

namespace {

ModelConfig preset(const char* name) {
  Options o;
  o.model = name;
  return model_config(o, 2);
}

PlanConfig config(const char* model, int T, int sp, int world, bool rc, int chunks, int zero, Device d,
                  bool offload = false) {
  PlanConfig c;
  c.model = preset(model);
  c.batch = 1, c.seq = T, c.sp = sp, c.world = world;
  c.recompute = rc, c.mlp_chunks = chunks, c.zero = zero, c.device = d, c.offload = offload;
  c.dtype = d == Device::cuda ? DType::bf16 : DType::f32;
  c.local_comm = false;  // mpirun / NCCL: no slice of the gradient kept by the communicator
  if (!c.model.is_llama() && c.model.max_seq < T) c.model.max_seq = T;
  return c;
}

double gib(double b) { return b / (1024.0 * 1024 * 1024); }

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args(argc, argv, "usage: bench_long_context [--memory 24G]   (memory per host, K/M/G/T binary units)");
  const double host = args.bytes("--memory", 24.0 * 1024 * 1024 * 1024);
  args.done();
  const char* models[] = {"gpt2-124M", "llama-1B"};

  std::printf("## activation memory per rank at T = 16384 (cpu, f32, batch 1)\n");
  std::printf("| model | recompute | sp 1 arena | sp 4 arena | sp4 / sp1 | kept per token per layer (x C*4 B) |\n|---|---|---|---|---|---|\n");
  for (const char* m : models)
    for (bool rc : {false, true}) {
      MemoryPlan a = plan_memory(config(m, 16384, 1, 1, rc, rc ? 8 : 1, 0, Device::cpu));
      MemoryPlan b = plan_memory(config(m, 16384, 4, 4, rc, rc ? 8 : 1, 0, Device::cpu));
      // kept per layer: the difference between L and L + 1 layers, per token, with the row's own
      // chunks (the MLP's chunks change what a layer without recompute keeps)
      PlanConfig k0 = config(m, 16384, 1, 1, rc, rc ? 8 : 1, 0, Device::cpu), k1 = k0;
      k1.model.layers += 1;
      const double per = double(plan_memory(k1).kept - plan_memory(k0).kept) / 16384 / (k0.model.dim * 4.0);
      std::printf("| %s | %s | %.2f GiB | %.2f GiB | 1/%.2f | %.2f |\n", m, rc ? "yes, mlp chunks 8" : "no",
                  gib(a.arena_peak), gib(b.arena_peak), double(a.arena_peak) / double(b.arena_peak), per);
    }

  std::printf("\n## longest T on one %.0f GiB host (cpu, f32, batch 1; the host's memory split among its ranks)\n", gib(host));
  std::printf("| model | sp (ranks) | plain | recompute + mlp chunks 8 | + zero 1 |\n|---|---|---|---|---|\n");
  for (const char* m : models)
    for (int sp : {1, 2, 4}) {
      const double budget = host / sp;
      std::printf("| %s | %d | %lld | %lld | %lld |\n", m, sp,
                  (long long)longest_seq(config(m, 64, sp, sp, false, 1, 0, Device::cpu), budget),
                  (long long)longest_seq(config(m, 64, sp, sp, true, 8, 0, Device::cpu), budget),
                  (long long)longest_seq(config(m, 64, sp, sp, true, 8, 1, Device::cpu), budget));
    }

  std::printf("\n## longest T on H200s (139 GiB each: the 140 GiB nvidia-smi shows less the CUDA context; bf16 weights "
              "and activations, batch 1 per dp rank)\n");
  std::printf("| model | GPUs | sp x dp | plain | recompute + mlp chunks 8 + zero 1 | + offload (pinned host GiB per GPU) |\n"
              "|---|---|---|---|---|---|\n");
  const double h200 = 139.0 * (1 << 30);  // "141 GB" is 143771 MiB as nvidia-smi counts it
  struct Layout { int gpus, sp; };
  for (const char* m : {"gpt2-124M", "llama-1B", "llama-3.1-8B", "qwen2.5-7B"}) {
    // sp: the largest that divides both the heads and the GPUs (12 heads: 4; Qwen's 28: 4).
    auto widest_sp = [&](int gpus) {
      int sp = gpus;
      while (preset(m).heads % sp || gpus % sp) sp--;
      return sp;
    };
    for (Layout l : {Layout{1, 1}, Layout{8, widest_sp(8)}, Layout{32, widest_sp(32)}}) {
      const int64_t off = longest_seq(config(m, 64, l.sp, l.gpus, true, 8, 1, Device::cuda, true), h200);
      const double pinned = gib(double(plan_memory(config(m, int(off), l.sp, l.gpus, true, 8, 1, Device::cuda, true)).pinned_host));
      std::printf("| %s | %d | %d x %d | %lld | %lld | %lld (%.1f) |\n", m, l.gpus, l.sp, l.gpus / l.sp,
                  (long long)longest_seq(config(m, 64, l.sp, l.gpus, false, 1, 0, Device::cuda), h200),
                  (long long)longest_seq(config(m, 64, l.sp, l.gpus, true, 8, 1, Device::cuda), h200), (long long)off,
                  pinned);
    }
  }
  return 0;
}
