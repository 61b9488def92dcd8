// The tokenizer's encoder: GPT-2's pre-tokenizer (engine/pretokenize.h) piece by piece, UTF-8
// errors, and the byte-level BPE against tiktoken's ids for a vocabulary learned by
// tools/reference_bpe.py (tests/data/bpe_tiny_*), and against Hugging Face's tokenizers in each
// tokenizer.json layout (Qwen 2's with its NFC normalizer and added tokens found in text).
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "engine/export.h"
#include "engine/nfc.h"
#include "engine/pretokenize.h"
#include "engine/tokenizer.h"
#include "run_cmd.h"
#include "temp_dir.h"
#include "tokenizer_file.h"

using namespace ul;

namespace {

// The pieces the pre-tokenizer (GPT-2's by default) cuts s into.
std::vector<std::string> pieces(const std::string& s, size_t (*piece_end)(std::string_view, size_t) = gpt2_piece_end) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t e = piece_end(s, i);
    REQUIRE(e > i);
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}

}  // namespace

TEST_CASE("GPT-2 pre-tokenizer: words keep their space, classes split, white space leaves one", "[bpe]") {
  using V = std::vector<std::string>;
  CHECK(pieces("Hello world") == V{"Hello", " world"});
  CHECK(pieces("Hello  world") == V{"Hello", " ", " world"});
  CHECK(pieces("hi   ") == V{"hi", "   "});  // at the end the whole run is one piece
  CHECK(pieces("don't we're I'm") == V{"don", "'t", " we", "'re", " I", "'m"});
  CHECK(pieces("'S 'sup ''s") == V{"'", "S", " '", "sup", " ''", "s"});  // upper case is no contraction
  CHECK(pieces("abc123def 42") == V{"abc", "123", "def", " 42"});
  CHECK(pieces("x\ny") == V{"x", "\n", "y"});
  CHECK(pieces("x\n\n  y") == V{"x", "\n\n ", " y"});
  CHECK(pieces("a?!...b") == V{"a", "?!...", "b"});
  CHECK(pieces(" ?!") == V{" ?!"});
  CHECK(pieces("\t\tx") == V{"\t", "\t", "x"});
  // Non-ASCII classes: letters (é, Cyrillic, CJK), numbers (½ is No, Ⅻ is Nl), white space
  // (U+00A0 and U+3000 are White_Space; U+001C is not: it is "other").
  CHECK(pieces("café Москва 東京") == V{"café", " Москва", " 東京"});
  CHECK(pieces("½Ⅻ x") == V{"½Ⅻ", " x"});
  CHECK(pieces("a\u00a0b\u3000c") == V{"a", "\u00a0", "b", "\u3000", "c"});
  CHECK(pieces("a\x1c\x1f b") == V{"a", "\x1c\x1f", " b"});
  CHECK(pieces("e\u0301") == V{"e", "\u0301"});  // a combining mark (Mn) is not a letter
  CHECK(pieces("🙂🚀 🙂") == V{"🙂🚀", " 🙂"});
  // Unicode 16.0's classes, the reference encoders' (tiktoken 0.14, tokenizers 0.23): U+1C89 (new
  // in 16.0) is a letter; U+323B0 (CJK Extension J) and U+088F, new in 17.0, are not yet: symbols,
  // split as tokenizers splits them (a table from Unicode 17 once made them letters).
  CHECK(pieces("x\u1C89") == V{"x\u1C89"});
  CHECK(pieces("\U000323B0's x\u088F1") == V{"\U000323B0'", "s", " x", "\u088F", "1"});
}

TEST_CASE("invalid UTF-8 is refused naming its byte offset", "[bpe]") {
  const std::pair<std::string, std::string> bad[] = {
      {"ab\xff", "never starts"},           {"a\x80", "continuation"},
      {"ab\xe2\x82", "cut off"},           {"\xe2(\xa1", "cut short"},
      {"\xc0\xaf", "never starts"},        {"x\xe0\x80\xaf", "overlong"},
      {"\xed\xa0\x80", "surrogate"},       {"\xf4\x90\x80\x80", "above U+10FFFF"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.second);
    const size_t at = b.first.find_first_not_of("abx");
    CHECK_THROWS_WITH(pieces(b.first), Catch::Contains("invalid UTF-8 at byte " + std::to_string(at)) &&
                                            Catch::Contains(b.second));
  }
  size_t len = 0;
  CHECK(decode_utf8("\xf0\x9f\x99\x82", 0, len) == 0x1F642);
  CHECK(len == 4);
  CHECK(decode_utf8("\xf4\x8f\xbf\xbf", 0, len) == 0x10FFFF);
}

