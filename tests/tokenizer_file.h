// Writes llm.c tokenizer files for tests: the 1024-byte header [magic, version, vocab, eot, 0...]
// then each token as one length byte and its bytes.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ul_test {

inline std::string tok_file(uint32_t magic, uint32_t version, uint32_t vocab, uint32_t eot,
                            const std::vector<std::string>& toks) {
  std::string s(1024, '\0');
  const uint32_t h[4] = {magic, version, vocab, eot};
  std::memcpy(&s[0], h, sizeof h);
  for (const std::string& t : toks) s += char(t.size()) + t;
  return s;
}

// The 256 single bytes, in byte order, then `more`: a vocabulary that can encode any text.
inline std::vector<std::string> byte_tokens(const std::vector<std::string>& more = {}) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; b++) t.push_back(std::string(1, char(b)));
  t.insert(t.end(), more.begin(), more.end());
  return t;
}

}  // namespace ul_test
