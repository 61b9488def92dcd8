#include "layers/residual.h"

#include <stdexcept>

#include "layers/op_util.h"

namespace ul {
namespace cpu {

// a, b, y: (n)
template <class T>
void residual_forward(T* y, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

// da and db may be the same buffer (y = x + x): each add is applied in turn, so x gets 2 dy.
template <class T>
void residual_backward(T* da, T* db, const T* dy, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    da[i] += dy[i];
    db[i] += dy[i];
  }
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);
template void residual_backward<float>(float*, float*, const float*, int64_t);
template void residual_backward<double>(double*, double*, const double*, int64_t);
}  // namespace cpu

Tensor add(const Tensor& a, const Tensor& b) {
  require_cpu_f32(a, "add");
  require_cpu_f32(b, "add");
  if (a.shape != b.shape)
    throw std::runtime_error("add: operands must have the same shape, got " + a.shape.str() + " and " +
                             b.shape.str());
  const int64_t n = a.numel();
  Context& c = ctx();
  Tensor y = c.empty(a.shape);
  cpu::residual_forward(y.f32(), a.f32(), b.f32(), n);
  if (needs_grad({&a, &b})) {
    y = c.tape.track(y);
    c.tape.push("add", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::residual_backward(grad_or_scratch(a), grad_or_scratch(b), dy, n);
    });
  }
  return y;
}

}  // namespace ul
