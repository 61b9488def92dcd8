// AdamW and the gradient norm on CUDA (the math is in optimizer.h; the CPU loops it must match are
// in optimizer.cpp).
//
// adamw_update   four consecutive elements a thread (16-byte loads; one at a time where a ZeRO
//                shard leaves the arrays unaligned), grid-stride, the CPU's arithmetic in the CPU's
//                order on the fp32 master; for bf16 parameters the master is then rounded
//                stochastically, with 16 random bits from a counter-based hash of (seed, t, global
//                index). Each thread's indices only grow, so its cursor into the decay segments
//                only moves on.
// sum_squares    (1) a fixed number of blocks, chosen from n alone, each summing a fixed strided
//                    subset and writing one partial; (2) one block adds the partials in order.
//                No atomics: the same gradient gives the same bits on every run.
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/cuda_launch.h"
#include "engine/optimizer.h"
#include "layers/elementwise.cuh"

namespace ul {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxUpdateBlocks = 2048;  // enough to fill a GPU; more only adds scheduling
constexpr size_t kNormPerBlock = 8192;       // elements per partial of sum_squares, at least ...
constexpr size_t kMaxNormBlocks = 1024;      // ... and at most this many partials

// A 64-bit mixing function (the finalizer of splitmix64): every input bit affects every output bit.
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// bf16 of x, rounded away from zero with probability (low 16 bits of x) / 2^16: adding 16 random
// bits to the bits that bf16 drops carries into the kept ones with exactly that probability.
// (A carry out of the largest finite exponent gives infinity, as rounding up there should.)
__device__ __forceinline__ __nv_bfloat16 round_stochastic(float x, uint32_t random16) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf, NaN: nothing to round
  // The sum has zero low bits, so the truncating conversion is exact.
  return __float2bfloat16_rz(__uint_as_float((u + (random16 & 0xffffu)) & 0xffff0000u));
}

// The weight decay of element i, walking the decay segments forward: a thread's indices only grow,
// so its cursor only moves on, and the current segment's end stays in a register.
struct DecayCursor {
  const DecaySegments& segs;
  float weight_decay;
  int seg = 0;
  uint64_t end;
  __device__ DecayCursor(const DecaySegments& s, float wd)
      : segs(s), weight_decay(wd), end(s.count ? s.ends[0] : ~uint64_t(0)) {}
  __device__ float at(size_t i) {
    if (!segs.count) return weight_decay;
    while (i >= end) end = segs.ends[++seg];  // the last end is n, so seg stays below count
    return segs.decay[seg] ? weight_decay : 0.f;
  }
};

// One element's update: the CPU's arithmetic in the CPU's order. p is the f32 weight (params or
// master), updated in place; m, v likewise.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float wd, float lr, float beta1,
                                              float beta2, float eps, float grad_scale, float step_size,
                                              float inv_sqrt_bc2) {
  const float gi = g * grad_scale;
  m = beta1 * m + (1.0f - beta1) * gi;
  v = beta2 * v + (1.0f - beta2) * gi * gi;
  p = p - lr * wd * p;
  p = p - step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
}

// The bf16 parameter of master value p at global index g: its 16 random bits are the counter (the
// element's index in the whole buffer) through the mixer, keyed by the step's seed.
__device__ __forceinline__ __nv_bfloat16 rounded_param(float p, uint64_t step_seed, size_t g) {
  return round_stochastic(p, uint32_t(mix64(step_seed + (g + 1) * 0x9e3779b97f4a7c15ull) >> 48));
}

