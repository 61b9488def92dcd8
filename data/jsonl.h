// JSON Lines input for `train prepare`: the format corpora are exported in (Hugging Face datasets'
// to_json, most public dumps). One JSON object a line; its string field `key` ("text" unless
// --json-key says otherwise) is one document. Blank lines are skipped; any other line that is not
// such an object stops prepare, naming the file and the line (a corpus with a broken line is
// better fixed than trained on with a hole or a line of JSON syntax as text).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace ul {

// Whether prepare reads the file as JSON Lines: its name ends in .jsonl or .ndjson (any case).
bool is_jsonl(const std::string& path);

class JsonlReader {
 public:
  JsonlReader(const std::string& path, const std::string& key);  // throws naming the file
  // The next document's text (decoded: escapes resolved, \u as UTF-8); false after the last.
  bool next(std::string& text);
  int64_t line() const { return line_; }  // the line the last document came from, from 1
  // "FILE line N": for messages about the last document.
  std::string where() const { return path_ + " line " + std::to_string(line_); }

 private:
  std::ifstream f_;
  std::string path_, key_, buf_;
  int64_t line_ = 0;
};

}  // namespace ul
