// Durable files and the two small text formats that checkpoints and run logs share.
//
// AtomicFile: every file a checkpoint or log plot holds is written as NAME.tmp, fsynced, renamed
// over NAME, and the directory fsynced — so after a crash NAME is either the old file or the whole
// new one, never a torn mix.
// crc32: the checksum of the binary checkpoint files (IEEE 802.3, as zlib; "123456789" ->
// 0xCBF43926), so a flipped byte is refused instead of silently trained on.
// JsonLine / parse_flat_json: one flat JSON object per line (string and number values only),
// enough for per-rank checkpoint metadata and the jsonl run log, with no library.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ul {

class AtomicFile {
 public:
  // Creates (truncates) path + ".tmp". Throws std::runtime_error naming the file.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();  // not committed: closes and removes the temporary file
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // fsync and close: every byte on disk, still under NAME.tmp (the slow half of a commit, so that
  // a set of files can be made durable first and then renamed together). Idempotent.
  void sync();
  // sync(), rename over the final name, fsync the directory. Throws on any failure.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Directories made for a run's outputs, undone if the run does not get to write them: make()
// creates a directory with its missing parents and remembers those it created; unless keep() is
// called (the outputs are in place), the destructor removes them again, the deepest first, each
// only if empty. So a run refused or failed after making them leaves the filesystem as it was.
class MadeDirs {
 public:
  MadeDirs() = default;
  ~MadeDirs() { undo(); }
  MadeDirs(const MadeDirs&) = delete;
  MadeDirs& operator=(const MadeDirs&) = delete;
  // Creates dir and its missing parents. Returns "" when dir is a directory afterwards (another
  // process may have made it: ranks race), else why not.
  std::string make(const std::string& dir);
  void keep() { made_.clear(); }
  void undo();  // removes them now (those still empty)

 private:
  std::vector<std::string> made_;  // absolute paths, the deepest first
};

// The whole of `text` into `path`, atomically.
void write_file_atomic(const std::string& path, const std::string& text);
// Makes the entries of a directory (creations, renames, removals) durable.
void fsync_dir(const std::string& dir);
// The whole file as bytes; throws naming the file when it cannot be read, or when it is not a
// regular file (a pipe would block, or give its bytes once) unless allow_pipe (a --prompt-file).
std::string read_whole_file(const std::string& path, bool allow_pipe = false);
// s with ASCII letters in lower case (file names compared without regard to case).
inline std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}
// Whether s (a file name) ends with tail.
inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// Throws naming the path when it exists but is not a regular file: a directory would fail
// mid-read with a stream error, /dev/zero would never end, a pipe reads once (data and weights
// are read more than once, or by every rank). A missing path is left to the open, which names it.
// allow_pipe: a file read once, whole (--prompt-file /dev/stdin).
void require_regular_file(const std::string& path, bool allow_pipe = false);

// The shortest "%g" text that reads back as the same float: 0.707, 1e-06 (not 0.707000017,
// 9.99999997e-07), for settings printed where people read them and parsed back.
std::string float_text(float v);

// The bytes this process has written through AtomicFile (and the llm.c writer) and read from
// checkpoint payloads, since it started: the heartbeat's clock names them during a long save,
// export or resume load ("3.20 GiB written"). Every thread's count, --comm local's ranks' summed.
uint64_t io_bytes_written();
// "3.20 GiB" from 1 GiB on, else "812.0 MiB": a size in a progress line or a note.
std::string bytes_text(double bytes);
uint64_t io_bytes_read();
void count_io_written(uint64_t bytes);
void count_io_read(uint64_t bytes);

// Continues a CRC-32 over `bytes` more bytes: crc32(crc32(0, a), b) == crc32 of a followed by b.
uint32_t crc32(uint32_t crc, const void* data, size_t bytes);

// Builds one JSON object: {"key":value,...}. Doubles keep every bit with the default precision
// (17 significant digits), so a value read back compares equal; non-finite numbers become null.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, int value) { return add(key, int64_t(value)); }
  JsonLine& add(const std::string& key, uint64_t value);
  JsonLine& add(const std::string& key, double value, int digits = 17);
  JsonLine& add_raw(const std::string& key, const std::string& json_text);  // text is already JSON
  std::string str() const { return body_ + "}"; }

 private:
  std::string body_ = "{";
};

// A JSON string literal for s: quotes, backslashes and control characters escaped, UTF-8 as is,
// and each byte that is not UTF-8 as \udcXX (Python's surrogateescape reads it back as that byte).
std::string json_quote(const std::string& s);

// Parses one flat JSON object. Values map to their text: strings unescaped, numbers / true / false
// / null as written (so a uint64 seed or a double keeps its exact digits). Nested objects and
// arrays are refused. Throws std::runtime_error prefixed with `where`.
std::map<std::string, std::string> parse_flat_json(const std::string& text, const std::string& where);
// A field's text as a base-10 integer in [lo, hi]: digits with an optional leading '-', nothing
// else (no spaces, no '+', no wrap-around of a negative into a large unsigned); else nullopt.
std::optional<int64_t> parse_decimal(const std::string& text, int64_t lo, int64_t hi);

}  // namespace ul
