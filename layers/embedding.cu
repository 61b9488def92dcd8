// Token + position embedding on CUDA (the math is in embedding.h; the CPU loops it must match are
// in embedding.cpp). T is float or __nv_bfloat16; sums in float; table gradients are float.
//
// forward    one block per row n gathers wte[idx[n]] (+ wpe[pos[n]]) in 16-byte packs when C is a
//            multiple of the pack and the pointers are aligned, element by element otherwise.
// backward   dwte[idx[n]] += dy[n] for every n: rows n that share a table row must be summed, and
//            float atomics would make the sum's order (so its bits) vary from run to run. Instead:
//            (1) keys k_n = (idx[n] << 32 | n), padded to a power of two with ~0, are sorted by a
//                bitonic network: each tile of up to 1024 keys in shared memory, then merges with
//                global compare-exchange passes for the strides above a tile and a shared-memory
//                pass for the strides within one;
//            (2) the sorted keys are runs of one table row with n increasing; one block per run
//                start (grid over all N keys, the others return at once) and per channel slice
//                finds its run's end by bisection and adds the run's dy rows in order of n onto
//                the row's gradient, starting from the gradient's old value: the very additions
//                the CPU loop makes, in its order, so the f32 result is bitwise the CPU's.
//            dwpe the same with pos. That order makes a run one dependent chain of additions per
//            channel: a frequent token (a byte-level space, a padding id: runs of 10^4-10^6 rows
//            at long T) is walked by one thread per channel. The additions are cheap; the loads
//            are what wait, so they go kRunBatch at a time, all issued before any is added (the
//            run's end known beforehand, no load waits on the one before): the chain's latency
//            is divided by kRunBatch and the result keeps its bits. Splitting a run among threads
//            would be faster still, but adds in another order than the CPU's.
// range check   one thread per id, atomicMin of the index of an id out of range (an integer
//            minimum: the same answer whatever the order), read back by the host.
#include <cstdint>

#include "engine/cuda_launch.h"
#include "layers/scratch_sizes.h"
#include "layers/elementwise.cuh"
#include "layers/embedding.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kSortTile = 1024;  // keys sorted or merged in shared memory by one block (8 KiB)
constexpr uint64_t kPadKey = ~uint64_t(0);  // sorts after every real key (table row < 2^31)

int64_t sort_size(int N) { return scratch::embedding_sort_size(N); }

// Threads for a block that covers `items` of a row: whole warps, at most 256 (then they loop).
int row_threads(int items) { return items < 256 ? int(ceil_div(items, 32)) * 32 : 256; }

// y: (N, C); idx, pos: (N); wte: (V, C); wpe: (maxT, C) or nullptr. Block n gathers row n.
template <class T, int V>
__global__ void embedding_forward_kernel(T* __restrict__ y, const int32_t* __restrict__ idx,
                                         const int32_t* __restrict__ pos, const T* __restrict__ wte,
                                         const T* __restrict__ wpe, int C) {
  const int n = blockIdx.x;
  T* yr = y + size_t(n) * C;
  const T* te = wte + size_t(idx[n]) * C;
  const T* pe = wpe ? wpe + size_t(pos[n]) * C : nullptr;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    const Pack<T, V> tv = load_pack<V>(te + c);
    Pack<T, V> yv;
    if (pe) {
      const Pack<T, V> pv = load_pack<V>(pe + c);
      for (int k = 0; k < V; k++) yv.v[k] = from_float<T>(to_float(tv.v[k]) + to_float(pv.v[k]));
    } else {
      yv = tv;
    }
    store_pack<V>(yr + c, yv);
  }
}

// keys: (P) with P >= N a power of two; key n = (ids[n] << 32) | n, the rest padding.
__global__ void embedding_keys_kernel(uint64_t* __restrict__ keys, const int32_t* __restrict__ ids, int N,
                                      int64_t P) {
  for (int64_t i = grid_first(); i < P; i += grid_stride())
    keys[i] = i < N ? (uint64_t(uint32_t(ids[i])) << 32) | uint64_t(i) : kPadKey;
}

// One compare-exchange of the bitonic network: keys i < l = i + j, ascending where bit k of i is 0.
__device__ __forceinline__ void compare_exchange(uint64_t& a, uint64_t& b, bool ascending) {
  if ((a > b) == ascending) {
    const uint64_t t = a;
    a = b;
    b = t;
  }
}

