// The per-step activation arena: a bump allocator over large blocks on one device.
// Everything a step creates (activations, their gradients, kernel scratch) comes from here and is
// dropped at once by reset(), or back to a mark by release() (scoped scratch, a block's backward).
//
// used() counts the bytes handed out and not released, nothing else; its high-water mark is the
// activation memory the step log reports and the planner (engine/planner.h) predicts byte for
// byte. reserve() holds one block of the planned peak up front, so a step never opens a second
// block, no block tail is wasted, and on a GPU a too-large run fails at start-up, not mid-step.
// Without a reservation (tests, tools) blocks of 64 MiB (or the request, when larger) are added
// as needed; a request that does not fit the current block's tail goes to the next block.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "engine/tensor.h"

namespace ul {

// Poisoning: every uninitialised allocation is filled with 0xff bytes (NaN in f32 and bf16, -1 in
// i32), so an op that reads memory it never wrote (a `+=` into a gradient nobody zeroed, a kernel
// tail left unwritten) poisons its result instead of reading what the previous op or step left
// there. What a release or reset frees is poisoned too, so a tensor read after its scope ended reads
// NaN even where nothing was allocated over it since. For tests and debugging: it costs a memset
// per allocation and per release. On when the environment
// variable ULYSSES_POISON_ARENA is set (to anything but 0) as the arena is made; CI runs the
// sanitizer and emulated tests with it.
bool arena_poison_from_env();

class Arena {
 public:
  explicit Arena(Device dev = Device::cpu, size_t block_bytes = size_t(64) << 20);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(size_t bytes);               // 64-byte aligned, uninitialised (or poisoned)
  void* alloc_zero(size_t bytes);
  Tensor tensor(Shape s, DType t = DType::f32) { return make(s, t, false); }  // uninitialised
  Tensor zeros(Shape s, DType t = DType::f32) { return make(s, t, true); }

  // A mark/release pair frees everything allocated after the mark (scoped scratch in tiled loops).
  struct Mark { size_t block; size_t offset; size_t used; };
  Mark mark() const { return {cur_, off_, used_}; }
  void release(const Mark& m);

  // Replace the blocks by one of `bytes` (rounded up to 2 MiB). Only while nothing is in use.
  void reserve(size_t bytes);
  void reset();                            // drop everything; keeps the blocks for the next step
  void set_poison(bool on) { poison_ = on; }
  bool poison() const { return poison_; }
  size_t used() const { return used_; }    // bytes handed out and not released
  size_t high_water() const { return peak_; }
  void reset_high_water() { peak_ = used_; }
  size_t reserved() const;                 // bytes held from the device
  size_t blocks() const { return blocks_.size(); }
  Device device() const { return dev_; }

 private:
  struct Block { char* base; size_t size; };
  void* take(size_t bytes);  // alloc without the poison
  // From `offset` in `block` to `top_offset` in `top_block` (what a release or reset gives back).
  void poison_between(size_t block, size_t offset, size_t top_block, size_t top_offset);
  Tensor make(Shape s, DType t, bool zero);
  Device dev_;
  size_t block_bytes_;
  std::vector<Block> blocks_;
  size_t cur_ = 0, off_ = 0, used_ = 0, peak_ = 0;
  bool poison_ = arena_poison_from_env();
};

// Releases to a mark when it goes out of scope.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : a_(a), m_(a.mark()) {}
  // A destructor must not throw: it may run while an error unwinds, and a throw then ends the
  // program before that error is said. The release cannot fail; its poisoning
  // (ULYSSES_POISON_ARENA) is a device memset, which fails once the device has faulted (sticky on
  // a GPU): that fault is the error unwinding, or the next call reports it. A release out of
  // order (a logic_error, a bug) still ends the program.
  ~ArenaScope() {
    try {
      a_.release(m_);
    } catch (const std::runtime_error&) {
    }
  }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;
 private:
  Arena& a_;
  Arena::Mark m_;
};

}  // namespace ul
