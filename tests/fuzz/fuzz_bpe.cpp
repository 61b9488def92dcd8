// The BPE encoder (engine/tokenizer.h, engine/pretokenize.h) on arbitrary text, with a fixed small
// vocabulary: invalid UTF-8 is refused; anything else encodes to ids that are in the vocabulary,
// never the EOT, decode back to the exact text, and match when the text is cut where
// data/tokenize_files.cpp cuts it (a letter followed by a space).
#include "engine/tokenizer.h"
#include "fuzz_util.h"
#include "tests/tokenizer_file.h"

#include <stdexcept>

namespace {

const ul::Tokenizer& tokenizer() {
  static const ul::Tokenizer tok = [] {
    const std::vector<std::string> toks = ul_test::byte_tokens(
        {"th", "he", "the", " t", " the", "in", "ing", "  ", "\n\n", "é", "é!", "12", "<|", "'s", "<|endoftext|>"});
    const std::string file = ul_test::tok_file(20240328, 2, uint32_t(toks.size()), uint32_t(toks.size() - 1), toks);
    return ul::Tokenizer(fuzz::input_file(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "bpe_vocab.bin"));
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ul::Tokenizer& tok = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<int> ids;
  try {
    ids = tok.encode(text);
  } catch (const std::invalid_argument&) {
    return 0;  // invalid UTF-8: refused
  }
  std::string back;
  for (int id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.vocab() && id != tok.eot());
    back += tok.decode(id);
  }
  FUZZ_CHECK(back == text);
  for (size_t k = 1; k < text.size(); k++) {
    if (text[k] != ' ' || unsigned((text[k - 1] | 0x20) - 'a') >= 26) continue;
    std::vector<int> cut = tok.encode(std::string_view(text).substr(0, k));
    tok.encode_into(text, cut, k);
    FUZZ_CHECK(cut == ids);
    break;
  }
  return 0;
}
