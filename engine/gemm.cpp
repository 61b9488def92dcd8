// The GEMM's portable twin for the emulated CUDA backend (the cuBLASLt version is engine/gemm.cu):
// the emulated device memory is host memory, so the CPU's blocked Eigen GEMM (layers/gemm_blocks.h)
// runs on it directly. bf16 operands are widened to float first and D is rounded to TD once at the
// end, the order cuBLASLt follows (fp32 accumulation, one rounding of alpha·AB + beta·C + bias).
// Empty in the other builds.
#if ULYSSES_CUDA_EMULATED
#include "engine/cuda_launch.h"
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

// A float view of a (rows, width) matrix whose rows are `stride` elements apart, packed: the buffer
// itself for packed floats, else a widened or gathered copy.
template <class T>
const float* as_float(const T* p, size_t rows, size_t width, size_t stride, std::vector<float>& keep) {
  if (std::is_same<T, float>::value && stride == width) return reinterpret_cast<const float*>(p);
  keep.resize(rows * width);
  for (size_t r = 0; r < rows; r++)
    for (size_t i = 0; i < width; i++) keep[r * width + i] = widen(p[r * stride + i]);
  return keep.data();
}

}  // namespace

void gemm_prepare() {}  // no handle, no workspace: Eigen packs into its own buffers

template <class TA, class TD>
void gemm(TD* d, const TA* a, const TA* b, const TD* bias, int M, int N, int K, bool trans_a, bool trans_b,
          bool accumulate, const char* op, cudaStream_t s, GemmStrides ld_given) {
  const std::string what = std::string(op) + ": gemm (" + std::to_string(M) + ", " + std::to_string(K) + ") x (" +
                           std::to_string(K) + ", " + std::to_string(N) + ")";
  if (M < 0 || N < 0 || K < 0 || (M > 0 && N > 0 && (!d || (K > 0 && (!a || !b)))))
    throw std::runtime_error(what + " with a negative size or a null buffer");
  if (bias && accumulate)  // as the cuBLASLt version, which would round a bf16 D twice (engine/gemm.h)
    throw std::runtime_error(std::string(op) + ": gemm with a bias and accumulate (see engine/gemm.h)");
  const GemmStrides ld = gemm_strides(ld_given, M, N, K, trans_a, trans_b, bias != nullptr, what);
  if (M == 0 || N == 0) return;
  // After a kernel's fault every cuBLASLt call fails too (the device is in error for good).
  if (const cudaError_t e = ul_emu::device_fault()) throw std::runtime_error(what + ": " + cuda_error_text(e));
  gpu_profile::Span span;
  if (gpu_profile::enabled()) span.begin(gemm_profile_name(op, M, N, K), s, 2.0 * M * N * K);
  if (K == 0 && ld.d != N) throw std::runtime_error(what + ": an empty product into a strided D");
  if (K == 0) {  // no product: the kernel the cuBLASLt version launches (engine/gemm_bias.cu)
    gemm_bias_rows<TD>(d, bias, M, N, accumulate, s);
    return;
  }
  // Stream-ordered like the cuBLASLt call: queued when the stream runs late (engine/cuda_emu/runtime.h).
  ul_emu::on_stream(s, [=] {
    std::vector<float> a_keep, b_keep, d_keep;
    // Stored (rows, width) of A and B: (M, K) or (K, M); (K, N) or (N, K).
    const float* af = as_float(a, trans_a ? K : M, trans_a ? M : K, size_t(ld.a), a_keep);
    const float* bf = as_float(b, trans_b ? N : K, trans_b ? K : N, size_t(ld.b), b_keep);
    // The result in float: D's current value (accumulate) or zero, then + bias, + the product (K > 0 here).
    RowMat acc(M, N);
    if (accumulate)
      acc = MapCM(as_float(d, M, N, size_t(ld.d), d_keep), M, N);
    else
      acc.setZero();
    if (bias) {
      std::vector<float> bias_keep;
      const float* bias_f = as_float(bias, 1, size_t(N), size_t(N), bias_keep);
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
    for (size_t r = 0; r < size_t(M); r++)  // D's stride: the elements between its rows are left as they were
      for (size_t i = 0; i < size_t(N); i++) d[r * size_t(ld.d) + i] = narrow<TD>(src[r * size_t(N) + i]);
  });
}

UL_GEMM_INSTANTIATE_ALL()

}  // namespace cuda
}  // namespace ul
#endif  // ULYSSES_CUDA_EMULATED