// Every case of a tools/reference_bpe.py file (`count` of them): the ids, and the text back from
// them (after `lead`, which a SentencePiece-style tokenizer puts before a text; with
// lead_unless_space, only before a text that does not start with a space; with an NFC normalizer,
// a text canonically equivalent: the same NFC form).
static void check_cases(const Tokenizer& tok, const std::string& cases, const std::string& lead = "",
                        bool lead_unless_space = false, int count = 341) {
  std::ifstream f(ul_test::source_path(cases));
  std::string hex, ids;
  int n = 0, merged = 0;
  while (f >> hex >> ids) {
    const std::string text = hex == "-" ? "" : unhex(hex);
    std::vector<int> want;
    if (ids != "-") {
      std::stringstream ss(ids);
      for (std::string id; std::getline(ss, id, ',');) want.push_back(std::stoi(id));
    }
    CAPTURE(n, text);
    const std::vector<int> got = tok.encode(text);
    CHECK(got == want);
    std::string back;
    for (int id : got) back += tok.decode(id);
    const bool led = !text.empty() && !(lead_unless_space && text[0] == ' ');
    if (tok.nfc()) CHECK(nfc(back) == nfc(text));
    else CHECK(back == (led ? lead : "") + text);
    merged += got.size() < text.size();
    n++;
  }
  CHECK(n == count);
  CHECK(merged > 300);  // the vocabulary's merges are in play, not just single bytes
}

TEST_CASE("BPE encoding matches tiktoken on a learned vocabulary, and decodes back to the text", "[bpe]") {
  Tokenizer tok(ul_test::source_path("tests/data/bpe_tiny_tokenizer.bin"));
  REQUIRE(tok.vocab() == 577);
  REQUIRE(tok.eot() == 576);
  check_cases(tok, "tests/data/bpe_tiny_cases.txt");
  // The EOT is never produced from text, and encode_into appends.
  std::vector<int> out = {7};
  tok.encode_into("<|endoftext|>", out);
  CHECK(out.size() > 2);
  CHECK(out[0] == 7);
  for (int id : out) CHECK(id != tok.eot());
}

TEST_CASE("BPE: merges by lowest id, a whole-token piece stays whole, long pieces, missing bytes", "[bpe]") {
  ul_test::TempDir dir;
  const std::string path = dir / "tok.bin";
  auto make = [&](const std::vector<std::string>& toks, int eot) {
    std::ofstream(path, std::ios::binary) << ul_test::tok_file(20240328, 2, uint32_t(toks.size()), uint32_t(eot), toks);
    return Tokenizer(path);
  };
  // "abc": ids 256 "bc" < 257 "ab", so b+c merge first and "ab" can never form: a, bc. "abcd" is a
  // token of its own and stays whole, though the merges alone would never reach it.
  Tokenizer t = make(ul_test::byte_tokens({"bc", "ab", "abcd", "<|e|>"}), 259);
  CHECK(t.encode("abc") == std::vector<int>{'a', 256});
  CHECK(t.encode("abcd") == std::vector<int>{258});
  CHECK(t.encode("abab") == std::vector<int>{257, 257});
  CHECK(t.encode("ab abc") == std::vector<int>{257, ' ', 'a', 256});
  // Ties between equal ranks go left to right: "aaa" -> aa, a.
  Tokenizer aa = make(ul_test::byte_tokens({"aa", "<|e|>"}), 257);
  CHECK(aa.encode("aaa") == std::vector<int>{256, 'a'});
  // A piece of a million letters merges in O(n log n) (the plain loop would take hours).
  const std::string big(1 << 20, 'a');
  const std::vector<int> ids = aa.encode(big);
  CHECK(ids.size() == big.size() / 2);
  CHECK(ids.front() == 256);
  CHECK(ids.back() == 256);
  // A byte with no token: named with its offset and the file.
  Tokenizer ab = make({"a", "b", "ab", "<|e|>"}, 3);
  CHECK(ab.encode("abab") == std::vector<int>{2, 2});
  CHECK_THROWS_WITH(ab.encode("ab c"), Catch::Contains("byte 0x20 at byte 2") && Catch::Contains(path));
}

