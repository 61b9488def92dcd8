// llm.c's tokenizer file (written by its data preparation scripts, e.g. gpt2_tokenizer.bin), for
// decoding sampled tokens and encoding a prompt.
//
//   header 256 x uint32: [20240328, version (1 or 2), vocab_size, eot_token (version 2 only), 0...]
//   then for each of the vocab_size tokens: one uint8 length (> 0), then that many bytes
//
// The reader is strict: bad magic or version, a zero vocab, an eot_token outside the vocab, a zero
// length, a token running past the end of the file, or bytes after the last token are errors that
// name the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ul {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path);

  int vocab() const { return int(tokens_.size()); }
  int eot() const { return eot_; }  // -1 in version 1 files
  // The bytes of token `id`; throws when id is outside the vocabulary.
  const std::string& decode(int id) const;
  // Greedy longest match over the vocabulary's byte strings. Every byte string in the text is then
  // a valid token sequence, but not necessarily the one GPT-2's BPE merges would produce (this
  // file has no merge ranks). Throws naming the byte offset when nothing matches there.
  std::vector<int> encode(const std::string& text) const;

 private:
  std::string path_;
  std::vector<std::string> tokens_;
  int eot_ = -1;
  size_t max_len_ = 0;
};

}  // namespace ul