// params, master, grad, m, v: (n). step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t).
// V: elements a thread takes at a time, consecutive: 4 (16-byte loads of the f32 arrays; every
// pointer aligned to its 4 elements, n any: a last partial group goes one element at a time) or 1.
// The elements' arithmetic is the same either way, so both give the same bits.
template <class Tp, int V>
__global__ void adamw_kernel(Tp* __restrict__ params, float* __restrict__ master, const float* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v, size_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale, float step_size,
                             float inv_sqrt_bc2, uint64_t step_seed, size_t index_base, DecaySegments segs) {
  constexpr bool f32 = std::is_same<Tp, float>::value;
  float* w = f32 ? reinterpret_cast<float*>(params) : master;  // the f32 weights the update works on
  DecayCursor decay(segs, weight_decay);
  const size_t stride = size_t(gridDim.x) * blockDim.x * V;
  for (size_t i0 = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * V; i0 < n; i0 += stride) {
    float gv[V], mv[V], vv[V], pv[V];
    const bool whole = V > 1 && i0 + V <= n;
    if (whole) {
      load_floats<V>(grad + i0, gv);
      load_floats<V>(m + i0, mv);
      load_floats<V>(v + i0, vv);
      load_floats<V>(w + i0, pv);
    } else {
      UL_UNROLL for (int k = 0; k < V; k++) {
        if (i0 + k >= n) break;
        gv[k] = grad[i0 + k], mv[k] = m[i0 + k], vv[k] = v[i0 + k], pv[k] = w[i0 + k];
      }
    }
    UL_UNROLL for (int k = 0; k < V; k++) {
      if (i0 + k >= n) break;
      adamw_element(pv[k], mv[k], vv[k], gv[k], decay.at(i0 + k), lr, beta1, beta2, eps, grad_scale, step_size,
                    inv_sqrt_bc2);
    }
    if (whole) {
      store_floats<V>(m + i0, mv);
      store_floats<V>(v + i0, vv);
      store_floats<V>(w + i0, pv);
      if constexpr (!f32) {
        Pack<__nv_bfloat16, V> pk;
        UL_UNROLL for (int k = 0; k < V; k++) pk.v[k] = rounded_param(pv[k], step_seed, index_base + i0 + k);
        store_pack<V>(params + i0, pk);
      }
    } else {
      UL_UNROLL for (int k = 0; k < V; k++) {
        if (i0 + k >= n) break;
        m[i0 + k] = mv[k], v[i0 + k] = vv[k], w[i0 + k] = pv[k];
        if constexpr (!f32) params[i0 + k] = rounded_param(pv[k], step_seed, index_base + i0 + k);
      }
    }
  }
}

// params (n) = master (n) rounded stochastically with the bits adamw_kernel<bf16> draws at the
// same step: the bf16 weights a resumed run had before it stopped (checkpoints keep the master).
__global__ void round_master_kernel(__nv_bfloat16* __restrict__ params, const float* __restrict__ master, size_t n,
                                    uint64_t step_seed, size_t index_base) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    params[i] = rounded_param(master[i], step_seed, index_base + i);
}

// Sum of the block's values, the same order every run; the total is valid in thread 0.
__device__ __forceinline__ double block_sum(double v) {
  UL_STATIC_SMEM(double, s_warp, [kThreads / 32]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int k = 0; k < int(blockDim.x / 32); k++) total += s_warp[k];
  return total;
}

