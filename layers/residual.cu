// Residual add on CUDA (the math is in residual.h; the CPU loop it must match is in residual.cpp).
// T is float or __nv_bfloat16; every sum is taken in float and rounded to T once.
//
// forward, backward   grid-stride loops over 16-byte packs (V = 4 floats or 8 bf16 per access)
//                     when every pointer is 16-byte aligned, then a scalar loop over the last
//                     n % V elements; unaligned pointers take the scalar path (V = 1) throughout.
// da and db may be one buffer (y = x + x): the backward is not __restrict__ there, and each thread
// stores da before it loads db, so the element gets both additions, as on the CPU. A gradient's
// first writer (Tape::grad_to_overwrite) stores 0 + dy there without reading it; with one buffer
// only da can be the first writer, and db then adds to what da stored.
#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "layers/residual.h"

namespace ul {
namespace cuda {
namespace {

// y = a + b.  y, a, b: (n)
template <class T, int V>
__global__ void residual_forward_kernel(T* __restrict__ y, const T* __restrict__ a, const T* __restrict__ b,
                                        int64_t n) {
  const int64_t packs = n / V;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const Pack<T, V> av = load_pack<V>(a + p * V), bv = load_pack<V>(b + p * V);
    Pack<T, V> yv;
    for (int k = 0; k < V; k++) yv.v[k] = from_float<T>(to_float(av.v[k]) + to_float(bv.v[k]));
    store_pack<V>(y + p * V, yv);
  }
  for (int64_t i = packs * V + grid_first(); i < n; i += grid_stride())
    y[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// da += dy, then db += dy (either = 0 + dy when it is not accumulated).  da, db, dy: (n); da == db
// allowed (then acc_b).
template <class T, int V>
__global__ void residual_backward_kernel(T* da, T* db, const T* __restrict__ dy, int64_t n, bool acc_a, bool acc_b) {
  const int64_t packs = n / V;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const Pack<T, V> dyv = load_pack<V>(dy + p * V);
    Pack<T, V> v;
    if (acc_a) v = load_pack<V>(da + p * V);
    for (int k = 0; k < V; k++) v.v[k] = from_float<T>((acc_a ? to_float(v.v[k]) : 0.f) + to_float(dyv.v[k]));
    store_pack<V>(da + p * V, v);
    if (acc_b) v = load_pack<V>(db + p * V);  // after the store: sees it when db is da
    for (int k = 0; k < V; k++) v.v[k] = from_float<T>((acc_b ? to_float(v.v[k]) : 0.f) + to_float(dyv.v[k]));
    store_pack<V>(db + p * V, v);
  }
  for (int64_t i = packs * V + grid_first(); i < n; i += grid_stride()) {
    const float d = to_float(dy[i]);
    da[i] = from_float<T>((acc_a ? to_float(da[i]) : 0.f) + d);
    db[i] = from_float<T>((acc_b ? to_float(db[i]) : 0.f) + d);
  }
}

}  // namespace

template <class T>
void residual_forward(T* y, const T* a, const T* b, int64_t n, cudaStream_t s) {
  if (n == 0) return;  // a grid of no blocks is an invalid launch
  constexpr int V = kPackElems<T>;
  if (pack_aligned({y, a, b}))
    launch("residual_forward", residual_forward_kernel<T, V>, dim3(elementwise_blocks(n / V)),
           dim3(kElementwiseThreads), 0, s, y, a, b, n);
  else
    launch("residual_forward", residual_forward_kernel<T, 1>, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads),
           0, s, y, a, b, n);
}

template <class T>
void residual_backward(T* da, T* db, const T* dy, int64_t n, cudaStream_t s, bool acc_a, bool acc_b) {
  if (n == 0) return;
  constexpr int V = kPackElems<T>;
  if (pack_aligned({da, db, dy}))
    launch("residual_backward", residual_backward_kernel<T, V>, dim3(elementwise_blocks(n / V)),
           dim3(kElementwiseThreads), 0, s, da, db, dy, n, acc_a, acc_b);
  else
    launch("residual_backward", residual_backward_kernel<T, 1>, dim3(elementwise_blocks(n)),
           dim3(kElementwiseThreads), 0, s, da, db, dy, n, acc_a, acc_b);
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                              cudaStream_t);
template void residual_backward<float>(float*, float*, const float*, int64_t, cudaStream_t, bool, bool);
template void residual_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                               cudaStream_t, bool, bool);

}  // namespace cuda
}  // namespace ul
