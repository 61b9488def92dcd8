#include "data/input_check.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

namespace {


struct Packed {
  const char* magic;
  size_t len;
  const char *what, *suffix, *unpack;  // unpack: a command that writes the data to stdout
};
// Each signature holds bytes that are no text's first (control bytes; bzip2's is checked further).
const Packed kCompressed[] = {{"\x1f\x8b", 2, "gzip-compressed", ".gz", "gzip -dc"},
                              {"\x28\xb5\x2f\xfd", 4, "zstd-compressed", ".zst", "zstd -dc"},
                              {"\xfd" "7zXZ\0", 6, "xz-compressed", ".xz", "xz -dc"},
                              {"\x04\x22\x4d\x18", 4, "lz4-compressed", ".lz4", "lz4 -dc"},
                              {"BZh", 3, "bzip2-compressed", ".bz2", "bzip2 -dc"}};
const Packed kArchives[] = {{"PK\x03\x04", 4, "a zip archive", ".zip", "unzip"},
                            {"7z\xbc\xaf\x27\x1c", 6, "a 7-Zip archive", ".7z", "7z x"}};

const char* kRaw = " (--raw takes every input as it is)";

// A path a command takes as a file, never as an option: "./-x.gz", not "-x.gz".
std::string as_operand(const std::string& path) { return path.compare(0, 1, "-") == 0 ? "./" + path : path; }

// The command that unpacks `path` into a name prepare reads as it should: the suffix dropped
// (c4.json.gz -> c4.jsonl: C4's JSON Lines), or "unpacked_" before the name when it has none.
std::string unpack_hint(const std::string& path, const Packed& p) {
  std::string out = path;
  if (ends_with(ascii_lower(out), p.suffix)) out.resize(out.size() - std::strlen(p.suffix));
  const size_t slash = out.rfind('/'), base = slash == std::string::npos ? 0 : slash + 1;
  if (out.size() == base || out == path) out.insert(base, "unpacked_");  // no suffix, or nothing but it
  if (ends_with(ascii_lower(out), ".json")) out += "l";
  return std::string(p.unpack) + " " + shell_quote(as_operand(path)) + " > " + shell_quote(as_operand(out));
}

// Whether the file looks like JSON Lines: its first two lines that are not blank each one object
// on its line ("{...}"), judged by their shape within the first 1 MiB of each, not parsed (a
// line the strict parser refuses is still JSON Lines here, where .jsonl would name it; a
// one-line minified .json is one object, not lines of them; a pretty-printed one starts "{" alone).
bool looks_like_json_lines(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  constexpr size_t kLook = size_t(1) << 20;
  int objects = 0;
  for (int lines = 0; lines < 2 && f;) {
    std::string line;
    bool whole = false;  // the line's end was seen within kLook bytes
    for (int c; (c = f.get()) != EOF;) {
      if (c == '\n') {
        whole = true;
        break;
      }
      if (line.size() < kLook) line += char(c);
    }
    whole = whole || f.eof();
    if (lines == 0 && objects == 0 && line.compare(0, 3, "\xef\xbb\xbf") == 0) line.erase(0, 3);
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;  // blank
    lines++;
    const size_t last = line.find_last_not_of(" \t\r");
    const bool object = line[first] == '{' && last > first && (line.size() >= kLook || !whole || line[last] == '}');
    if (!object) return false;
    objects++;
  }
  return objects == 2;
}

}  // namespace

std::string shell_quote(const std::string& word) {
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string unreadable_input(const std::string& path) {
  const std::string name = ascii_lower(path);
  unsigned char head[512] = {};
  size_t n = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
  }
  auto starts = [&](const Packed& p) { return n >= p.len && std::memcmp(head, p.magic, p.len) == 0; };
  for (const Packed& p : kCompressed) {
    // bzip2: "BZh", the block size 1-9, then the first block's magic (pi's digits 1AY&SY).
    const bool bzip2 = std::strcmp(p.suffix, ".bz2") == 0;
    if (starts(p) && (!bzip2 || (n >= 10 && head[3] >= '1' && head[3] <= '9' && std::memcmp(head + 4, "1AY&SY", 6) == 0)))
      return path + ": " + p.what + " (prepare reads plain text and JSON Lines): unpack it first: " + unpack_hint(path, p) +
             kRaw;
  }
  for (const Packed& p : kArchives)
    if (starts(p))
      return path + ": " + p.what + " (prepare reads plain text and JSON Lines): extract its files (" + p.unpack + " " +
             shell_quote(as_operand(path)) + ") and give them" + kRaw;
  if (n >= 262 && std::memcmp(head + 257, "ustar", 5) == 0)
    return path + ": a tar archive (prepare reads plain text and JSON Lines): extract its files (tar xf " +
           shell_quote(as_operand(path)) + ") and give them" + kRaw;
  for (const char* z : {".gz", ".zst", ".bz2", ".xz", ".lz4", ".zip", ".tar", ".7z"})
    if (ends_with(name, z))
      return path + ": named as a compressed file or an archive (prepare reads plain text and JSON Lines): unpack it "
                    "first" + std::string(kRaw);
  if (ends_with(name, ".parquet") || ends_with(name, ".arrow"))
    return path + ": a " + (ends_with(name, ".arrow") ? "Arrow" : "Parquet") +
           " table (prepare reads plain text and JSON Lines): export it as JSON Lines first, e.g. with the datasets "
           "library: Dataset.from_file or load_dataset, then .to_json(\"F.jsonl\")" + kRaw;
  if (ends_with(name, ".json") && looks_like_json_lines(path))
    return path + ": a .json file of one JSON object a line: JSON Lines, as C4 and Dolma name it; name it .jsonl (or "
                  ".ndjson) to read one document a line" + std::string(kRaw);
  return "";
}

}  // namespace ul
