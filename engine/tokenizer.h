// A BPE tokenizer, for decoding sampled tokens, encoding a prompt, and `train prepare --tokenizer`
// (data/prepare.h). Two files are read:
//
// llm.c's tokenizer file (written by its data preparation scripts, e.g. gpt2_tokenizer.bin):
//   header 256 x uint32: [20240328, version (1 or 2), vocab_size, eot_token (version 2 only), 0...]
//   then for each of the vocab_size tokens: one uint8 length (> 0), then that many bytes.
//   It holds no merge list: the ids serve as merge ranks (GPT-2's are), with GPT-2's pre-tokenizer.
//   The reader is strict: bad magic or version, a zero vocab, an eot_token outside the vocab, a zero
//   length, a token running past the end of the file, or bytes after the last token are errors that
//   name the file.
//
// A Hugging Face tokenizer.json of a BPE model (engine/tokenizer_json.cpp), byte-level: GPT-2's
//   layout (a ByteLevel pre-tokenizer with its regex), that with digits split apart first
//   (StarCoder 2's, SmolLM's), Llama 3's (its Split regex, then ByteLevel) or Qwen 2's (Llama 3's
//   regex with single digits; Qwen 2.5's too), each optionally after an NFC normalizer (Qwen 2's
//   has one: engine/nfc.h), the vocabulary in GPT-2's byte-to-character alphabet; or
//   SentencePiece-style, as Hugging Face converts Llama 2's (and TinyLlama's): no pieces, spaces as
//   "▁" with one before the text, merges over characters, a character missing from the vocabulary
//   as its byte tokens (<0x0A>). The merge list gives the ranks, added_tokens the special tokens and
//   the added ones that are not special (Qwen 2.5's <tool_call>, <|fim_prefix|>, ...), which are
//   found in the text as Hugging Face's tokenizers finds them. Anything else (another normalizer,
//   pre-tokenizer or model, word prefixes or suffixes, an added token that strips spaces or wants a
//   single word) is refused naming it, since it would be encoded differently. The EOT is
//   <|endoftext|> (GPT-2, Qwen 2), else <|begin_of_text|> (Llama 3, whose llm.c shards open each
//   document with it), else <s> (Llama 2, TinyLlama), else none.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ul {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path);
  Tokenizer(const std::string& path, const std::string& bytes);  // the file's bytes, already read
  // Its maps view into its own token strings: a copy would view the original's. A move keeps
  // the strings where they are (the vector's buffer changes hands).
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  Tokenizer(Tokenizer&&) = default;
  Tokenizer& operator=(Tokenizer&&) = default;

  int vocab() const { return int(tokens_.size()); }
  int eot() const { return eot_; }  // -1 in version 1 files and a tokenizer.json without one
  // Whether the EOT is a begin-of-text token (Llama 3's <|begin_of_text|>, Llama 2's <s>) that
  // opens every text, a prompt included, rather than one that ends it (GPT-2's <|endoftext|>).
  bool eot_opens_text() const {
    return eot_ >= 0 && (tokens_[size_t(eot_)] == "<|begin_of_text|>" || tokens_[size_t(eot_)] == "<s>");
  }
  // The layout: the pre-tokenizer, and an NFC normalizer where it is not the layout's own (Qwen 2's).
  std::string splitter() const;
  // Whether an NFC normalizer runs before the pre-tokenizer (engine/nfc.h).
  bool nfc() const { return nfc_; }
  // Whether text may be cut between a letter and a space and the parts encoded apart with the same
  // result (data/tokenize_files.cpp): for the byte-level layouts unless an added token found in
  // text holds a letter followed by a space; SentencePiece-style only when no token holds a space
  // after another character. (NFC never changes text across a space: see tokenize_files.cpp.)
  bool cuts_at_words() const { return cuts_at_words_; }
  // The bytes of token `id`; throws when id is outside the vocabulary.
  const std::string& decode(int id) const;
  // BPE: the text (UTF-8) is cut at the added tokens that are not special (each is that token; a
  // tokenizer.json's, as Hugging Face's tokenizers finds them: the leftmost, longest first, those
  // marked "normalized" in the normalized text), the rest normalized (NFC, when the file asks for
  // it) and cut into pieces by the pre-tokenizer (engine/pretokenize.h; none SentencePiece-style);
  // a piece that is a token is that token (llm.c files, as tiktoken; tokenizer.json with
  // ignore_merges), any other starts as its bytes (SentencePiece-style: its characters) and
  // repeatedly merges the adjacent pair of lowest rank. llm.c files: any pair whose concatenation
  // is a token, ranked by its id; GPT-2's ids are its merge ranks (token 256 + r is merge r's
  // result), so this is GPT-2's (and tiktoken's) encoding for GPT-2's vocabulary. tokenizer.json:
  // the pairs of its merge list, ranked by their place there (as Hugging Face's tokenizers does).
  // Special tokens are never produced from text: "<|endoftext|>" in the text is ordinary
  // characters. Throws
  // std::invalid_argument naming the byte offset of invalid UTF-8 or of a byte the vocabulary has
  // no token for (after NFC, an offset in the normalized text, said so).
  std::vector<int> encode(std::string_view text) const;
  // Appends the encoding of text[from, size) to out, where `from` is a piece boundary (0, or a
  // letter (any script) followed by a space where cuts_at_words(): data/tokenize_files.cpp cuts a large file
  // there). Error offsets count from text's start.
  void encode_into(std::string_view text, std::vector<int>& out, size_t from = 0) const;

 private:
  void read_llmc(const std::string& bytes);
  void read_hf_json(const std::string& text);  // engine/tokenizer_json.cpp
  // Added tokens found in text (Hugging Face's added vocabulary): the leftmost match, of those
  // there the longest. A special token's match (id -1) is passed over, its bytes left to the text
  // around it, but no other match overlaps it (as with tokenizers' encode_special_tokens).
  struct AddedTokens {
    struct Entry {
      std::string text;  // as matched: a "normalized" token's text is normalized too
      int id;
    };
    std::vector<Entry> entries;  // by first byte, then longest first
    // Looked up by hash, not tried one by one: at each byte of the text, each length an entry
    // starting with that byte has (longest first), the hash of the text's prefix of that length.
    // A tokenizer given 200,000 words with add_tokens encoded 60 KB/s, every entry compared at
    // every byte.
    // The hash is polynomial (h * B + byte + 1, mod 2^64), so the hash of any stretch of the text is
    // two prefix hashes and a power of B (O(1) a length): one long added token made every byte cost
    // its length, a 100 KB token 60 s a MB of text.
    std::vector<uint32_t> lengths[256];                   // distinct, longest first
    std::unordered_multimap<uint64_t, uint32_t> by_hash;  // hash(text) -> entry
    std::vector<uint64_t> powers;                         // B^L for L up to the longest entry
    static constexpr uint64_t kBase = 0x100000001b3ull;
    static uint64_t hash_step(uint64_t h, unsigned char b) { return h * kBase + b + 1; }
    void index();  // lengths and by_hash from entries (sorted)
    bool empty() const { return entries.empty(); }
    // Prefix hashes of one text, kept from call to call of find() over it (each call starts at or
    // after the last match's end): prefix[k] is the hash of the text from where the scan began to
    // base + k; what lies before the place a scan has reached is dropped as it goes, so the array
    // holds about the longest entry's length, not the text's (a match rebuilding it each call made
    // a long entry cost its length a match: "ab" x 100,000 beside a 100 KB token took 10 s).
    struct Scan {
      size_t base = 0;
      std::vector<uint64_t> prefix;
    };
    // The first match in s[at, size), the longest there: true with its place [pos, pos + len) and
    // id. scan: the same for every call over s, with at never moving back.
    bool find(std::string_view s, size_t at, size_t& pos, size_t& len, int& id, Scan& scan) const;
  };
  // text[from, to) without the added tokens found before normalization (or all of it).
  void encode_span(std::string_view text, size_t from, size_t to, std::vector<int>& out) const;
  // s[at, end) cut into pieces, each merged; `base` + a position in s is its offset for errors.
  void encode_pieces(std::string_view s, size_t at, size_t end, size_t base, std::vector<int>& out) const;
  // One piece's merges, appending its ids; offset is the piece's byte offset in the text.
  void merge(std::string_view piece, size_t offset, std::vector<int>& out) const;
  int byte_token(unsigned char b, size_t offset) const;

  enum class Split : uint8_t { gpt2, gpt2_digits, llama3, qwen2, sentencepiece };
  // A merge: the token's bytes and where its left part ends (0 in llm.c files: any split).
  struct MergeKey {
    std::string_view bytes;
    uint32_t left;
    bool operator==(const MergeKey& o) const { return left == o.left && bytes == o.bytes; }
  };
  struct MergeHash {
    size_t operator()(const MergeKey& k) const { return std::hash<std::string_view>()(k.bytes) ^ (size_t(k.left) << 48); }
  };
  std::string path_;
  std::vector<std::string> tokens_;  // by id; a special token's text as it is
  int eot_ = -1;
  Split split_ = Split::gpt2;
  bool whole_first_ = true;  // a piece that is a token is taken whole
  bool any_split_ = true;    // llm.c files: any two parts whose concatenation is a token may merge
  bool char_symbols_ = false;  // SentencePiece-style: merges start from characters, not bytes
  bool prepend_always_ = true;  // SentencePiece-style: "▁" before the text even when it starts with one
  bool cuts_at_words_ = true;  // a letter followed by a space is always a piece boundary
  bool nfc_ = false;           // an NFC normalizer first (byte-level layouts)
  // The added tokens found in text: those matched before normalization and those after. Both
  // empty unless some added token is not special (then the special ones join, to be passed over).
  AddedTokens added_raw_, added_normalized_;
  // Views into tokens_, special tokens left out. Byte string -> id (the lowest of duplicates), and
  // merge -> its rank (tokenizer.json: a token can be made by several merges, each its own rank).
  std::unordered_map<std::string_view, int> ids_;
  std::unordered_map<MergeKey, int, MergeHash> merges_;
  int byte_id_[256];  // the id of each single-byte token, -1 where the vocabulary has none
};

}  // namespace ul
