// The emulated twins of the tensor-core MMA and ldmatrix (engine/mma.h) against the PTX layout
// (the cases, shared with the GPU test, are in mma_cases.h), and the emulator's report of a
// misaligned ldmatrix.
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/mma_cases.h"

namespace {

// A misaligned row address: ldmatrix faults on the GPU, the emulator reports it.
__global__ void ldmatrix_misaligned_kernel(float* out) {
  UL_DYNAMIC_SMEM(__nv_bfloat16, smem);
  uint32_t r[4];
  ul::cuda::ldmatrix_x4<false>(r, smem + 1 + (threadIdx.x % 8) * kLd);
  out[threadIdx.x] = float(r[0]);
}

}  // namespace

TEST_CASE("emulated ldmatrix refuses a row address that is not 16-byte aligned", "[emu][mma]") {
  float* d_out;
  UL_CUDA_CHECK(cudaMalloc(&d_out, 32 * 4));
  CHECK_THROWS_WITH(ul::launch("ldmatrix_misaligned", ldmatrix_misaligned_kernel, dim3(1), dim3(32), 16 * kLd * 2,
                               nullptr, d_out),
                    Catch::Contains("not 16-byte aligned"));
  cudaFree(d_out);
}
