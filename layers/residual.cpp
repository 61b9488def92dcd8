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

namespace {
void check_same_shape(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape)
    throw std::runtime_error("add: operands must have the same shape, got " + a.shape.str() + " and " +
                             b.shape.str());
}
}  // namespace

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors.
static Tensor add_cuda(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b);
  const int64_t n = a.numel();
  Tensor y;
  dispatch_cuda(a, {&b}, "add", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(a.shape, a.dtype);
    cuda::residual_forward(y.as<T>(), a.as<T>(), b.as<T>(), n, op_stream());
    if (!needs_grad({&a, &b})) return;
    y = c.tape.track(y);
    c.tape.push("add", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      // For a + a both are the same buffer, which the kernel allows (it gets 2 dy): the first call
      // may make it fresh (overwrite a), the second then finds it made (add b).
      bool overwrite_a = false, overwrite_b = false;  // each written whole: a first writer stores
      T* da = grad_to_overwrite_as<T>(a, overwrite_a);
      T* db = grad_to_overwrite_as<T>(b, overwrite_b);
      cuda::residual_backward(da, db, dy, n, op_stream(), !overwrite_a, !overwrite_b);
    });
  });
  return y;
}
#endif

Tensor add(const Tensor& a, const Tensor& b) {
#if ULYSSES_HAVE_CUDA
  if (a.device == Device::cuda) return add_cuda(a, b);
#endif
  require_cpu_f32(a, "add");
  require_cpu_f32(b, "add");
  check_same_shape(a, b);
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
