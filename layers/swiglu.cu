// SwiGLU on CUDA (the math is in swiglu.h; the CPU loop it must match is in swiglu.cpp).
// T is float or __nv_bfloat16; every value is computed in float and rounded to T once.
//
// forward, backward   grid-stride loops over the N * F outputs in packs of V: 16-byte packs
//                     (4 floats or 8 bf16) when F is a multiple of V and the pointers are 16-byte
//                     aligned (then the gate and up halves of every row are aligned too, and a
//                     pack never straddles two rows), single elements (V = 1) otherwise.
#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "layers/swiglu.h"

namespace ul {
namespace cuda {
namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

// x: (N, 2F) rows [gate | up],  y: (N, F).  Pack p covers y[n][f .. f + V).
template <class T, int V>
__global__ void swiglu_forward_kernel(T* __restrict__ y, const T* __restrict__ x, int N, int F) {
  const int64_t packs_per_row = F / V, packs = int64_t(N) * packs_per_row;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const int64_t n = p / packs_per_row, f = (p % packs_per_row) * V;
    const Pack<T, V> gv = load_pack<V>(x + n * 2 * F + f), uv = load_pack<V>(x + n * 2 * F + F + f);
    Pack<T, V> yv;
    for (int k = 0; k < V; k++) {
      const float g = to_float(gv.v[k]);
      yv.v[k] = from_float<T>(g * sigmoid(g) * to_float(uv.v[k]));
    }
    store_pack<V>(y + n * F + f, yv);
  }
}

// dgate += dy * up * s (1 + g (1 - s)),  dup += dy * g * s,  s = sigmoid(g).
// dx, x: (N, 2F), dy: (N, F)
template <class T, int V>
__global__ void swiglu_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, int N,
                                       int F, bool accumulate) {
  const int64_t packs_per_row = F / V, packs = int64_t(N) * packs_per_row;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const int64_t n = p / packs_per_row, f = (p % packs_per_row) * V;
    const int64_t gate = n * 2 * F + f, up = gate + F;
    const Pack<T, V> gv = load_pack<V>(x + gate), uv = load_pack<V>(x + up), dyv = load_pack<V>(dy + n * F + f);
    Pack<T, V> dgv, duv;  // read only when adding: the first writer stores 0 + the term
    if (accumulate) {
      dgv = load_pack<V>(dx + gate);
      duv = load_pack<V>(dx + up);
    }
    for (int k = 0; k < V; k++) {
      const float g = to_float(gv.v[k]), u = to_float(uv.v[k]), d = to_float(dyv.v[k]), sg = sigmoid(g);
      dgv.v[k] = from_float<T>((accumulate ? to_float(dgv.v[k]) : 0.f) + d * u * sg * (1.f + g * (1.f - sg)));
      duv.v[k] = from_float<T>((accumulate ? to_float(duv.v[k]) : 0.f) + d * g * sg);
    }
    store_pack<V>(dx + gate, dgv);
    store_pack<V>(dx + up, duv);
  }
}

}  // namespace

template <class T>
void swiglu_forward(T* y, const T* x, int N, int F, cudaStream_t s) {
  if (N == 0 || F == 0) return;  // a grid of no blocks is an invalid launch
  constexpr int V = kPackElems<T>;
  const int64_t NF = int64_t(N) * F;
  if (F % V == 0 && pack_aligned({y, x}))
    launch("swiglu_forward", swiglu_forward_kernel<T, V>, dim3(elementwise_blocks(NF / V)), dim3(kElementwiseThreads),
           0, s, y, x, N, F);
  else
    launch("swiglu_forward", swiglu_forward_kernel<T, 1>, dim3(elementwise_blocks(NF)), dim3(kElementwiseThreads), 0,
           s, y, x, N, F);
}

template <class T>
void swiglu_backward(T* dx, const T* dy, const T* x, int N, int F, cudaStream_t s, bool accumulate) {
  if (N == 0 || F == 0) return;
  constexpr int V = kPackElems<T>;
  const int64_t NF = int64_t(N) * F;
  if (F % V == 0 && pack_aligned({dx, dy, x}))
    launch("swiglu_backward", swiglu_backward_kernel<T, V>, dim3(elementwise_blocks(NF / V)),
           dim3(kElementwiseThreads), 0, s, dx, dy, x, N, F, accumulate);
  else
    launch("swiglu_backward", swiglu_backward_kernel<T, 1>, dim3(elementwise_blocks(NF)), dim3(kElementwiseThreads),
           0, s, dx, dy, x, N, F, accumulate);
}

template void swiglu_forward<float>(float*, const float*, int, int, cudaStream_t);
template void swiglu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int, int, cudaStream_t);
template void swiglu_backward<float>(float*, const float*, const float*, int, int, cudaStream_t, bool);
template void swiglu_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                                             cudaStream_t, bool);

}  // namespace cuda
}  // namespace ul
