#include "layers/swiglu.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "layers/cpu_exp.h"
#include "layers/op_util.h"

namespace ul {
namespace cpu {

namespace {
// exp_simd: the row loops below vectorize (libm's expf would keep them scalar).
template <class T> inline T sigmoid(T g) { return T(1) / (T(1) + exp_simd(-g)); }
}  // namespace

// x: (N, 2F) rows [gate | up],  y: (N, F)
template <class T>
void swiglu_forward(T* y, const T* x, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* gate = x + size_t(n) * 2 * F;
    const T* up = gate + F;
    T* yr = y + size_t(n) * F;
    for (int f = 0; f < F; f++) yr[f] = gate[f] * sigmoid(gate[f]) * up[f];
  }
}

template <class T>
void swiglu_backward(T* dx, const T* dy, const T* x, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* gate = x + size_t(n) * 2 * F;
    const T* up = gate + F;
    const T* dyr = dy + size_t(n) * F;
    T* dgate = dx + size_t(n) * 2 * F;
    T* dup = dgate + F;
    for (int f = 0; f < F; f++) {
      const T g = gate[f], s = sigmoid(g);
      dgate[f] += dyr[f] * up[f] * s * (T(1) + g * (T(1) - s));
      dup[f] += dyr[f] * g * s;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int, int);
template void swiglu_forward<double>(double*, const double*, int, int);
template void swiglu_backward<float>(float*, const float*, const float*, int, int);
template void swiglu_backward<double>(double*, const double*, const double*, int, int);
}  // namespace cpu

namespace {
// The output shape (..., F) of x: (..., 2F); refuses an odd last dim.
Shape swiglu_out_shape(const Tensor& x) {
  const int C = last_dim(x);
  if (C % 2 != 0)
    throw std::runtime_error("swiglu: last dim must hold [gate | up] of equal width, got odd size " +
                             std::to_string(C) + " in " + x.shape.str());
  Shape ys = x.shape;
  ys.d[ys.ndim - 1] = C / 2;
  return ys;
}
}  // namespace

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors.
static Tensor swiglu_cuda(const Tensor& x) {
  const Shape ys = swiglu_out_shape(x);
  const int N = rows(x), F = last_dim(x) / 2;
  Tensor y;
  dispatch_cuda(x, {}, "swiglu", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(ys, x.dtype);
    cuda::swiglu_forward(y.as<T>(), x.as<T>(), N, F, op_stream());
    if (!needs_grad({&x})) return;
    y = c.tape.track(y);
    c.tape.push("swiglu", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      bool overwrite = false;  // dx is written whole: its first writer stores it
      T* dx = grad_to_overwrite_as<T>(x, overwrite);
      cuda::swiglu_backward(dx, dy, x.as<T>(), N, F, op_stream(), !overwrite);
    });
  });
  return y;
}
#endif

Tensor swiglu(const Tensor& x) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return swiglu_cuda(x);
#endif
  require_cpu_f32(x, "swiglu");
  const Shape ys = swiglu_out_shape(x);
  const int N = rows(x), F = last_dim(x) / 2;
  Context& c = ctx();
  Tensor y = c.empty(ys);
  cpu::swiglu_forward(y.f32(), x.f32(), N, F);
  if (needs_grad({&x})) {
    y = c.tape.track(y);
    c.tape.push("swiglu", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::swiglu_backward(grad_or_scratch(x), dy, x.f32(), N, F);
    });
  }
  return y;
}

}  // namespace ul
