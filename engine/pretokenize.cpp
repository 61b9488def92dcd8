#include "engine/pretokenize.h"

#include <stdexcept>
#include <string>

#include "engine/unicode_classes.h"

namespace ul {

namespace {

enum class Cls : uint8_t { kLetter, kNumber, kSpace, kOther };

std::invalid_argument bad_utf8(size_t i, const char* what) {
  return std::invalid_argument("invalid UTF-8 at byte " + std::to_string(i) + " (" + what + ")");
}

Cls classify(uint32_t cp) {
  if (cp < 0x80) {  // ASCII, the common case, without the tables
    if ((cp | 0x20) - 'a' < 26) return Cls::kLetter;
    if (cp - '0' < 10) return Cls::kNumber;
    if (cp == ' ' || cp - 9 < 5) return Cls::kSpace;  // \t \n \v \f \r
    return Cls::kOther;
  }
  if (is_unicode_letter(cp)) return Cls::kLetter;
  if (is_unicode_number(cp)) return Cls::kNumber;
  if (is_unicode_space(cp)) return Cls::kSpace;
  return Cls::kOther;
}

Cls class_at(std::string_view s, size_t i, size_t& len) { return classify(decode_utf8(s, i, len)); }

// The end of the run of code points of class c that starts at byte i.
size_t run_end(std::string_view s, size_t i, Cls c) {
  size_t len = 0;
  while (i < s.size() && class_at(s, i, len) == c) i += len;
  return i;
}

size_t gpt2_scan(std::string_view s, size_t i, bool digits_apart);
size_t llama3_scan(std::string_view s, size_t i, int max_digits);

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[k])); };
  const uint32_t b0 = b(i);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  uint32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2, cp = b0 & 0x1F, min = 0x80;
  else if (b0 >= 0xE0 && b0 <= 0xEF) len = 3, cp = b0 & 0x0F, min = 0x800;
  else if (b0 >= 0xF0 && b0 <= 0xF4) len = 4, cp = b0 & 0x07, min = 0x10000;
  else throw bad_utf8(i, b0 < 0xC0 ? "a continuation byte where a character starts" : "a byte that never starts a character");
  if (len > s.size() - i) throw bad_utf8(i, "the sequence is cut off by the end of the text");
  for (size_t k = 1; k < len; k++) {
    if ((b(i + k) & 0xC0) != 0x80) throw bad_utf8(i, "a sequence cut short by a byte that does not continue it");
    cp = cp << 6 | (b(i + k) & 0x3F);
  }
  if (cp < min) throw bad_utf8(i, "an overlong encoding");
  if (cp >= 0xD800 && cp <= 0xDFFF) throw bad_utf8(i, "a UTF-16 surrogate");
  if (cp > 0x10FFFF) throw bad_utf8(i, "a value above U+10FFFF");
  return cp;
}

bool ends_with_letter(std::string_view s) {
  if (s.empty()) return false;
  const unsigned char last = static_cast<unsigned char>(s.back());
  if (last < 0x80) return unsigned((last | 0x20) - 'a') < 26;
  size_t i = s.size() - 1;
  for (int back = 0; i > 0 && back < 3 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; back++) i--;
  try {
    size_t len = 0;
    const uint32_t cp = decode_utf8(s, i, len);
    return i + len == s.size() && is_unicode_letter(cp);
  } catch (const std::invalid_argument&) {
    return false;
  }
}

size_t gpt2_piece_end(std::string_view s, size_t i) { return gpt2_scan(s, i, false); }

size_t gpt2_digits_piece_end(std::string_view s, size_t i) { return gpt2_scan(s, i, true); }

