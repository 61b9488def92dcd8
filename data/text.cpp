#include "data/text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

namespace {

// The file's bytes, read once per process and shared: the train and val splits, and every rank of
// --comm local (threads), each held a whole copy (two per rank, outside the memory check). Read,
// not mapped: a text rewritten while the run reads it (an editor saving in place, a generator
// writing over it) would end a mapped run by SIGBUS; read, the run keeps what it started with.
// Keyed by the file's identity, so a changed file is read anew.
std::shared_ptr<const std::vector<uint8_t>> shared_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open text file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot read text file: " + std::strerror(err));
  }
  const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) +
                          ":" + std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const std::vector<uint8_t>>> cache;
  std::lock_guard<std::mutex> lock(mu);  // (one reader at a time: the others then share its bytes)
  if (auto held = cache[key].lock()) {
    ::close(fd);
    return held;
  }
  std::shared_ptr<std::vector<uint8_t>> bytes;
  try {
    bytes = std::make_shared<std::vector<uint8_t>>(size_t(st.st_size));
  } catch (const std::bad_alloc&) {  // (it once said "--data: std::bad_alloc")
    ::close(fd);
    throw std::runtime_error(path + ": " + std::to_string(int64_t(st.st_size)) + " bytes do not fit in memory (text:FILE "
                             "is read whole): `train prepare --out DIR " + path + "` makes shards of it, which are read "
                             "as the run needs them");
  }
  for (size_t at = 0; at < bytes->size();) {
    const ssize_t n = ::read(fd, bytes->data() + at, bytes->size() - at);
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(path + ": " + (n == 0 ? std::string("the file shrank while it was read")
                                                      : "cannot read text file: " + std::string(std::strerror(err))));
    }
    at += size_t(n);
  }
  ::close(fd);
  cache[key] = bytes;
  return bytes;
}

// The crc32 of shared bytes, computed once for all who share them: the train and val splits and
// every rank of --comm local each made their own (a 1 GB text's four passes at --ranks 2: 62% of
// the start-up). Keyed by the bytes' owner, so a freed buffer's address reused is another key.
uint32_t shared_crc(const std::shared_ptr<const std::vector<uint8_t>>& bytes) {
  using Key = std::weak_ptr<const std::vector<uint8_t>>;
  static std::mutex mu;
  static std::map<Key, uint32_t, std::owner_less<Key>> crcs;
  std::lock_guard<std::mutex> lock(mu);  // (the others wait for the one computing it, then take it)
  for (auto it = crcs.begin(); it != crcs.end();) it = it->first.expired() ? crcs.erase(it) : std::next(it);
  if (const auto it = crcs.find(bytes); it != crcs.end()) return it->second;
  const uint32_t crc = crc32(0, bytes->data(), bytes->size());
  crcs.emplace(bytes, crc);
  return crc;
}

}  // namespace

TextDataset::TextDataset(const std::string& path, Split split, int model_vocab) : path_(path), split_(split) {
  require_regular_file(path);
  held_ = shared_bytes(path);
  bytes_ = held_->data();
  size_ = held_->size();
  if (size_ == 0) throw std::runtime_error(path + ": text file is empty");
  if (model_vocab > 0 && model_vocab < 256) {
    vocab_ = model_vocab;
    for (size_t k = 0; k < size_; k++)
      if (bytes_[k] >= model_vocab)
        throw std::runtime_error(path + ": byte " + std::to_string(bytes_[k]) + " at offset " + std::to_string(k) +
                                 " is >= the model vocab " + std::to_string(model_vocab));
  }
}

int64_t TextDataset::num_sequences(int T) const {
  if (T < 1) throw std::runtime_error(path_ + ": sequence length must be >= 1");
  const int64_t size = int64_t(size_), cut = holdout_start(size);
  // train: bytes [0, cut] hold cut / T sequences; val: bytes [cut, size) hold (size - cut - 1) / T.
  const int64_t n = split_ == Split::val ? (size - cut - 1) / T : std::min(cut, size - 1) / T;
  if (n < 1)
    throw std::runtime_error(path_ + ": too short for sequence length " + std::to_string(T) + ": its " +
                             split_name(split_) + " split (" +
                             (split_ == Split::val ? "the last 10%, " + std::to_string(size - cut) + " of "
                                                   : "the first 90%, " + std::to_string(std::min(cut + 1, size)) + " of ") +
                             std::to_string(size) + " bytes) holds no sequence of " + std::to_string(int64_t(T) + 1) +
                             " bytes" +
                             (split_ != Split::val ? ""
                              : size - cut < 2   ? "; the file is too short to hold out a val split at any --seq: give --val-data"
                                                 : "; give --val-data, or a smaller --seq"));
  return n;
}

void TextDataset::sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const {
  const int64_t n = num_sequences(T);
  const int64_t first = split_ == Split::val ? holdout_start(int64_t(size_)) : 0;
  const uint8_t* p = bytes_ + first + (i % n) * int64_t(T);
  for (int t = 0; t < T; t++) {
    inputs[t] = p[t];
    targets[t] = p[t + 1];
  }
}

std::vector<Dataset::FileSpan> TextDataset::file_spans() const {
  const int64_t size = int64_t(size_), cut = holdout_start(size);
  if (split_ == Split::val) return {{path_, cut, size}};
  return {{path_, 0, std::min(cut + 1, size)}};
}

std::string TextDataset::identity() const {
  // Once: every save and every resume asks (a 1 GB text added 3 s to each save).
  if (identity_.empty()) {
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", shared_crc(held_));
    identity_ = std::to_string(size_) + " bytes, crc32 " + crc;
  }
  return identity_;
}

std::string TextDataset::describe() const {
  // The split's own bytes, as shards give their split's tokens (the file's size read as the split's).
  const int64_t size = int64_t(size_), cut = holdout_start(size);
  const std::string part = split_ == Split::val ? "the last " + std::to_string(size - cut) + " of "
                                                : std::to_string(cut) + " of ";
  return "text " + path_ + " (" + split_name(split_) + "): " + part + std::to_string(size_) + " bytes, vocab " +
         std::to_string(vocab_);
}

}  // namespace ul