TEST_CASE("Llama 3 pre-tokenizer: any-case contractions, one symbol before a word, digits by three", "[bpe]") {
  using V = std::vector<std::string>;
  auto cut = [](const std::string& s) { return pieces(s, llama3_piece_end); };
  CHECK(cut("Hello world") == V{"Hello", " world"});
  CHECK(cut("DON'T we'RE") == V{"DON", "'T", " we", "'RE"});
  CHECK(cut("x'\u017ft") == V{"x", "'\u017f", "t"});  // (?i) folds U+017F (long s) to s
  CHECK(cut("(word \tword") == V{"(word", " ", "\tword"});
  CHECK(cut("1234567 x") == V{"123", "456", "7", " x"});
  CHECK(cut("a!?\n\nb") == V{"a", "!?\n\n", "b"});
  CHECK(cut("a \n \n  b") == V{"a", " \n \n", " ", " b"});
  CHECK(cut("x\ny") == V{"x", "\n", "y"});
  CHECK(cut("$100") == V{"$", "100"});
  CHECK(cut("end  ") == V{"end", "  "});
}

TEST_CASE("Qwen 2 pre-tokenizer: Llama 3's with every digit a piece", "[bpe]") {
  using V = std::vector<std::string>;
  auto cut = [](const std::string& s) { return pieces(s, qwen2_piece_end); };
  CHECK(cut("1234567 x") == V{"1", "2", "3", "4", "5", "6", "7", " x"});
  CHECK(cut("$100 x1y") == V{"$", "1", "0", "0", " x", "1", "y"});
  CHECK(cut("\u00bd\u2168\u0663") == V{"\u00bd", "\u2168", "\u0663"});  // No, Nl, Nd: each alone
  CHECK(cut("DON'T we'RE") == V{"DON", "'T", " we", "'RE"});
  CHECK(cut("(word \tword") == V{"(word", " ", "\tword"});
  CHECK(cut("a!?\n\nb") == V{"a", "!?\n\n", "b"});
  CHECK(cut("a \n \n  b") == V{"a", " \n \n", " ", " b"});
  CHECK(cut("end  ") == V{"end", "  "});
}

TEST_CASE("GPT-2 pre-tokenizer with digits apart: each number alone, the pattern between them", "[bpe]") {
  using V = std::vector<std::string>;
  auto cut = [](const std::string& s) { return pieces(s, gpt2_digits_piece_end); };
  CHECK(cut("x  12") == V{"x", "  ", "1", "2"});  // the white space before a number stays whole
  CHECK(cut(" 123abc") == V{" ", "1", "2", "3", "abc"});
  CHECK(cut("a 1 b") == V{"a", " ", "1", " b"});
  CHECK(cut("\u00bd \u216b x") == V{"\u00bd", " ", "\u216b", " x"});  // No and Nl are numbers too
  CHECK(cut("it's 42!") == V{"it", "'s", " ", "4", "2", "!"});
}

