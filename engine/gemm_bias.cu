// The GEMM's one hand-written kernel (engine/gemm.h: gemm_bias_rows), compiled in both CUDA builds
// so that the emulated one runs it too: the cuBLASLt GEMM calls it when the product is empty or
// its bias epilogue is refused, the emulated twin when the product is empty.
#include <algorithm>

#include "engine/cuda_launch.h"
#include "engine/gemm.h"

namespace ul {
namespace cuda {
namespace {

// d: (M, N), bias: (N) or null. Grid-stride over the M N elements.
template <class TD>
__global__ void bias_rows_kernel(TD* __restrict__ d, const TD* __restrict__ bias, int M, int N, bool accumulate) {
  const size_t total = size_t(M) * N;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const float base = accumulate ? to_float(d[i]) : 0.f;
    d[i] = from_float<TD>(base + (bias ? to_float(bias[i % N]) : 0.f));
  }
}

}  // namespace

template <class TD>
void gemm_bias_rows(TD* d, const TD* bias, int M, int N, bool accumulate, cudaStream_t s) {
  if (M == 0 || N == 0) return;  // a grid of no blocks is an invalid launch
  const unsigned blocks = capped_blocks((long long)M * N, 256, 4096);
  launch("gemm_bias_rows", bias_rows_kernel<TD>, dim3(blocks), dim3(256), 0, s, d, bias, M, N, accumulate);
}

template void gemm_bias_rows<float>(float*, const float*, int, int, bool, cudaStream_t);
template void gemm_bias_rows<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int, int, bool, cudaStream_t);

}  // namespace cuda
}  // namespace ul
