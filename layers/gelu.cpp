#include "layers/gelu.h"

#include <cmath>

#include "layers/cpu_exp.h"
#include "layers/op_util.h"

namespace ul {
namespace cpu {

// The kernels use 0.5 (1 + tanh(u)) = sigmoid(2 u) = 1 / (1 + exp(-2 u)): one exp (exp_simd,
// which the loops vectorize), and no cancellation in 1 + tanh(u) where tanh(u) is near -1.
template <class T>
inline T gelu_sigmoid(T v) {
  const T u = T(kGeluScale) * (v + T(kGeluCubic) * v * v * v);
  return T(1) / (T(1) + exp_simd(T(-2) * u));
}

// x, y: (n)
template <class T>
void gelu_forward(T* y, const T* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * gelu_sigmoid(x[i]);
}

// With u = k (x + a x^3), t = tanh(u) and s = sigmoid(2 u) = 0.5 (1 + t), so 1 - t^2 = 4 s (1 - s):
//   dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2) = s + 2 x s (1 - s) k (1 + 3 a x^2)
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, int64_t n) {
  const T k = T(kGeluScale), a3 = T(3 * kGeluCubic);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const T v = x[i], s = gelu_sigmoid(v);
    dx[i] += dy[i] * (s + T(2) * v * s * (T(1) - s) * k * (T(1) + a3 * v * v));
  }
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors.
static Tensor gelu_cuda(const Tensor& x) {
  const int64_t n = x.numel();
  Tensor y;
  dispatch_cuda(x, {}, "gelu", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(x.shape, x.dtype);
    cuda::gelu_forward(y.as<T>(), x.as<T>(), n, op_stream());
    if (!needs_grad({&x})) return;
    y = c.tape.track(y);
    c.tape.push("gelu", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      bool overwrite = false;  // dx is written whole: its first writer stores it
      T* dx = grad_to_overwrite_as<T>(x, overwrite);
      cuda::gelu_backward(dx, dy, x.as<T>(), n, op_stream(), !overwrite);
    });
  });
  return y;
}
#endif

Tensor gelu(const Tensor& x) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return gelu_cuda(x);
#endif
  require_cpu_f32(x, "gelu");
  const int64_t n = x.numel();
  Context& c = ctx();
  Tensor y = c.empty(x.shape);
  cpu::gelu_forward(y.f32(), x.f32(), n);
  if (needs_grad({&x})) {
    y = c.tape.track(y);
    c.tape.push("gelu", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::gelu_backward(grad_or_scratch(x), dy, x.f32(), n);
    });
  }
  return y;
}

}  // namespace ul
