#include "engine/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <unordered_map>

#include "engine/file_io.h"
#include "engine/nfc.h"
#include "engine/pretokenize.h"

namespace ul {

namespace {

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr size_t kHeaderBytes = 256 * 4;

std::runtime_error tok_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": llm.c tokenizer: " + what);
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) : Tokenizer(path, read_whole_file(path)) {}

Tokenizer::Tokenizer(const std::string& path, const std::string& bytes) : path_(path) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    read_hf_json(bytes);
  } else if (bytes.compare(0, 3, "\xEF\xBB\xBF") == 0 && bytes.find_first_not_of(" \t\r\n", 3) != std::string::npos &&
             bytes[bytes.find_first_not_of(" \t\r\n", 3)] == '{') {
    // JSON after a UTF-8 byte-order mark (an editor's save): not llm.c's magic, which it was read as.
    throw std::runtime_error(path + ": tokenizer.json starts with a UTF-8 byte-order mark (EF BB BF), which JSON "
                             "does not allow (Hugging Face's tokenizers refuses it too): save it without one");
  } else {
    read_llmc(bytes);
  }
}

void Tokenizer::read_llmc(const std::string& bytes) {
  const std::string& path = path_;
  if (bytes.size() < kHeaderBytes)
    throw tok_error(path, "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the 1024-byte header");
  uint32_t h[256];
  std::memcpy(h, bytes.data(), kHeaderBytes);
  if (h[0] != kTokenizerMagic)
    throw tok_error(path, "bad magic " + std::to_string(h[0]) + " (expected 20240328)");
  if (h[1] != 1 && h[1] != 2) throw tok_error(path, "unsupported version " + std::to_string(h[1]) + " (expected 1 or 2)");
  const uint32_t n = h[2];
  // Each token takes at least 2 bytes, so a vocab_size that the file cannot hold is refused before
  // anything is allocated for it.
  if (n == 0 || n > (bytes.size() - kHeaderBytes) / 2)
    throw tok_error(path, "vocab_size " + std::to_string(n) + " does not fit the " + std::to_string(bytes.size()) + "-byte file");
  if (h[1] == 2) {
    if (h[3] >= n) throw tok_error(path, "eot_token " + std::to_string(h[3]) + " is outside the vocab of " + std::to_string(n));
    eot_ = int(h[3]);
  }
  tokens_.reserve(n);
  size_t at = kHeaderBytes;
  for (uint32_t i = 0; i < n; i++) {
    if (at >= bytes.size())
      throw tok_error(path, "truncated: token " + std::to_string(i) + " of " + std::to_string(n) + " starts past the end");
    const size_t len = static_cast<unsigned char>(bytes[at++]);
    if (len == 0) throw tok_error(path, "token " + std::to_string(i) + " has length 0");
    if (len > bytes.size() - at)
      throw tok_error(path, "token " + std::to_string(i) + " of length " + std::to_string(len) + " at byte " +
                                std::to_string(at - 1) + " runs past the end of the file");
    tokens_.push_back(bytes.substr(at, len));
    at += len;
  }
  if (at != bytes.size()) throw tok_error(path, std::to_string(bytes.size() - at) + " trailing bytes after the last token");
  ids_.reserve(n);
  merges_.reserve(n);
  for (int i = vocab() - 1; i >= 0; i--) {  // from the top, so that of duplicates the lowest id stays
    if (i == eot_) continue;
    const std::string& t = tokens_[size_t(i)];
    ids_[t] = i;
    merges_[{t, 0}] = i;
    if (t.size() == 1) byte_id_[static_cast<unsigned char>(t[0])] = i;
  }
}

