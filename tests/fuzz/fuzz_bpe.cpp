// The BPE encoder (engine/tokenizer.h, engine/pretokenize.h) on arbitrary text, with each
// pre-tokenizer: a small llm.c vocabulary (GPT-2's), and the learned test vocabulary as
// tokenizer.json in the digits-apart, Llama 3 and SentencePiece-style layouts (tests/data; run.sh
// runs from the repo root). Invalid UTF-8 is refused; anything else encodes to ids that are in the vocabulary, never
// a special token, decode back to the exact text, and match when the text is cut where
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

// `decoded`: what the ids must decode to.
void check(const ul::Tokenizer& tok, const std::string& text, const std::string& decoded) {
  std::vector<int> ids;
  try {
    ids = tok.encode(text);
  } catch (const std::invalid_argument&) {
    return;  // invalid UTF-8: refused
  }
  std::string back;
  for (int id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.vocab() && id != tok.eot());
    back += tok.decode(id);
  }
  FUZZ_CHECK(back == decoded);
  for (size_t k = 1; k < text.size(); k++) {
    if (text[k] != ' ' || unsigned((text[k - 1] | 0x20) - 'a') >= 26) continue;
    std::vector<int> cut = tok.encode(std::string_view(text).substr(0, k));
    tok.encode_into(text, cut, k);
    FUZZ_CHECK(cut == ids);
    break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ul::Tokenizer digits("tests/data/bpe_tiny_digits.json"), llama3("tests/data/bpe_tiny_llama3.json"),
      sp("tests/data/bpe_tiny_sp.json");
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const ul::Tokenizer* tok : {&tokenizer(), &digits, &llama3}) check(*tok, text, text);
  // SentencePiece-style decodes to a space before the text, and its "▁"s (U+2581) as spaces.
  std::string spaced = text.empty() ? "" : " ";
  for (size_t k = 0; k < text.size(); k++)
    if (text.compare(k, 3, "\xE2\x96\x81") == 0) spaced += ' ', k += 2;
    else spaced += text[k];
  check(sp, text, spaced);
  return 0;
}
