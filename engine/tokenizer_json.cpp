// Tokenizer::read_hf_json: a Hugging Face tokenizer.json of a BPE model, byte-level (optionally after
// an NFC normalizer) or SentencePiece-style (engine/tokenizer.h).
#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>

#include "engine/json.h"
#include "engine/nfc.h"
#include "engine/pretokenize.h"
#include "engine/tokenizer.h"

namespace ul {

namespace {

// GPT-2's byte-level alphabet: the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
// themselves, the other 68 for U+0100 onwards in byte order. Returns the byte of code point cp, or
// -1 outside the alphabet.
int byte_of_char(uint32_t cp) {
  auto printable = [](uint32_t b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  if (cp < 256) return printable(cp) ? int(cp) : -1;
  uint32_t k = cp - 256;
  for (int b = 0; b < 256; b++)
    if (!printable(uint32_t(b)) && k-- == 0) return b;
  return -1;
}

// Llama 3's Split pattern, as its tokenizer.json writes it, and Qwen 2's (Qwen 2.5's): the same with
// \p{N} for \p{N}{1,3}.
const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char* kLayouts =
    "GPT-2's ByteLevel, Digits + ByteLevel, Llama 3's or Qwen 2's Split + ByteLevel, each optionally after an NFC "
    "normalizer, or SentencePiece-style: a Prepend + Replace normalizer or a non-splitting Metaspace";

bool is_null_or(const JsonValue* v, const std::string& empty) {
  return !v || v->is(JsonValue::Kind::null) || (v->is(JsonValue::Kind::string) && v->text == empty);
}

}  // namespace

void Tokenizer::read_hf_json(const std::string& text) {
  const std::string where = path_ + ": tokenizer.json";
  auto bad = [&](const std::string& what) { return std::runtime_error(where + ": " + what); };
  // Real files hold a value in 9 bytes or more (Llama 3's: 9 MB, about a million values); one of
  // "0,0,0,..." is refused at a sixth of its size in values (each takes ~112 bytes in memory).
  const JsonValue j = parse_json(text, path_, text.size() / 6 + 4096);
  auto type_of = [&](const JsonValue& v) {
    const JsonValue* t = v.find("type");
    return t && t->is(JsonValue::Kind::string) ? t->text : std::string("(no type)");
  };
  // SentencePiece-style (Hugging Face's conversion of Llama 2's tokenizer): spaces become "▁" and
  // one is put before the text, by the normalizer (Prepend + Replace, no pre-tokenizer) or by a
  // Metaspace pre-tokenizer that does not split; merges over characters with byte fallback.
  const JsonValue *norm = j.find("normalizer"), *pre = j.find("pre_tokenizer");
  const bool has_norm = norm && !norm->is(JsonValue::Kind::null), has_pre = pre && !pre->is(JsonValue::Kind::null);
  const JsonValue* steps = has_norm && type_of(*norm) == "Sequence" ? norm->find("normalizers") : nullptr;
  auto text_of = [](const JsonValue* v) { return v && v->is(JsonValue::Kind::string) ? v->text : std::string(); };
  const bool sp_norm = steps && steps->items.size() == 2 && type_of(steps->items[0]) == "Prepend" &&
                       text_of(steps->items[0].find("prepend")) == "\u2581" && type_of(steps->items[1]) == "Replace" &&
                       steps->items[1].find("pattern") &&
                       text_of(steps->items[1].find("pattern")->find("String")) == " " &&
                       text_of(steps->items[1].find("content")) == "\u2581";
  const JsonValue* split_flag = has_pre ? pre->find("split") : nullptr;
  const std::string scheme = has_pre ? text_of(pre->find("prepend_scheme")) : "";
  const bool sp_pre = has_pre && type_of(*pre) == "Metaspace" && text_of(pre->find("replacement")) == "\u2581" &&
                      (scheme == "first" || scheme == "always") && split_flag && !split_flag->b;
  const bool spm = (sp_norm && !has_pre) || (sp_pre && !has_norm);
  // NFC (Qwen 2's) before a byte-level pre-tokenizer; any other normalizer is refused.
  nfc_ = has_norm && type_of(*norm) == "NFC";
  if (has_norm && !spm && !nfc_)
    throw bad("a normalizer (" + type_of(*norm) + ") is not applied by ulysses; the text would be encoded differently");
  if (nfc_ && has_pre && type_of(*pre) == "Metaspace")
    throw bad("an NFC normalizer before a Metaspace pre-tokenizer is not one ulysses implements (" +
              std::string(kLayouts) + ")");
  const JsonValue* model = j.find("model");
  if (!model || type_of(*model) != "BPE") throw bad("model is " + (model ? type_of(*model) : "missing") + ", not BPE");
  if (const JsonValue* fb = model->find("byte_fallback"); fb && fb->b && !spm)
    throw bad("byte_fallback BPE is not byte-level");
  if (!is_null_or(model->find("continuing_subword_prefix"), "") || !is_null_or(model->find("end_of_word_suffix"), ""))
    throw bad("word prefixes or suffixes are not byte-level BPE");
  if (!is_null_or(model->find("dropout"), "")) throw bad("BPE dropout is set");
  const JsonValue* ignore = model->find("ignore_merges");
  whole_first_ = ignore && ignore->b;
  any_split_ = false;

  // The pre-tokenizer, unless SentencePiece-style: GPT-2's (ByteLevel with its regex), that after
  // Digits, or Llama 3's or Qwen 2's (Split, then ByteLevel).
  auto byte_level = [&](const JsonValue& v, bool regex) {
    const JsonValue *r = v.find("use_regex"), *prefix = v.find("add_prefix_space");
    return type_of(v) == "ByteLevel" && (r ? r->b : true) == regex && !(prefix && prefix->b);
  };
  const JsonValue* seq = pre && type_of(*pre) == "Sequence" ? pre->find("pretokenizers") : nullptr;
  const bool pair = seq && seq->items.size() == 2;
  const JsonValue* digits = pair && type_of(seq->items[0]) == "Digits" ? seq->items[0].find("individual_digits") : nullptr;
  if (spm) {
    split_ = Split::sentencepiece;
    char_symbols_ = true;
    prepend_always_ = sp_norm;
  } else if (pre && byte_level(*pre, true)) {
    split_ = Split::gpt2;
  } else if (digits && digits->b && byte_level(seq->items[1], true)) {
    split_ = Split::gpt2_digits;
  } else if (pair) {
    const JsonValue& split = seq->items[0];
    const JsonValue* pat = split.find("pattern");
    const JsonValue* regex = pat ? pat->find("Regex") : nullptr;
    const JsonValue *behavior = split.find("behavior"), *invert = split.find("invert");
    const bool known = regex && (regex->text == kLlama3Pattern || regex->text == kQwen2Pattern);
    if (type_of(split) != "Split" || !known || !behavior || behavior->text != "Isolated" || (invert && invert->b) ||
        !byte_level(seq->items[1], false))
      throw bad("the pre-tokenizer is not one ulysses implements (" + std::string(kLayouts) + ")" +
                std::string(regex ? ": its pattern is " + regex->text : ""));
    split_ = regex->text == kLlama3Pattern ? Split::llama3 : Split::qwen2;
  } else {
    throw bad("the pre-tokenizer (" + (pre ? type_of(*pre) : std::string("none")) + ") is not one ulysses implements (" +
              kLayouts + ")");
  }

  // Tokens: the vocabulary in the byte alphabet (SentencePiece-style: as text, "▁" a space), then
  // the added (special) tokens as written.
  const JsonValue* vocab = model->find("vocab");
  if (!vocab || !vocab->is(JsonValue::Kind::object)) throw bad("model.vocab is not an object");
  // A token or merge part -> its bytes.
  auto to_bytes = [&](const std::string& s, const std::string& what) {
    std::string b;
    try {
      for (size_t i = 0, len = 0; i < s.size(); i += len) {
        const uint32_t cp = decode_utf8(s, i, len);
        if (spm) {
          b += cp == 0x2581 ? std::string(" ") : s.substr(i, len);
          continue;
        }
        const int x = byte_of_char(cp);
        if (x < 0) throw std::invalid_argument("a character outside it");
        b += char(x);
      }
    } catch (const std::invalid_argument& e) {
      throw bad(what + " '" + s + "' is not " + (spm ? "UTF-8" : "in the byte-level alphabet") + " (" + e.what() + ")");
    }
    if (b.empty()) throw bad(what + " is empty");
    return b;
  };
  std::vector<std::pair<int64_t, std::string>> toks;  // id, bytes
  for (const auto& [str, idv] : vocab->fields) {
    const int64_t id = idv.as_int(where + ": vocab id of '" + str + "'");
    toks.push_back({id, to_bytes(str, "token " + std::to_string(id))});
  }
  // Added tokens: id, text, and whether it is found in text (not special), and where (before or
  // after normalization). "special" left out (tokenizers itself would refuse the file) counts as
  // special: never found in text.
  struct Added {
    int64_t id;
    std::string text;
    bool special, normalized;
  };
  std::vector<Added> added;
  bool any_found = false;
  if (const JsonValue* a = j.find("added_tokens"))
    for (const JsonValue& t : a->items) {
      const JsonValue *id = t.find("id"), *content = t.find("content");
      if (!id || !content) throw bad("an added token without id or content");
      auto flag = [&](const char* name, bool absent) {
        const JsonValue* f = t.find(name);
        return f && f->is(JsonValue::Kind::boolean) ? f->b : absent;
      };
      added.push_back({id->as_int(where + ": added token id"), content->as_string(where + ": added token"),
                       flag("special", true), flag("normalized", false)});
      const Added& x = added.back();
      if (x.special) continue;
      any_found = true;
      if (x.text.empty()) throw bad("added token " + std::to_string(x.id) + " is empty");
      // These change where a match starts or ends (taking the spaces around it, or only whole words).
      for (const char* f : {"lstrip", "rstrip", "single_word"})
        if (flag(f, false))
          throw bad("added token '" + x.text + "' sets " + f + ", which ulysses does not implement");
      if (spm)
        throw bad("added token '" + x.text + "' is not special: with a SentencePiece-style layout ulysses does not "
                  "find added tokens in text");
    }
  int64_t n = 0;
  for (const auto& t : toks) n = std::max(n, t.first + 1);
  for (const auto& t : added) n = std::max(n, t.id + 1);
  if (n > (int64_t(1) << 24)) throw bad("a token id of " + std::to_string(n - 1) + " (at most 2^24 - 1 here)");
  // Ids run from 0 without gaps: past the entries' count one is missing (found here, before tables
  // of n entries: a 200-byte file naming id 2^24 - 1 took 600 MB to refuse).
  if (n > int64_t(toks.size() + added.size()))
    throw bad("a token id of " + std::to_string(n - 1) + " among " + std::to_string(toks.size() + added.size()) +
              " tokens (ids must run from 0 without gaps)");
  tokens_.assign(size_t(n), std::string());
  std::vector<int> kind(size_t(n), 0);  // 0 none, 1 vocab, 2 added, 3 byte (SentencePiece's <0x..>)
  // An added token may also be a vocabulary entry (GPT-2's <|endoftext|>; tokenizers' add_tokens
  // writes that layout for a string already in the vocabulary): it stays in the BPE vocabulary, so
  // that the merges that make it still make it.
  std::vector<char> in_vocab(size_t(n), 0);
  for (const auto& t : toks) {
    if (t.first < 0 || kind[size_t(t.first)]) throw bad("token id " + std::to_string(t.first) + " is negative or taken twice");
    tokens_[size_t(t.first)] = t.second, kind[size_t(t.first)] = 1, in_vocab[size_t(t.first)] = 1;
  }
  for (const auto& t : added) {  // an added token may repeat a vocab entry (GPT-2's <|endoftext|>)
    if (t.id < 0) throw bad("added token id " + std::to_string(t.id));
    // ... the same text at the same id; another text there would make two tokens one id.
    if (kind[size_t(t.id)] == 1 && tokens_[size_t(t.id)] != t.text)
      throw bad("added token '" + t.text + "' has id " + std::to_string(t.id) + ", which the vocabulary gives to '" +
                tokens_[size_t(t.id)] + "'");
    tokens_[size_t(t.id)] = t.text, kind[size_t(t.id)] = 2;
  }
  for (int64_t i = 0; i < n; i++)
    if (!kind[size_t(i)]) throw bad("no token has id " + std::to_string(i) + " (ids must run from 0 without gaps)");
  // SentencePiece-style byte tokens (<0x0A>) stand for their byte, outside the text's tokens.
  for (int64_t i = 0; spm && i < n; i++) {
    const std::string& t = tokens_[size_t(i)];
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      const int b = std::stoi(t.substr(3, 2), nullptr, 16);
      byte_id_[b] = int(i), tokens_[size_t(i)] = std::string(1, char(b)), kind[size_t(i)] = 3;
    }
  }
  for (const char* e : {"<|endoftext|>", "<|begin_of_text|>", "<s>"}) {
    for (int64_t i = 0; i < n && eot_ < 0; i++)
      if (kind[size_t(i)] == 2 && tokens_[size_t(i)] == e) eot_ = int(i);
  }
  // The added tokens found in text (none unless one is not special: then the special ones are passed
  // over where they match, as tokenizers does with encode_special_tokens), by first byte, longest
  // first.
  if (any_found) {
    for (const Added& t : added) {
      if (t.text.empty() || tokens_[size_t(t.id)] != t.text) continue;
      AddedTokens& set = t.normalized ? added_normalized_ : added_raw_;
      // tokenizers matches a "normalized" token in the normalized text, in its normalized form. It
      // must be UTF-8, so that it matches whole characters only.
      std::string text;
      try {
        text = t.normalized && nfc_ ? ul::nfc(t.text) : t.text;
        for (size_t k = 0, len = 0; k < text.size(); k += len) decode_utf8(text, k, len);
      } catch (const std::invalid_argument& e) {
        throw bad("added token " + std::to_string(t.id) + ": " + e.what());
      }
      // A match could span a letter followed by a space, where tokenize_files.cpp would cut.
      for (size_t k = 1; k < text.size(); k++)
        if (text[k] == ' ' && ends_with_letter(std::string_view(text).substr(0, k))) cuts_at_words_ = false;
      set.entries.push_back({std::move(text), t.special ? -1 : int(t.id)});
    }
    for (AddedTokens* set : {&added_raw_, &added_normalized_}) {
      auto& e = set->entries;
      std::stable_sort(e.begin(), e.end(), [](const AddedTokens::Entry& a, const AddedTokens::Entry& b) {
        const unsigned char x = static_cast<unsigned char>(a.text[0]), y = static_cast<unsigned char>(b.text[0]);
        return x != y ? x < y : a.text.size() > b.text.size();
      });
      set->index();
    }
  }
  ids_.reserve(size_t(n));
  for (int64_t i = n - 1; i >= 0; i--) {
    if (!in_vocab[size_t(i)] || kind[size_t(i)] == 3) continue;  // added tokens alone are not BPE's
    const std::string& t = tokens_[size_t(i)];
    ids_[t] = int(i);
    if (t.size() == 1 && !spm) byte_id_[static_cast<unsigned char>(t[0])] = int(i);
    // A token with a space after another character could join two words: then text cannot be
    // cut between words (data/tokenize_files.cpp).
    if (spm && t.find(' ', 1) != std::string::npos && t.find_first_not_of(' ') < t.rfind(' ')) cuts_at_words_ = false;
  }

