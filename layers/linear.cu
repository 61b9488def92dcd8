// The linear layer on CUDA (the math is in linear.h; the CPU code it must match is linear.cpp).
// T is float or __nv_bfloat16; dw and db are fp32 (parameter gradients).
//
// forward      one GEMM, y = x w^T, with the bias added in the GEMM's epilogue.
// backward dx  one GEMM, dx += dy w (accumulating in place: beta = 1).
// backward dw  one GEMM, dw += dy^T x, fp32 output from T inputs.
// backward db  column sums of dy, without atomics so that they are deterministic:
//              (1) a 2-D grid of (32 columns) x (a chunk of rows) blocks writes each chunk's sums
//                  to scratch, in a fixed order;
//              (2) one thread per column adds the chunks' sums, in chunk order, into db.
#include "engine/cuda_launch.h"
#include "engine/gemm.h"
#include "layers/scratch_sizes.h"
#include "layers/linear.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kColTile = 32;       // columns per block of the partial-sum kernel
constexpr int kRowLanes = 8;       // row strands per column in that kernel (block 32 x 8)

// Block (32, 8), grid (ceil(OC / 32), chunks). partial: (chunks, OC).
// Thread (tx, ty) sums rows ty, ty + 8, ... of its chunk for column c; the block adds the 8 strands in order.
template <class T>
__global__ void column_sums_partial_kernel(float* __restrict__ partial, const T* __restrict__ dy, int N, int OC,
                                           int chunk_rows) {
  __shared__ float s_sum[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColTile + tx;
  const int chunk = blockIdx.y;
  const int r0 = chunk * chunk_rows, r1 = min(N, r0 + chunk_rows);
  float sum = 0.f;
  if (c < OC)
    for (int n = r0 + ty; n < r1; n += kRowLanes) sum += to_float(dy[size_t(n) * OC + c]);
  s_sum[ty][tx] = sum;
  __syncthreads();  // every thread gets here: out-of-range columns only skipped the loop
  if (ty == 0 && c < OC) {
    float total = 0.f;
    for (int k = 0; k < kRowLanes; k++) total += s_sum[k][tx];
    partial[size_t(chunk) * OC + c] = total;
  }
}

// db[c] += sum_k partial[k][c], k in order.
__global__ void column_sums_reduce_kernel(float* __restrict__ db, const float* __restrict__ partial, int chunks,
                                          int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float total = 0.f;
  for (int k = 0; k < chunks; k++) total += partial[size_t(k) * OC + c];
  db[c] += total;
}

}  // namespace

size_t linear_backward_scratch_bytes(int N, int OC) { return scratch::linear_backward(N, OC); }

template <class T>
void column_sums_add(float* db, const T* dy, float* scratch, int N, int OC, cudaStream_t s) {
  if (N == 0 || OC == 0) return;  // a grid of no blocks is an invalid launch
  const int chunks = scratch::column_chunks(N), chunk_rows = int(ceil_div(N, chunks));
  launch("column_sums_partial", column_sums_partial_kernel<T>, dim3(ceil_div(OC, kColTile), chunks),
         dim3(kColTile, kRowLanes), 0, s, scratch, dy, N, OC, chunk_rows);
  launch("column_sums_reduce", column_sums_reduce_kernel, dim3(ceil_div(OC, 256)), dim3(256), 0, s, db, scratch,
         chunks, OC);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC, cudaStream_t s) {
  // y (N, OC) = x (N, C) · w^T (C, OC) + b
  gemm<T, T>(y, x, w, b, N, OC, C, /*trans_a=*/false, /*trans_b=*/true, /*accumulate=*/false, "linear forward", s);
}

template <class T>
void linear_backward(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, float* scratch, int N, int C,
                     int OC, cudaStream_t s) {
  // dx (N, C) += dy (N, OC) · w (OC, C)
  if (dx) gemm<T, T>(dx, dy, w, nullptr, N, C, OC, false, false, true, "linear backward dx", s);
  // dw (OC, C) += dy^T (OC, N) · x (N, C), in fp32
  if (dw) gemm<T, float>(dw, dy, x, nullptr, OC, C, N, true, false, true, "linear backward dw", s);
  if (db) column_sums_add<T>(db, dy, scratch, N, OC, s);
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int, int, cudaStream_t);
template void linear_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                            const __nv_bfloat16*, int, int, int, cudaStream_t);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, float*, int,
                                     int, int, cudaStream_t);
template void linear_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, const __nv_bfloat16*, float*, int, int, int,
                                             cudaStream_t);
template void column_sums_add<float>(float*, const float*, float*, int, int, cudaStream_t);
template void column_sums_add<__nv_bfloat16>(float*, const __nv_bfloat16*, float*, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
