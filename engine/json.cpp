#include "engine/json.h"

#include <cerrno>
#include <new>
#include <set>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>

namespace ul {

namespace {

class Parser {
 public:
  Parser(const std::string& s, const std::string& where, size_t max_values, const std::string* only)
      : s_(s), where_(where), values_left_(max_values), only_(only) {}

  JsonValue document() {
    JsonValue v = value(0, false);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  const std::string& where_;
  size_t values_left_;
  const std::string* only_;  // keep only this field of a top-level object (the others are checked, not kept)
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonSyntaxError(where_, i_, what);
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) i_++;
  }
  char peek() {
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end of text");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    i_++;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  // drop: checked as strictly, but nothing of it kept (a field parse_json's `only` leaves out: its
  // values cost no memory however many there are).
  JsonValue value(int depth, bool drop) {
    if (depth > 64) fail("nested deeper than 64 levels");  // bounds the recursion on hostile input
    if (!drop && values_left_-- == 0) fail("more values than a file of its kind holds");  // each takes ~112 bytes
    JsonValue v;
    const char c = peek();
    if (c == '{') {
      v.kind = JsonValue::Kind::object;
      i_++;
      if (peek() == '}') return i_++, v;
      std::set<std::string> dropped_keys;  // a dropped object's keys, for the duplicate check
      for (;;) {
        if (peek() != '"') fail("expected a string key");
        std::string key = string();
        expect(':');
        // Left out: the top-level fields but `only` (kept by name, as null, for a caller's message).
        const bool leave = drop || (depth == 0 && only_ && key != *only_);
        JsonValue field = value(depth + 1, leave);
        const bool fresh = drop ? dropped_keys.insert(key).second : v.fields.emplace(key, std::move(field)).second;
        if (!fresh) fail("duplicate key \"" + key + "\"");
        if (peek() == ',') { i_++; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = JsonValue::Kind::array;
      i_++;
      if (peek() == ']') return i_++, v;
      for (;;) {
        if (drop) value(depth + 1, true);
        else v.items.push_back(value(depth + 1, false));
        if (peek() == ',') { i_++; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = JsonValue::Kind::string;
      std::string text = string();
      if (!drop) v.text = std::move(text);
      return v;
    }
    if (literal("true")) { v.kind = JsonValue::Kind::boolean; v.b = true; return v; }
    if (literal("false")) { v.kind = JsonValue::Kind::boolean; return v; }
    if (literal("null")) return v;
    v.kind = JsonValue::Kind::number;
    // Python's json module writes a float that is not finite as NaN, Infinity or -Infinity (not
    // JSON, but what every json.dumps of a dataset's metadata may hold): numbers, kept as text.
    for (const char* word : {"NaN", "Infinity", "-Infinity"})
      if (literal(word)) return v.text = word, v;
    if (c != '-' && (c < '0' || c > '9')) {
      char what[48];
      std::snprintf(what, sizeof what, c >= 0x20 && c < 0x7f ? "unexpected character '%c'" : "unexpected byte 0x%02x",
                    c >= 0x20 && c < 0x7f ? c : unsigned(uint8_t(c)));
      fail(what);
    }
    std::string text = number();
    if (!drop) v.text = std::move(text);
    return v;
  }

  std::string number() {  // the JSON grammar: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?
    const size_t start = i_;
    auto digits = [&] {
      size_t d0 = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') i_++;
      if (i_ == d0) fail("expected a digit");
    };
    if (i_ < s_.size() && s_[i_] == '-') i_++;
    if (i_ < s_.size() && s_[i_] == '0') i_++;
    else digits();
    if (i_ < s_.size() && s_[i_] == '.') { i_++; digits(); }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      i_++;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) i_++;
      digits();
    }
    return s_.substr(start, i_ - start);
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; k++) {
      const char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f') u |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= unsigned(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) { out += char(cp); return; }
    if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); }
    else {
      if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); }
      else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); }
      out += char(0x80 | ((cp >> 6) & 0x3F));
    }
    out += char(0x80 | (cp & 0x3F));
  }

  std::string string() {
    i_++;  // the opening quote
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character inside a string");
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate needs its low half
            if (s_.compare(i_, 2, "\\u") != 0) fail("unpaired surrogate in \\u escape");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate in \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind != Kind::object) return nullptr;
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

int64_t JsonValue::as_int(const std::string& where) const {
  if (kind == Kind::number && text.find_first_of(".eE") == std::string::npos) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && *end == 0) return v;
  }
  throw std::runtime_error(where + ": expected an integer, got " + (kind == Kind::number ? text : "a non-number"));
}

double JsonValue::as_double(const std::string& where) const {
  if (kind != Kind::number) throw std::runtime_error(where + ": expected a number");
  const double x = std::strtod(text.c_str(), nullptr);
  // NaN and Infinity parse (Python writes them), and 1e999 overflows: no setting is meant to be either.
  if (!std::isfinite(x)) throw std::runtime_error(where + ": expected a finite number, got " + text);
  return x;
}

bool JsonValue::as_bool(const std::string& where) const {
  if (kind != Kind::boolean && kind != Kind::null) throw std::runtime_error(where + ": expected true or false");
  return b;
}

const std::string& JsonValue::as_string(const std::string& where) const {
  if (kind != Kind::string) throw std::runtime_error(where + ": expected a string");
  return text;
}

JsonValue parse_json(const std::string& text, const std::string& where, size_t max_values, const std::string* only) {
  try {
    return Parser(text, where, max_values, only).document();
  } catch (const std::bad_alloc&) {  // a value takes about 112 bytes: "0," 56 times its size
    throw std::runtime_error(where + ": out of memory parsing " + std::to_string(text.size()) +
                             " bytes of JSON (each value takes about 112 bytes)");
  }
}

}  // namespace ul
