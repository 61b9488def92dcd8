// "text:FILE": a file's bytes are the token stream (vocab 256, no tokenizer needed), for quick
// character-level experiments. At length T, sequence j of the stream covers tokens [j*T, j*T+T]
// (T inputs and their T shifted targets; consecutive sequences share one boundary token). The last
// 10% of the bytes are the val split, the rest train (data/dataset.h: holdout_start, the same cut
// at every T); each split is cut into sequences from its own start, both are read in order, and an
// index past the split's end wraps into the next epoch.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace ul {

class TextDataset : public Dataset {
 public:
  // Throws naming the file when it is missing, empty, or holds a byte >= model_vocab (if > 0).
  TextDataset(const std::string& path, Split split, int model_vocab);

  // 256, or the model's vocab when smaller (every byte was checked against it).
  int vocab() const override { return vocab_; }
  // Throws naming the file when the split gets no sequence at length T.
  int64_t num_sequences(int T) const override;
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override;
  std::string describe() const override;
  std::string identity() const override;  // "N bytes, crc32 X"
  int64_t held_out_tokens() const override { return int64_t(size_) - holdout_start(int64_t(size_)); }
  std::string token_kind() const override { return kTextBytes; }
  std::vector<FileSpan> file_spans() const override;

 private:
  std::string path_;
  Split split_;
  std::shared_ptr<const std::vector<uint8_t>> held_;  // the file's bytes, shared in the process
  const uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
  mutable std::string identity_;  // identity(), made at its first call
  int vocab_ = 256;
};

}  // namespace ul
