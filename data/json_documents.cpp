#include "data/json_documents.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/json.h"

namespace ul {

namespace {

bool json_blank(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// A byte for a message: 'x' when printable ASCII, else its value (a NUL would end the message).
std::string shown(int c) {
  if (c > 0x20 && c < 0x7f) return "'" + std::string(1, char(c)) + "'";
  char hex[16];
  std::snprintf(hex, sizeof hex, "byte 0x%02x", c);
  return hex;
}

// An element longer than this is taken for a broken one (a quote unescaped or missing makes the
// scan run on through the file) rather than read on into memory.
constexpr size_t kMaxElement = size_t(1) << 30;
const char kBom[] = "\xef\xbb\xbf";

}  // namespace

JsonForm json_form(const std::string& path, bool raw) {
  const std::string name = ascii_lower(path);
  if (ends_with(name, ".jsonl") || ends_with(name, ".ndjson")) return JsonForm::lines;
  std::error_code ec;
  // Only a regular file is looked into: opening a pipe would block until a writer comes (prepare
  // refuses it, naming what it is, before reading).
  if (raw || !ends_with(name, ".json") || !std::filesystem::is_regular_file(path, ec)) return JsonForm::none;
  std::ifstream f(path, std::ios::binary);
  int c = f.get();
  if (c == 0xef && f.get() == 0xbb && f.get() == 0xbf) c = f.get();  // a UTF-8 byte-order mark
  size_t looked = 0;
  for (char want : {'[', '{'}) {
    while (json_blank(c) && ++looked < (size_t(1) << 20)) c = f.get();
    if (c != want) return JsonForm::none;
    c = f.get();
  }
  return JsonForm::array;
}

JsonDocReader::JsonDocReader(const std::string& path, const std::string& key, JsonForm form)
    : f_(path, std::ios::binary), path_(path), key_(key), form_(form), line_(form == JsonForm::lines ? 0 : 1) {
  if (form == JsonForm::none) throw std::logic_error(path + ": JsonDocReader on a file that is not JSON documents");
  if (!f_) throw std::runtime_error(path + ": cannot open input file");
  if (form == JsonForm::array) chunk_.resize(size_t(1) << 16);
}

std::string JsonDocReader::where() const {
  if (form_ == JsonForm::lines) return path_ + " line " + std::to_string(doc_line_);
  return path_ + " element " + std::to_string(element_) + " (line " + std::to_string(doc_line_) + ")";
}

std::runtime_error JsonDocReader::not_an_object() const {
  return std::runtime_error(where() + ": not a JSON object (" +
                            (form_ == JsonForm::lines ? "a .jsonl input holds one object a line"
                                                      : "a .json array of documents holds one object an element") +
                            ", its \"" + key_ + "\" field the document's text)");
}

bool JsonDocReader::fill() {
  if (at_ < have_) return true;
  f_.read(chunk_.data(), std::streamsize(chunk_.size()));
  have_ = size_t(f_.gcount());
  at_ = 0;
  if (have_ == 0 && f_.bad()) throw std::runtime_error(path_ + ": read error at line " + std::to_string(line_));
  return have_ > 0;
}

int JsonDocReader::get() {
  if (!fill()) return -1;
  const int c = static_cast<unsigned char>(chunk_[at_++]);
  line_ += c == '\n';
  return c;
}

int JsonDocReader::get_past_blanks() {
  int c;
  while (json_blank(c = get())) {
  }
  return c;
}

void JsonDocReader::take(std::string& text) {
  JsonValue v;
  try {
    // The other fields checked, not kept; of what is kept (the text, the other fields' names), no
    // more than a record of a text and its metadata holds: a text field that is an array of a
    // million values is refused at the 65537th, not after taking 112 bytes each.
    v = parse_json(buf_, where(), size_t(1) << 16, &key_);
  } catch (const JsonSyntaxError& e) {
    if (e.problem.rfind("more values than", 0) == 0)  // the bound above, not a syntax error
      throw std::runtime_error(where() + ": more than 65536 values in its \"" + key_ + "\" field and the other "
                               "fields' names: not a document (its \"" + key_ + "\" must be a string)");
    if (form_ == JsonForm::lines) throw;  // a byte of a line is a place in the file already
    // An element may span lines (pretty-printed): the line of the fault, not a byte of the element.
    const size_t at = std::min(e.offset, buf_.size());
    const int64_t line = doc_line_ + std::count(buf_.begin(), buf_.begin() + std::ptrdiff_t(at), '\n');
    throw std::runtime_error(where() + ": invalid JSON on line " + std::to_string(line) + ": " + e.problem);
  }
  if (!v.is(JsonValue::Kind::object)) throw not_an_object();
  auto it = v.fields.find(key_);
  if (it == v.fields.end()) {
    std::string keys;
    int listed = 0;
    for (const auto& [k, _] : v.fields) {
      if (listed++ == 8) {
        keys += ", ...";
        break;
      }
      keys += (keys.empty() ? "\"" : ", \"") + k + "\"";
    }
    throw std::runtime_error(where() + ": no \"" + key_ + "\" field (it has " + (keys.empty() ? "none" : keys) +
                             "); --json-key names the field that holds the text" +
                             (form_ == JsonForm::array ? " (--raw reads a .json file whole, as text)" : ""));
  }
  if (!it->second.is(JsonValue::Kind::string))
    throw std::runtime_error(where() + ": its \"" + key_ + "\" field is not a string");
  text = std::move(it->second.text);
  // A long record's JSON is not kept beside its text while the caller holds that (a batch of them).
  if (buf_.capacity() > (size_t(1) << 20)) std::string().swap(buf_);
}

// One line into `line` (without its '\n'), as std::getline, but refused past kMaxElement bytes: a
// file of one huge line (a .json array named .jsonl) is not read whole before it is refused.
bool JsonDocReader::read_line(std::string& line) {
  line.clear();
  char chunk[1 << 16];
  bool any = false;
  for (;;) {
    f_.getline(chunk, sizeof chunk);
    const std::streamsize got = f_.gcount();
    const bool full = f_.fail() && !f_.eof() && got == std::streamsize(sizeof chunk) - 1;  // no '\n' yet
    if (!f_.eof() && !full && got > 0) {
      line.append(chunk, size_t(got) - 1);  // the '\n' was taken
      return true;
    }
    any = any || got > 0;
    line.append(chunk, size_t(got));
    if (line.size() > kMaxElement)
      throw std::runtime_error(path_ + " line " + std::to_string(line_ + 1) +
                               ": over 1 GiB without a line end: a .jsonl file holds one JSON object a line (a .json "
                               "array is read as one when named .json)");
    if (!full) return any || !line.empty();  // the end of the file (or an empty last read)
    f_.clear();  // the chunk filled: read on
  }
}

bool JsonDocReader::next(std::string& text) {
  if (form_ == JsonForm::array) return next_element(text);
  while (read_line(buf_)) {
    doc_line_ = ++line_;
    if (line_ == 1 && buf_.compare(0, 3, kBom) == 0) buf_.erase(0, 3);
    if (buf_.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank (a trailing empty line)
    take(text);
    return true;
  }
  if (f_.bad()) throw std::runtime_error(path_ + ": read error after line " + std::to_string(line_));
  return false;
}

// The array is read as a stream: each element's bytes are found by their braces (outside strings)
// and parsed alone, so a file of any size costs one element's memory.
bool JsonDocReader::next_element(std::string& text) {
  if (done_) return false;
  int c;
  if (!started_) {
    started_ = true;
    c = get();
    if (c == 0xef && get() == 0xbb && get() == 0xbf) c = get();  // a UTF-8 byte-order mark
    while (json_blank(c)) c = get();
    if (c != '[') throw std::runtime_error(path_ + ": no longer opens with '[' (changed while being read?)");
    c = get_past_blanks();
    if (c == ']') c = -2;  // an empty array
  } else {
    auto truncated = [&](const char* after) {
      return std::runtime_error(path_ + ": ends after element " + std::to_string(element_) + after +
                                " without the array's closing ']' (a truncated file?)");
    };
    c = get_past_blanks();
    if (c == ',') {
      c = get_past_blanks();
      if (c == -1) throw truncated(" and a ','");
      if (c == ']')
        throw std::runtime_error(path_ + " line " + std::to_string(line_) + ": a ',' after element " +
                                 std::to_string(element_) + " and then the array's end (not JSON)");
    } else if (c == ']') {
      c = -2;
    } else if (c == -1) {
      throw truncated("");
    } else {
      throw std::runtime_error(path_ + " line " + std::to_string(line_) + ": after element " + std::to_string(element_) +
                               " comes " + shown(c) + " where a ',' or the closing ']' should");
    }
  }
  if (c == -2) {  // the closing ']': nothing but blanks may follow
    done_ = true;
    if (get_past_blanks() != -1)
      throw std::runtime_error(path_ + " line " + std::to_string(line_) +
                               ": more after the array's closing ']' (arrays one after another are not one JSON "
                               "document: write JSON Lines instead, as datasets' to_json does by default)");
    return false;
  }
  element_++;
  doc_line_ = line_;
  if (c != '{') throw not_an_object();
  buf_.assign(1, '{');
  int depth = 1;
  bool in_string = false, escaped = false;
  while (depth > 0) {
    if (buf_.size() >= kMaxElement)
      throw std::runtime_error(where() + ": over 1 GiB without its end: a quote missing or not escaped (as \\\") "
                               "somewhere in it? (a document that long: give it as a text file)");
    if (in_string && !escaped && fill()) {  // a run of a string's plain bytes, copied at once
      const char* run = chunk_.data() + at_;
      size_t n = 0;
      while (at_ + n < have_ && run[n] != '"' && run[n] != '\\' && run[n] != '\n') n++;
      buf_.append(run, n);
      at_ += n;
      if (at_ == have_) continue;
    }
    if ((c = get()) == -1)
      throw std::runtime_error(where() + ": the file ends inside it (a truncated file, or a string whose closing "
                               "quote is missing or that holds a quote not escaped as \\\")");
    if (in_string && c < 0x20)
      throw std::runtime_error(where() + ": a raw control " + shown(c) + " inside a string, on line " +
                               std::to_string(line_ - (c == '\n')) +
                               " (not JSON: written \\n and so on; or a quote before it is not escaped as \\\")");
    buf_ += char(c);
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  take(text);
  return true;
}

}  // namespace ul
