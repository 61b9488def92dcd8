// The tokens `train prepare --tokenizer` has encoded, kept in a temporary file beside the shards
// until their count, and so the cut between the train and val splits, is known: memory holds a
// batch of the corpus, never the whole (a 10B-token corpus would be 40 GB of int32 in memory).
// The file is PATH.tmp (a name prepare's next run clears if this one is killed) and is removed
// when the spill is destroyed.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/file_io.h"

namespace ul {

class TokenSpill {
 public:
  // width: bytes a token on disk (2 for a vocabulary of at most 65536, else 4).
  TokenSpill(const std::string& path, int width) : file_(path), tmp_(path + ".tmp"), width_(width), buf_(kChunk) {}

  void push(uint32_t token) {
    if (used_ == kChunk) flush();
    for (int b = 0; b < width_; b++) buf_[used_++] = uint8_t(token >> (8 * b));  // little-endian
    count_++;
  }
  int64_t count() const { return count_; }

  // Every token pushed, in order, to fn(token).
  template <class Fn>
  void replay(Fn fn) {
    flush();
    std::ifstream in(tmp_, std::ios::binary);
    std::vector<uint8_t> chunk(kChunk);
    int64_t seen = 0;
    while (in.read(reinterpret_cast<char*>(chunk.data()), std::streamsize(chunk.size())) || in.gcount() > 0) {
      const size_t n = size_t(in.gcount()) / size_t(width_);
      for (size_t k = 0; k < n; k++) {
        uint32_t t = 0;
        for (int b = 0; b < width_; b++) t |= uint32_t(chunk[k * size_t(width_) + size_t(b)]) << (8 * b);
        fn(t);
      }
      seen += int64_t(n);
    }
    if (seen != count_)
      throw std::runtime_error(tmp_ + ": read back " + std::to_string(seen) + " tokens of the " + std::to_string(count_) +
                               " written (the disk or another process changed it)");
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 20;  // a multiple of both widths
  void flush() {
    file_.write(buf_.data(), used_);
    used_ = 0;
  }
  AtomicFile file_;  // never committed: its destructor removes the temporary
  std::string tmp_;
  int width_;
  std::vector<uint8_t> buf_;  // kChunk bytes, used_ of them filled
  size_t used_ = 0;
  int64_t count_ = 0;
};

}  // namespace ul
