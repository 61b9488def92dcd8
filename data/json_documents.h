// JSON inputs for `train prepare`: the forms corpora are exported in. Each document is the string
// field `key` ("text" unless --json-key says otherwise) of one JSON object:
//   - JSON Lines (a name ending in .jsonl or .ndjson, any case: Hugging Face datasets' to_json,
//     most public dumps): one object a line; blank lines are skipped;
//   - a JSON array of objects (a .json file opening with "[" then "{": to_json(lines=False),
//     Alpaca-style instruction sets), read element by element as a stream, never whole.
// Anything else where a document should be stops prepare, naming the file and the line (and the
// element): a corpus with a broken record is better fixed than trained on with a hole or with JSON
// syntax as text.
#pragma once
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ul {

enum class JsonForm { none, lines, array };  // none: the file is one document, its bytes

// How prepare reads `path`: lines for a .jsonl/.ndjson name; array for a .json name whose content
// opens with "[" and "{" (whitespace and a byte-order mark aside; the first 1 MiB is looked at),
// unless `raw` (--raw: a .json is read whole, as text); none otherwise.
JsonForm json_form(const std::string& path, bool raw);

class JsonDocReader {
 public:
  JsonDocReader(const std::string& path, const std::string& key, JsonForm form);  // throws naming the file
  // The next document's text (decoded: escapes resolved, \u as UTF-8); false after the last.
  bool next(std::string& text);
  int64_t line() const { return doc_line_; }  // the line the last document starts on, from 1
  // "FILE line N" or "FILE element K (line N)": for messages about the last document.
  std::string where() const;

 private:
  bool fill();  // false at the end of the file, else bytes are in chunk_
  int get();    // the next byte, or -1 at the end (counts lines)
  int get_past_blanks();
  void take(std::string& text);  // the document's text from the object in buf_
  std::runtime_error not_an_object() const;  // the last record is not an object: the message
  bool next_element(std::string& text);
  bool read_line(std::string& line);

  std::ifstream f_;
  std::string path_, key_, buf_;
  JsonForm form_;
  std::vector<char> chunk_;  // array: the bytes read ahead
  size_t at_ = 0, have_ = 0;
  int64_t line_ = 1, doc_line_ = 0, element_ = 0;
  bool started_ = false, done_ = false;
};

}  // namespace ul