TEST_CASE("tokenizer.json: GPT-2's, digits-apart and Llama 3's layouts match Hugging Face's ids", "[bpe]") {
  Tokenizer gpt2(ul_test::source_path("tests/data/bpe_tiny_gpt2.json"));
  CHECK(gpt2.vocab() == 577);
  CHECK(gpt2.eot() == 576);
  CHECK(std::string(gpt2.splitter()) == "GPT-2");
  CHECK(gpt2.decode(576) == "<|endoftext|>");
  check_cases(gpt2, "tests/data/bpe_tiny_cases.txt");  // tools/reference_bpe.py: HF's ids are tiktoken's here
  Tokenizer digits(ul_test::source_path("tests/data/bpe_tiny_digits.json"));
  CHECK(std::string(digits.splitter()) == "GPT-2 (digits apart)");
  check_cases(digits, "tests/data/bpe_tiny_digits_cases.txt");
  Tokenizer llama3(ul_test::source_path("tests/data/bpe_tiny_llama3.json"));
  CHECK(llama3.eot() == 576);
  CHECK(llama3.decode(576) == "<|begin_of_text|>");
  CHECK(std::string(llama3.splitter()) == "Llama 3");
  check_cases(llama3, "tests/data/bpe_tiny_llama3_cases.txt");
  // SentencePiece-style (Llama 2's, TinyLlama's): merges over characters, byte fallback, <s>.
  Tokenizer sp(ul_test::source_path("tests/data/bpe_tiny_sp.json"));
  CHECK(std::string(sp.splitter()) == "SentencePiece-style");
  CHECK(sp.decode(sp.eot()) == "<s>");
  CHECK(sp.eot_opens_text());
  CHECK(sp.cuts_at_words());  // learned split at spaces: no token joins two words
  check_cases(sp, "tests/data/bpe_tiny_sp_cases.txt", " ");
  {  // The newer conversion: Metaspace instead of the normalizer; no "▁" added before a leading space.
    std::ifstream in(ul_test::source_path("tests/data/bpe_tiny_sp.json"));
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string norm_from = "\"normalizer\": {", pre = "\"pre_tokenizer\": null";
    const size_t a = json.find(norm_from), b = json.find(pre);
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    json.replace(b, pre.size(), "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", "
                                "\"prepend_scheme\": \"first\", \"split\": false}");
    json.replace(a, json.find("\n  },", a) + 4 - a, "\"normalizer\": null");
    ul_test::TempDir d;
    std::ofstream(d / "metaspace.json", std::ios::binary) << json;
    Tokenizer meta(d / "metaspace.json");
    check_cases(meta, "tests/data/bpe_tiny_sp_metaspace_cases.txt", " ", true);
  }
  // A character outside the vocabulary (U+4E00, bytes E4 B8 80) falls back to its byte tokens
  // <0xE4> <0xB8> <0x80>, ids 3 + byte; "▁" before it is the space the text gets.
  CHECK(sp.encode("\u4e00") == std::vector<int>{sp.encode(" ")[0], 3 + 0xE4, 3 + 0xB8, 3 + 0x80});
  {  // A merge listed twice takes its last rank, as Hugging Face's merge map keeps it: with "q x",
    // "x z", "q x" appended, "x z" comes first and "qxz" is q, xz (the first rank would give qx, z).
    std::ifstream in(ul_test::source_path("tests/data/bpe_tiny_gpt2.json"));
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string vocab = "\"vocab\": {", merges = "\"merges\": [";
    REQUIRE(json.find(vocab) != std::string::npos);
    json.insert(json.find(vocab) + vocab.size(), "\"qx\": 576, \"xz\": 577,");
    REQUIRE(json.find(merges) != std::string::npos);
    json.insert(json.find(merges) + merges.size(), "[\"q\", \"x\"], [\"x\", \"z\"], [\"q\", \"x\"],");
    const std::string added = "\"id\": 576";  // <|endoftext|>, after the two new tokens
    REQUIRE(json.find(added) != std::string::npos);
    json.replace(json.find(added), added.size(), "\"id\": 578");
    ul_test::TempDir d;
    std::ofstream(d / "dup.json", std::ios::binary) << json;
    Tokenizer dup(d / "dup.json");
    CHECK(dup.encode("qxz") == std::vector<int>{dup.encode("q")[0], 577});
  }
  // A prompt opens with Llama 3's <|begin_of_text|>, not with GPT-2's <|endoftext|>.
  CHECK(llama3.eot_opens_text());
  CHECK_FALSE(gpt2.eot_opens_text());
  const std::vector<int> hi = llama3.encode("hi there");
  std::vector<int> want = {576};
  want.insert(want.end(), hi.begin(), hi.end());
  CHECK(parse_prompt("hi there", 577, &llama3) == want);
  CHECK(parse_prompt("hi there", 577, &gpt2) == gpt2.encode("hi there"));
}

