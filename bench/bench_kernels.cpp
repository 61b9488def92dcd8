// The memory-bound CUDA kernels against the copy bandwidth measured in the same run. For each: the
// fewest bytes it must move (each input read once, each output written once), its best time over
// --reps launches (CUDA events, each behind an untimed launch), the GB/s that makes, and the ratio to a
// device-to-device cudaMemcpy's GB/s (bytes read + written). A ratio well under 1 is a kernel
// moving more bytes than it must (re-reads, narrow or uncoalesced accesses) or with too little in
// flight. Defaults: GPT-2 124M at B = 32, T = 1024 in bf16. Last, the classifier's GEMMs at 1, 2
// and 4 times the chunk's rows (TFLOP/s), which is what a larger chunk would buy.
//   ./build-cuda/bench_kernels --help   prints the flags and their defaults (the usage string below is the one list)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#if ULYSSES_HAVE_CUDA
#include "bench/bench_args.h"
#include "bench/guarded_main.h"
#include "engine/context.h"
#include "engine/cuda_launch.h"
#include "engine/gemm.h"
#include "engine/optimizer.h"
#include "engine/options.h"
#include "layers/classifier.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/residual.h"
#include "layers/scratch_sizes.h"
#include "layers/transformer.h"
#include "parallel/ulysses.h"

namespace {

using bf16 = __nv_bfloat16;

template <class T> T from_float(float v) { return T(v); }
template <> bf16 from_float<bf16>(float v) { return __float2bfloat16(v); }

// A device buffer of n elements of T, filled with small pseudo-random values (never zeros: they
// can hide wrong indexing and run faster than real data).
template <class T>
struct Buf {
  T* p = nullptr;
  explicit Buf(size_t n) {
    UL_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    std::vector<T> h(n);
    uint64_t z = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      const float v = float(int((z >> 40) % 2001) - 1000) / 1000.f;  // [-1, 1]
      h[i] = from_float<T>(v);
    }
    UL_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { cudaFree(p); }
};

// Best ms of `reps` timed runs of f, each queued behind an untimed one: the GPU is still running
// that one when the host records a and launches f, so the launch's host latency (microseconds, a
// few percent of the shortest kernels here) falls outside a to b.
double best_ms(int reps, const std::function<void()>& f) {
  cudaEvent_t a, b;
  UL_CUDA_CHECK(cudaEventCreate(&a));
  UL_CUDA_CHECK(cudaEventCreate(&b));
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    f();
    UL_CUDA_CHECK(cudaEventRecord(a, nullptr));
    f();
    UL_CUDA_CHECK(cudaEventRecord(b, nullptr));
    UL_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    UL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, double(ms));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

int run(int argc, char** argv) {
  BenchArgs args(argc, argv,
                 "usage: bench_kernels [--rows 32768] [--dim 768] [--vocab 50257] [--chunk-rows 1280]\n"
                 "                     [--params 124475904] [--reps 20]");
  const int N = args.positive("--rows", 32768), C = args.positive("--dim", 768);
  const int V = args.positive("--vocab", 50257), R = args.positive("--chunk-rows", 1280);
  const size_t P = size_t(args.integer("--params", 124475904, 1));
  const int reps = args.positive("--reps", 20);
  args.done();
  ul::init_cuda_backend();
  const size_t NC = size_t(N) * C, F = 4 * NC;  // F: the MLP's hidden activations (N, 4C)
  std::printf("kernels at rows %d, dim %d, vocab %d (chunks of %d rows), %zu parameters; best of %d\n", N, C, V, R, P,
              reps);

  // The baseline: a device-to-device copy of the largest operand's size, counted read + write.
  const size_t copy_bytes = std::max<size_t>({F * 2, size_t(R) * V * 4, P * 4});
  double copy_gbs;
  {
    Buf<char> src(copy_bytes), dst(copy_bytes);
    const double ms =
        best_ms(reps, [&] { UL_CUDA_CHECK(cudaMemcpy(dst.p, src.p, copy_bytes, cudaMemcpyDeviceToDevice)); });
    copy_gbs = 2.0 * copy_bytes / (ms * 1e-3) / 1e9;
    std::printf("%-34s %10.1f MB %9.3f ms %8.1f GB/s\n", "cudaMemcpy device to device", 2.0 * copy_bytes / 1e6, ms,
                copy_gbs);
  }
  std::printf("%-34s %13s %12s %13s %s\n", "kernel (bf16 unless said)", "bytes", "best", "rate", "vs copy");
  auto report = [&](const char* name, double bytes, double ms) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-34s %10.1f MB %9.3f ms %8.1f GB/s %7.2f\n", name, bytes / 1e6, ms, gbs, gbs / copy_gbs);
  };

