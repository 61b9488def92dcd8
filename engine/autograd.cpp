#include "engine/autograd.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/device.h"

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

Tape::Slot& Tape::slot_of(const Tensor& t) {
  if (t.gid < 0 || size_t(t.gid) >= slots_.size())
    throw std::runtime_error("autograd: tensor " + t.str() + " has no gradient slot");
  return slots_[t.gid];
}

void* Tape::grad(const Tensor& t) {
  Slot& s = slot_of(t);
  if (!s.grad) s.grad = arena_.alloc_zero(s.bytes);
  else if (s.unwritten) device_zero(arena_.device(), s.grad, s.bytes);
  s.unwritten = false;
  return s.grad;
}

void* Tape::grad_to_overwrite(const Tensor& t, bool& overwrite) {
  Slot& s = slot_of(t);
  overwrite = !s.grad || s.unwritten;
  if (!s.grad) s.grad = arena_.alloc(s.bytes);  // the caller's first store fills it
  s.unwritten = false;
  return s.grad;
}

void* Tape::grad_if_any(const Tensor& t) const {
  if (t.gid < 0 || size_t(t.gid) >= slots_.size()) return nullptr;
  const Slot& s = slots_[t.gid];
  return s.unwritten ? nullptr : s.grad;
}

void Tape::reserve_grad(const Tensor& t) {
  Slot& s = slot_of(t);
  if (s.grad) return;
  s.grad = arena_.alloc(s.bytes);
  s.unwritten = true;
}

void Tape::move_grad(const Tensor& t, void* dst) {
  void* src = grad(t);
  Slot& s = slots_[t.gid];
  if (dst != src) device_copy(dst, arena_.device(), src, arena_.device(), s.bytes);
  s.grad = dst;
}

void Tape::adopt_grad(const Tensor& t, void* buf, size_t bytes) {
  Slot& s = slot_of(t);
  if (s.grad) throw std::runtime_error("autograd: adopt_grad on " + t.str() + ", whose gradient already exists");
  if (bytes < s.bytes)
    throw std::runtime_error("autograd: adopt_grad on " + t.str() + ": a buffer of " + std::to_string(bytes) +
                             " bytes for a gradient of " + std::to_string(s.bytes));
  s.grad = buf;
}

void Tape::push(const char* name, std::function<void()> backward) {
  nodes_.push_back({name, std::move(backward)});
}

Tensor Tape::rows(const Tensor& t, int64_t r0, int64_t r1) {
  const int64_t C = t.size(-1), n = t.numel() / C;
  if (r0 < 0 || r1 > n || r0 >= r1)
    throw std::runtime_error("autograd: rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") of " + t.str());
  Tensor v = t;
  v.shape = Shape{r1 - r0, C};
  v.ptr = static_cast<char*>(t.ptr) + size_t(r0 * C) * dtype_size(t.dtype);
  v.gid = -1;
  if (!t.requires_grad()) return v;
  const Slot& parent = slots_[t.gid];
  char* g = static_cast<char*>(grad(t));
  // The gradient's dtype may differ from t's; a parameter slot (bytes 0) has an f32 gradient.
  const size_t row_bytes = parent.bytes ? parent.bytes / size_t(n) : size_t(C) * sizeof(float);
  v.gid = int(slots_.size());
  slots_.push_back({g + size_t(r0) * row_bytes, size_t(r1 - r0) * row_bytes});
  return v;
}

void Tape::replay(const std::function<Tensor()>& forward, void* dout) {
  std::vector<Node> outer;
  outer.swap(nodes_);
  const size_t n_slots = slots_.size();
  const bool was_recording = recording;
  auto restore = [&] {
    nodes_.swap(outer);
    slots_.resize(n_slots);
    recording = was_recording;
  };
  try {
    recording = true;
    Tensor y = forward();
    recording = was_recording;
    if (!y.requires_grad()) throw std::runtime_error("autograd: the replayed forward recorded no gradient for its output");
    slots_[y.gid].grad = dout;
    for (size_t i = nodes_.size(); i-- > 0;) {
      std::function<void()> fn = std::move(nodes_[i].fn);
      fn();
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

void Tape::backward() {
  // A node may replay a sub-tape (recompute, tiled MLP), which swaps nodes_ out and back: the
  // closure is moved out first so it never runs from inside a vector that is being swapped.
  // A node that throws (a collective's timeout, a device fault) leaves the rest unrun: they are
  // dropped with it, so the next step does not meet this one's nodes (emptied, or pointing into
  // an arena that step has reused).
  try {
    for (size_t i = nodes_.size(); i-- > 0;) {
      std::function<void()> fn = std::move(nodes_[i].fn);
      fn();
    }
  } catch (...) {
    clear();
    throw;
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