TEST_CASE("tokenizer.json: Qwen 2's layout (NFC, single digits, added tokens in text) matches Hugging Face's ids",
          "[bpe]") {
  Tokenizer qwen(ul_test::source_path("tests/data/bpe_tiny_qwen2.json"));
  CHECK(qwen.vocab() == 586);
  CHECK(qwen.eot() == 576);
  CHECK(qwen.decode(576) == "<|endoftext|>");
  CHECK_FALSE(qwen.eot_opens_text());
  CHECK(qwen.nfc());
  CHECK(qwen.splitter() == "Qwen 2");
  CHECK(qwen.cuts_at_words());
  // tools/reference_bpe.py: the shared texts, then texts not in NFC, digits, added tokens.
  check_cases(qwen, "tests/data/bpe_tiny_qwen2_cases.txt", "", false, 574);
  // Added tokens that are not special come out of text (<tool_call> 579); special ones never do.
  CHECK(qwen.encode("<tool_call>") == std::vector<int>{579});
  const std::vector<int> eot_text = qwen.encode("<|endoftext|><|im_start|>");
  CHECK(eot_text.size() > 2);
  for (int id : eot_text) CHECK(id < 576);
  // Composed and decomposed text encode alike.
  CHECK(qwen.encode("cafe\u0301 \u1100\u1161\u11a8") == qwen.encode("caf\u00e9 \uac01"));
  // The same layout without the normalizer: not NFC'd, and named so.
  std::ifstream in(ul_test::source_path("tests/data/bpe_tiny_qwen2.json"));
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string norm = "\"normalizer\": {\n    \"type\": \"NFC\"\n  }";
  const size_t at = json.find(norm);
  REQUIRE(at != std::string::npos);
  ul_test::TempDir d;
  std::ofstream(d / "raw.json", std::ios::binary) << json.replace(at, norm.size(), "\"normalizer\": null");
  Tokenizer raw(d / "raw.json");
  CHECK(raw.splitter() == "Qwen 2 without NFC");
  CHECK(raw.encode("cafe\u0301") != qwen.encode("cafe\u0301"));
  CHECK(raw.encode("caf\u00e9") == qwen.encode("caf\u00e9"));
}

TEST_CASE("tokenizer.json with NFC: a text cut at a letter before a space encodes as whole", "[bpe]") {
  // data/tokenize_files.cpp cuts large files there; NFC never reaches across a space.
  Tokenizer qwen(ul_test::source_path("tests/data/bpe_tiny_qwen2.json"));
  std::string text;
  for (int i = 0; i < 300; i++)
    text += std::string(i % 3 ? "cafe\u0301 " : "a\u0323\u0301 ") + std::to_string(i) +
            " \u1100\u1161 word<tool_call>x " + (i % 5 ? "e\u0301" : "\u0958") + " \u0301 over the lazy dog ";
  const std::vector<int> whole = qwen.encode(text);
  int cuts = 0, beyond_ascii = 0;
  for (size_t k = 1; k < text.size(); k++) {
    // (every letter, any script: the Hangul syllables, after NFC composes the jamo, too)
    if (text[k] != ' ' || !ul::ends_with_letter(std::string_view(text).substr(0, k))) continue;
    beyond_ascii += static_cast<unsigned char>(text[k - 1]) >= 0x80;
    std::vector<int> part = qwen.encode(std::string_view(text).substr(0, k));
    qwen.encode_into(text, part, k);
    CAPTURE(k);
    CHECK(part == whole);
    cuts++;
  }
  CHECK(cuts > 1000);
  CHECK(beyond_ascii >= 300);
  // The other layouts, on text in several scripts: the same at every cut the rule makes.
  for (const char* fixture : {"tests/data/bpe_tiny_gpt2.json", "tests/data/bpe_tiny_sp.json"}) {
    CAPTURE(fixture);
    Tokenizer t(ul_test::source_path(fixture));
    REQUIRE(t.cuts_at_words());
    std::string mixed;
    for (int i = 0; i < 40; i++)
      mixed += std::string(i % 2 ? "\u043f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 " : "\u4e2d\u6587 ") +
               "the cat  \u00e9t\u00e9 " + std::to_string(i) + " ";
    const std::vector<int> all = t.encode(mixed);
    int made = 0;
    for (size_t k = 1; k < mixed.size(); k++) {
      if (mixed[k] != ' ' || !ul::ends_with_letter(std::string_view(mixed).substr(0, k))) continue;
      std::vector<int> part = t.encode(std::string_view(mixed).substr(0, k));
      t.encode_into(mixed, part, k);
      CAPTURE(k);
      CHECK(part == all);
      made++;
    }
    CHECK(made > 100);
  }
  // The letter test itself: the last character whole and a letter, any script.
  for (const char* yes : {"abc", "\u041f\u0440\u0438\u0432\u0435\u0442", "x\u4e2d", "\uac01"}) CHECK(ul::ends_with_letter(yes));
  for (const char* no : {"", "1", "a.", "e\u0301", "\xd0", "a\x80"}) CHECK_FALSE(ul::ends_with_letter(no));
}

