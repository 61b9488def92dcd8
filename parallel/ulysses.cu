// The Ulysses pack/unpack permutes on CUDA (shapes and semantics in ulysses.h; the CPU loops they
// must match are in ulysses.cpp). Pure data movement: one thread per OUTPUT pack, grid-stride,
// 64-bit indices (an all-to-all buffer can exceed 2^31 elements). Writing each output once from
// one thread needs no atomics; for chunks_to_heads it means gathering, for each destination head,
// the (rank, slot) pairs that carry it — several for a kv head replicated over ranks.
#include <algorithm>
#include <initializer_list>

#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "parallel/ulysses.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr long long kMaxBlocks = 8192;

// HeadSplit's mapping, callable on the device (HeadSplit itself is host code).
struct HeadMap {
  int Hq, Hkv, P;
  __device__ __forceinline__ int ql() const { return Hq / P; }
  __device__ __forceinline__ int kl() const { return Hkv == 0 ? 0 : (Hkv >= P ? Hkv / P : 1); }
  __device__ __forceinline__ int width() const { return ql() + 2 * kl(); }
  __device__ __forceinline__ int first_kv(int j) const { return Hkv >= P ? j * kl() : (j * ql()) / (Hq / Hkv); }
  __device__ __forceinline__ int source(int j, int s) const {
    if (s < ql()) return j * ql() + s;
    if (s < ql() + kl()) return Hq + first_kv(j) + (s - ql());
    return Hq + Hkv + first_kv(j) + (s - ql() - kl());
  }
  // The slot of input head h on rank j, or -1 when rank j does not receive it.
  __device__ __forceinline__ int slot(int j, int h) const {
    if (h < Hq) return h / ql() == j ? h % ql() : -1;
    const bool is_v = h >= Hq + Hkv;
    const int kv = h - Hq - (is_v ? Hkv : 0), off = kv - first_kv(j);
    if (off < 0 || off >= kl()) return -1;
    return ql() + (is_v ? kl() : 0) + off;
  }
};

HeadMap head_map(const HeadSplit& hs) { return {hs.Hq, hs.Hkv, hs.P}; }

dim3 grid_for(size_t total) { return dim3(capped_blocks((long long)total, kThreads, kMaxBlocks)); }

#define UL_GRID_STRIDE(i, total) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (total); i += size_t(gridDim.x) * blockDim.x)

// Each kernel moves packs of V elements along the innermost (contiguous) dimension, D or R: 16 bytes
// (8 bf16, 4 floats) when that dimension is a multiple of it and the buffers are 16-byte aligned,
// else V = 1. The index arithmetic (64-bit divisions) is then paid once per pack.

// send: (P, B, Tl, W, D)  <-  src: (B, Tl, H, D)
template <class T, int V>
__global__ void heads_to_chunks_kernel(T* __restrict__ send, const T* __restrict__ src, HeadMap hs, int B, int Tl,
                                       int D) {
  const int H = hs.Hq + 2 * hs.Hkv, W = hs.width(), Dp = D / V;
  const size_t total = size_t(hs.P) * B * Tl * W * Dp;
  UL_GRID_STRIDE(i, total) {
    size_t r = i / Dp;
    const int d = int(i % Dp) * V, s = int(r % W);
    r /= W;  // (j, b, t)
    const size_t bt = r % (size_t(B) * Tl);
    const int j = int(r / (size_t(B) * Tl));
    store_pack<V>(send + i * V, load_pack<V>(src + (bt * H + hs.source(j, s)) * D + d));
  }
}

// dst: (B, Tl, H, D)  (+)=  recv: (P, B, Tl, W, D), the copies of a head summed in rank order.
template <class T, int V>
__global__ void chunks_to_heads_kernel(T* __restrict__ dst, const T* __restrict__ recv, HeadMap hs, int B, int Tl,
                                       int D, bool accumulate) {
  const int H = hs.Hq + 2 * hs.Hkv, W = hs.width(), Dp = D / V;
  const size_t BT = size_t(B) * Tl, total = BT * H * Dp;
  UL_GRID_STRIDE(i, total) {
    const int d = int(i % Dp) * V, h = int(i / Dp % H);
    const size_t bt = i / Dp / H;
    float acc[V];
    if (accumulate) load_floats<V>(dst + i * V, acc);
    bool any = false;
    for (int j = 0; j < hs.P; j++) {
      const int s = hs.slot(j, h);
      if (s < 0) continue;
      float x[V];
      load_floats<V>(recv + ((size_t(j) * BT + bt) * W + s) * D + d, x);
      for (int k = 0; k < V; k++) acc[k] = accumulate ? acc[k] + x[k] : x[k];  // else the last copy wins, as on the CPU
      any = true;
    }
    if (any) store_floats<V>(dst + i * V, acc);
  }
}

