// The GEMM's portable twin for the emulated CUDA backend (the cuBLASLt version is engine/gemm.cu):
// the emulated device memory is host memory, so the CPU's blocked Eigen GEMM (layers/gemm_blocks.h)
// runs on it directly. bf16 operands are widened to float first and D is rounded to TD once at the
// end, the order cuBLASLt follows (fp32 accumulation, one rounding of alpha·AB + beta·C + bias).
// Empty in the other builds.
#if ULYSSES_CUDA_EMULATED
#include "engine/gemm.h"
#include "engine/gpu_profile.h"
#include "layers/gemm_blocks.h"

#include <Eigen/Core>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ul {
namespace cuda {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<RowMat>;
using MapCM = Eigen::Map<const RowMat>;

inline float widen(float v) { return v; }
inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> T narrow(float v);
template <> inline float narrow<float>(float v) { return v; }
template <> inline __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A float view of n elements: the buffer itself for float, a widened copy for bf16.
template <class T>
const float* as_float(const T* p, size_t n, std::vector<float>& keep) {
  if (std::is_same<T, float>::value) return reinterpret_cast<const float*>(p);
  keep.resize(n);
  for (size_t i = 0; i < n; i++) keep[i] = widen(p[i]);
  return keep.data();
}

}  // namespace

void gemm_prepare() {}  // no handle, no workspace: Eigen packs into its own buffers

template <class TA, class TD>
void gemm(TD* d, const TA* a, const TA* b, const TD* bias, int M, int N, int K, bool trans_a, bool trans_b,
          bool accumulate, const char* op, cudaStream_t s) {
  if (M < 0 || N < 0 || K < 0 || (M > 0 && N > 0 && (!d || (K > 0 && (!a || !b)))))
    throw std::runtime_error(std::string(op) + ": gemm (" + std::to_string(M) + ", " + std::to_string(K) + ") x (" +
                             std::to_string(K) + ", " + std::to_string(N) + ") with a negative size or a null buffer");
  if (bias && accumulate)  // as the cuBLASLt version, which would round a bf16 D twice (engine/gemm.h)
    throw std::runtime_error(std::string(op) + ": gemm with a bias and accumulate (see engine/gemm.h)");
  if (M == 0 || N == 0) return;
  gpu_profile::Span span;
  if (gpu_profile::enabled()) span.begin(gemm_profile_name(op, M, N, K), s, 2.0 * M * N * K);
  if (K == 0) {  // no product: the kernel the cuBLASLt version launches (engine/gemm_bias.cu)
    gemm_bias_rows<TD>(d, bias, M, N, accumulate, s);
    return;
  }
  std::vector<float> a_keep, b_keep, d_keep;
  const float* af = as_float(a, size_t(M) * K, a_keep);
  const float* bf = as_float(b, size_t(K) * N, b_keep);
  // The result in float: D's current value (accumulate) or zero, then + bias, + the product (K > 0 here).
  RowMat acc(M, N);
  if (accumulate)
    acc = MapCM(as_float(d, size_t(M) * N, d_keep), M, N);
  else
    acc.setZero();
  if (bias) {
    std::vector<float> bias_keep;
    const float* bias_f = as_float(bias, size_t(N), bias_keep);
    acc.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias_f, N);
  }
  // Stored shapes, then the op: A is (M, K) or (K, M)^T; B is (K, N) or (N, K)^T.
  MapCM A(af, trans_a ? K : M, trans_a ? M : K), B(bf, trans_b ? N : K, trans_b ? K : N);
  MapM D(acc.data(), M, N);  // blocks fixed by the shape: the same bits at any thread count
  if (!trans_a && !trans_b) cpu::gemm_add(D, A, B);
  else if (!trans_a) cpu::gemm_add(D, A, B.transpose());
  else if (!trans_b) cpu::gemm_add(D, A.transpose(), B);
  else cpu::gemm_add(D, A.transpose(), B.transpose());
  const float* src = acc.data();
  for (size_t i = 0, n = size_t(M) * N; i < n; i++) d[i] = narrow<TD>(src[i]);
}

UL_GEMM_INSTANTIATE_ALL()

}  // namespace cuda
}  // namespace ul
#endif  // ULYSSES_CUDA_EMULATED
