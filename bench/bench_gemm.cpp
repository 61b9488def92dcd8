// GEMM throughput of the CPU linear and classifier kernels at the shapes of one GPT-2 124M step
// with B = 4, T = 64 (N = 256 rows, C = 768), as GFLOP/s and as a ratio to Eigen's peak on a large
// square product measured in the same run. Each row is the best of several runs: the machine may be
// shared, and the best run is the one least disturbed.
//   ./build/bench_gemm --help   prints the flags and their defaults (the usage string below is the one list)

// GCC 12 reports false "may be used uninitialized" warnings inside Eigen's AVX-512 packet code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "bench/bench_args.h"
#include "bench/gemm_peak.h"
#include "bench/guarded_main.h"
#include "layers/classifier.h"
#include "layers/linear.h"

namespace {

double best_seconds(int reps, const std::function<void()>& f) {
  f();  // warm-up: first touch of the output, packing buffers
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count());
  }
  return best;
}

std::vector<float> randv(size_t n, unsigned seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double g_peak = 0;

// One table row: our kernel's time and rate, and (when eigen_sec > 0) the same product as one plain
// Eigen expression, threaded by Eigen itself.
void row(const char* name, const char* gemm, double flops, double sec, double eigen_sec = 0) {
  double gf = flops / sec * 1e-9;
  std::printf("%-10s %-28s %9.2f ms %8.1f GFLOP/s %6.2f", name, gemm, sec * 1e3, gf, gf / g_peak);
  if (eigen_sec > 0) std::printf("   %8.1f GFLOP/s %6.2f", flops / eigen_sec * 1e-9, flops / eigen_sec * 1e-9 / g_peak);
  std::printf("\n");
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<RowMat>;

// The three GEMMs of a linear layer x (N, C) -> (N, OC), through the kernels the model calls.
void bench_linear(const char* name, int N, int C, int OC, int reps) {
  auto x = randv(size_t(N) * C, 1, 1.f), w = randv(size_t(OC) * C, 2, 0.02f), b = randv(OC, 3, 0.02f);
  auto dy = randv(size_t(N) * OC, 4, 1.f);
  std::vector<float> y(size_t(N) * OC), dx(size_t(N) * C), dw(size_t(OC) * C);
  const double flops = 2.0 * N * C * OC;
  char s[64];
  std::snprintf(s, sizeof s, "fwd (%dx%d)(%dx%d)", N, C, C, OC);
  MapM X(x.data(), N, C), W(w.data(), OC, C), DY(dy.data(), N, OC), Y(y.data(), N, OC), DX(dx.data(), N, C),
      DW(dw.data(), OC, C);
  row(name, s, flops, best_seconds(reps, [&] {
    ul::cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  }), best_seconds(reps, [&] { Y.noalias() = X * W.transpose(); }));
  std::snprintf(s, sizeof s, "dx  (%dx%d)(%dx%d)", N, OC, OC, C);
  row(name, s, flops, best_seconds(reps, [&] {
    ul::cpu::linear_backward(dx.data(), (float*)nullptr, (float*)nullptr, dy.data(), x.data(), w.data(), N, C, OC);
  }), best_seconds(reps, [&] { DX.noalias() += DY * W; }));
  std::snprintf(s, sizeof s, "dw  (%dx%d)(%dx%d)", OC, N, N, C);
  row(name, s, flops, best_seconds(reps, [&] {
    ul::cpu::linear_backward((float*)nullptr, dw.data(), (float*)nullptr, dy.data(), x.data(), w.data(), N, C, OC);
  }), best_seconds(reps, [&] { DW.noalias() += DY.transpose() * X; }));
}

// The fused classifier: logits, softmax, loss and both gradients, in chunks of rows.
void bench_classifier(int N, int C, int V, int chunk_rows, int reps) {
  auto x = randv(size_t(N) * C, 5, 1.f), w = randv(size_t(V) * C, 6, 0.02f);
  std::vector<int32_t> tg(N);
  for (int n = 0; n < N; n++) tg[n] = (n * 7919) % V;
  std::vector<float> dx(size_t(N) * C), dw(size_t(V) * C);
  // Kept across the calls, as the op keeps it in its arena (a vector made each call added its
  // page faults to the time: 7% at chunk 256).
  std::vector<float> scratch(ul::cpu::classifier_scratch_elems(chunk_rows, C, V));
  char s[64];
  std::snprintf(s, sizeof s, "loss only, chunk %d", chunk_rows);
  row("classifier", s, 2.0 * N * C * V, best_seconds(reps, [&] {
    ul::cpu::classifier_forward_backward<float>(nullptr, nullptr, x.data(), w.data(), tg.data(), N, C, V, 1.f / N,
                                                chunk_rows, scratch.data());
  }));
  std::snprintf(s, sizeof s, "loss+dx+dw, chunk %d", chunk_rows);
  row("classifier", s, 6.0 * N * C * V, best_seconds(reps, [&] {
    ul::cpu::classifier_forward_backward<float>(dx.data(), dw.data(), x.data(), w.data(), tg.data(), N, C, V,
                                                1.f / N, chunk_rows, scratch.data());
  }));
}

int run(int argc, char** argv) {
  BenchArgs args(argc, argv, "usage: bench_gemm [--reps 5] [--threads N (OpenMP's default: OMP_NUM_THREADS or every core)]");
  const int reps = args.positive("--reps", 5), threads = int(args.integer("--threads", 0, 0, 4096));
  args.done();
  if (threads > 0) omp_set_num_threads(threads);
  const int N = 256, C = 768, V = 50257;
  g_peak = eigen_gemm_peak_gflops(2048, reps);
  std::printf("threads %d, Eigen %d.%d.%d, SIMD %s\n", omp_get_max_threads(), EIGEN_WORLD_VERSION,
              EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse());
  std::printf("Eigen peak: (2048x2048)(2048x2048) %.1f GFLOP/s\n\n", g_peak);
  std::printf("%-10s %-28s %12s %16s %6s   %16s %6s\n", "layer", "GEMM", "time", "ulysses", "/peak", "Eigen-threaded",
              "/peak");
  bench_linear("qkv", N, C, 3 * C, reps);
  bench_linear("attn proj", N, C, C, reps);
  bench_linear("fc", N, C, 4 * C, reps);
  bench_linear("fc proj", N, 4 * C, C, reps);
  bench_linear("lm head", N, C, V, std::max(1, reps / 2));
  // Chunks of ~16 MiB and ~32 MiB of logits (the op's choice), and all rows at once.
  for (int chunk : {(4 << 20) / V / 16 * 16, (8 << 20) / V / 16 * 16, N})
    bench_classifier(N, C, V, chunk, std::max(1, reps / 2));
  std::printf("\nEigen peak again (load drift check): %.1f GFLOP/s\n", eigen_gemm_peak_gflops(2048, reps));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return guarded_main(run, argc, argv); }