TEST_CASE("tokenizer.json: an added token that is also a vocabulary entry, ignore_merges, a byte-order mark",
          "[bpe]") {
  std::ifstream in(ul_test::source_path("tests/data/bpe_tiny_gpt2.json"));
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ul_test::TempDir d;
  int files = 0;
  auto edited = [&](std::string s, const std::vector<std::pair<std::string, std::string>>& edits) {
    for (const auto& [from, to] : edits) {
      const size_t at = s.find(from);
      REQUIRE(at != std::string::npos);
      s.replace(at, from.size(), to);
    }
    const std::string path = d / ("t" + std::to_string(files++) + ".json");
    std::ofstream(path, std::ios::binary) << s;
    return path;
  };
  const Tokenizer base(ul_test::source_path("tests/data/bpe_tiny_gpt2.json"));
  // "he" (id 256, merge 0) also an added special token, as tokenizers' add_special_tokens writes a
  // string already in the vocabulary: it stays the merges' token (Hugging Face encodes "the cat
  // the" through it), and the file loads (it was refused: "merge 0 ('h', 'e') makes no token").
  const Tokenizer dup(edited(good, {{"\"added_tokens\": [", "\"added_tokens\": [{\"id\": 256, \"content\": \"he\", "
                                    "\"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": "
                                    "false, \"special\": true}, "}}));
  CHECK(dup.encode("the cat the") == base.encode("the cat the"));
  // Added tokens (not special: found in text) that overlap: at each place the longest that starts
  // there, the leftmost place first ("abcd" over "ab" and "abc"; then "bc"; "ab"), the rest BPE's.
  std::string added;
  const char* texts[] = {"ab", "abc", "abcd", "bc", "b!"};
  for (int k = 0; k < 5; k++)
    added += "{\"id\": " + std::to_string(577 + k) + ", \"content\": \"" + texts[k] + "\", \"single_word\": false, "
             "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": false}, ";
  const Tokenizer over(edited(good, {{"\"added_tokens\": [", "\"added_tokens\": [" + added}}));
  std::vector<int> want = base.encode("x");
  for (int id : {579, 580, 577, 578}) want.push_back(id);
  CHECK(over.encode("xabcdbcababc") == want);
  // The leftmost place wins over a longer match further on: "ab" at 0, not "b!" at 1.
  want = {577};
  for (int id : base.encode("!")) want.push_back(id);
  CHECK(over.encode("ab!") == want);
  CHECK(over.encode("cb!") == [&] {  // "b!" at 1, after a "c" no entry starts
    std::vector<int> w = base.encode("c");
    w.push_back(581);
    return w;
  }());
  // A long added token (the lookup hashes stretches of the text in O(1) a length: it once cost
  // every byte the longest entry's length), found where it is whole, between shorter ones.
  const std::string long_token(3000, 'a');
  const Tokenizer longer(edited(good, {{"\"added_tokens\": [", "\"added_tokens\": [" + added + "{\"id\": 582, "
                                        "\"content\": \"" + long_token + "\", \"single_word\": false, \"lstrip\": "
                                        "false, \"rstrip\": false, \"normalized\": false, \"special\": false}, "}}));
  want = {577};
  for (int id : {582, 582}) want.push_back(id);
  for (int id : base.encode(std::string(100, 'a'))) want.push_back(id);
  want.push_back(578);
  CHECK(longer.encode("ab" + std::string(6100, 'a') + "abc") == want);
  // Matches one after another over 80 KB, past where the scan drops the hashes behind it (64 KiB),
  // then the long one: every match found, none misplaced.
  std::string many;
  for (int k = 0; k < 40000; k++) many += "ab";
  want.assign(40000, 577);
  want.push_back(582);
  CHECK(longer.encode(many + long_token) == want);
  // ... and a stretch of 70 KB where no entry starts, then a match: the scan's hashes had not
  // reached the place it dropped them to (it erased past the array's end: a crash).
  const std::string gap(70000, 'z');
  want = base.encode(gap);
  want.push_back(577);
  CHECK(longer.encode(gap + "ab") == want);
  std::vector<int> twice = want;
  twice.insert(twice.end(), want.begin(), want.end());
  CHECK(longer.encode(gap + "ab" + gap + "ab") == twice);
  CHECK(base.encode("the").size() < 3);  // (merged through "he")
  // ignore_merges: a piece that is a token whole stays whole though no merge reaches it (Llama 3's
  // rule); without it, the merges decide. "zqxj" (id 576) is reached by none.
  const std::vector<std::pair<std::string, std::string>> zqxj = {{"\"vocab\": {", "\"vocab\": {\"zqxj\": 576, "},
                                                                 {"\"id\": 576,", "\"id\": 577,"}};
  std::vector<std::pair<std::string, std::string>> whole = zqxj;
  whole.push_back({"\"ignore_merges\": false", "\"ignore_merges\": true"});
  const Tokenizer kept(edited(good, whole)), merged(edited(good, zqxj));
  CHECK(kept.encode("zqxj") == std::vector<int>{576});
  CHECK(merged.encode("zqxj").size() == 4);
  CHECK(merged.encode("zqxj") == base.encode("zqxj"));
  // A byte-order mark before the JSON: named as such (it was read as an llm.c file's bad magic).
  const std::string bom = d / "bom.json";
  std::ofstream(bom, std::ios::binary) << "\xEF\xBB\xBF" << good;
  CHECK_THROWS_WITH(Tokenizer(bom), Catch::Contains(bom + ": tokenizer.json starts with a UTF-8 byte-order mark"));
  // SentencePiece-style without the byte token <0xE4>: the error names the byte's offset in the
  // text (it named one in the text as rewritten, a space before it and each U+2581 one byte).
  std::ifstream sp_in(ul_test::source_path("tests/data/bpe_tiny_sp.json"));
  const std::string sp_json((std::istreambuf_iterator<char>(sp_in)), std::istreambuf_iterator<char>());
  const Tokenizer no_e4(edited(sp_json, {{"\"<0xE4>\"", "\"<0xZZ>\""}, {"\"<0xE4>\"", "\"<0xZZ>\""}}));
  CHECK_THROWS_WITH(no_e4.encode("ab cd \u4e00"), Catch::Contains("byte 0xE4 at byte 6 has no token"));
  CHECK_THROWS_WITH(no_e4.encode("\u2581\u2581\u2581\u4e00"), Catch::Contains("byte 0xE4 at byte 9 has no token"));
}