const std::string& Tokenizer::decode(int id) const {
  if (id < 0 || id >= vocab())
    throw std::runtime_error(path_ + ": token id " + std::to_string(id) + " is outside the tokenizer's vocab of " +
                             std::to_string(vocab()));
  return tokens_[size_t(id)];
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  std::vector<int> out;
  encode_into(text, out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, std::vector<int>& out, size_t from) const {
  if (split_ == Split::sentencepiece) {
    // No pieces: the text is one, its spaces (and any U+2581 in it) the vocabulary's "▁", with one
    // more before the text's first character. UTF-8 is checked first, so that errors name the
    // text's own offsets.
    for (size_t k = from, len = 0; k < text.size(); k += len) decode_utf8(text, k, len);
    if (from == text.size()) return;
    // Prepend (a normalizer) always; Metaspace only when the text does not start with a space.
    const bool lead = from == 0 && (prepend_always_ || (text[0] != ' ' && text.compare(0, 3, "\xE2\x96\x81") != 0));
    std::string norm(lead ? " " : "");
    norm.reserve(text.size() - from + 1);
    for (size_t k = from; k < text.size(); k++) {
      if (text.compare(k, 3, "\xE2\x96\x81") == 0) norm += ' ', k += 2;
      else norm += text[k];
    }
    try {
      merge(norm, from, out);
    } catch (const std::invalid_argument&) {
      // merge counts offsets in norm (the space before, each U+2581 one byte): the text's own
      // offset of the character without a token is found again here.
      for (size_t k = from, len = 0; k < text.size(); k += len) {
        decode_utf8(text, k, len);
        const std::string_view c = text.compare(k, 3, "\xE2\x96\x81") == 0 ? " " : text.substr(k, len);
        if (ids_.count(c)) continue;
        for (size_t b = 0; b < c.size(); b++) byte_token(static_cast<unsigned char>(c[b]), k + b);  // throws
      }
      throw;
    }
    return;
  }
  // Between the added tokens found in the text as it is, the spans go on to normalization. A passed
  // over special token's bytes stay in the span around them.
  size_t span = from, pos = 0, len = 0;
  int id = -1;
  AddedTokens::Scan scan;
  for (size_t at = from; added_raw_.find(text, at, pos, len, id, scan); at = pos + len) {
    if (id < 0) continue;
    encode_span(text, span, pos, out);
    out.push_back(id);
    span = pos + len;
  }
  encode_span(text, span, text.size(), out);
}

void Tokenizer::encode_span(std::string_view text, size_t from, size_t to, std::vector<int>& out) const {
  if (from == to) return;
  // NFC: the span's normalized form, in which positions no longer match the text's (errors say so).
  std::string_view s = text.substr(0, to);
  size_t at = from, base = 0;
  thread_local std::string scratch;
  bool normalized = false;
  if (nfc_) {
    const std::string_view n = to_nfc(s, scratch, from);
    if (n.data() != s.data() + from) s = n, at = 0, base = from, normalized = true;
  }
  try {
    size_t span = at, pos = 0, len = 0;
    int id = -1;
    AddedTokens::Scan scan;
    for (size_t k = at; added_normalized_.find(s, k, pos, len, id, scan); k = pos + len) {
      if (id < 0) continue;
      encode_pieces(s, span, pos, base, out);
      out.push_back(id);
      span = pos + len;
    }
    encode_pieces(s, span, s.size(), base, out);
  } catch (const std::invalid_argument& e) {
    if (!normalized) throw;
    throw std::invalid_argument(std::string(e.what()) + " (counted in the text as NFC normalized from byte " +
                                std::to_string(from) + ")");
  }
}

void Tokenizer::encode_pieces(std::string_view s, size_t at, size_t end, size_t base, std::vector<int>& out) const {
  // The pre-tokenizer sees the span alone: its look-ahead (\s+(?!\S)) stops at the span's end.
  s = s.substr(0, end);
  while (at < end) {
    const size_t e = split_ == Split::gpt2          ? gpt2_piece_end(s, at)
                     : split_ == Split::gpt2_digits ? gpt2_digits_piece_end(s, at)
                     : split_ == Split::llama3      ? llama3_piece_end(s, at)
                                                    : qwen2_piece_end(s, at);
    merge(s.substr(at, e - at), base + at, out);
    at = e;
  }
}

void Tokenizer::AddedTokens::index() {
  by_hash.clear();
  for (auto& l : lengths) l.clear();
  for (uint32_t k = 0; k < entries.size(); k++) {
    const std::string& t = entries[k].text;
    uint64_t h = 0;
    for (unsigned char c : t) h = hash_step(h, c);
    by_hash.emplace(h, k);
    std::vector<uint32_t>& l = lengths[static_cast<unsigned char>(t[0])];
    if (std::find(l.begin(), l.end(), uint32_t(t.size())) == l.end()) l.push_back(uint32_t(t.size()));
  }
  size_t longest = 0;
  for (auto& l : lengths) {
    std::sort(l.begin(), l.end(), std::greater<uint32_t>());
    if (!l.empty()) longest = std::max<size_t>(longest, l.front());
  }
  powers.assign(longest + 1, 1);
  for (size_t L = 1; L <= longest; L++) powers[L] = powers[L - 1] * kBase;
}

bool Tokenizer::AddedTokens::find(std::string_view s, size_t at, size_t& pos, size_t& len, int& id, Scan& scan) const {
  if (entries.empty()) return false;
  // The hash of s[i, i + L) is prefix[i + L - base] - prefix[i - base] B^L (the hashes run on from
  // where the scan began, so dropping the array's front changes no value).
  std::vector<uint64_t>& prefix = scan.prefix;  // (empty at the first call: started at the first i below)
  for (size_t i = at; i < s.size(); i++) {
    const std::vector<uint32_t>& ls = lengths[static_cast<unsigned char>(s[i])];
    if (ls.empty()) continue;
    // Nothing reads before i again: the hashes that far back go. (The array grows only where a
    // byte starts an entry: a stretch of text with none leaves it short of i, and then it starts
    // anew at i: differences of hashes need no common origin.)
    if (prefix.size() <= i - scan.base) {
      prefix.assign(1, 0);
      scan.base = i;
    } else if (i - scan.base >= 65536 && i - scan.base >= prefix.size() / 2) {
      prefix.erase(prefix.begin(), prefix.begin() + long(i - scan.base));
      scan.base = i;
    }
    const size_t longest = std::min<size_t>(ls.front(), s.size() - i);
    while (prefix.size() <= i + longest - scan.base)
      prefix.push_back(hash_step(prefix.back(), static_cast<unsigned char>(s[scan.base + prefix.size() - 1])));
    const size_t k = i - scan.base;
    for (uint32_t L : ls) {
      if (L > longest) continue;
      // The entry of that text that comes first (entries' order: two of one text, the first wins).
      uint32_t best = UINT32_MAX;
      const auto [from, to] = by_hash.equal_range(prefix[k + L] - prefix[k] * powers[L]);
      for (auto it = from; it != to; ++it)
        if (it->second < best && s.compare(i, L, entries[it->second].text) == 0) best = it->second;
      if (best != UINT32_MAX) {
        pos = i, len = L, id = entries[best].id;
        return true;
      }
    }
  }
  return false;
}

std::string Tokenizer::splitter() const {
  const char* split = split_ == Split::gpt2          ? "GPT-2"
                      : split_ == Split::gpt2_digits ? "GPT-2 (digits apart)"
                      : split_ == Split::llama3      ? "Llama 3"
                      : split_ == Split::qwen2       ? "Qwen 2"
                                                     : "SentencePiece-style";
  // Qwen 2's layout has its NFC normalizer; the others have none of their own.
  if (split_ == Split::qwen2) return nfc_ ? split : "Qwen 2 without NFC";
  return nfc_ ? "NFC + " + std::string(split) : split;
}

int Tokenizer::byte_token(unsigned char b, size_t offset) const {
  if (byte_id_[b] < 0) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", b);
    throw std::invalid_argument("byte " + std::string(hex) + " at byte " + std::to_string(offset) +
                                " has no token in the tokenizer " + path_);
  }
  return byte_id_[b];
}