// The index of the lower key of pair t at stride j: pairs are (i, i + j) with bit j of i clear.
__device__ __forceinline__ int64_t pair_low(int64_t t, int64_t j) { return (t / j) * 2 * j + t % j; }

// Block b holds keys [b * tile, (b + 1) * tile) in shared memory (tile = 2 * blockDim.x) and runs
// the network's stages (k, j) for every k in [k_first, k_last] (powers of two) and j from
// min(k/2, tile/2) down to 1. k_first = 2, k_last = tile sorts each tile (alternating directions,
// as the full network wants); k_first = k_last = k > tile finishes merge stage k below the tile.
// Up to kSortTile / 2 threads a block: launch bounds keep nvcc's registers to what that many may hold.
__global__ void __launch_bounds__(kSortTile / 2) embedding_sort_tile_kernel(uint64_t* __restrict__ keys, int64_t k_first,
                                                                            int64_t k_last) {
  UL_STATIC_SMEM(uint64_t, s, [kSortTile]);
  const int tile = 2 * blockDim.x;
  const int64_t base = int64_t(blockIdx.x) * tile;
  for (int i = threadIdx.x; i < tile; i += blockDim.x) s[i] = keys[base + i];
  __syncthreads();
  for (int64_t k = k_first; k <= k_last; k <<= 1) {
    for (int64_t j = (k / 2 < tile / 2 ? k / 2 : tile / 2); j > 0; j >>= 1) {
      const int64_t i = pair_low(threadIdx.x, j);
      compare_exchange(s[i], s[i + j], ((base + i) & k) == 0);
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = s[i];
}

// Stage (k, j) of the network for a stride j too large for one tile: one thread per pair.
__global__ void embedding_sort_global_kernel(uint64_t* __restrict__ keys, int64_t P, int64_t k, int64_t j) {
  for (int64_t t = grid_first(); t < P / 2; t += grid_stride()) {
    const int64_t i = pair_low(t, j);
    uint64_t a = keys[i], b = keys[i + j];
    compare_exchange(a, b, (i & k) == 0);
    keys[i] = a;
    keys[i + j] = b;
  }
}

__device__ __forceinline__ uint32_t key_row(uint64_t key) { return uint32_t(key >> 32); }
__device__ __forceinline__ uint32_t key_n(uint64_t key) { return uint32_t(key); }

// The end of the run of `row` that starts at key j: the first r in (j, N] whose key is of another
// row (or N). The keys are sorted, so bisection: log2(N) loads instead of one per row of the run.
__device__ __forceinline__ int run_end(const uint64_t* __restrict__ keys, int j, int N, uint32_t row) {
  int lo = j + 1, hi = N;  // keys[j, lo) are of the row; the end lies in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (key_row(keys[mid]) == row) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

constexpr int kRunBatch = 8;  // dy loads in flight per thread while a run is summed

// dtable[row] += dy[n] for the sorted keys (N of them). Block (j, slice): if key j starts a run of
// one table row, sum that run's dy rows in order of n onto the row, for channels of the slice.
template <class T>
__global__ void embedding_backward_runs_kernel(float* __restrict__ dtable, const T* __restrict__ dy,
                                               const uint64_t* __restrict__ keys, int N, int C) {
  const int j = blockIdx.x;
  const uint32_t row = key_row(keys[j]);
  if (j > 0 && key_row(keys[j - 1]) == row) return;  // not the start of a run
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int end = run_end(keys, j, N, row);
  float* g = dtable + size_t(row) * C + c;
  float sum = *g;
  int r = j;
  for (; r + kRunBatch <= end; r += kRunBatch) {
    float v[kRunBatch];  // every load issued, then the additions in order of n
    for (int k = 0; k < kRunBatch; k++) v[k] = to_float(dy[size_t(key_n(keys[r + k])) * C + c]);
    for (int k = 0; k < kRunBatch; k++) sum += v[k];
  }
  for (; r < end; r++) sum += to_float(dy[size_t(key_n(keys[r])) * C + c]);
  *g = sum;
}

// first_bad: above any index on entry; becomes the smallest n with v[n] outside [0, limit), if any.
__global__ void embedding_check_kernel(int* __restrict__ first_bad, const int32_t* __restrict__ v, int N,
                                       int64_t limit) {
  for (int64_t n = grid_first(); n < N; n += grid_stride())
    if (v[n] < 0 || v[n] >= limit) atomicMin(first_bad, int(n));
}

// Sorts keys for `ids` and adds the runs of dy into dtable.
template <class T>
void backward_table(float* dtable, const T* dy, const int32_t* ids, uint64_t* keys, int N, int C, cudaStream_t s) {
  embedding_sort_keys(keys, ids, N, s);
  const int threads = row_threads(C);
  launch("embedding_backward_runs", embedding_backward_runs_kernel<T>, dim3(unsigned(N), ceil_div(C, threads)),
         dim3(threads), 0, s, dtable, dy, static_cast<const uint64_t*>(keys), N, C);
}

}  // namespace

size_t embedding_backward_scratch_bytes(int N) { return scratch::embedding_backward(N); }

void embedding_sort_keys(uint64_t* keys, const int32_t* ids, int N, cudaStream_t s) {
  if (N == 0) return;
  const int64_t P = sort_size(N);
  const int tile = int(P < kSortTile ? P : kSortTile);
  launch("embedding_keys", embedding_keys_kernel, dim3(elementwise_blocks(P)), dim3(kElementwiseThreads), 0, s, keys,
         ids, N, P);
  // Merge stages k <= tile: within each tile. Larger k: the strides j >= tile across tiles, one
  // pass each, then the strides below a tile in shared memory again.
  launch("embedding_sort_tile", embedding_sort_tile_kernel, dim3(unsigned(P / tile)), dim3(tile / 2), 0, s, keys,
         int64_t(2), int64_t(tile));
  for (int64_t k = 2 * int64_t(tile); k <= P; k <<= 1) {
    for (int64_t j = k / 2; j >= tile; j >>= 1)
      launch("embedding_sort_global", embedding_sort_global_kernel, dim3(elementwise_blocks(P / 2)),
             dim3(kElementwiseThreads), 0, s, keys, P, k, j);
    launch("embedding_sort_tile", embedding_sort_tile_kernel, dim3(unsigned(P / tile)), dim3(tile / 2), 0, s, keys, k,
           k);
  }
}

template <class T>
void embedding_forward(T* y, const int32_t* idx, const int32_t* pos, const T* wte, const T* wpe, int N, int C,
                       cudaStream_t s) {
  if (N == 0 || C == 0) return;  // a grid of no blocks is an invalid launch
  constexpr int V = kPackElems<T>;
  if (C % V == 0 && pack_aligned({y, wte, wpe}))
    launch("embedding_forward", embedding_forward_kernel<T, V>, dim3(unsigned(N)), dim3(row_threads(C / V)), 0, s, y,
           idx, pos, wte, wpe, C);
  else
    launch("embedding_forward", embedding_forward_kernel<T, 1>, dim3(unsigned(N)), dim3(row_threads(C)), 0, s, y, idx,
           pos, wte, wpe, C);
}

template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dy, const int32_t* idx, const int32_t* pos, void* scratch,
                        int N, int C, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  uint64_t* keys = static_cast<uint64_t*>(scratch);
  backward_table(dwte, dy, idx, keys, N, C, s);
  if (dwpe) backward_table(dwpe, dy, pos, keys, N, C, s);  // same stream: runs after the first used the keys
}

int embedding_first_out_of_range(const int32_t* v, int N, int64_t limit, int* scratch, cudaStream_t s) {
  if (N == 0) return -1;
  const int none = INT32_MAX;  // above any index (N <= 2^31 - 1); synchronised below, before it goes
  UL_CUDA_CHECK(cudaMemcpyAsync(scratch, &none, sizeof(int), cudaMemcpyHostToDevice, s));
  launch("embedding_check", embedding_check_kernel, dim3(elementwise_blocks(N)), dim3(kElementwiseThreads), 0, s,
         scratch, v, N, limit);
  int first = none;
  UL_CUDA_CHECK(cudaMemcpyAsync(&first, scratch, sizeof(int), cudaMemcpyDeviceToHost, s));
  UL_CUDA_CHECK(cudaStreamSynchronize(s));
  return first == none ? -1 : first;
}

template void embedding_forward<float>(float*, const int32_t*, const int32_t*, const float*, const float*, int, int,
                                       cudaStream_t);
template void embedding_forward<__nv_bfloat16>(__nv_bfloat16*, const int32_t*, const int32_t*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, int, int, cudaStream_t);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, const int32_t*, void*, int, int,
                                        cudaStream_t);
template void embedding_backward<__nv_bfloat16>(float*, float*, const __nv_bfloat16*, const int32_t*, const int32_t*,
                                                void*, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
