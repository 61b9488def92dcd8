#include "data/jsonl.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "engine/json.h"

namespace ul {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

bool is_jsonl(const std::string& path) {
  const std::string name = lower(path);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson");
}

std::string unreadable_input(const std::string& path) {
  const std::string name = lower(path);
  const bool json = name.find(".json.") != std::string::npos;  // C4's c4-train.00000-of-01024.json.gz
  const std::string as_jsonl = json ? "; a JSON Lines file then needs a name ending in .jsonl" : "";
  // By content first: the name may not say (a gzip file named .txt, .GZ or .jsonl).
  unsigned char head[512] = {};
  size_t n = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
  }
  auto starts = [&](const char* magic, size_t len) { return n >= len && std::memcmp(head, magic, len) == 0; };
  struct Packed {
    const char* magic;
    size_t len;
    const char *what, *undo;
  };
  // Each signature holds bytes that are no text's first (control bytes, or bzip2's "BZh" + level +
  // the block magic 1AY&SY).
  const Packed packed[] = {{"\x1f\x8b", 2, "gzip-compressed", "gunzip -k"},
                           {"\x28\xb5\x2f\xfd", 4, "zstd-compressed", "zstd -d"},
                           {"\xfd" "7zXZ\0", 6, "xz-compressed", "unxz -k"},
                           {"\x04\x22\x4d\x18", 4, "lz4-compressed", "lz4 -d"},
                           {"PK\x03\x04", 4, "a zip archive", "unzip"},
                           {"7z\xbc\xaf\x27\x1c", 6, "a 7-Zip archive", "7z x"}};
  for (const Packed& p : packed)
    if (starts(p.magic, p.len))
      return path + ": " + p.what + " (prepare reads plain text and JSON Lines): unpack it first (" + p.undo + " " + path +
             ")" + as_jsonl;
  if (n >= 10 && starts("BZh", 3) && head[3] >= '1' && head[3] <= '9' && std::memcmp(head + 4, "1AY&SY", 6) == 0)
    return path + ": bzip2-compressed (prepare reads plain text and JSON Lines): unpack it first (bunzip2 -k " + path + ")" +
           as_jsonl;
  if (n >= 262 && std::memcmp(head + 257, "ustar", 5) == 0)
    return path + ": a tar archive (prepare reads plain text and JSON Lines): extract its files (tar xf " + path +
           ") and give them";
  for (const char* z : {".gz", ".zst", ".bz2", ".xz", ".lz4", ".zip", ".tar", ".7z"})
    if (ends_with(name, z))
      return path + ": named as a compressed file or an archive (prepare reads plain text and JSON Lines): unpack it "
                    "first" + as_jsonl;
  if (ends_with(name, ".parquet") || ends_with(name, ".arrow"))
    return path + ": a " + (ends_with(name, ".arrow") ? "Arrow" : "Parquet") +
           " table (prepare reads plain text and JSON Lines): export it as JSON Lines first, e.g. with the datasets "
           "library: Dataset.from_file or load_dataset, then .to_json(\"F.jsonl\")";
  if (ends_with(name, ".json"))
    return path + ": a .json file is read as JSON Lines only when its name ends in .jsonl (or .ndjson): rename it if it "
                  "holds one object a line (C4's and Dolma's .json files do), or give it another ending (.txt) to train "
                  "on its characters as text";
  return "";
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