void Tokenizer::merge(std::string_view p, size_t offset, std::vector<int>& out) const {
  const size_t n = p.size();
  if (n == 1 && !char_symbols_) return out.push_back(byte_token(static_cast<unsigned char>(p[0]), offset));
  // A piece that is a token stays whole (as tiktoken does; for GPT-2's vocabulary the merges would
  // reach it anyway).
  if (whole_first_)
    if (auto it = ids_.find(p); it != ids_.end()) return out.push_back(it->second);
  // The parts form a linked list over their first byte: part s covers [s, next[s]). Candidate
  // pairs wait in a min-heap by (rank, position), so the lowest rank, leftmost on ties, merges
  // first, as in the plain loop that rescans all pairs after each merge, but in O(n log n): a piece
  // can be a megabyte of letters without spaces.
  if (n >= UINT32_MAX)  // positions below are 32-bit
    throw std::invalid_argument("a piece of " + std::to_string(n) + " bytes at byte " + std::to_string(offset) +
                                " (4 GiB of one character class)");
  struct Pair {
    int rank;
    uint32_t left, right, end;  // the parts [left, right) and [right, end) when it was pushed
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  thread_local std::vector<uint32_t> next, prev;
  thread_local std::vector<Pair> heap;
  next.resize(n);
  prev.resize(n);
  heap.clear();
  // The first parts: the bytes; SentencePiece-style, the characters, and the bytes (byte
  // fallback tokens) of a character the vocabulary lacks.
  uint32_t last = 0;
  auto add_part = [&](uint32_t k, uint32_t len) {
    next[k] = k + len, prev[k] = k == 0 ? 0 : last;  // prev[0] is never read
    last = k;
  };
  for (uint32_t k = 0; k < n;) {
    size_t len = 1;
    if (char_symbols_) decode_utf8(p, k, len);
    // (a byte-level vocabulary's single bytes are byte_id_'s, filled with ids_: no string hash a byte)
    if (char_symbols_ ? ids_.count(p.substr(k, len)) > 0 : byte_id_[static_cast<unsigned char>(p[k])] >= 0) {
      add_part(k, uint32_t(len));
    } else {  // a byte, or a character without a token of its own: its bytes, a part each
      for (uint32_t b = 0; b < len; b++) {
        byte_token(static_cast<unsigned char>(p[k + b]), offset + k + b);
        add_part(k + b, 1);
      }
    }
    k += uint32_t(len);
  }
  auto push = [&](uint32_t left) {
    const uint32_t right = next[left];
    if (right >= n || right <= left) return;
    const uint32_t end = next[right];
    const auto it = merges_.find({p.substr(left, end - left), any_split_ ? 0 : right - left});
    if (it != merges_.end()) {
      heap.push_back({it->second, left, right, end});
      std::push_heap(heap.begin(), heap.end(), std::greater<Pair>());
    }
  };
  // Over the parts, not the bytes: a character's later bytes are no part (their next[] is stale),
  // and a pair pushed there hashed the rest of the piece, quadratic in a piece of multi-byte
  // characters (a SentencePiece vocabulary's Cyrillic or CJK document is one piece).
  for (uint32_t k = 0; k < n; k = next[k]) push(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Pair>());
    const Pair c = heap.back();
    heap.pop_back();
    // Stale when a part has changed since: [left, right) merged on (next[left]), [right, end)
    // merged on (next[right]), or left was merged into its own left neighbour (then prev[right]
    // names that neighbour).
    if (next[c.left] != c.right || next[c.right] != c.end || prev[c.right] != c.left) continue;
    next[c.left] = c.end;
    if (c.end < n) prev[c.end] = c.left;
    if (c.left > 0) push(prev[c.left]);
    push(c.left);
  }
  // Every part is a token: a merge's result or a character (ids_), or a byte (a byte token).
  for (uint32_t k = 0; k < n; k = next[k]) {
    const auto it = ids_.find(p.substr(k, next[k] - k));
    out.push_back(it != ids_.end() ? it->second : byte_token(static_cast<unsigned char>(p[k]), offset + k));
  }
}

}  // namespace ul
