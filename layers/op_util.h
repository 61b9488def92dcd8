// Small helpers shared by the autograd ops in layers/*.cpp.
#pragma once
#include <stdexcept>
#include <string>

#include "engine/context.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

// The gradient buffer an op's backward adds into for input t: t's slot when t needs a gradient,
// else throwaway zeroed scratch (so backward kernels never branch on "is this gradient wanted").
inline float* grad_or_scratch(const Tensor& t) {
  Context& c = ctx();
  if (t.requires_grad()) return c.tape.gradf(t);
  return static_cast<float*>(c.arena.alloc_zero(t.nbytes()));
}

// The same for any element type (a bf16 tensor's gradient is bf16).
template <class T>
inline T* grad_or_scratch_as(const Tensor& t) {
  Context& c = ctx();
  if (t.requires_grad()) return static_cast<T*>(c.tape.grad(t));
  return static_cast<T*>(c.arena.alloc_zero(t.nbytes()));
}

// The same for a backward that writes every element of t's gradient (Tape::grad_to_overwrite):
// overwrite says whether it stores (the first writer; the buffer is not zeroed) or adds.
template <class T>
inline T* grad_to_overwrite_as(const Tensor& t, bool& overwrite) {
  Context& c = ctx();
  if (t.requires_grad()) return static_cast<T*>(c.tape.grad_to_overwrite(t, overwrite));
  overwrite = true;
  return static_cast<T*>(c.arena.alloc(t.nbytes()));
}

// Parameter gradients are f32 whatever the parameters' dtype (bf16 training keeps f32 gradients
// and f32 master weights): the buffer a weight's gradient is added into, or f32 scratch.
inline float* weight_grad_or_scratch(const Tensor& w) {
  Context& c = ctx();
  if (w.requires_grad()) return c.tape.gradf(w);
  return static_cast<float*>(c.arena.alloc_zero(size_t(w.numel()) * sizeof(float)));
}

// The CPU backend runs f32 tensors in host memory; other devices dispatch to their backend.
inline void require_cpu_f32(const Tensor& t, const char* op) {
  if (t.device != Device::cpu)
    throw std::runtime_error(std::string(op) + ": the " + device_name(t.device) + " backend is not built in");
  if (t.dtype != DType::f32)
    throw std::runtime_error(std::string(op) + ": CPU backend expects f32, got " + dtype_name(t.dtype));
}

#if ULYSSES_HAVE_CUDA
// The stream ops launch on: the legacy default stream, which the synchronous cudaMemcpy of the
// device layer (engine/cuda_runtime.cu) is ordered with.
inline cudaStream_t op_stream() { return nullptr; }

// The CUDA path of an op: checks that x and `others` share x's device and dtype and that the
// context is a CUDA one (its arena holds the outputs), then calls f with a value of the element
// type, float or __nv_bfloat16, so the op writes its launches once for both:
//   dispatch_cuda(x, {&w, &b}, "layernorm", [&](auto tag) { using T = decltype(tag); ... });
template <class F>
void dispatch_cuda(const Tensor& x, std::initializer_list<const Tensor*> others, const char* op, F&& f) {
  if (ctx().device != x.device)
    throw std::runtime_error(std::string(op) + ": input on " + device_name(x.device) + " but the context is on " +
                             device_name(ctx().device));
  for (const Tensor* t : others)
    if (t->device != x.device || t->dtype != x.dtype)
      throw std::runtime_error(std::string(op) + ": expected every input like " + x.str() + ", got " + t->str());
  switch (x.dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    default: throw std::runtime_error(std::string(op) + ": CUDA backend expects f32 or bf16, got " + dtype_name(x.dtype));
  }
}
#endif

// A row count as the kernels take it (int): refused past 2^31 - 1, not wrapped (train's flags keep
// B * T below it; a fork or a test calling an op directly meets this instead of a wrong answer).
inline int row_count(int64_t n, const char* what) {
  if (n > 2147483647)
    throw std::runtime_error(std::string(what) + ": " + std::to_string(n) + " rows, past the 2^31 - 1 an op takes");
  return int(n);
}
inline int last_dim(const Tensor& t) { return int(t.size(-1)); }
inline int rows(const Tensor& t) {  // (every op asks: the tensor's text is made only for the error)
  const int64_t n = t.numel() / t.size(-1);
  return n > 2147483647 ? row_count(n, t.str().c_str()) : int(n);
}

}  // namespace ul
