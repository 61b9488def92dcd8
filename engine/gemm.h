// The one matrix multiply of the CUDA backend, over row-major buffers in device memory:
//   D (M, N) = op(A) (M, K) · op(B) (K, N)   [+ D, when accumulate]   [+ bias (N) on every row]
// (not both: a bias cuBLASLt's epilogue cannot take is added to D first, which would round a bf16 D
// twice; the layers add a bias only in a forward, which writes D, so the pair is refused.)
// A is stored (M, K), or (K, M) when trans_a; B is stored (K, N), or (N, K) when trans_b.
// What the layers ask of it (linear, classifier; x: (N, C), w: (OC, C), y: (N, OC)):
//   forward      y  = x w^T + b     gemm(y, x, w, b, N, OC, C, false, true, false)
//   input grad   dx += dy w         gemm(dx, dy, w, null, N, C, OC, false, false, true)
//   weight grad  dw += dy^T x       gemm(dw, dy, x, null, OC, C, N, true, false, true)  (dw: fp32)
// Types: TA (A and B) is float or __nv_bfloat16; TD (D and the bias) is TA, or float for bf16
// inputs (fp32 parameter gradients, fp32 logits). Products are summed in fp32, and D is rounded to
// TD once, after the bias and the previous D are added. fp32 inputs use plain fp32 (no TF32), so
// the f32 backend matches the CPU to fp32 rounding.
//
// Under ULYSSES_CUDA: cuBLASLt (engine/gemm.cu), one handle and one 32 MiB workspace per device
// and host thread, created on first use; the bias is cuBLASLt's BIAS epilogue (or gemm_bias_rows
// before the product, for a problem whose epilogue cuBLASLt refuses, at its heuristic or its call). Under
// ULYSSES_CUDA_EMULATION: the portable twin (engine/gemm.cpp), the CPU's blocked Eigen GEMM on the
// (host-memory) device buffers. Both throw std::runtime_error naming `op` and the shapes on any failure.
// Under --profile (engine/gpu_profile.h) each call is one row named by gemm_profile_name, with its
// 2 M N K FLOPs, so the report gives each GEMM shape's rate.
#pragma once
#if ULYSSES_HAVE_CUDA
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/cuda_runtime.h"

namespace ul {
namespace cuda {

// "linear forward M=8192 N=2304 K=768"
inline std::string gemm_profile_name(const char* op, int M, int N, int K) {
  return std::string(op) + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// Creates the calling thread's cuBLASLt handle and 32 MiB workspace now rather than at the first
// GEMM: the trainer does it before it reserves its arena, so that a run too large for the device
// fails at start-up, not at its first forward. Nothing under emulation.
void gemm_prepare();

// D (M, N) = (accumulate ? D : 0) + bias (N) on every row (bias may be null), rounded to TD once:
// a GEMM's result when its product is empty (K = 0), and cuBLASLt's fallback before the product
// when its bias epilogue is refused. TD: float or __nv_bfloat16. (engine/gemm_bias.cu)
template <class TD>
void gemm_bias_rows(TD* d, const TD* bias, int M, int N, bool accumulate, cudaStream_t s);

// Row strides, in elements, of the stored matrices; 0 for packed rows (the width stored). The
// classifier's logits are (R, V) inside rows of round_up(V, 64): GPT-2's V = 50257 packed would
// leave every row but the first off the 16-byte alignment cuBLASLt's fast kernels need.
struct GemmStrides {
  int64_t a = 0, b = 0, d = 0;
};

template <class TA, class TD>
void gemm(TD* d, const TA* a, const TA* b, const TD* bias, int M, int N, int K, bool trans_a, bool trans_b,
          bool accumulate, const char* op, cudaStream_t s, GemmStrides ld = {});

// The (TA, TD) pairs gemm exists for; the cuBLASLt and the emulated implementation each instantiate
// every one with UL_GEMM_INSTANTIATE_ALL().
#define UL_GEMM_INSTANTIATE(TA, TD)                                                                       \
  template void gemm<TA, TD>(TD*, const TA*, const TA*, const TD*, int, int, int, bool, bool, bool, const char*, \
                             cudaStream_t, GemmStrides);
#define UL_GEMM_INSTANTIATE_ALL()                 \
  UL_GEMM_INSTANTIATE(float, float)               \
  UL_GEMM_INSTANTIATE(__nv_bfloat16, __nv_bfloat16) \
  UL_GEMM_INSTANTIATE(__nv_bfloat16, float)

// The row strides gemm uses: each given one, checked against the stored width (at least it), or
// the width itself; throws naming `what`. A strided D takes no bias (none is needed).
inline GemmStrides gemm_strides(GemmStrides ld, int M, int N, int K, bool trans_a, bool trans_b, bool bias,
                                const std::string& what) {
  const int64_t wa = trans_a ? M : K, wb = trans_b ? K : N;  // the stored rows' widths
  auto pick = [&](int64_t given, int64_t width, const char* name) {
    if (given == 0) return width;
    if (given < width)
      throw std::runtime_error(what + ": the row stride of " + name + " (" + std::to_string(given) +
                               ") is shorter than its rows (" + std::to_string(width) + ")");
    return given;
  };
  GemmStrides r{pick(ld.a, wa, "A"), pick(ld.b, wb, "B"), pick(ld.d, N, "D")};
  if (bias && r.d != N) throw std::runtime_error(what + ": a bias with a strided D");
  return r;
}

}  // namespace cuda
}  // namespace ul
#endif
