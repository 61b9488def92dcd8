// The emulated twins of the tensor-core MMA and ldmatrix (engine/mma.h) against the PTX layout
// (the cases, shared with the GPU test, are in mma_cases.h), and the emulator's report of a
// misaligned ldmatrix or bf16-pair access and of an mma that part of a warp misses.
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/mma_cases.h"
#include "stream_order.h"

namespace {

// A misaligned row address: ldmatrix faults on the GPU, the emulator reports it.
__global__ void ldmatrix_misaligned_kernel(float* out) {
  UL_DYNAMIC_SMEM(__nv_bfloat16, smem);
  uint32_t r[4];
  ul::cuda::ldmatrix_x4<false>(r, smem + 1 + (threadIdx.x % 8) * kLd);
  out[threadIdx.x] = float(r[0]);
}

// ldmatrix from global memory: a GPU faults (it reads shared memory only).
__global__ void ldmatrix_global_kernel(float* out, const __nv_bfloat16* in) {
  uint32_t r[4];
  ul::cuda::ldmatrix_x4<false>(r, in + (threadIdx.x % 8) * kLd);
  out[threadIdx.x] = float(r[0]);
}

// A bf16 pair loaded from in + offset and stored to out + offset (4-byte accesses).
__global__ void bf16x2_copy_kernel(__nv_bfloat16* out, const __nv_bfloat16* in, int offset) {
  const uint32_t v = ul::cuda::load_bf16x2(in + offset);
  __nv_bfloat16 pair[2];
  std::memcpy(pair, &v, 4);
  ul::cuda::store_bf16x2(out + offset, __bfloat162float(pair[0]), __bfloat162float(pair[1]));
}

// An mma with lanes gone: the first `stay` lanes of the warp run it (the rest have exited, or
// the block has only `stay` threads). Undefined on the GPU (.aligned): the emulator reports it.
__global__ void mma_partial_warp_kernel(float* out, int stay) {
  if (int(threadIdx.x) >= stay) return;
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  ul::cuda::mma_m16n8k16_bf16(c, a, b);
  out[threadIdx.x] = c[0];
}

}  // namespace

TEST_CASE("emulated mma.sync needs all 32 lanes of the warp, as the .aligned instruction does", "[emu][mma]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  float* d_out;
  UL_CUDA_CHECK(cudaMalloc(&d_out, 64 * 4));
  ul::launch("mma_whole_warp", mma_partial_warp_kernel, dim3(1), dim3(64), 0, nullptr, d_out, 64);
  // Lanes 16-31 exit first (or run first and exit) while lanes 0-15 wait in the mma.
  CHECK_THROWS_WITH(ul::launch("mma_exited", mma_partial_warp_kernel, dim3(1), dim3(32), 0, nullptr, d_out, 16),
                    Catch::Contains("mma.sync/ldmatrix") && Catch::Contains("32 lanes"));
  CHECK(ul_emu::device_fault() == cudaErrorLaunchFailure);  // a fault, sticky as a GPU's
  ul_emu::clear_device_fault();
  // A block whose last warp has 16 threads: its lanes 16-31 do not exist.
  CHECK_THROWS_WITH(ul::launch("mma_partial", mma_partial_warp_kernel, dim3(1), dim3(48), 0, nullptr, d_out, 48),
                    Catch::Contains("0xffff0000") && Catch::Contains("block of 48 threads"));
  ul_emu::clear_device_fault();
  cudaFree(d_out);
}

TEST_CASE("emulated bf16-pair accesses refuse an odd element offset, as a GPU faults on it", "[emu][mma]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  __nv_bfloat16 *in, *out;
  UL_CUDA_CHECK(cudaMalloc(&in, 8 * 2));
  UL_CUDA_CHECK(cudaMalloc(&out, 8 * 2));
  UL_CUDA_CHECK(cudaMemset(in, 0, 8 * 2));
  ul::launch("bf16x2_aligned", bf16x2_copy_kernel, dim3(1), dim3(1), 0, nullptr, out, in, 2);
  CHECK_THROWS_WITH(ul::launch("bf16x2_misaligned", bf16x2_copy_kernel, dim3(1), dim3(1), 0, nullptr, out, in, 1),
                    Catch::Contains("bf16x2_misaligned") && Catch::Contains("misaligned 4-byte"));
  ul_emu::clear_device_fault();  // the fault is sticky: the frees below would fail
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("emulated ldmatrix refuses a row address that is not 16-byte aligned", "[emu][mma]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  float* d_out;
  UL_CUDA_CHECK(cudaMalloc(&d_out, 32 * 4));
  CHECK_THROWS_WITH(ul::launch("ldmatrix_misaligned", ldmatrix_misaligned_kernel, dim3(1), dim3(32), 16 * kLd * 2,
                               nullptr, d_out),
                    Catch::Contains("not 16-byte aligned"));
  ul_emu::clear_device_fault();
  cudaFree(d_out);
}

TEST_CASE("emulated ldmatrix refuses a row address outside the block's shared memory", "[emu][mma]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  float* d_out;
  __nv_bfloat16* d_in;
  UL_CUDA_CHECK(cudaMalloc(&d_out, 32 * 4));
  UL_CUDA_CHECK(cudaMalloc(&d_in, 16 * kLd * 2));
  UL_CUDA_CHECK(cudaMemset(d_in, 0, 16 * kLd * 2));
  CHECK_THROWS_WITH(ul::launch("ldmatrix_global", ldmatrix_global_kernel, dim3(1), dim3(32), 0, nullptr, d_out, d_in),
                    Catch::Contains("outside this block's shared memory"));
  ul_emu::clear_device_fault();
  cudaFree(d_in);
  cudaFree(d_out);
}
