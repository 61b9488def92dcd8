#include "engine/arena.h"

#include "engine/device.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ul {

static size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

bool arena_poison_from_env() {
  static const bool on = [] {
    const char* v = std::getenv("ULYSSES_POISON_ARENA");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

Arena::Arena(Device dev, size_t block_bytes) : dev_(dev), block_bytes_(block_bytes) {}

Arena::~Arena() {
  for (auto& b : blocks_) device_free(dev_, b.base);
}

void* Arena::alloc(size_t bytes) {
  void* p = take(bytes);
  if (poison_) device_set(dev_, p, 0xff, bytes);
  return p;
}

void* Arena::take(size_t bytes) {
  bytes = align64(bytes ? bytes : 1);
  // Walk forward to the first block (current or later) with room; make one if none has.
  while (cur_ < blocks_.size() && off_ + bytes > blocks_[cur_].size) {
    cur_++;  // the tail of this block stays unused until a release or reset walks back over it
    off_ = 0;
  }
  if (cur_ == blocks_.size()) {
    size_t sz = bytes > block_bytes_ ? bytes : block_bytes_;
    blocks_.push_back({static_cast<char*>(device_alloc(dev_, sz)), sz});
    off_ = 0;
  }
  void* p = blocks_[cur_].base + off_;
  off_ += bytes;
  used_ += bytes;
  if (used_ > peak_) peak_ = used_;
  return p;
}

void* Arena::alloc_zero(size_t bytes) {
  void* p = take(bytes);
  device_zero(dev_, p, bytes);
  return p;
}

Tensor Arena::make(Shape s, DType t, bool zero) {
  Tensor x;
  x.shape = s;
  x.dtype = t;
  x.device = dev_;
  x.ptr = zero ? alloc_zero(x.nbytes()) : alloc(x.nbytes());
  return x;
}

void Arena::poison_between(size_t block, size_t offset, size_t top_block, size_t top_offset) {
  for (size_t b = block; b <= top_block && b < blocks_.size(); b++) {
    const size_t lo = b == block ? offset : 0, hi = b == top_block ? top_offset : blocks_[b].size;
    if (hi > lo) device_set(dev_, blocks_[b].base + lo, 0xff, hi - lo);
  }
}

void Arena::release(const Mark& m) {
  // Marks nest: one above the top was taken inside a scope already released (out of order).
  if (m.used > used_) throw std::logic_error("Arena::release: a mark above what is in use (released out of order)");
  const size_t top_block = cur_, top_offset = off_;
  cur_ = m.block;
  off_ = m.offset;
  used_ = m.used;
  // Last, so that a poisoning that fails (its memset on a device that has faulted) leaves the
  // arena released all the same.
  if (poison_) poison_between(m.block, m.offset, top_block, top_offset);
}

void Arena::reserve(size_t bytes) {
  if (used_ != 0) throw std::logic_error("Arena::reserve while " + std::to_string(used_) + " bytes are in use");
  bytes = (bytes + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);
  if (blocks_.size() == 1 && blocks_[0].size >= bytes) return;
  for (auto& b : blocks_) device_free(dev_, b.base);
  blocks_.clear();
  cur_ = off_ = 0;
  if (bytes) blocks_.push_back({static_cast<char*>(device_alloc(dev_, bytes)), bytes});
}

void Arena::reset() {
  const size_t top_block = cur_, top_offset = off_;
  cur_ = 0;
  off_ = 0;
  used_ = 0;
  if (poison_) poison_between(0, 0, top_block, top_offset);
}

size_t Arena::reserved() const {
  size_t n = 0;
  for (auto& b : blocks_) n += b.size;
  return n;
}

}  // namespace ul
