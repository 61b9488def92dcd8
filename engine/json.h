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
#include <stdexcept>
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

// What parse_json throws on malformed input: the message "WHERE: invalid JSON at byte N: PROBLEM",
// with N and PROBLEM kept apart for a caller that says where N is in its own terms.
struct JsonSyntaxError : std::runtime_error {
  JsonSyntaxError(const std::string& where, size_t at, const std::string& problem)
      : std::runtime_error(where + ": invalid JSON at byte " + std::to_string(at) + ": " + problem),
        offset(at), problem(problem) {}
  size_t offset;
  std::string problem;
};

// Throws JsonSyntaxError on any malformed input, or past max_values values (a reader's bound on
// what a file of its kind can hold: each value takes about 112 bytes however short its text), and
// a runtime_error naming `where` when memory runs out. only: of a top-level object keep just that
// field; the others are checked as strictly but kept as empty values of their kind (their names
// stay, for a message listing them): a .jsonl record's metadata (an array of a million token ids
// beside its text) then costs nothing.
JsonValue parse_json(const std::string& text, const std::string& where, size_t max_values = SIZE_MAX,
                     const std::string* only = nullptr);

}  // namespace ul