  {  // LayerNorm over (N, C): forward reads x, writes y and the row stats; backward reads dy, x
     // and dx and writes dx (its dw/db column sums re-read dy and x: they count against it)
    Buf<bf16> x(NC), y(NC), dy(NC), dx(NC), w(C), b(C);
    Buf<float> mean(N), rstd(N), dw(C), db(C), scratch(ul::cuda::layernorm_backward_scratch_bytes(N, C) / 4);
    report("layernorm_forward", 4.0 * NC + 8.0 * N,
           best_ms(reps, [&] { ul::cuda::layernorm_forward(y.p, mean.p, rstd.p, x.p, w.p, b.p, N, C, nullptr); }));
    report("layernorm_backward (dx, dw, db)", 8.0 * NC + 8.0 * N, best_ms(reps, [&] {
             ul::cuda::layernorm_backward(dx.p, dw.p, db.p, dy.p, x.p, w.p, mean.p, rstd.p, scratch.p, N, C, nullptr);
           }));
  }
  {  // GELU over the MLP's (N, 4C); the residual add over (N, C)
    Buf<bf16> u(F), g(F), du(F), dg(F);
    report("gelu_forward (N, 4C)", 4.0 * F, best_ms(reps, [&] { ul::cuda::gelu_forward(g.p, u.p, int64_t(F), nullptr); }));
    // As the model runs it: the gradient's first writer stores dx without reading it (the
    // accumulating variant, 8 bytes an element, runs only where dx already holds a gradient).
    report("gelu_backward (N, 4C), stores dx", 6.0 * F, best_ms(reps, [&] {
             ul::cuda::gelu_backward(du.p, dg.p, u.p, int64_t(F), nullptr, /*accumulate=*/false);
           }));
    report("residual_forward", 6.0 * NC,
           best_ms(reps, [&] { ul::cuda::residual_forward(g.p, u.p, du.p, int64_t(NC), nullptr); }));
  }
  {  // the fc layer's bias gradient: column sums of dy (N, 4C)
    Buf<bf16> dy(F);
    Buf<float> db(4 * size_t(C)), scratch(ul::cuda::linear_backward_scratch_bytes(N, 4 * C) / 4);
    report("linear bias grad (N, 4C)", 2.0 * F,
           best_ms(reps, [&] { ul::cuda::column_sums_add(db.p, dy.p, scratch.p, N, 4 * C, nullptr); }));
  }
  {  // one classifier chunk's softmax + cross-entropy: reads fp32 logits, writes bf16 dlogits, in
     // rows of L = round_up(V, 64) as the classifier lays them out (16-byte aligned rows)
    const int L = int(ul::scratch::classifier_row_stride(V));
    Buf<float> logits(size_t(R) * L), loss(R);
    Buf<bf16> dlogits(size_t(R) * L);
    Buf<int32_t> hit(R);
    std::vector<int32_t> t(R);
    for (int r = 0; r < R; r++) t[r] = int32_t((r * 7919) % V);
    Buf<int32_t> targets(R);
    UL_CUDA_CHECK(cudaMemcpy(targets.p, t.data(), R * sizeof(int32_t), cudaMemcpyHostToDevice));
    auto softmax = [&] {
      ul::cuda::softmax_cross_entropy<bf16>(dlogits.p, loss.p, hit.p, logits.p, targets.p, R, V, 1e-5f, nullptr, L);
    };
    // As the classifier runs it (the row staged in shared memory where a block can hold it), then,
    // where it was staged, with the row read twice from global memory (the baseline: "(2 reads)"),
    // so that the ratio of the two is what staging buys.
    const bool staged = ul::cuda::softmax_row_staged(V);
    report(staged ? "softmax_cross_entropy (smem row)" : "softmax_cross_entropy (not staged)", 6.0 * R * V,
           best_ms(reps, softmax));
    if (staged) {
      const int old = ul::cuda::set_softmax_row_staging(1);
      report("softmax_cross_entropy (2 reads)", 6.0 * R * V, best_ms(reps, softmax));
      ul::cuda::set_softmax_row_staging(old);
    }
  }
  {  // the Ulysses scatter's pack at sp 4: (B = 1, N tokens, 3 x 12 heads, D = C / 12)
    const int D = C % 12 == 0 ? C / 12 : 64;
    const ul::HeadSplit hs{12, 12, 4};
    const size_t n = size_t(N) * 3 * 12 * D;
    Buf<bf16> src(n), send(n);
    report("ulysses heads_to_chunks (sp 4)", 4.0 * n,
           best_ms(reps, [&] { ul::cuda::heads_to_chunks(send.p, src.p, hs, 1, N, D, nullptr); }));
  }
  {  // AdamW on every parameter (bf16 weights, f32 master, grad, m, v), and the gradient norm
    Buf<bf16> params(P);
    Buf<float> master(P), grad(P), m(P), v(P);
    Buf<double> out(1), scratch(ul::cuda::sum_squares_scratch_bytes(P) / sizeof(double));
    report("adamw_update (all parameters)", 30.0 * P, best_ms(reps, [&] {
             ul::cuda::adamw_update(params.p, master.p, grad.p, m.p, v.p, P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.f, 1,
                                    1, nullptr);
           }));
    // The same update one element a thread, as it runs where the arrays are off their 4-element
    // boundary (a ZeRO shard's start): every array one element in.
    report("adamw_update (4-byte loads)", 30.0 * (P - 1), best_ms(reps, [&] {
             ul::cuda::adamw_update(params.p + 1, master.p + 1, grad.p + 1, m.p + 1, v.p + 1, P - 1, 1e-4f, 0.9f,
                                    0.95f, 1e-8f, 0.1f, 1.f, 1, 1, nullptr);
           }));
    report("sum_squares (grad norm, f64 sums)", 4.0 * P,
           best_ms(reps, [&] { ul::cuda::sum_squares(out.p, grad.p, P, scratch.p, nullptr); }));
  }
  {  // AdamW as the training step runs it: AdamW::step on GPT-2 124M's bf16 parameters, which
     // passes the model's decay segments (weights decay, biases and norms not) to the same kernel
     // (the rows above pass none: every element decays). The gradient is non-zero, so the weights
     // are too from the untimed first step on (no init: 124M host draws for nothing).
    ul::Options o;
    o.model = "gpt2-124M";
    ul::Context c(ul::Device::cuda);
    ul::ContextGuard guard(c);
    ul::Transformer model(ul::model_config(o, V), ul::DType::bf16);
    ul::AdamW opt(model.params, ul::AdamWConfig{});
    const size_t Pm = model.params.numel();
    {
      Buf<float> g(Pm);
      UL_CUDA_CHECK(cudaMemcpy(model.params.grad(), g.p, Pm * sizeof(float), cudaMemcpyDeviceToDevice));
    }
    report("AdamW::step (gpt2-124M segments)", 30.0 * Pm, best_ms(reps, [&] { opt.step(1e-4f, 1.f); }));
  }

