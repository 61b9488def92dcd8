// The BPE encoder (engine/tokenizer.h, engine/pretokenize.h) on arbitrary text, with each
// pre-tokenizer: a small llm.c vocabulary (GPT-2's), and the learned test vocabulary as
// tokenizer.json in the digits-apart, Llama 3, Qwen 2 (NFC, added tokens found in text) and
// SentencePiece-style layouts (tests/data; run.sh runs from the repo root). Invalid UTF-8 is
// refused; anything else encodes to ids that are in the vocabulary, never a special token, decode
// back to the exact text (Qwen 2: to one with the same NFC form), and match when the text is cut
// where data/tokenize_files.cpp cuts it (a letter followed by a space). NFC (engine/nfc.h) is
// idempotent, leaves ASCII and its own output alone (no copy), and writes valid UTF-8.
#include "engine/nfc.h"
#include "engine/pretokenize.h"
#include "engine/tokenizer.h"
#include "fuzz_util.h"
#include "tests/tokenizer_file.h"

#include <algorithm>
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

// `decoded`: what the ids must decode to (with an NFC normalizer: its NFC form).
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
  FUZZ_CHECK(tok.nfc() ? ul::nfc(back) == ul::nfc(decoded) : back == decoded);
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
      qwen2("tests/data/bpe_tiny_qwen2.json"), sp("tests/data/bpe_tiny_sp.json");
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const ul::Tokenizer* tok : {&tokenizer(), &digits, &llama3, &qwen2}) check(*tok, text, text);
  std::string scratch, again;
  std::string_view n;
  try {
    n = ul::to_nfc(text, scratch);
  } catch (const std::invalid_argument&) {
    n = {};  // invalid UTF-8: refused (an exception from the checks below is a finding)
  }
  if (n.data()) {
    const bool ascii =
        std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    FUZZ_CHECK(!ascii || n.data() == text.data());
    const std::string once(n);
    for (size_t k = 0, len = 0; k < once.size(); k += len) ul::decode_utf8(once, k, len);
    const std::string_view twice = ul::to_nfc(once, again);
    FUZZ_CHECK(twice.data() == once.data() && twice.size() == once.size());  // already NFC: left alone
  }
  // SentencePiece-style decodes to a space before the text, and its "▁"s (U+2581) as spaces.
  std::string spaced = text.empty() ? "" : " ";
  for (size_t k = 0; k < text.size(); k++)
    if (text.compare(k, 3, "\xE2\x96\x81") == 0) spaced += ' ', k += 2;
    else spaced += text[k];
  check(sp, text, spaced);
  return 0;
}
