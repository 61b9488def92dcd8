#include "layers/layernorm.h"

#include <cmath>
#include <vector>

#include "layers/op_util.h"
#include "layers/row_sums.h"

namespace ul {
namespace cpu {

template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* xr = x + size_t(n) * C;
    T* yr = y + size_t(n) * C;
    // The sums in double: a float mean is off by about C ulps of the row's offset, and every
    // normalised value moves by that error times rstd (a row of 768 values near 1000 with spread
    // 0.1 came out 8e-3 wrong). The loops are scalar either way (no reassociation), so it is free.
    double sum = 0;
    for (int c = 0; c < C; c++) sum += xr[c];
    const T m = T(sum / C);
    double var = 0;
    for (int c = 0; c < C; c++) var += (double(xr[c]) - double(m)) * (double(xr[c]) - double(m));
    const T s = T(1.0 / std::sqrt(var / C + kLayerNormEps));
    for (int c = 0; c < C; c++) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean,
                        const T* rstd, int N, int C) {
  // dw, db are sums over rows, in a fixed order (layers/row_sums.h): [dw | db] per chunk.
  const std::vector<T> sums = chunked_row_sums<T>(N, 2 * C, [&](int n, T* part) {
    const T* xr = x + size_t(n) * C;
    const T* dyr = dy + size_t(n) * C;
    T* dxr = dx + size_t(n) * C;
    T m = mean[n], s = rstd[n];
    T g_mean = 0, gx_mean = 0;
    for (int c = 0; c < C; c++) {
      T xhat = (xr[c] - m) * s;
      T g = dyr[c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= C;
    gx_mean /= C;
    for (int c = 0; c < C; c++) {
      T xhat = (xr[c] - m) * s;
      T g = dyr[c] * w[c];
      dxr[c] += s * (g - g_mean - xhat * gx_mean);
      part[c] += dyr[c] * xhat;
      part[C + c] += dyr[c];
    }
  });
  for (int c = 0; c < C; c++) {
    dw[c] += sums[size_t(c)];
    db[c] += sums[size_t(C + c)];
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int, int);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors; mean and rstd are f32 either way.
static Tensor layernorm_cuda(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int C = last_dim(x), N = rows(x);
  check_shape(w, {C}, "layernorm weight");
  check_shape(b, {C}, "layernorm bias");
  Tensor y;
  dispatch_cuda(x, {&w, &b}, "layernorm", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(x.shape, x.dtype);
    Tensor mean = c.empty({N}), rstd = c.empty({N});
    cuda::layernorm_forward(y.as<T>(), mean.f32(), rstd.f32(), x.as<T>(), w.as<T>(), b.as<T>(), N, C, op_stream());
    if (!needs_grad({&x, &w, &b})) return;
    y = c.tape.track(y);
    c.tape.push("layernorm", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      // Gradient buffers first: one allocated lazily inside the scratch scope would be released with it.
      T* dx = grad_or_scratch_as<T>(x);
      float* dw = weight_grad_or_scratch(w);  // parameter gradients are f32 whatever T is
      float* db = weight_grad_or_scratch(b);
      ArenaScope scope(ctx().arena);
      float* scratch = static_cast<float*>(ctx().arena.alloc(cuda::layernorm_backward_scratch_bytes(N, C)));
      cuda::layernorm_backward(dx, dw, db, dy, x.as<T>(), w.as<T>(), mean.f32(), rstd.f32(), scratch, N, C,
                               op_stream());
    });
  });
  return y;
}
#endif

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return layernorm_cuda(x, w, b);
#endif
  require_cpu_f32(x, "layernorm");
  const int C = last_dim(x), N = rows(x);
  check_shape(w, {C}, "layernorm weight");
  check_shape(b, {C}, "layernorm bias");
  Context& c = ctx();
  Tensor y = c.empty(x.shape);
  Tensor mean = c.empty({N}), rstd = c.empty({N});
  cpu::layernorm_forward(y.f32(), mean.f32(), rstd.f32(), x.f32(), w.f32(), b.f32(), N, C);
  if (needs_grad({&x, &w, &b})) {
    y = c.tape.track(y);
    c.tape.push("layernorm", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::layernorm_backward(grad_or_scratch(x), grad_or_scratch(w), grad_or_scratch(b), dy, x.f32(),
                              w.f32(), mean.f32(), rstd.f32(), N, C);
    });
  }
  return y;
}

}  // namespace ul
