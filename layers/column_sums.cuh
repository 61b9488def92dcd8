// Deterministic column sums over rows, for the parameter gradients of the per-token ops (a
// linear's bias, LayerNorm's weight and bias, RMSNorm's weight):
//   out[k][c] += sum over rows n of term(n, c)[k],   k < K,  c < C
// without atomics, so the sum's order, and the gradient's bits, never depend on scheduling:
//   (1) a 2-D grid of (32 x V columns) x (a chunk of rows) blocks: thread (tx, ty) adds rows ty,
//       ty + 8, ... of its chunk for its V columns, then the block adds the 8 strands in order
//       into partial (K, chunks, C);
//   (2) one thread per column adds the chunks' partials, in chunk order, into out[k] (their loads
//       batched ahead of the additions).
// V is 16 bytes of the term's element type (8 bf16, 4 floats) when C is a multiple of it and the
// term's buffers are 16-byte aligned, else 1; the sums per column are the same either way.
// The chunking (layers/scratch_sizes.h) bounds the scratch: K * chunks * C floats.
//
// Term is a small struct with
//   using Elem = T;                                  // the element type of its inputs
//   bool aligned() const;                            // host: its inputs are 16-byte aligned
//   template <int V> __device__ void operator()(int n, int c, float (&acc)[K][V]) const
// whose operator adds row n's contributions to columns c .. c + V - 1 into acc (it reads each
// input once for all K).
#pragma once
#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
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

template <int K, int V, class Term>
__global__ void partial_kernel(float* __restrict__ partial, Term term, int N, int C, int chunk_rows) {
  UL_STATIC_SMEM(float, s_acc, [K][kRowLanes][kColTile * V]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = (blockIdx.x * kColTile + tx) * V;  // this thread's first column
  const int chunk = blockIdx.y, chunks = gridDim.y;
  // (in 64 bits: near int's end, r0 + chunk_rows and the row loop's last step would wrap)
  const int64_t r0 = int64_t(chunk) * chunk_rows, r1 = r0 + chunk_rows < N ? r0 + chunk_rows : int64_t(N);
  float acc[K][V];
  for (int k = 0; k < K; k++)
    for (int v = 0; v < V; v++) acc[k][v] = 0.f;
  if (c < C)
    for (int64_t n = r0 + ty; n < r1; n += kRowLanes) term.template operator()<V>(int(n), c, acc);
  for (int k = 0; k < K; k++)
    for (int v = 0; v < V; v++) s_acc[k][ty][tx * V + v] = acc[k][v];
  __syncthreads();  // every thread gets here: out-of-range columns only skipped the loop
  if (ty == 0 && c < C)
    for (int k = 0; k < K; k++)
      for (int v = 0; v < V; v++) {
        float total = 0.f;
        for (int j = 0; j < kRowLanes; j++) total += s_acc[k][j][tx * V + v];
        partial[(size_t(k) * chunks + chunk) * C + c + v] = total;
      }
}

// Partials loaded per batch, all issued before any is added: a GPU waits for a load only where its
// value is used, so the chunks' sum (up to kMaxChunks in order) waits on memory once a batch, not
// once for every few chunks as a plain loop would (the compiler unrolls only a little). Only a few
// blocks run this (one thread per column), so that wait is the kernel's time.
constexpr int kReduceBatch = 16;

template <int K>
__global__ void reduce_kernel(Outs<K> outs, const float* __restrict__ partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = 0; k < K; k++) {
    const float* p = partial + size_t(k) * chunks * C + c;  // chunk j's partial at p[j * C]
    float total = 0.f;
    int j = 0;
    for (; j + kReduceBatch <= chunks; j += kReduceBatch) {
      float v[kReduceBatch];
      for (int u = 0; u < kReduceBatch; u++) v[u] = p[size_t(j + u) * C];
      for (int u = 0; u < kReduceBatch; u++) total += v[u];  // in chunk order, as before
    }
    for (; j < chunks; j++) total += p[size_t(j) * C];
    outs.out[k][c] += total;
  }
}

// The two launches; `name` names them in errors. partial: K * column_chunks(N) * C floats of scratch.
template <int K, class Term>
void add(const char* name, Outs<K> outs, Term term, float* partial, int N, int C, cudaStream_t s) {
  if (N == 0 || C == 0) return;  // a grid of no blocks is an invalid launch
  const int chunks = scratch::column_chunks(N), chunk_rows = int(ceil_div(N, chunks));
  constexpr int kV = kPackElems<typename Term::Elem>;
  const dim3 block(kColTile, kRowLanes);
  if (C % kV == 0 && term.aligned())
    launch(name, partial_kernel<K, kV, Term>, dim3(ceil_div(C, kColTile * kV), chunks), block, 0, s, partial, term, N,
           C, chunk_rows);
  else
    launch(name, partial_kernel<K, 1, Term>, dim3(ceil_div(C, kColTile), chunks), block, 0, s, partial, term, N, C,
           chunk_rows);
  launch(name, reduce_kernel<K>, dim3(ceil_div(C, 256)), dim3(256), 0, s, outs, partial, chunks, C);
}

}  // namespace colsum
}  // namespace cuda
}  // namespace ul
