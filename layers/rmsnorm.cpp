#include "layers/rmsnorm.h"

#include <cmath>
#include <limits>
#include <vector>

#include "layers/op_util.h"
#include "layers/row_sums.h"

namespace ul {
namespace cpu {

// x, y: (N, C), w: (C), rrms: (N) kept for the backward
template <class T>
void rmsnorm_forward(T* y, T* rrms, const T* x, const T* w, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* xr = x + size_t(n) * C;
    T* yr = y + size_t(n) * C;
    T ss = 0;
    for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
    T r = T(1) / std::sqrt(ss / C + T(eps));
    // A row past ~1.8e19 / sqrt(C) overflows the float sum: r would be 0, the row's output and
    // gradients silently 0 (a run blowing up would go on at loss log V). Summed again in double
    // there (the usual rows keep their bits; NaN stays NaN).
    if (std::isinf(ss)) {
      double wide = 0;
      for (int c = 0; c < C; c++) wide += double(xr[c]) * double(xr[c]);
      r = T(1.0 / std::sqrt(wide / C + eps));
    }
    for (int c = 0; c < C; c++) yr[c] = xr[c] * r * w[c];
    rrms[n] = r;
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rrms, int N, int C) {
  // dw is a sum over rows, in a fixed order (layers/row_sums.h).
  const std::vector<T> sums = chunked_row_sums<T>(N, C, [&](int n, T* part) {
    const T* xr = x + size_t(n) * C;
    const T* dyr = dy + size_t(n) * C;
    T* dxr = dx + size_t(n) * C;
    const T r = rrms[n];
    T gx_mean = 0;  // mean_c(g * x), g = dy * w
    for (int c = 0; c < C; c++) gx_mean += dyr[c] * w[c] * xr[c];
    gx_mean /= C;
    T k = r * r * gx_mean;
    // A row past ~1e19 (its r under 1.1e-19): r^2 is below the smallest normal float, 0 where
    // subnormals flush (engine/float_env.h), and dx lost its projection term, even its sign; r
    // times the mean first then stays in range. Only there: the usual rows keep their bits.
    if (r != 0 && r * r < std::numeric_limits<T>::min()) k = (r * gx_mean) * r;
    for (int c = 0; c < C; c++) {
      dxr[c] += r * (dyr[c] * w[c] - xr[c] * k);
      part[c] += dyr[c] * xr[c] * r;
    }
  });
  for (int c = 0; c < C; c++) dw[c] += sums[size_t(c)];
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int, int);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors; rrms is f32 either way.
static Tensor rmsnorm_cuda(const Tensor& x, const Tensor& w, float eps) {
  const int C = last_dim(x), N = rows(x);
  check_shape(w, {C}, "rmsnorm weight");
  Tensor y;
  dispatch_cuda(x, {&w}, "rmsnorm", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(x.shape, x.dtype);
    Tensor rrms = c.empty({N});
    cuda::rmsnorm_forward(y.as<T>(), rrms.f32(), x.as<T>(), w.as<T>(), N, C, op_stream(), eps);
    if (!needs_grad({&x, &w})) return;
    y = c.tape.track(y);
    c.tape.push("rmsnorm", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      // Gradient buffers first: one allocated lazily inside the scratch scope would be released with it.
      T* dx = grad_or_scratch_as<T>(x);
      float* dw = weight_grad_or_scratch(w);  // parameter gradients are f32 whatever T is
      ArenaScope scope(ctx().arena);
      float* scratch = static_cast<float*>(ctx().arena.alloc(cuda::rmsnorm_backward_scratch_bytes(N, C)));
      cuda::rmsnorm_backward(dx, dw, dy, x.as<T>(), w.as<T>(), rrms.f32(), scratch, N, C, op_stream());
    });
  });
  return y;
}
#endif

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  if (!(eps > 0) || !std::isfinite(eps)) throw std::runtime_error("rmsnorm: eps must be > 0, got " + std::to_string(eps));
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return rmsnorm_cuda(x, w, eps);
#endif
  require_cpu_f32(x, "rmsnorm");
  require_cpu_f32(w, "rmsnorm weight");
  const int C = last_dim(x), N = rows(x);
  check_shape(w, {C}, "rmsnorm weight");
  Context& c = ctx();
  Tensor y = c.empty(x.shape);
  Tensor rrms = c.empty({N});
  cpu::rmsnorm_forward(y.f32(), rrms.f32(), x.f32(), w.f32(), N, C, eps);
  if (needs_grad({&x, &w})) {
    y = c.tape.track(y);
    c.tape.push("rmsnorm", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::rmsnorm_backward(grad_or_scratch(x), grad_or_scratch(w), dy, x.f32(), w.f32(), rrms.f32(), N, C);
    });
  }
  return y;
}

}  // namespace ul