  // The classifier's three GEMMs per chunk at 1, 2 and 4 times the chunk's rows: the weight
  // gradient (V, C) += dlogits^T x reads and writes its fp32 (V, C) output once per chunk, so
  // fewer, larger chunks trade scratch memory for that traffic. Compute-bound: TFLOP/s, no ratio.
  std::printf("%-34s %9s %9s %9s  (TFLOP/s; classifier GEMMs by chunk rows)\n", "chunk rows", "logits", "dx", "dw");
  // The logits and their gradient in rows of L = V rounded up to 64 elements, as the classifier
  // lays them (layers/classifier.cu): packed rows of V = 50257 leave every row but the first off
  // the 16-byte alignment cuBLASLt's fast kernels need.
  const int64_t L = ul::scratch::classifier_row_stride(V);
  for (int mult : {1, 2, 4}) {
    const int Rc = std::min(N, R * mult);
    Buf<bf16> x(size_t(Rc) * C), w(size_t(V) * C), dl(size_t(Rc) * L), dx(size_t(Rc) * C);
    Buf<float> logits(size_t(Rc) * L), dw(size_t(V) * C);
    const double flops = 2.0 * Rc * V * C;
    const double t_logits = best_ms(reps, [&] {
      ul::cuda::gemm<bf16, float>(logits.p, x.p, w.p, nullptr, Rc, V, C, false, true, false, "logits", nullptr,
                                  {0, 0, L});
    });
    const double t_dx = best_ms(reps, [&] {
      ul::cuda::gemm<bf16, bf16>(dx.p, dl.p, w.p, nullptr, Rc, C, V, false, false, true, "dx", nullptr, {L, 0, 0});
    });
    const double t_dw = best_ms(reps, [&] {
      ul::cuda::gemm<bf16, float>(dw.p, dl.p, x.p, nullptr, V, C, Rc, true, false, true, "dw", nullptr, {L, 0, 0});
    });
    std::printf("%-34d %9.1f %9.1f %9.1f\n", Rc, flops / (t_logits * 1e-3) / 1e12, flops / (t_dx * 1e-3) / 1e12,
                flops / (t_dw * 1e-3) / 1e12);
    if (Rc == N) break;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return guarded_main(run, argc, argv); }

#else  // a build without the CUDA backend

int main() {
  std::fprintf(stderr, "bench_kernels times CUDA kernels: configure with -DULYSSES_CUDA=ON (or the emulation)\n");
  return 2;
}

#endif
