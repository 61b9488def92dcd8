#include "engine/autograd.h"

#include <stdexcept>
#include <string>

namespace ul {

int Tape::param_slot(void* grad) {
  if (slots_.size() != n_param_slots_)
    throw std::runtime_error("autograd: parameter slots must be made before any activation slot");
  slots_.push_back({grad, 0});
  return int(n_param_slots_++);
}

Tensor Tape::track(Tensor t) { return track(t, t.dtype); }

Tensor Tape::track(Tensor t, DType grad_dtype) {
  t.gid = int(slots_.size());
  slots_.push_back({nullptr, size_t(t.numel()) * dtype_size(grad_dtype)});
  return t;
}

void* Tape::grad(const Tensor& t) {
  if (t.gid < 0 || size_t(t.gid) >= slots_.size())
    throw std::runtime_error("autograd: tensor " + t.str() + " has no gradient slot");
  Slot& s = slots_[t.gid];
  if (!s.grad) s.grad = arena_.alloc_zero(s.bytes);
  return s.grad;
}

void* Tape::grad_if_any(const Tensor& t) const {
  if (t.gid < 0 || size_t(t.gid) >= slots_.size()) return nullptr;
  return slots_[t.gid].grad;
}

void Tape::push(const char* name, std::function<void()> backward) {
  nodes_.push_back({name, std::move(backward)});
}

void Tape::backward() {
  // Nodes may push nothing during backward; a recompute node runs its own sub-walk (see recompute).
  for (size_t i = nodes_.size(); i-- > 0;) {
    nodes_[i].fn();
  }
  clear();
}

void Tape::clear() {
  nodes_.clear();
  slots_.resize(n_param_slots_);
}

void Tape::clear_params() {
  nodes_.clear();
  slots_.clear();
  n_param_slots_ = 0;
}

}  // namespace ul
