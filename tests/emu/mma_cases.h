// The tensor-core MMA and the ldmatrix loaders (engine/mma.h) against the PTX ISA's fragment layout
// for mma.m16n8k16.row.col.f32.bf16.bf16.f32, written here element by element from the ISA's
// formulas (not from the wrapper's register view), so the two readings of the layout check each
// other:
//   groupID = lane >> 2, threadID_in_group = lane % 4
//   A  a_i (i = 0..7): row = groupID for i in {0, 1, 4, 5}, else groupID + 8;
//                      col = 2 threadID_in_group + (i & 1), plus 8 for i >= 4
//   B  b_i (i = 0..3): row = 2 threadID_in_group + (i & 1), plus 8 for i >= 2; col = groupID
//   C  c_i (i = 0..3): row = groupID for i < 2, else groupID + 8; col = 2 threadID_in_group + (i & 1)
// Element i of a fragment sits in register i / 2, half i % 2 (low half first).
// Shared by the emulated test (tests/emu/test_mma.cpp: the emulated twins) and the GPU test
// (tests/gpu/test_mma_gpu.cpp, compiled by nvcc: the real instructions).
#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including mma_cases.h"
#endif
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cuda_launch.h"
#include "engine/mma.h"
#include "gradcheck.h"

namespace {

constexpr int kWarpsPerBlock = 3;  // several warps of one block each do their own product

// Lane l of warp w: c = C + A B from the fragments it is handed (a: 4 words, b: 2, c: 4 floats).
__global__ void mma_fragments_kernel(float* c_out, const uint32_t* a, const uint32_t* b, const float* c_in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t af[4], bf[2];
  float cf[4];
  for (int k = 0; k < 4; k++) af[k] = a[i * 4 + k], cf[k] = c_in[i * 4 + k];
  for (int k = 0; k < 2; k++) bf[k] = b[i * 2 + k];
  ul::cuda::mma_m16n8k16_bf16(cf, af, bf);
  for (int k = 0; k < 4; k++) c_out[i * 4 + k] = cf[k];
}

// The ldmatrix loaders: warp w stages its A (16x16, row-major), B^T (16x16: B stored transposed)
// and B (16x16, row-major), each with rows kLd apart, in shared memory, and computes A B (16x16,
// two 8-column blocks) twice, once with B through each loader. c: (warp, lane, block, 4).
constexpr int kLd = 24;  // 48 bytes: rows stay 16-byte aligned, as ldmatrix needs
constexpr int kTileElems = 16 * kLd;
__global__ void mma_loaders_kernel(float* c_col, float* c_row, const __nv_bfloat16* A, const __nv_bfloat16* Bt,
                                   const __nv_bfloat16* B) {
  UL_DYNAMIC_SMEM(__nv_bfloat16, smem);  // per warp: A, Bt, B
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  __nv_bfloat16* s = smem + w * 3 * kTileElems;
  for (int i = lane; i < kTileElems; i += 32) {
    s[i] = A[w * kTileElems + i];
    s[kTileElems + i] = Bt[w * kTileElems + i];
    s[2 * kTileElems + i] = B[w * kTileElems + i];
  }
  __syncthreads();
  uint32_t af[4], b1[4], b2[4];
  ul::cuda::ldsm_a(af, s, kLd);
  ul::cuda::ldsm_b_col_x2(b1, s + kTileElems, kLd);
  ul::cuda::ldsm_b_row_x2(b2, s + 2 * kTileElems, kLd);
  for (int half = 0; half < 2; half++) {
    float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
    ul::cuda::mma_m16n8k16_bf16(c1, af, b1 + 2 * half);
    ul::cuda::mma_m16n8k16_bf16(c2, af, b2 + 2 * half);
    for (int k = 0; k < 4; k++) {
      c_col[((w * 32 + lane) * 2 + half) * 4 + k] = c1[k];
      c_row[((w * 32 + lane) * 2 + half) * 4 + k] = c2[k];
    }
  }
}

uint16_t bits(float v) {
  const __nv_bfloat16 h = __float2bfloat16(v);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

int a_row(int lane, int i) { return (lane >> 2) + ((i < 2 || (i >= 4 && i < 6)) ? 0 : 8); }
int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
int b_col(int lane, int) { return lane >> 2; }
int c_row(int lane, int i) { return (lane >> 2) + (i < 2 ? 0 : 8); }
int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

// Reference: C + A B in double from the bf16 values, and sum |A| |B| for the rounding bound.
// An m16n8k16 output is 16 exact bf16 products (8-bit significands: exact in fp32) and C, summed in
// fp32: 17 additions, each off by at most one ulp of a partial sum no larger than the terms' |sum|
// (tensor cores may truncate rather than round: one ulp, not half), so 17 x 2^-23 of it.
constexpr double kAccumTol = 17 * 0x1p-23;

struct Ref {
  double v, mag;
};
// A: 16x16, B: 16 x `cols`.
Ref product(const std::vector<float>& A, const std::vector<float>& B, float c, int r, int n, int cols = 8) {
  double v = c, mag = std::fabs(c);
  for (int k = 0; k < 16; k++) {
    v += double(A[r * 16 + k]) * B[k * cols + n];
    mag += std::fabs(double(A[r * 16 + k]) * B[k * cols + n]);
  }
  return {v, mag};
}

}  // namespace

TEST_CASE("mma.m16n8k16 bf16 follows the PTX fragment layout", UL_CUDA_TEST_TAG "[mma]") {
  const int lanes = 32 * kWarpsPerBlock * 2;  // two blocks
  std::vector<std::vector<float>> A(lanes / 32), B(lanes / 32), C(lanes / 32);
  std::vector<uint32_t> a(lanes * 4, 0), b(lanes * 2, 0);
  std::vector<float> c(lanes * 4);
  for (int w = 0; w < lanes / 32; w++) {
    A[w] = ul_test::randn_f(16 * 16, 10 + w);
    B[w] = ul_test::randn_f(16 * 8, 20 + w);
    C[w] = ul_test::randn_f(16 * 8, 30 + w);
    for (float& x : A[w]) x = bf(x);
    for (float& x : B[w]) x = bf(x);
    for (int l = 0; l < 32; l++) {
      const int L = w * 32 + l;
      for (int i = 0; i < 8; i++)
        a[L * 4 + i / 2] |= uint32_t(bits(A[w][a_row(l, i) * 16 + a_col(l, i)])) << (16 * (i % 2));
      for (int i = 0; i < 4; i++)
        b[L * 2 + i / 2] |= uint32_t(bits(B[w][b_row(l, i) * 8 + b_col(l, i)])) << (16 * (i % 2));
      for (int i = 0; i < 4; i++) c[L * 4 + i] = C[w][c_row(l, i) * 8 + c_col(l, i)];
    }
  }
  float *d_out, *d_c;
  uint32_t *d_a, *d_b;
  UL_CUDA_CHECK(cudaMalloc(&d_out, c.size() * 4));
  UL_CUDA_CHECK(cudaMalloc(&d_c, c.size() * 4));
  UL_CUDA_CHECK(cudaMalloc(&d_a, a.size() * 4));
  UL_CUDA_CHECK(cudaMalloc(&d_b, b.size() * 4));
  UL_CUDA_CHECK(cudaMemcpy(d_c, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
  UL_CUDA_CHECK(cudaMemcpy(d_a, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  UL_CUDA_CHECK(cudaMemcpy(d_b, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  ul::launch("mma_fragments", mma_fragments_kernel, dim3(2), dim3(32 * kWarpsPerBlock), 0, nullptr, d_out, d_a, d_b,
             d_c);
  std::vector<float> out(c.size());
  UL_CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int w = 0; w < lanes / 32; w++)
    for (int l = 0; l < 32; l++)
      for (int i = 0; i < 4; i++) {
        const Ref r = product(A[w], B[w], C[w][c_row(l, i) * 8 + c_col(l, i)], c_row(l, i), c_col(l, i));
        const double got = out[(w * 32 + l) * 4 + i];
        if (!(std::fabs(got - r.v) <= kAccumTol * r.mag)) {
          if (bad++ < 5) INFO("warp " << w << " lane " << l << " c" << i << ": got " << got << ", want " << r.v);
          CHECK(std::fabs(got - r.v) <= kAccumTol * r.mag);
        }
      }
  CHECK(bad == 0);
  cudaFree(d_out);
  cudaFree(d_c);
  cudaFree(d_a);
  cudaFree(d_b);
}

TEST_CASE("ldmatrix fragment loaders read shared tiles in the PTX layout", UL_CUDA_TEST_TAG "[mma]") {
  const int W = 2;  // warps, each with its own tiles
  // Row padding stays NaN: a loader that reads it makes a NaN product, which fails the check.
  std::vector<float> A(W * kTileElems, NAN), Bt(W * kTileElems, NAN), Bm(W * kTileElems, NAN);
  std::vector<std::vector<float>> As(W), Bs(W);  // A (16x16), B (16 k x 16 n)
  for (int w = 0; w < W; w++) {
    As[w] = ul_test::randn_f(16 * 16, 40 + w);
    Bs[w] = ul_test::randn_f(16 * 16, 50 + w);
    for (float& x : As[w]) x = bf(x);
    for (float& x : Bs[w]) x = bf(x);
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 16; k++) A[w * kTileElems + r * kLd + k] = As[w][r * 16 + k];
    for (int k = 0; k < 16; k++)
      for (int n = 0; n < 16; n++) {
        Bt[w * kTileElems + n * kLd + k] = Bs[w][k * 16 + n];
        Bm[w * kTileElems + k * kLd + n] = Bs[w][k * 16 + n];
      }
  }
  auto to_device = [](const std::vector<float>& v) {
    std::vector<__nv_bfloat16> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = __float2bfloat16(v[i]);
    __nv_bfloat16* p;
    UL_CUDA_CHECK(cudaMalloc(&p, h.size() * 2));
    UL_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return p;
  };
  __nv_bfloat16 *d_A = to_device(A), *d_Bt = to_device(Bt), *d_B = to_device(Bm);
  const size_t nc = W * 32 * 2 * 4;
  float *d_c1, *d_c2;
  UL_CUDA_CHECK(cudaMalloc(&d_c1, nc * 4));
  UL_CUDA_CHECK(cudaMalloc(&d_c2, nc * 4));
  ul::launch("mma_loaders", mma_loaders_kernel, dim3(1), dim3(32 * W), W * 3 * kTileElems * 2, nullptr, d_c1, d_c2,
             d_A, d_Bt, d_B);
  std::vector<float> c1(nc), c2(nc);
  UL_CUDA_CHECK(cudaMemcpy(c1.data(), d_c1, nc * 4, cudaMemcpyDeviceToHost));
  UL_CUDA_CHECK(cudaMemcpy(c2.data(), d_c2, nc * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int w = 0; w < W; w++)
    for (int l = 0; l < 32; l++)
      for (int half = 0; half < 2; half++)
        for (int i = 0; i < 4; i++) {
          const Ref r = product(As[w], Bs[w], 0.f, c_row(l, i), 8 * half + c_col(l, i), 16);
          for (const std::vector<float>* c : {&c1, &c2}) {
            const double got = (*c)[((w * 32 + l) * 2 + half) * 4 + i];
            if (!(std::fabs(got - r.v) <= kAccumTol * r.mag)) bad++;  // NaN (a padding element read) fails too
          }
        }
  CHECK(bad == 0);
  for (void* p : {(void*)d_A, (void*)d_Bt, (void*)d_B, (void*)d_c1, (void*)d_c2}) cudaFree(p);
}

