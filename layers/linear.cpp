#include "layers/linear.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "layers/gemm_blocks.h"
#include "layers/op_util.h"

namespace ul {
namespace cpu {

// Row-major maps, so the (N, C) buffers read as the matrices the math names.
template <class T> using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T> using MapM = Eigen::Map<RowMat<T>>;
template <class T> using MapCM = Eigen::Map<const RowMat<T>>;
template <class T> using MapRowV = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T> using MapCRowV = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

template <class T> void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC) {
  MapM<T> Y(y, N, OC);                 // (N, OC)
  MapCM<T> X(x, N, C), W(w, OC, C);    // (N, C), (OC, C)
  // Eigen's GEMM accumulates into its destination (an `=` first zero-fills it), so starting from the
  // broadcast bias and adding the product costs no extra pass over y.
  if (b)
    Y.rowwise() = MapCRowV<T>(b, OC);
  else
    Y.setZero();
  gemm_add(Y, X, W.transpose());       // (N, C)(C, OC)
}

// Any of dx, dw, db may be null: that gradient is not wanted and its GEMM is skipped.
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int N, int C, int OC) {
  MapCM<T> DY(dy, N, OC), X(x, N, C), W(w, OC, C);
  if (dx) gemm_add(MapM<T>(dx, N, C), DY, W);               // (N, OC)(OC, C)
  if (dw) gemm_add(MapM<T>(dw, OC, C), DY.transpose(), X);  // (OC, N)(N, C)
  if (db) MapRowV<T>(db, OC) += DY.colwise().sum();         // (OC): a vectorised sum of rows
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int, int);
template void linear_forward<double>(double*, const double*, const double*, const double*, int, int, int);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int);
template void linear_backward<double>(double*, double*, double*, const double*, const double*, const double*, int,
                                      int, int);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors; dw and db are f32 either way.
static Tensor linear_cuda(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int C = last_dim(x), N = rows(x);
  if (w.ndim() != 2 || w.size(1) != C)
    throw std::runtime_error("linear: weight must be (OC, " + std::to_string(C) + ") for input " + x.shape.str() +
                             ", got " + w.shape.str());
  const int OC = int(w.size(0));
  if (b.defined()) check_shape(b, {OC}, "linear bias");
  Tensor y;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    Shape ys = x.shape;
    ys.d[ys.ndim - 1] = OC;
    y = c.empty(ys, x.dtype);
    cuda::linear_forward(y.as<T>(), x.as<T>(), w.as<T>(), b.defined() ? b.as<T>() : nullptr, N, C, OC, op_stream());
    if (!needs_grad({&x, &w, &b})) return;
    y = c.tape.track(y);
    c.tape.push("linear", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      // Only the gradients someone needs, fetched before the scratch scope (a gradient allocated
      // lazily inside it would be released with it).
      // dx is written whole by its GEMM: the first writer stores it (no zeroed buffer to read).
      bool overwrite_dx = false;
      T* dx = x.requires_grad() ? grad_to_overwrite_as<T>(x, overwrite_dx) : nullptr;
      float* dw = w.requires_grad() ? weight_grad_or_scratch(w) : nullptr;
      float* db = b.defined() && b.requires_grad() ? weight_grad_or_scratch(b) : nullptr;
      ArenaScope scope(ctx().arena);
      float* scratch =
          db ? static_cast<float*>(ctx().arena.alloc(cuda::linear_backward_scratch_bytes(N, OC))) : nullptr;
      cuda::linear_backward(dx, dw, db, dy, x.as<T>(), w.as<T>(), scratch, N, C, OC, op_stream(), !overwrite_dx);
    });
  };
  if (b.defined())
    dispatch_cuda(x, {&w, &b}, "linear", run);
  else
    dispatch_cuda(x, {&w}, "linear", run);
  return y;
}
#endif

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return linear_cuda(x, w, b);
#endif
  require_cpu_f32(x, "linear");
  require_cpu_f32(w, "linear weight");
  const int C = last_dim(x), N = rows(x);
  if (w.ndim() != 2 || w.size(1) != C)
    throw std::runtime_error("linear: weight must be (OC, " + std::to_string(C) + ") for input " + x.shape.str() +
                             ", got " + w.shape.str());
  const int OC = int(w.size(0));
  if (b.defined()) {
    require_cpu_f32(b, "linear bias");
    check_shape(b, {OC}, "linear bias");
  }
  Context& c = ctx();
  Shape ys = x.shape;
  ys.d[ys.ndim - 1] = OC;
  Tensor y = c.empty(ys);
  cpu::linear_forward(y.f32(), x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, N, C, OC);
  if (needs_grad({&x, &w, &b})) {
    y = c.tape.track(y);
    c.tape.push("linear", [=] {
      Tape& tape = ctx().tape;
      const float* dy = static_cast<const float*>(tape.grad_if_any(y));
      if (!dy) return;
      // Only the gradients someone needs: each skipped one saves a GEMM as large as the forward.
      float* dx = x.requires_grad() ? tape.gradf(x) : nullptr;
      float* dw = w.requires_grad() ? tape.gradf(w) : nullptr;
      float* db = b.defined() && b.requires_grad() ? tape.gradf(b) : nullptr;
      cpu::linear_backward(dx, dw, db, dy, x.f32(), w.f32(), N, C, OC);
    });
  }
  return y;
}

}  // namespace ul
