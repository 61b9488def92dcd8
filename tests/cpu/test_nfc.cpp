// NFC normalization (engine/nfc.h) against Hugging Face's tokenizers' NFC normalizer (Unicode 9.0's
// NFC: the reference, since a model saw its tokens): the cases of tests/data/nfc_cases.txt, written
// by tools/gen_nfc_tables.py (fixed texts, every code point of the tables in context, random mixes
// of starters, marks of many classes and ages, Hangul and exclusions).
// Text already in NFC comes back as a view of itself, and invalid UTF-8 is refused.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "engine/nfc.h"
#include "run_cmd.h"

using namespace ul;

namespace {

std::string unhex(const std::string& h) {
  if (h == "-") return "";
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}

// Whether to_nfc left s alone: its result views s itself.
bool unchanged(const std::string& s) {
  std::string scratch;
  const std::string_view v = to_nfc(s, scratch);
  return v.data() == s.data() && v.size() == s.size();
}

}  // namespace

TEST_CASE("NFC matches Hugging Face's tokenizers on the generated cases", "[nfc]") {
  std::ifstream f(ul_test::source_path("tests/data/nfc_cases.txt"));
  REQUIRE(f);
  std::string in_hex, want_hex;
  int n = 0, changed = 0;
  while (f >> in_hex >> want_hex) {
    const std::string in = unhex(in_hex), want = unhex(want_hex);
    CAPTURE(n, in_hex, want_hex);
    const std::string got = nfc(in);
    CHECK(got == want);
    // The result is in NFC: normalizing it again leaves it alone, without a copy.
    CHECK(nfc(want) == want);
    CHECK(unchanged(want));
    CHECK(unchanged(in) == (in == want));
    changed += in != want;
    n++;
  }
  CHECK(n == 818);
  CHECK(changed > 600);
}

TEST_CASE("NFC: the classic cases, Hangul, exclusions, and a start offset", "[nfc]") {
  CHECK(nfc("e\u0301") == "\u00e9");
  CHECK(nfc("A\u030a") == "\u00c5");
  CHECK(nfc("\u212b") == "\u00c5");  // ANGSTROM SIGN, a singleton
  CHECK(nfc("\u2126") == "\u03a9");  // OHM SIGN
  CHECK(nfc("\u0958") == "\u0915\u093c");  // a composition exclusion stays decomposed
  CHECK(nfc("\u1100\u1161\u11a8") == "\uac01");
  CHECK(nfc("\uac00\u11a8") == "\uac01");
  CHECK(nfc("a\u0301\u0323") == "\u1ea1\u0301");  // marks reordered by class, then composed
  CHECK(nfc("\u1e9b\u0323") == "\u1e9b\u0323");  // UAX #15's example
  CHECK(nfc("\u0301x") == "\u0301x");  // a mark with nothing before it
  // Unicode 9.0's NFC, as tokenizers: a mark encoded later (U+07FD, 11.0) is a starter, so the
  // dot below stays after it; U+11935 U+11930 (13.0) do not compose into U+11938.
  CHECK(nfc("a\u07fd\u0323") == "a\u07fd\u0323");
  CHECK(nfc("\U00011935\U00011930") == "\U00011935\U00011930");
  CHECK(nfc("") == "");
  std::string scratch;
  const std::string text = "abc e\u0301";
  CHECK(to_nfc(text, scratch, 4) == "\u00e9");
  CHECK(to_nfc(text, scratch, 3) == " \u00e9");
}

TEST_CASE("NFC leaves ASCII and text already in NFC as it is, and refuses invalid UTF-8", "[nfc]") {
  CHECK(unchanged("plain ASCII, no copy\n"));
  CHECK(unchanged("caf\u00e9 \u6771\u4eac \ud55c\uad6d\uc5b4 \u0b95\u0bbe \U0001f642 \u00e9\u0316"));
  CHECK_FALSE(unchanged("cafe\u0301"));
  CHECK_THROWS_WITH(nfc("ab\xff"), Catch::Contains("invalid UTF-8 at byte 2"));
  CHECK_THROWS_WITH(nfc("e\u0301\xed\xa0\x80"),
                    Catch::Contains("invalid UTF-8 at byte 3") && Catch::Contains("surrogate"));
  std::string scratch;
  CHECK_THROWS_WITH(to_nfc("xyz\xe2\x82", scratch, 1), Catch::Contains("invalid UTF-8 at byte 3"));
}
