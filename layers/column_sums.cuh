// Deterministic column sums over rows, for the parameter gradients of the per-token ops (a
// linear's bias, LayerNorm's weight and bias, RMSNorm's weight):
//   out[k][c] += sum over rows n of term(n, c)[k],   k < K,  c < C
// without atomics, so the sum's order, and the gradient's bits, never depend on scheduling:
//   (1) a 2-D grid of (32 columns) x (a chunk of rows) blocks: thread (tx, ty) adds rows ty, ty + 8,
//       ... of its chunk, then the block adds the 8 strands in order into partial (K, chunks, C);
//   (2) one thread per column adds the chunks' partials, in chunk order, into out[k].
// The chunking (layers/scratch_sizes.h) bounds the scratch: K * chunks * C floats.
//
// Term is a small struct with  __device__ void operator()(int n, int c, float (&acc)[K]) const
// that adds row n's contributions to column c into acc (it reads each input once for all K).
#pragma once
#include "engine/cuda_launch.h"
#include "layers/scratch_sizes.h"

namespace ul {
namespace cuda {
namespace colsum {

constexpr int kColTile = 32;  // columns per block of the partial kernel
constexpr int kRowLanes = 8;  // row strands per column in that kernel (block 32 x 8)

template <int K>
struct Outs {
  float* out[K];
};

template <int K, class Term>
__global__ void partial_kernel(float* __restrict__ partial, Term term, int N, int C, int chunk_rows) {
  __shared__ float s_acc[K][kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColTile + tx;
  const int chunk = blockIdx.y, chunks = gridDim.y;
  const int r0 = chunk * chunk_rows, r1 = min(N, r0 + chunk_rows);
  float acc[K];
  for (int k = 0; k < K; k++) acc[k] = 0.f;
  if (c < C)
    for (int n = r0 + ty; n < r1; n += kRowLanes) term(n, c, acc);
  for (int k = 0; k < K; k++) s_acc[k][ty][tx] = acc[k];
  __syncthreads();  // every thread gets here: out-of-range columns only skipped the loop
  if (ty == 0 && c < C)
    for (int k = 0; k < K; k++) {
      float total = 0.f;
      for (int j = 0; j < kRowLanes; j++) total += s_acc[k][j][tx];
      partial[(size_t(k) * chunks + chunk) * C + c] = total;
    }
}

template <int K>
__global__ void reduce_kernel(Outs<K> outs, const float* __restrict__ partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = 0; k < K; k++) {
    float total = 0.f;
    for (int j = 0; j < chunks; j++) total += partial[(size_t(k) * chunks + j) * C + c];
    outs.out[k][c] += total;
  }
}

// The two launches; `name` names them in errors. partial: K * column_chunks(N) * C floats of scratch.
template <int K, class Term>
void add(const char* name, Outs<K> outs, Term term, float* partial, int N, int C, cudaStream_t s) {
  if (N == 0 || C == 0) return;  // a grid of no blocks is an invalid launch
  const int chunks = scratch::column_chunks(N), chunk_rows = int(ceil_div(N, chunks));
  launch(name, partial_kernel<K, Term>, dim3(ceil_div(C, kColTile), chunks), dim3(kColTile, kRowLanes), 0, s, partial,
         term, N, C, chunk_rows);
  launch(name, reduce_kernel<K>, dim3(ceil_div(C, 256)), dim3(256), 0, s, outs, partial, chunks, C);
}

}  // namespace colsum
}  // namespace cuda
}  // namespace ul
