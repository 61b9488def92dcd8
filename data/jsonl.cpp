#include "data/jsonl.h"

#include <stdexcept>

#include "engine/file_io.h"
#include "engine/json.h"

namespace ul {

bool is_jsonl(const std::string& path) {
  const std::string name = ascii_lower(path);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson");
}

JsonlReader::JsonlReader(const std::string& path, const std::string& key) : f_(path, std::ios::binary), path_(path), key_(key) {
  if (!f_) throw std::runtime_error(path + ": cannot open input file");
}

bool JsonlReader::next(std::string& text) {
  while (std::getline(f_, buf_)) {
    line_++;
    if (line_ == 1 && buf_.compare(0, 3, "\xef\xbb\xbf") == 0) buf_.erase(0, 3);  // a UTF-8 byte-order mark
    if (buf_.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank (a trailing empty line)
    JsonValue v = parse_json(buf_, where());
    if (!v.is(JsonValue::Kind::object))
      throw std::runtime_error(where() + ": not a JSON object (a .jsonl input holds one object a line, its \"" + key_ +
                               "\" field the document's text)");
    auto it = v.fields.find(key_);
    if (it == v.fields.end()) {
      std::string keys;
      int shown = 0;
      for (const auto& [k, _] : v.fields) {
        if (shown++ == 8) {
          keys += ", ...";
          break;
        }
        keys += (keys.empty() ? "\"" : ", \"") + k + "\"";
      }
      throw std::runtime_error(where() + ": no \"" + key_ + "\" field (it has " + (keys.empty() ? "none" : keys) +
                               "); --json-key names the field that holds the text");
    }
    if (!it->second.is(JsonValue::Kind::string))
      throw std::runtime_error(where() + ": its \"" + key_ + "\" field is not a string");
    text = std::move(it->second.text);
    return true;
  }
  if (f_.bad()) throw std::runtime_error(path_ + ": read error after line " + std::to_string(line_));
  return false;
}

}  // namespace ul