// dst: (B, P*Tl, R)  (+)=  recv: (P, B, Tl, R)
template <class T, int V>
__global__ void chunks_to_sequence_kernel(T* __restrict__ dst, const T* __restrict__ recv, int P, int B, int Tl,
                                          int R, bool accumulate) {
  const int Rp = R / V;
  const size_t total = size_t(B) * P * Tl * Rp;
  UL_GRID_STRIDE(i, total) {
    const size_t tok = i / Rp;  // (b, global t)
    const int r = int(i % Rp) * V, tg = int(tok % (size_t(P) * Tl)), b = int(tok / (size_t(P) * Tl));
    const int j = tg / Tl, t = tg % Tl;
    const T* x = recv + ((size_t(j) * B + b) * Tl + t) * R + r;
    if (!accumulate) {
      store_pack<V>(dst + i * V, load_pack<V>(x));
      continue;
    }
    float acc[V], xv[V];
    load_floats<V>(dst + i * V, acc);
    load_floats<V>(x, xv);
    for (int k = 0; k < V; k++) acc[k] += xv[k];
    store_floats<V>(dst + i * V, acc);
  }
}

// send: (P, B, Tl, R)  <-  src: (B, P*Tl, R)
template <class T, int V>
__global__ void sequence_to_chunks_kernel(T* __restrict__ send, const T* __restrict__ src, int P, int B, int Tl,
                                          int R) {
  const int Rp = R / V;
  const size_t total = size_t(P) * B * Tl * Rp;
  UL_GRID_STRIDE(i, total) {
    const size_t tok = i / Rp;  // (j, b, t)
    const int r = int(i % Rp) * V, t = int(tok % Tl), b = int(tok / Tl % B), j = int(tok / Tl / B);
    store_pack<V>(send + i * V, load_pack<V>(src + ((size_t(b) * P + j) * Tl + t) * R + r));
  }
}

#undef UL_GRID_STRIDE

// Launches `packed` (kernel<T, kPackElems<T>>) when packs fit (elementwise.cuh), else `single`
// (kernel<T, 1>). `work` counts elements.
template <class T, class K, class... A>
void launch_packed(const char* name, K* single, K* packed, int inner, size_t work,
                   std::initializer_list<const void*> buffers, cudaStream_t s, A... args) {
  constexpr int kV = kPackElems<T>;
  if (packs_fit<T>(inner, buffers))
    launch(name, packed, grid_for(work / kV), dim3(kThreads), 0, s, args...);
  else
    launch(name, single, grid_for(work), dim3(kThreads), 0, s, args...);
}

}  // namespace

template <class T>
void heads_to_chunks(T* send, const T* src, const HeadSplit& hs, int B, int Tl, int D, cudaStream_t s) {
  const size_t total = size_t(hs.P) * B * Tl * hs.width() * D;
  if (total == 0) return;  // a grid of no blocks is an invalid launch
  launch_packed<T>("heads_to_chunks", heads_to_chunks_kernel<T, 1>, heads_to_chunks_kernel<T, kPackElems<T>>, D,
                   total, {send, src}, s, send, src, head_map(hs), B, Tl, D);
}

template <class T>
void chunks_to_heads(T* dst, const T* recv, const HeadSplit& hs, int B, int Tl, int D, bool accumulate,
                     cudaStream_t s) {
  const size_t total = size_t(B) * Tl * (hs.Hq + 2 * hs.Hkv) * D;
  if (total == 0) return;
  launch_packed<T>("chunks_to_heads", chunks_to_heads_kernel<T, 1>, chunks_to_heads_kernel<T, kPackElems<T>>, D,
                   total, {dst, recv}, s, dst, recv, head_map(hs), B, Tl, D, accumulate);
}

template <class T>
void chunks_to_sequence(T* dst, const T* recv, int P, int B, int Tl, int R, bool accumulate, cudaStream_t s) {
  const size_t total = size_t(B) * P * Tl * R;
  if (total == 0) return;
  launch_packed<T>("chunks_to_sequence", chunks_to_sequence_kernel<T, 1>,
                   chunks_to_sequence_kernel<T, kPackElems<T>>, R, total, {dst, recv}, s, dst, recv, P, B, Tl, R,
                   accumulate);
}

template <class T>
void sequence_to_chunks(T* send, const T* src, int P, int B, int Tl, int R, cudaStream_t s) {
  const size_t total = size_t(P) * B * Tl * R;
  if (total == 0) return;
  launch_packed<T>("sequence_to_chunks", sequence_to_chunks_kernel<T, 1>, sequence_to_chunks_kernel<T, kPackElems<T>>,
                   R, total, {send, src}, s, send, src, P, B, Tl, R);
}


#define UL_INSTANTIATE(T)                                                                                  \
  template void heads_to_chunks<T>(T*, const T*, const HeadSplit&, int, int, int, cudaStream_t);           \
  template void chunks_to_heads<T>(T*, const T*, const HeadSplit&, int, int, int, bool, cudaStream_t);     \
  template void chunks_to_sequence<T>(T*, const T*, int, int, int, int, bool, cudaStream_t);               \
  template void sequence_to_chunks<T>(T*, const T*, int, int, int, int, cudaStream_t);
UL_INSTANTIATE(float)
UL_INSTANTIATE(__nv_bfloat16)
#undef UL_INSTANTIATE

}  // namespace cuda
}  // namespace ul
