// llm.c's tokenizer file (written by its data preparation scripts, e.g. gpt2_tokenizer.bin), for
// decoding sampled tokens, encoding a prompt, and `train prepare --tokenizer` (data/prepare.h).
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
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ul {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path);

  int vocab() const { return int(tokens_.size()); }
  int eot() const { return eot_; }  // -1 in version 1 files
  // The bytes of token `id`; throws when id is outside the vocabulary.
  const std::string& decode(int id) const;
  // GPT-2's byte-level BPE: the text (UTF-8) is cut into pieces by GPT-2's pre-tokenizer
  // (engine/pretokenize.h); a piece that is a token is that token, any other starts as its bytes
  // and repeatedly merges the adjacent pair whose concatenation has the lowest id. The file holds
  // no merge list, but GPT-2's ids are its merge ranks (token 256 + r is merge r's result), so this
  // is GPT-2's (and tiktoken's) encoding for GPT-2's vocabulary; another vocabulary is encoded by
  // GPT-2's rules with its own ids as ranks. The EOT is never produced from text: "<|endoftext|>"
  // in the text is ordinary characters. Throws std::invalid_argument naming the byte offset of
  // invalid UTF-8 or of a byte the vocabulary has no token for.
  std::vector<int> encode(std::string_view text) const;
  // Appends the encoding of text[from, size) to out, where `from` is a piece boundary (0, or a
  // letter followed by a space: data/tokenize_files.cpp cuts a large file there). Error offsets
  // count from text's start.
  void encode_into(std::string_view text, std::vector<int>& out, size_t from = 0) const;

 private:
  // One piece's merges, appending its ids; offset is the piece's byte offset in the text.
  void merge(std::string_view piece, size_t offset, std::vector<int>& out) const;
  int byte_token(unsigned char b, size_t offset) const;

  std::string path_;
  std::vector<std::string> tokens_;
  int eot_ = -1;
  // Byte string -> id (the rank), the EOT left out; views into tokens_. The lowest id of duplicates.
  std::unordered_map<std::string_view, int> ranks_;
  int byte_id_[256];  // the id of each single-byte token, -1 where the vocabulary has none
};

}  // namespace ul
