// The per-step activation arena: a bump allocator over a list of large blocks on one device.
// Everything a step creates (activations, their gradients, kernel scratch) comes from here and is
// dropped at once by reset(). The high-water mark of bytes in use is the activation memory the
// step log reports, and the number the memory tests and the planner are held to.
#pragma once
#include <cstddef>
#include <vector>

#include "engine/tensor.h"

namespace ul {

class Arena {
 public:
  explicit Arena(Device dev = Device::cpu, size_t block_bytes = size_t(64) << 20);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(size_t bytes);               // 64-byte aligned, uninitialised
  void* alloc_zero(size_t bytes);
  Tensor tensor(Shape s, DType t = DType::f32);  // uninitialised
  Tensor zeros(Shape s, DType t = DType::f32);

  // A mark/release pair frees everything allocated after the mark (scoped scratch in tiled loops).
  struct Mark { size_t block; size_t offset; size_t used; };
  Mark mark() const { return {cur_, off_, used_}; }
  void release(const Mark& m);

  void reset();                            // drop everything; keeps the blocks for the next step
  size_t used() const { return used_; }    // bytes in use now
  size_t high_water() const { return peak_; }
  void reset_high_water() { peak_ = used_; }
  size_t reserved() const;                 // bytes held from the device
  Device device() const { return dev_; }

 private:
  struct Block { char* base; size_t size; };
  Device dev_;
  size_t block_bytes_;
  std::vector<Block> blocks_;
  size_t cur_ = 0, off_ = 0, used_ = 0, peak_ = 0;
};

// Releases to a mark when it goes out of scope.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : a_(a), m_(a.mark()) {}
  ~ArenaScope() { a_.release(m_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;
 private:
  Arena& a_;
  Arena::Mark m_;
};

}  // namespace ul
