#include "engine/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "engine/file_io.h"

namespace ul {

namespace {

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr size_t kHeaderBytes = 256 * 4;

std::runtime_error tok_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": llm.c tokenizer: " + what);
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) : path_(path) {
  const std::string bytes = read_whole_file(path);
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
    max_len_ = std::max(max_len_, len);
    at += len;
  }
  if (at != bytes.size()) throw tok_error(path, std::to_string(bytes.size() - at) + " trailing bytes after the last token");
}

const std::string& Tokenizer::decode(int id) const {
  if (id < 0 || id >= vocab())
    throw std::runtime_error(path_ + ": token id " + std::to_string(id) + " is outside the tokenizer's vocab of " +
                             std::to_string(vocab()));
  return tokens_[size_t(id)];
}

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::unordered_map<std::string, int> ids;
  for (int i = vocab() - 1; i >= 0; i--) ids[tokens_[size_t(i)]] = i;  // duplicates: the lowest id wins
  std::vector<int> out;
  for (size_t at = 0; at < text.size();) {
    size_t len = std::min(max_len_, text.size() - at);
    for (; len > 0; len--) {
      auto it = ids.find(text.substr(at, len));
      if (it == ids.end()) continue;
      out.push_back(it->second);
      break;
    }
    if (len == 0) throw std::runtime_error(path_ + ": no token matches the prompt at byte " + std::to_string(at));
    at += len;
  }
  return out;
}

}  // namespace ul