TEST_CASE("tokenizer.json: what would encode differently is refused, naming the file", "[bpe]") {
  std::ifstream in(ul_test::source_path("tests/data/bpe_tiny_llama3.json"));
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ul_test::TempDir d;
  const std::string path = d / "tokenizer.json";
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    std::ofstream(path, std::ios::binary) << s;
    return path;
  };
  const struct {
    std::string from, to, words;
  } bad[] = {
      {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "a normalizer (NFKC)"},
      {"\\p{N}{1,3}", "\\p{N}{1,2}", "its pattern is"},
      {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model is WordPiece, not BPE"},
      {"\"byte_fallback\": false", "\"byte_fallback\": true", "byte_fallback"},
      // an id past the entries' count: a gap, refused before tables of that many entries are made
      {"\"Ġ\": 220,", "\"Ġ\": 9999,", "a token id of 9999 among"},
      {"\"id\": 576,", "\"id\": 16777215,", "a token id of 16777215 among"},
      // an added token on a vocabulary token's id: two texts, one id
      {"\"id\": 576,", "\"id\": 5,", "added token '<|begin_of_text|>' has id 5, which the vocabulary gives to '&'"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.words);
    CHECK_THROWS_WITH(Tokenizer(with(b.from, b.to)), Catch::Contains(path) && Catch::Contains(b.words));
  }
  // Qwen 2's layout: an added token found in text that would take the spaces around it, or whole
  // words only, is matched differently.
  std::ifstream q(ul_test::source_path("tests/data/bpe_tiny_qwen2.json"));
  const std::string qwen((std::istreambuf_iterator<char>(q)), std::istreambuf_iterator<char>());
  for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
    std::string s = qwen;
    const std::string tool = "\"content\": \"<tool_call>\",";
    const size_t at = s.find(tool);
    REQUIRE(at != std::string::npos);
    const std::string off = "\"" + std::string(flag) + "\": false";
    const size_t f = s.find(off, at);
    REQUIRE(f != std::string::npos);
    s.replace(f, off.size(), "\"" + std::string(flag) + "\": true");
    std::ofstream(path, std::ios::binary) << s;
    CAPTURE(flag);
    CHECK_THROWS_WITH(Tokenizer(path),
                      Catch::Contains(path) && Catch::Contains("'<tool_call>' sets " + std::string(flag)));
  }
}
