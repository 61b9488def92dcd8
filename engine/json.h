// A small JSON value and a strict parser, for the JSON that interop and prepare read: the header of
// a safetensors file, a Hugging Face config.json and tokenizer.json, the lines of a .jsonl corpus.
// They nest (objects of objects, arrays of numbers), which the flat parser in engine/file_io.h
// refuses on purpose.
//
// Strict means: one value, then only whitespace; no trailing commas, no comments, no duplicate keys,
// no control characters inside strings, \u escapes (with surrogate pairs) decoded to UTF-8. Numbers
// keep their text so that an int64 offset is not rounded through a double. One extension: NaN,
// Infinity and -Infinity, which Python's json module writes for floats that are not finite (a
// dataset's metadata in a .jsonl line), parse as numbers; as_int and as_double refuse them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ul {

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool b = false;
  std::string text;                        // number: as written; string: decoded
  std::vector<JsonValue> items;            // array
  std::map<std::string, JsonValue> fields; // object

  bool is(Kind k) const { return kind == k; }
  const JsonValue* find(const std::string& key) const;  // object field or nullptr
  // Throw std::runtime_error prefixed with `where` unless the value has the right form.
  int64_t as_int(const std::string& where) const;  // a number that is an exact integer
  double as_double(const std::string& where) const;
  const std::string& as_string(const std::string& where) const;
  bool as_bool(const std::string& where) const;  // true or false; null reads as false (Python's falsy None)
};

// Throws std::runtime_error "WHERE: invalid JSON at byte N: ..." on any malformed input.
JsonValue parse_json(const std::string& text, const std::string& where);

}  // namespace ul
