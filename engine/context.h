// One rank's execution context: its device, its activation arena and its autograd tape.
// Ops find it through ctx(), a thread-local pointer, so the local communicator can run one rank
// per thread, each with its own replica, without passing a context through every op.
#pragma once
#include "engine/arena.h"
#include "engine/autograd.h"

namespace ul {

struct Context {
  explicit Context(Device d = Device::cpu) : device(d), arena(d), tape(arena) {}
  Device device;
  Arena arena;
  Tape tape;

  Tensor empty(Shape s, DType t = DType::f32) { return arena.tensor(s, t); }
  Tensor zeros(Shape s, DType t = DType::f32) { return arena.zeros(s, t); }
};

Context& ctx();                 // the calling thread's context; throws if none is set
Context* ctx_or_null();
// The thread's contexts are a stack: the current one is the newest guard's still alive. A guard
// that ends out of order (a Trainer replaced by another built before the old one is destroyed)
// takes out only its own entry, so the other stays current and none left points at a dead one.
void push_ctx(Context* c);
void pop_ctx(Context* c);       // removes c's newest entry

class ContextGuard {            // makes c current for a scope
 public:
  explicit ContextGuard(Context& c) : c_(&c) { push_ctx(c_); }
  ~ContextGuard() { pop_ctx(c_); }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
 private:
  Context* c_;
};

class Recording {               // turns the tape's recording on or off for a scope
 public:
  explicit Recording(bool on) : prev_(ctx().tape.recording) { ctx().tape.recording = on; }
  ~Recording() { ctx().tape.recording = prev_; }
 private:
  bool prev_;
};

// True when an op with these inputs must record a backward node.
inline bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!ctx().tape.recording) return false;
  for (const Tensor* t : inputs)
    if (t && t->requires_grad()) return true;
  return false;
}

}  // namespace ul
