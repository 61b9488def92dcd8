#include "data/text.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

TextDataset::TextDataset(const std::string& path, Split split, int model_vocab) : path_(path), split_(split) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open text file");
  bytes_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (bytes_.empty()) throw std::runtime_error(path + ": text file is empty");
  if (model_vocab > 0 && model_vocab < 256) {
    vocab_ = model_vocab;
    for (size_t k = 0; k < bytes_.size(); k++)
      if (bytes_[k] >= model_vocab)
        throw std::runtime_error(path + ": byte " + std::to_string(bytes_[k]) + " at offset " + std::to_string(k) +
                                 " is >= the model vocab " + std::to_string(model_vocab));
  }
}

int64_t TextDataset::num_sequences(int T) const {
  if (T < 1) throw std::runtime_error(path_ + ": sequence length must be >= 1");
  const int64_t size = int64_t(bytes_.size()), cut = holdout_start(size);
  // train: bytes [0, cut] hold cut / T sequences; val: bytes [cut, size) hold (size - cut - 1) / T.
  const int64_t n = split_ == Split::val ? (size - cut - 1) / T : std::min(cut, size - 1) / T;
  if (n < 1)
    throw std::runtime_error(path_ + ": too short for sequence length " + std::to_string(T) + ": its " +
                             split_name(split_) + " split (" +
                             (split_ == Split::val ? "the last 10%, " + std::to_string(size - cut) + " of "
                                                   : "the first 90%, " + std::to_string(std::min(cut + 1, size)) + " of ") +
                             std::to_string(size) + " bytes) holds no sequence of " + std::to_string(int64_t(T) + 1) +
                             " bytes" + (split_ == Split::val ? "; give --val-data, or a smaller --seq" : ""));
  return n;
}

void TextDataset::sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const {
  const int64_t n = num_sequences(T);
  const int64_t first = split_ == Split::val ? holdout_start(int64_t(bytes_.size())) : 0;
  const uint8_t* p = bytes_.data() + first + (i % n) * int64_t(T);
  for (int t = 0; t < T; t++) {
    inputs[t] = p[t];
    targets[t] = p[t + 1];
  }
}

std::vector<Dataset::FileSpan> TextDataset::file_spans() const {
  const int64_t size = int64_t(bytes_.size()), cut = holdout_start(size);
  if (split_ == Split::val) return {{path_, cut, size}};
  return {{path_, 0, std::min(cut + 1, size)}};
}

std::string TextDataset::identity() const {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32(0, bytes_.data(), bytes_.size()));
  return std::to_string(bytes_.size()) + " bytes, crc32 " + crc;
}

std::string TextDataset::describe() const {
  return "text " + path_ + " (" + split_name(split_) + "): " + std::to_string(bytes_.size()) + " bytes, vocab " + std::to_string(vocab_);
}

}  // namespace ul