  // Merges, ranked by their place: "a b" (older files) or ["a", "b"].
  const JsonValue* merges = model->find("merges");
  if (!merges || !merges->is(JsonValue::Kind::array)) throw bad("model.merges is not an array");
  merges_.reserve(merges->items.size());
  for (size_t r = 0; r < merges->items.size(); r++) {
    const JsonValue& m = merges->items[r];
    std::string a, b;
    if (m.is(JsonValue::Kind::string)) {
      const size_t sp = m.text.find(' ');
      if (sp == std::string::npos || m.text.find(' ', sp + 1) != std::string::npos)
        throw bad("merge " + std::to_string(r) + " '" + m.text + "' is not two parts");
      a = m.text.substr(0, sp), b = m.text.substr(sp + 1);
    } else if (m.is(JsonValue::Kind::array) && m.items.size() == 2) {
      a = m.items[0].as_string(where + ": merge"), b = m.items[1].as_string(where + ": merge");
    } else {
      throw bad("merge " + std::to_string(r) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const std::string what = "merge " + std::to_string(r) + "'s part";
    const std::string left = to_bytes(a, what), both = left + to_bytes(b, what);
    const auto it = ids_.find(both);
    if (it == ids_.end())
      throw bad("merge " + std::to_string(r) + " ('" + a + "', '" + b + "') makes no token of the vocabulary");
    merges_[MergeKey{it->first, uint32_t(left.size())}] = int(r);  // of repeats the last rank stays, as in HF's map
  }
}

}  // namespace ul
