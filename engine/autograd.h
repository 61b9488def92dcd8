// The autograd tape, micrograd-sized. An op computes its forward; if the tape is recording and an
// input needs a gradient, the op gives its output a gradient slot and pushes a node: a closure that
// holds what the backward needs and reads grad(output), adding into grad(inputs).
// backward() walks the nodes in reverse. Every backward kernel ACCUMULATES (+=) into its input
// gradients, so fan-out (the residual stream), shared weights (tied embeddings) and gradient
// accumulation over micro-batches need nothing else. Gradient buffers of activations come from the
// arena, zeroed, on first use; parameter slots point into the model's gradient buffer and persist.
// One shortcut keeps that contract: an op whose backward writes ALL of an input's gradient may ask
// for it with grad_to_overwrite; when it is the first to write it, the buffer comes unzeroed and
// the op stores its values instead of adding them to zeros (the same values: 0 + v = v), which
// saves a pass that writes zeros and one that reads them back (on CUDA: the linear's dx GEMM and
// the GELU, SwiGLU, residual-add and attention backwards).
#pragma once
#include <functional>
#include <vector>

#include "engine/arena.h"
#include "engine/tensor.h"

namespace ul {

class Tape {
 public:
  explicit Tape(Arena& arena) : arena_(arena) {}

  bool recording = false;

  // A persistent slot whose gradient buffer is `grad` (the parameter gradient buffer).
  int param_slot(void* grad);
  // Give t a fresh activation gradient slot (allocated lazily) and return t. The gradient has t's
  // dtype, unless grad_dtype says otherwise (a bf16 weight made outside Params has an f32 gradient,
  // like every parameter gradient).
  Tensor track(Tensor t);
  Tensor track(Tensor t, DType grad_dtype);
  // The gradient buffer of t, allocated and zeroed on first use. t must have a slot.
  void* grad(const Tensor& t);
  float* gradf(const Tensor& t) { return static_cast<float*>(grad(t)); }
  // For an op that writes every element of t's gradient: the buffer, and whether the op is its
  // first writer (overwrite = true: the buffer was just allocated, NOT zeroed, and the op must
  // store its values) or must add to what is there (overwrite = false).
  void* grad_to_overwrite(const Tensor& t, bool& overwrite);
  // nullptr while nothing has asked for t's gradient (grad(), which makes it zeroed, or a first
  // writer): its consumers never ran backward. A gradient asked for and never written is zeros.
  void* grad_if_any(const Tensor& t) const;
  // Allocate t's gradient now, where the arena stands (a block's backward puts its input's below
  // its own activations' gradients, to outlive them), but leave it unwritten: the first grad()
  // zeroes it, or a grad_to_overwrite first writer stores into it unzeroed; until then
  // grad_if_any says there is none. Nothing happens if t's gradient exists already.
  void reserve_grad(const Tensor& t);

  // Move t's gradient to `dst` (a buffer of the same size whose contents are dead) and make dst
  // its gradient from now on. A block's backward uses it to hand the residual stream's gradient
  // down to the memory of the block output's, so the arena can drop everything above (transformer.cpp).
  void move_grad(const Tensor& t, void* dst);
  // Give t, whose gradient is not allocated yet, the buffer `buf` of `bytes` (zeroed by the caller,
  // alive as long as the gradient is used) as its gradient. Under SP the scatter's backward puts
  // the local qkv's gradient in its own dead output gradient this way.
  void adopt_grad(const Tensor& t, void* buf, size_t bytes);

  void push(const char* name, std::function<void()> backward);
  size_t size() const { return nodes_.size(); }

  // Rows [r0, r1) of t seen as (rows, last dim): the same memory, and, when t has a gradient slot,
  // a slot that IS t's gradient at those rows. Backward kernels add into their input gradients, so
  // a slice's gradient lands in its parent's with no copy and no op (tiled MLP). Allocates t's
  // gradient now if it has none yet.
  Tensor rows(const Tensor& t, int64_t r0, int64_t r1);

  // Recompute: runs forward() with recording on into a fresh node list, gives its output the
  // gradient buffer `dout` (the saved gradient of the output the un-recorded forward made), walks
  // those nodes in reverse, then restores the node list and forgets the replay's slots. The caller
  // fetches every gradient that must outlive the replay (its inputs') and brackets the call with an
  // arena mark/release, so the replayed activations live only during this call.
  void replay(const std::function<Tensor()>& forward, void* dout);

  // Walk the nodes in reverse, then drop them and every activation slot (also when a node throws).
  void backward();
  // Drop nodes and activation slots without running them (eval, or after an error).
  void clear();
  // Forget parameter slots too (a new model on this tape).
  void clear_params();

 private:
  struct Slot {
    void* grad;
    size_t bytes;
    bool unwritten = false;  // reserve_grad's buffer: allocated, not zeroed, nothing written yet
  };
  struct Node { const char* name; std::function<void()> fn; };
  Slot& slot_of(const Tensor& t);  // t's slot, or an error naming t if it has none
  Arena& arena_;
  std::vector<Slot> slots_;
  size_t n_param_slots_ = 0;
  std::vector<Node> nodes_;
};

}  // namespace ul