// Grid (blocks), block (kThreads): partial[b] = sum of x[i]^2 over i = b*kThreads + tid (+ grid stride).
// Each thread keeps 4 sums over every 4th of its elements, so 4 loads are in flight at once (the
// kernel waits on memory, not arithmetic), then adds them in a fixed order. In double, as the CPU
// sums: a float square is exact in double, and a billion-parameter model's sum kept in float was
// off by up to ~1e-5 relative (the clip factor with it); the kernel is memory-bound either way.
__global__ void sum_squares_partial_kernel(double* __restrict__ partial, const float* __restrict__ x, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (size_t i0 = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i0 < n; i0 += 4 * stride) {
    float v[4];
    UL_UNROLL for (int u = 0; u < 4; u++) v[u] = i0 + u * stride < n ? x[i0 + u * stride] : 0.f;
    UL_UNROLL for (int u = 0; u < 4; u++) acc[u] += double(v[u]) * double(v[u]);
  }
  double s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: *out = sum of partial[0 .. count), each thread a strided subset, then block_sum.
__global__ void sum_squares_final_kernel(double* __restrict__ out, const double* __restrict__ partial, int count) {
  double s = 0.0;
  for (int k = threadIdx.x; k < count; k += blockDim.x) s += partial[k];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// p (null for an f32 model's absent master) sits on a boundary of k of its elements.
template <size_t k, class T>
bool aligned_to(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (k * sizeof(T)) == 0;
}

size_t norm_blocks(size_t n) {
  const size_t b = (n + kNormPerBlock - 1) / kNormPerBlock;
  return b < 1 ? 1 : (b > kMaxNormBlocks ? kMaxNormBlocks : b);
}

}  // namespace

template <class Tp>
void adamw_update(Tp* params, float* master, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t, uint64_t seed,
                  cudaStream_t s, size_t index_base, DecaySegments segments) {
  constexpr bool f32 = std::is_same<Tp, float>::value;
  if (f32 != (master == nullptr))
    throw std::runtime_error(std::string("adamw_update: ") +
                             (f32 ? "f32 parameters are their own master weights: pass master = null"
                                  : "bf16 parameters need f32 master weights"));
  if (n == 0) return;
  // The step constants exactly as cpu::adamw_update computes them.
  const float bc1 = 1.0f - std::pow(beta1, float(t));
  const float bc2 = 1.0f - std::pow(beta2, float(t));
  const float step_size = lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const uint64_t step_seed = mix64(mix64(seed) ^ uint64_t(uint32_t(t)));
  // Four elements a thread at a time where every array starts on a 4-element boundary (a ZeRO
  // shard may start anywhere): one 16-byte load per f32 array instead of four 4-byte ones.
  constexpr size_t kVec = 4;
  const bool vec = aligned_to<kVec>(params) && aligned_to<kVec>(master) && aligned_to<kVec>(grad) &&
                   aligned_to<kVec>(m) && aligned_to<kVec>(v);
  const unsigned blocks = capped_blocks(vec ? (n + kVec - 1) / kVec : n, kThreads, kMaxUpdateBlocks);
  if (vec)
    launch("adamw_update", adamw_kernel<Tp, kVec>, dim3(blocks), dim3(kThreads), 0, s, params, master, grad, m, v, n,
           lr, beta1, beta2, eps, weight_decay, grad_scale, step_size, inv_sqrt_bc2, step_seed, index_base, segments);
  else
    launch("adamw_update", adamw_kernel<Tp, 1>, dim3(blocks), dim3(kThreads), 0, s, params, master, grad, m, v, n,
           lr, beta1, beta2, eps, weight_decay, grad_scale, step_size, inv_sqrt_bc2, step_seed, index_base, segments);
}

void round_master(__nv_bfloat16* params, const float* master, size_t n, int t, uint64_t seed, cudaStream_t s,
                  size_t index_base) {
  if (n == 0) return;
  const uint64_t step_seed = mix64(mix64(seed) ^ uint64_t(uint32_t(t)));  // as adamw_update
  const unsigned blocks = capped_blocks(n, kThreads, kMaxUpdateBlocks);
  launch("round_master", round_master_kernel, dim3(blocks), dim3(kThreads), 0, s, params, master, n, step_seed,
         index_base);
}

size_t sum_squares_scratch_bytes(size_t n) { return norm_blocks(n) * sizeof(double); }

void sum_squares(double* out, const float* x, size_t n, double* scratch, cudaStream_t s) {
  if (n == 0) {
    UL_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  const size_t blocks = norm_blocks(n);
  launch("sum_squares_partial", sum_squares_partial_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, s, scratch,
         x, n);
  launch("sum_squares_final", sum_squares_final_kernel, dim3(1), dim3(kThreads), 0, s, out, scratch, int(blocks));
}

namespace {
// The host-returning sum_squares' scratch, kept per host thread (each local rank is one) and device,
// grown as needed: the gradient norm runs every step, and a cudaMalloc / cudaFree pair there
// would cost a device-wide synchronisation each time. Released at thread exit.
struct NormScratch {
  double* p = nullptr;
  size_t bytes = 0;
  NormScratch() = default;
  NormScratch(const NormScratch&) = delete;
  NormScratch& operator=(const NormScratch&) = delete;
  ~NormScratch() {
    if (p) cudaFree(p);  // at process exit the runtime may be unloading: nothing is lost then
  }
  double* get(size_t need) {
    if (need > bytes) {
      if (p) UL_CUDA_CHECK(cudaFree(p));
      p = nullptr;
      bytes = 0;
      UL_CUDA_CHECK(cudaMalloc(&p, need));
      bytes = need;
    }
    return p;
  }
};
}  // namespace

double sum_squares(const float* x, size_t n, cudaStream_t s) {
  thread_local std::map<int, NormScratch> per_device;
  int dev = 0;
  UL_CUDA_CHECK(cudaGetDevice(&dev));
  double* scratch = per_device[dev].get(sum_squares_scratch_bytes(n) + sizeof(double));
  double* out = scratch + norm_blocks(n);
  sum_squares(out, x, n, scratch, s);
  double result = 0.0;
  UL_CUDA_CHECK(cudaMemcpyAsync(&result, out, sizeof(double), cudaMemcpyDeviceToHost, s));
  UL_CUDA_CHECK(cudaStreamSynchronize(s));
  return result;
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, size_t, float, float, float, float,
                                  float, float, int, uint64_t, cudaStream_t, size_t, DecaySegments);
template void adamw_update<__nv_bfloat16>(__nv_bfloat16*, float*, const float*, float*, float*, size_t, float, float,
                                          float, float, float, float, int, uint64_t, cudaStream_t, size_t,
                                          DecaySegments);

}  // namespace cuda
}  // namespace ul