namespace {

// GPT-2's pattern; with digits_apart, over the stretches between numbers (\p{N}), each number a
// piece of its own: the pattern then sees a number as the end of the text.
size_t gpt2_scan(std::string_view s, size_t i, bool digits_apart) {
  const size_t n = s.size();
  // 's 't 're 've 'm 'll 'd (lower case only, as GPT-2's pattern has them)
  if (s[i] == '\'' && i + 1 < n) {
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (i + 2 < n && ((c == 'r' && s[i + 2] == 'e') || (c == 'v' && s[i + 2] == 'e') || (c == 'l' && s[i + 2] == 'l')))
      return i + 3;
  }
  size_t len = 0;
  const Cls c0 = class_at(s, i, len);
  if (digits_apart && c0 == Cls::kNumber) return i + len;
  // " ?X+" for X = letters, numbers, others: one optional U+0020, then a run of one class.
  if (s[i] == ' ' && i + 1 < n) {
    size_t len1 = 0;
    const Cls c1 = class_at(s, i + 1, len1);
    if (c1 != Cls::kSpace && !(digits_apart && c1 == Cls::kNumber)) return run_end(s, i + 1, c1);
  }
  if (c0 != Cls::kSpace) return run_end(s, i, c0);
  // "\s+(?!\S)": the run of white space, less its last character when a non-space follows it (the
  // last one then goes with the next piece: " x" above, or a lone "\n" before a word); "\s+" when
  // that would leave nothing.
  size_t last = i, end = i;
  while (end < n && class_at(s, end, len) == Cls::kSpace) last = end, end += len;
  if (digits_apart && end < n && class_at(s, end, len) == Cls::kNumber) return end;  // the stretch ends here
  return end < n && last > i ? last : end;
}

}  // namespace

size_t llama3_piece_end(std::string_view s, size_t i) { return llama3_scan(s, i, 3); }

size_t qwen2_piece_end(std::string_view s, size_t i) { return llama3_scan(s, i, 1); }

namespace {

// Llama 3's pattern with numbers in runs of at most max_digits code points.
size_t llama3_scan(std::string_view s, size_t i, int max_digits) {
  const size_t n = s.size();
  auto lower = [&](size_t k) { return char(s[k] | 0x20); };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitive as Unicode folds case, where U+017F (long s)
  // is an s too.
  if (s[i] == '\'' && i + 1 < n) {
    const char c = lower(i + 1);
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (s.compare(i + 1, 2, "\xC5\xBF") == 0) return i + 3;
    if (i + 2 < n && ((c == 'r' && lower(i + 2) == 'e') || (c == 'v' && lower(i + 2) == 'e') ||
                      (c == 'l' && lower(i + 2) == 'l')))
      return i + 3;
  }
  size_t len = 0, len1 = 0;
  const Cls c0 = class_at(s, i, len);
  const bool newline0 = s[i] == '\r' || s[i] == '\n';
  const Cls c1 = i + len < n ? class_at(s, i + len, len1) : Cls::kSpace;  // kSpace: nothing usable
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0 == Cls::kLetter) return run_end(s, i, Cls::kLetter);
  if (c0 != Cls::kNumber && !newline0 && c1 == Cls::kLetter) return run_end(s, i + len, Cls::kLetter);
  // \p{N}{1,3} (Qwen 2: \p{N})
  if (c0 == Cls::kNumber) {
    size_t end = i + len;
    for (int k = 1; k < max_digits && end < n && class_at(s, end, len1) == Cls::kNumber; k++) end += len1;
    return end;
  }
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  auto others_then_newlines = [&](size_t from) {
    size_t end = run_end(s, from, Cls::kOther);
    while (end < n && (s[end] == '\r' || s[end] == '\n')) end++;
    return end;
  };
  if (c0 == Cls::kOther) return others_then_newlines(i);
  if (s[i] == ' ' && c1 == Cls::kOther && i + 1 < n) return others_then_newlines(i + 1);
  // White space from here on. \s*[\r\n]+: up to and including the run's last newline.
  size_t end = i, last_newline = n, last = i;
  while (end < n && class_at(s, end, len) == Cls::kSpace) {
    if (s[end] == '\r' || s[end] == '\n') last_newline = end;
    last = end, end += len;
  }
  if (last_newline != n) return last_newline + 1;
  // \s+(?!\S), else \s+ (as GPT-2's)
  return end < n && last > i ? last : end;
}

}  // namespace

}  // namespace ul
