#include "data/jsonl.h"

#include <stdexcept>

#include "engine/json.h"

namespace ul {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool is_jsonl(const std::string& path) { return ends_with(path, ".jsonl"); }

std::string unreadable_input(const std::string& path) {
  for (const char* z : {".gz", ".zst", ".bz2", ".xz"})
    if (ends_with(path, z))
      return path + ": a compressed file (prepare reads plain text and .jsonl): decompress it first, e.g. " +
             (std::string(z) == ".zst" ? "zstd -d " : std::string(z) == ".gz" ? "gunzip -k " :
              std::string(z) == ".bz2" ? "bunzip2 -k " : "unxz -k ") + path;
  if (ends_with(path, ".parquet"))
    return path + ": a Parquet table (prepare reads plain text and .jsonl): export it as JSON Lines first, e.g. "
                  "pandas.read_parquet(F).to_json(F.jsonl, orient='records', lines=True)";
  return "";
}

JsonlReader::JsonlReader(const std::string& path, const std::string& key) : f_(path, std::ios::binary), path_(path), key_(key) {
  if (!f_) throw std::runtime_error(path + ": cannot open input file");
}

bool JsonlReader::next(std::string& text) {
  while (std::getline(f_, buf_)) {
    line_++;
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
