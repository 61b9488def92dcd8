// The tokens `train prepare --tokenizer` has encoded, kept in a temporary file beside the shards
// until their count, and so the cut between the train and val splits, is known: memory holds a
// batch of the corpus, never the whole (a 10B-token corpus would be 40 GB of int32 in memory).
// The file is PATH.tmp (a name prepare's next run clears if this one is killed) and is removed
// when the spill is destroyed; the shards are cut from its end (take_tail), so that the disk holds
// the tokens once and a shard, not twice.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

  // Moves the tokens from `from` on out of the file, in order, as their little-endian bytes
  // (`width` each) to sink(bytes, n), then cuts the file to its first `from` tokens: the caller
  // takes the tokens from the end, a piece at a time, so the disk never holds them twice.
  template <class Sink>
  void take_tail(int64_t from, Sink sink) {
    if (from < 0 || from > count_) throw std::logic_error("TokenSpill::take_tail: " + std::to_string(from) + " of " +
                                                          std::to_string(count_) + " tokens");
    flush();
    std::ifstream in(tmp_, std::ios::binary);
    if (!in) throw std::runtime_error(tmp_ + ": cannot open it to read the tokens back: " + std::strerror(errno));
    in.seekg(std::streamoff(from * width_));
    std::vector<uint8_t> chunk(kChunk);
    int64_t left = (count_ - from) * width_;
    while (left > 0 && in.read(reinterpret_cast<char*>(chunk.data()),
                               std::streamsize(std::min<int64_t>(left, int64_t(chunk.size()))))) {
      sink(chunk.data(), size_t(in.gcount()));
      left -= in.gcount();
    }
    if (left != 0)
      throw std::runtime_error(tmp_ + ": reading back tokens " + std::to_string(from) + " to " + std::to_string(count_) +
                               ", " + std::to_string(left / width_) +
                               " were missing (the disk or another process changed the file)");
    if (::truncate(tmp_.c_str(), off_t(from * width_)) != 0)
      throw std::runtime_error(tmp_ + ": cannot shorten it: " + std::strerror(errno));
    count_ = from;
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
