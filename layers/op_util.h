// Small helpers shared by the autograd ops in layers/*.cpp.
#pragma once
#include <stdexcept>
#include <string>

#include "engine/context.h"

namespace ul {

// The gradient buffer an op's backward adds into for input t: t's slot when t needs a gradient,
// else throwaway zeroed scratch (so backward kernels never branch on "is this gradient wanted").
inline float* grad_or_scratch(const Tensor& t) {
  Context& c = ctx();
  if (t.requires_grad()) return c.tape.gradf(t);
  return static_cast<float*>(c.arena.alloc_zero(t.nbytes()));
}

// The CPU backend runs f32 tensors in host memory; other devices dispatch to their backend.
inline void require_cpu_f32(const Tensor& t, const char* op) {
  if (t.device != Device::cpu)
    throw std::runtime_error(std::string(op) + ": the " + device_name(t.device) + " backend is not built in");
  if (t.dtype != DType::f32)
    throw std::runtime_error(std::string(op) + ": CPU backend expects f32, got " + dtype_name(t.dtype));
}

inline int last_dim(const Tensor& t) { return int(t.size(-1)); }
inline int rows(const Tensor& t) { return int(t.numel() / t.size(-1)); }

}  // namespace ul
