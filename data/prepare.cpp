#include "data/prepare.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "data/input_check.h"
#include "data/json_documents.h"
#include "data/shards.h"
#include "data/token_spill.h"
#include "data/tokenize_files.h"
#include "engine/file_io.h"
#include "engine/options.h"
#include "engine/pretokenize.h"
#include "engine/tokenizer.h"

namespace fs = std::filesystem;

namespace ul {

const char* prepare_usage() {
  return R"(usage: train prepare --out DIR [flags] FILES...
  Text files -> llm.c token shards (uint16, magic 20240520): each file is one document (a file
  named *.jsonl or *.ndjson, JSON Lines: each line's "text" field; a *.json array of objects: each
  element's), written as the end-of-text id
  (EOT) then its tokens. The tokens are its bytes (vocabulary: 256 bytes + the EOT, 257 by
  default), or with --tokenizer the byte-level BPE of its UTF-8 text (that file's vocabulary and
  EOT). The headers name both, so a run on the shards takes its vocab and --eot
  from them.
  --out DIR           where the shards go (created; must not hold text_*.bin shards yet)
  --val-frac X        the last X of the tokens form DIR/text_val_*.bin (0: no val shard)   [0.1]
  --shard-tokens N    tokens per shard at most (a training sequence lies within one)  [100000000]
  --eot N             the end-of-text id; a byte value (< 256) refuses files containing it  [256]
  --tokenizer FILE    encode with an llm.c tokenizer (gpt2_tokenizer.bin, version 2: it names
                      the EOT) or a Hugging Face tokenizer.json (GPT-2, digits-apart, Llama 3,
                      Qwen 2 and 2.5, or SentencePiece-style: Llama 2, TinyLlama);
                      a vocabulary above 65536 writes uint32 shards (magic 20240801)
  --json-key KEY      the field of each JSON record that holds its document's text       [text]
  --files-from LIST   more inputs, one path a line of LIST (or NUL-separated, as find -print0
                      writes; - reads standard input), after those named here; repeatable
  --raw               take every input as it is: no refusal of compressed data, archives,
                      tables, or a .json file of JSON Lines; a .json array is one document
Train on the result with
  train --data 'shards:DIR/text_*.bin' --doc-mask ...
)";
}

// The flags that take a value (the others are switches).
static const char* const kWithValue[] = {"--out", "--val-frac", "--shard-tokens", "--tokenizer",
                                         "--files-from", "--json-key", "--eot"};

PrepareOptions parse_prepare_options(int argc, char** argv) {
  PrepareOptions o;
  // train's own flag parsers: decimal as written (no blanks, no hex), in range, the whole value.
  auto number = [](const std::string& flag, const std::string& v) { return parse_float("prepare: " + flag, v); };
  auto integer = [](const std::string& flag, const std::string& v) { return int64_t(parse_int("prepare: " + flag, v)); };
  bool eot_given = false;
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      o.files.push_back(arg);
      continue;
    }
    // --flag VALUE or --flag=VALUE, as train takes them; the flag is known before its value is read.
    const size_t eq = arg.find('=');
    const std::string a = arg.substr(0, eq);
    if (a == "--raw") {  // the one flag without a value
      if (eq != std::string::npos)
        throw std::runtime_error("prepare: --raw is a switch and takes no value (got '" + arg.substr(eq + 1) + "')");
      o.raw = true;
      continue;
    }
    if (std::find(std::begin(kWithValue), std::end(kWithValue), a) == std::end(kWithValue))
      throw std::runtime_error("prepare: unknown flag '" + a + "' (train prepare --help lists the flags)");
    std::string v;
    if (eq != std::string::npos) {
      v = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) throw std::runtime_error("prepare: " + a + ": missing value");
      v = argv[++i];
      // `--out --raw`: a flag where the value should be is a value forgotten, not a directory's
      // name (one that truly starts so goes as --out=--raw).
      if (v.rfind("--", 0) == 0 || v == "-h")
        throw std::runtime_error("prepare: " + a + ": missing value (the next argument, " + v +
                                 ", is a flag; a value spelled like a flag goes as " + a + "=" + v + ")");
    }
    // An empty path (`--tokenizer="$TOK"` with TOK unset) is refused, not taken as the flag left
    // out: that would write byte shards where BPE ones were asked for.
    if ((a == "--out" || a == "--tokenizer") && v.empty()) throw std::runtime_error("prepare: " + a + ": empty path");
    if (a == "--out") o.out = v;
    else if (a == "--val-frac") o.val_frac = number(a, v);
    else if (a == "--shard-tokens") o.shard_tokens = integer(a, v);
    else if (a == "--tokenizer") o.tokenizer = v;
    else if (a == "--files-from") {
      if (v.empty()) throw std::runtime_error("prepare: --files-from: empty path");
      o.files_from.push_back(v);
    }
    else if (a == "--json-key") {
      if (v.empty()) throw std::runtime_error("prepare: --json-key: empty field name");
      o.json_key = v;
    }
    else if (a == "--eot") {
      eot_given = true;
      const int64_t e = integer(a, v);
      // Byte shards' end-of-text: a byte, or 256 past them. A larger id would give them a header
      // ("vocab N+1") that reads as another tokenizer's: refused beside text:FILE's bytes, and
      // with --eot 50256 taken for GPT-2's BPE shards in one glob.
      if (e < 0 || e > 256)
        throw std::runtime_error("prepare: --eot " + v + " is not in [0, 256]: byte shards' end-of-text is a byte "
                                 "(refused in the text) or 256 (the default, past the bytes)");
      o.eot = int(e);
    }
  }
  if (o.out.empty()) throw std::runtime_error("prepare: --out DIR is required");
  if (eot_given && !o.tokenizer.empty())
    throw std::runtime_error("prepare: --eot with --tokenizer: the tokenizer file names its end-of-text id");
  if (o.files.empty() && o.files_from.empty()) throw std::runtime_error("prepare: no input files");
  if (!(o.val_frac >= 0 && o.val_frac < 1)) throw std::runtime_error("prepare: --val-frac must be in [0, 1)");
  // The header's token count is an int32.
  if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX)
    throw std::runtime_error("prepare: --shard-tokens must be in [1, 2^31 - 1]");
  return o;
}

namespace {

constexpr int64_t kMaxShards = 999999;  // a split's, as six digits name them

// Writes one split as shards of at most `per_shard` tokens, all kept as NAME.tmp until commit():
// token by token in order (push), or a whole shard at a time in any order (open, then its tokens'
// bytes with write_raw), as prepare cuts them from the end of its token file.
class ShardWriter {
 public:
  ShardWriter(const std::string& dir, const std::string& split, int64_t total, int64_t per_shard, int vocab, int eot)
      : total_(total), per_shard_(per_shard), vocab_(vocab), eot_(eot), width_(vocab > 65536 ? 4 : 2) {
    // Six digits name a shard: past 999999 the names would sort out of order (text_train_1000000
    // before text_train_100001), and a set that many is a flag's slip (--shard-tokens 1).
    const int64_t shards = (total + per_shard - 1) / per_shard;
    if (shards > kMaxShards)
      throw std::runtime_error("prepare: --shard-tokens " + std::to_string(per_shard) + " cuts the " + split + " split's " +
                               std::to_string(total) + " tokens into " + std::to_string(shards) + " shards, more than " +
                               std::to_string(kMaxShards) + ": give a larger --shard-tokens (llm.c's: 100000000)");
    for (int64_t at = 0; at < total; at += per_shard) {
      char name[64];
      std::snprintf(name, sizeof name, "text_%s_%06d.bin", split.c_str(), int(names_.size()));
      names_.push_back((fs::path(dir) / name).string());
    }
    files_.resize(names_.size());
    bytes_.resize(names_.size(), 0);
  }
  size_t count() const { return names_.size(); }
  int64_t first_token(size_t i) const { return int64_t(i) * per_shard_; }  // within the split
  int width() const { return width_; }
  void push(uint32_t token) {
    if (in_shard_ == 0) open(next_++);
    buf_.push_back(token);
    if (buf_.size() == 65536) flush();
    if (--in_shard_ == 0) {
      flush();
      close(current_);
    }
  }
  // Creates shard i (its temporary and header); its tokens follow with write_raw.
  void open(size_t i) {
    files_.at(i) = std::make_unique<AtomicFile>(names_[i]);
    in_shard_ = tokens_in(i);
    // llm.c's header (GPT-2's uint16 or llama-3's uint32 format), plus the tokenizer it was
    // written with (data/shards.h).
    int32_t header[256] = {width_ == 2 ? 20240520 : 20240801, width_ == 2 ? 1 : 7, int32_t(in_shard_), kShardTag,
                           vocab_, eot_};
    files_[i]->write(header, sizeof header);
    current_ = i;
  }
  // Tokens of the shard open()ed last, as little-endian bytes (width() each).
  void write_raw(const uint8_t* le, size_t n) {
    files_.at(current_)->write(le, n);
    bytes_[current_] += int64_t(n);
  }
  // Shard i complete: its bytes on disk and its descriptor closed, so that a set of thousands of
  // shards never holds more than one open (the open-file limit is often 1024).
  void close(size_t i) {
    check(i);
    files_[i]->sync();
  }
  const std::vector<std::string>& names() const { return names_; }  // the shards' final paths
  // Every shard's bytes on disk, still under their .tmp names; each must hold its tokens.
  void sync() {
    for (size_t i = 0; i < files_.size(); i++) close(i);  // (each already is: AtomicFile::sync is idempotent)
  }
  // Renames every shard into place once all of them are complete.
  void commit(std::vector<std::string>& written) {
    for (auto& f : files_) f->commit();
    written.insert(written.end(), names_.begin(), names_.end());
    if (!files_.empty()) fsync_dir(fs::path(names_[0]).parent_path().string());
  }

 private:
  int64_t tokens_in(size_t i) const { return std::min(per_shard_, total_ - first_token(i)); }
  void check(size_t i) const {
    if (!files_.at(i) || bytes_[i] != tokens_in(i) * width_)
      throw std::logic_error(names_[i] + ": " + std::to_string(bytes_[i] / width_) + " of its " +
                             std::to_string(tokens_in(i)) + " tokens written");
  }
  void flush() {
    // Little-endian on disk, as llm.c writes them, whatever this machine is.
    std::vector<uint8_t> le(buf_.size() * size_t(width_));
    for (size_t k = 0; k < buf_.size(); k++)
      for (int b = 0; b < width_; b++) le[k * size_t(width_) + size_t(b)] = uint8_t(buf_[k] >> (8 * b));
    write_raw(le.data(), le.size());
    buf_.clear();
  }
  int64_t total_, per_shard_, in_shard_ = 0;
  int32_t vocab_, eot_;
  int width_;  // bytes a token
  size_t next_ = 0, current_ = 0;  // push's next shard; the shard being written
  std::vector<uint32_t> buf_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<AtomicFile>> files_;
  std::vector<int64_t> bytes_;  // token bytes written to each shard
};

}  // namespace

namespace {

// A path quoted for a message, control bytes escaped (\r would move the cursor back over it).
std::string printable(const std::string& path) {
  std::string q = "'";
  for (unsigned char c : path) {
    if (c >= 0x20 && c != 0x7f) {
      q += char(c);
      continue;
    }
    char esc[8];
    std::snprintf(esc, sizeof esc, c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : "\\x%02x", c);
    q += esc;
  }
  return q + "'";
}

// o's inputs with those its --files-from lists name appended, in order: one path a line (blank
// lines and a trailing \r skipped: a list written on Windows), or one per NUL byte when the list
// holds any (find -print0: a path may hold a newline, never a NUL). A path is relative to the
// working directory, as on the command line.
PrepareOptions with_listed_files(PrepareOptions o) {
  for (const std::string& list : o.files_from) {
    const std::string name = list == "-" ? "- (standard input)" : list;
    std::string text;
    try {
      if (list == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      else text = read_whole_file(list, true);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("prepare: --files-from: ") + e.what());
    }
    if (text.compare(0, 3, "\xef\xbb\xbf") == 0) text.erase(0, 3);  // a byte-order mark
    if (text.compare(0, 2, "\xff\xfe") == 0 || text.compare(0, 2, "\xfe\xff") == 0)
      throw std::runtime_error("prepare: --files-from " + name + ": UTF-16 text (as PowerShell's > writes): write the list "
                               "as UTF-8");
    const char sep = text.find('\0') != std::string::npos ? '\0' : '\n';
    size_t listed = 0;
    int64_t line = 0;
    for (size_t at = 0; at < text.size(); at++) {
      size_t end = text.find(sep, at);
      if (end == std::string::npos) end = text.size();
      std::string path = text.substr(at, end - at);
      at = end;
      line++;
      if (sep == '\n' && !path.empty() && path.back() == '\r') path.pop_back();
      // Blank: nothing (NUL-separated, only an empty entry: a name may be a space).
      if (sep == '\n' ? path.find_first_not_of(" \t") == std::string::npos : path.empty()) continue;
      std::error_code ec;
      if (!fs::exists(path, ec))
        throw std::runtime_error("prepare: --files-from " + name + (sep ? " line " : " entry ") + std::to_string(line) +
                                 ": " + printable(path) +
                                 (ec ? ": " + ec.message()
                                     : " does not exist (a listed path is relative to the working directory)"));
      o.files.push_back(path), listed++;
    }
    if (listed == 0)
      throw std::runtime_error("prepare: --files-from " + name + " lists no file" +
                               (o.files.empty() ? " (and no input is named before it)" : ""));
  }
  return o;
}

// The inputs given more than once (the same file by any path: overlapping lists), with their
// counts: no error (repeating a file is a way to weight it), but said.
std::vector<std::pair<std::string, int>> repeated_inputs(const std::vector<std::string>& files) {
  std::map<std::string, std::pair<std::string, int>> seen;  // canonical path -> (first name, count)
  std::vector<std::string> order;
  for (const std::string& f : files) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(f, ec).string();
    auto [it, fresh] = seen.try_emplace(ec ? f : key, f, 0);
    if (fresh) order.push_back(it->first);
    it->second.second++;
  }
  std::vector<std::pair<std::string, int>> out;
  for (const std::string& k : order)
    if (seen[k].second > 1) out.push_back(seen[k]);
  return out;
}

std::runtime_error changed_while_read(const std::string& path, const std::string& before, const std::string& after) {
  return std::runtime_error(path + ": changed while being read (" + before + ", then " + after + ")");
}

// --out, made ready for the shards: created (with its missing parents) if need be, refused if it
// holds shards already, cleared of the temporaries (text_*.bin.tmp) of a run that was stopped.
// Unless kept() is called once the shards are in place, the directories it created are removed
// again (each only if empty: the failed run's temporaries are gone by then), so a failed run leaves
// --out as it found it.
class OutputDir {
 public:
  OutputDir(const std::string& dir, const std::vector<std::string>& inputs) {
    if (const std::string why = made_.make(dir); !why.empty())
      throw std::runtime_error(dir + ": cannot create the output directory (" + why + ")");
    // One prepare at a time in a directory: two share every temporary's name, and each would clear,
    // shorten or remove the other's. The lock is the directory's own (flock on its descriptor), so
    // nothing is left behind; the kernel drops it when the process ends, however it ends.
    lock_.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock_.fd >= 0 && ::flock(lock_.fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      throw std::runtime_error(dir + ": another process holds this --out's lock (another train prepare writing "
                               "shards? two would remove each other's files): wait for it to end or pick another --out");
    std::vector<fs::path> stale;
    std::error_code ec;
    // The inputs by device and inode, stat'ed once: each file prepare would remove is looked up
    // (fs::equivalent of every pair took minutes with 20,000 inputs beside 2,000 leftovers).
    std::map<std::pair<dev_t, ino_t>, std::string> input_ids;
    for (const std::string& in : inputs) {
      struct stat st{};
      if (::stat(in.c_str(), &st) == 0) input_ids.emplace(std::make_pair(st.st_dev, st.st_ino), in);
    }
    auto input_at = [&](const fs::path& p) -> const std::string* {  // the input that is p, if any
      struct stat st{};
      if (::stat(p.c_str(), &st) != 0) return nullptr;
      const auto it = input_ids.find({st.st_dev, st.st_ino});
      return it == input_ids.end() ? nullptr : &it->second;
    };
    // The marker's own names are prepare's: an input called so would be removed below.
    const fs::path own_names[] = {fs::path(dir) / kPrepareIncomplete,
                                  fs::path(dir) / (std::string(kPrepareIncomplete) + ".tmp")};
    for (const fs::path& own : own_names)
      if (const std::string* in = input_at(own))
        throw std::runtime_error(*in + ": an input file named like prepare's own marker in --out " + dir +
                                 " (which it would remove): move it or pick another --out");
    // A run killed while renaming its shards (kPrepareIncomplete): the shards it lists are part of
    // a set no run may train on; cleared, as its temporaries are.
    const fs::path marker = fs::path(dir) / kPrepareIncomplete;
    if (fs::exists(marker)) {
      std::istringstream listed(read_whole_file(marker.string()));
      for (std::string name; std::getline(listed, name);)
        if (name.rfind("text_", 0) == 0 && ends_with(name, ".bin") && name.find('/') == std::string::npos) {
          if (const std::string* in = input_at(fs::path(dir) / name))
            throw std::runtime_error(*in + ": an input file that " + marker.string() +
                                     " lists as a shard of an interrupted prepare (which it would remove): move it "
                                     "or pick another --out");
          cleared_ += fs::remove(fs::path(dir) / name, ec) ? 1 : 0;
        }
      fs::remove(marker, ec);
      fsync_dir(dir);
    }
    fs::remove(marker.string() + ".tmp", ec);  // killed while writing the marker itself
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("text_", 0) != 0) continue;
      if (ends_with(name, ".bin"))
        throw std::runtime_error(dir + ": already holds shard " + name + " (remove the old shards or pick another --out)");
      if (!ends_with(name, ".bin.tmp")) continue;
      // An input that happens to carry a temporary's name is an input: never removed.
      if (const std::string* in = input_at(e.path()))
        throw std::runtime_error(*in + ": an input file named like one of prepare's temporaries in --out " + dir +
                                 " (which it would remove): move it or pick another --out");
      stale.push_back(e.path());
    }
    for (const fs::path& p : stale) fs::remove(p, ec);
  }
  void kept() { made_.keep(); }
  int cleared() const { return cleared_; }  // shards of an interrupted run removed

 private:
  struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  };
  MadeDirs made_;  // (a throw above destroys it: what it made goes again)
  Fd lock_;        // --out's descriptor, flocked (closed before made_ removes the directory)
  int cleared_ = 0;
};

// Each document of a JSON input, in order, to fn(text, reader); returns its documents and bytes.
template <class Fn>
std::pair<int64_t, int64_t> json_documents(const std::string& path, const std::string& key, JsonForm form, Fn fn) {
  JsonDocReader json(path, key, form);
  std::string text;
  int64_t n = 0, bytes = 0;
  for (; json.next(text); n++) {
    fn(text, json);
    bytes += int64_t(text.size());
  }
  return {n, bytes};
}

// The --data argument that reads the shards under `out`, for a shell: glob's own characters in
// the directory's name escaped (--out 'run[1]' is no pattern matching run1), then quoted.
std::string shards_argument(const std::string& out) {
  std::string spec = "shards:";
  for (char c : out) {
    if (c == '[' || c == ']' || c == '*' || c == '?' || c == '\\') spec += '\\';
    spec += c;
  }
  return shell_quote(spec + "/text_*.bin");
}

}  // namespace

PrepareResult prepare_shards(const PrepareOptions& given, bool progress) {
  const PrepareOptions o = with_listed_files(given);
  std::unique_ptr<Tokenizer> tok;
  int eot = o.eot, vocab = std::max(256, o.eot + 1);
  if (!o.tokenizer.empty()) {
    tok = std::make_unique<Tokenizer>(o.tokenizer);
    if (tok->eot() < 0)
      throw std::runtime_error(o.tokenizer + ": the tokenizer names no end-of-text token, which opens every document "
                               "(a version 1 llm.c file has none; llm.c's gpt2_tokenizer.bin is version 2; a "
                               "tokenizer.json needs <|endoftext|>, <|begin_of_text|> or <s> among its added tokens)");
    eot = tok->eot();
    vocab = tok->vocab();
  }
  // Check every input before anything is written: present, readable, and free of a byte-valued EOT
  // (or, with a tokenizer, encoded whole).
  std::vector<int64_t> sizes;                          // bytes: each input's (JSON: its texts')
  std::vector<int64_t> per_file(o.files.size(), 1);    // documents (JSON: its records)
  std::vector<JsonForm> forms;                         // each input's (none: one document, its bytes)
  int64_t total = 0;
  // A line at most every 5 s through the passes that read every input (10 GB of text: minutes),
  // as the tokenizer's and the shard cutter's own.
  auto last_note = std::chrono::steady_clock::now();
  // of: the whole, when known ("inputs written to shards: 812 of 10240 MB").
  auto every_5s = [&](const char* what, int64_t bytes, int64_t of = -1) {
    const auto now = std::chrono::steady_clock::now();
    if (!progress || now - last_note < std::chrono::seconds(5)) return;
    if (of >= 0) std::printf("prepare | %s: %.0f of %.0f MB\n", what, double(bytes) / 1e6, double(of) / 1e6);
    else std::printf("prepare | %s: %.0f MB\n", what, double(bytes) / 1e6);
    std::fflush(stdout);
    last_note = now;
  };
  int64_t checked = 0;  // bytes read through by the checking pass
  auto eot_clash = [&](const std::string& where, int64_t offset) {
    return std::runtime_error(where + ": byte " + std::to_string(o.eot) + " at offset " + std::to_string(offset) +
                              " is the end-of-text id (--eot " + std::to_string(o.eot) +
                              "); use the default --eot 256, which no byte can collide with");
  };
  // A tokenizer encodes UTF-8 only: an input that is not is refused as it is read through, before
  // any is encoded, not after hours of encoding the ones before it. s: text at byte `base` of
  // `where`; more: text follows, so a sequence cut off at the end is left to it (its length is
  // returned, for the caller to carry over).
  auto check_utf8 = [](std::string_view s, int64_t base, const std::string& where, bool more) -> size_t {
    for (size_t i = 0, len = 1; i < s.size(); i += len) {
      len = 1;
      if (static_cast<unsigned char>(s[i]) < 0x80) continue;
      try {
        decode_utf8(s, i, len);
      } catch (const std::invalid_argument& e) {
        if (more && s.size() - i < 4) return s.size() - i;
        const char* why = std::strchr(e.what(), '(');
        throw std::runtime_error(where + ": invalid UTF-8 at byte " + std::to_string(base + int64_t(i)) + " " +
                                 (why ? why : ""));
      }
    }
    return 0;
  };
  // What each input is, from its type, name and first bytes, before any is read through (a
  // million-file list on a network file system: minutes, said every 5 s).
  for (const std::string& path : o.files) {
    if (progress && std::chrono::steady_clock::now() - last_note >= std::chrono::seconds(5)) {
      std::printf("prepare | inputs looked at: %zu of %zu files\n", forms.size(), o.files.size());
      std::fflush(stdout);
      last_note = std::chrono::steady_clock::now();
    }
    // The type first: opening a pipe would block until a writer comes.
    if (!fs::is_regular_file(path)) {
      std::error_code ec;
      if (fs::is_directory(path, ec))  // the README's way to take a tree's files, in a fixed order
        throw std::runtime_error(path + ": a directory; to prepare the files under it: find " + shell_quote(path) +
                                 " -type f -name '*.txt' | sort | train prepare --files-from - --out " +
                                 shell_quote(o.out) + " (with the other flags given, and any other inputs listed too)");
      require_regular_file(path);  // names a pipe or device
      throw std::runtime_error(path + ": cannot open input file");
    }
    if (!std::ifstream(path, std::ios::binary)) throw std::runtime_error(path + ": cannot open input file");
    if (!o.raw)
      if (const std::string why = unreadable_input(path); !why.empty()) throw std::runtime_error(why);
    forms.push_back(json_form(path, o.raw));
  }
  // A --json-key that no input reads (the default "text" is never an error).
  if (o.json_key != "text" && std::all_of(forms.begin(), forms.end(), [](JsonForm f) { return f == JsonForm::none; }))
    throw std::runtime_error("prepare: --json-key " + o.json_key + ": no input is read as JSON documents (a .jsonl or "
                             ".ndjson file, or a .json array of objects; any other file is one document, read whole)");
  for (size_t i = 0; i < o.files.size(); i++) {
    const std::string& path = o.files[i];
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error(path + ": cannot open input file");
    int64_t size = 0;
    if (forms[i] != JsonForm::none) {
      // Read through with a tokenizer too: a bad record is found now, not after hours of encoding.
      auto check = [&](const std::string& text, const JsonDocReader& at) {
        every_5s("inputs checked", checked += int64_t(text.size()));
        if (tok) check_utf8(text, 0, at.where() + " (its text)", false);
        if (!tok && o.eot < 256)
          if (const void* hit = std::memchr(text.data(), o.eot, text.size()))
            throw eot_clash(at.where() + " (its text)", static_cast<const char*>(hit) - text.data());
      };
      std::tie(per_file[i], size) = json_documents(path, o.json_key, forms[i], check);
    } else if (tok) {
      std::string chunk(1 << 20, '\0');
      size_t carried = 0;  // bytes of a character the last chunk cut, moved to the front
      while (f.read(&chunk[carried], std::streamsize(chunk.size() - carried)) || f.gcount() > 0) {
        const size_t n = carried + size_t(f.gcount());
        const size_t cut = check_utf8(std::string_view(chunk.data(), n), size - int64_t(carried), path, true);
        size += int64_t(f.gcount());
        every_5s("inputs checked", checked + size);
        std::memmove(&chunk[0], &chunk[n - cut], cut);
        carried = cut;
      }
      if (carried) check_utf8(std::string_view(chunk.data(), carried), size - int64_t(carried), path, false);
    } else {
      std::vector<char> chunk(1 << 20);
      while (f.read(chunk.data(), std::streamsize(chunk.size())) || f.gcount() > 0) {
        const size_t n = size_t(f.gcount());
        if (o.eot < 256)
          if (const void* hit = std::memchr(chunk.data(), o.eot, n))
            throw eot_clash(path, size + (static_cast<const char*>(hit) - chunk.data()));
        size += int64_t(n);
        every_5s("inputs checked", checked + size);
      }
    }
    if (forms[i] == JsonForm::none) checked += size;
    sizes.push_back(size);
    if (!tok) total += size + per_file[i];  // each document's EOT
  }
  // The output directory, before any encoding: one that holds shards is refused now, not after
  // hours of it. Created here if need be, and removed again if prepare fails before the shards.
  OutputDir out(o.out, o.files);
  PrepareResult r;
  std::unique_ptr<TokenSpill> spill;  // with a tokenizer: every document's EOT and tokens, in order
  if (tok) {
    int64_t text_bytes = 0;
    for (int64_t b : sizes) text_bytes += b;
    spill = std::make_unique<TokenSpill>((fs::path(o.out) / "text_tokens.bin").string(), vocab > 65536 ? 4 : 2);
    std::vector<int64_t> read, empty(o.files.size(), 0);
    tokenize_files(*tok, o.files, forms, o.json_key, size_t(text_bytes), progress, read,
                   [&, doc_tokens = size_t(0)](size_t f, std::vector<int32_t>& tokens, bool first,
                                               bool last) mutable {
                     if (first) spill->push(uint32_t(eot)), doc_tokens = 0;
                     for (int32_t t : tokens) spill->push(uint32_t(t));
                     doc_tokens += tokens.size();
                     if (last) empty[f] += doc_tokens == 0;
                   });
    for (size_t i = 0; i < o.files.size(); i++) {
      if (read[i] != per_file[i])
        throw changed_while_read(o.files[i], std::to_string(per_file[i]) + " documents", std::to_string(read[i]));
      if (forms[i] == JsonForm::none ? empty[i] > 0 : per_file[i] == 0) r.empty.push_back(o.files[i]);
      else if (empty[i] > 0) r.empty_docs.push_back({o.files[i], {empty[i], per_file[i]}});
    }
    total = spill->count();
  } else {
    for (size_t i = 0; i < o.files.size(); i++)
      if (forms[i] == JsonForm::none ? sizes[i] == 0 : per_file[i] == 0) r.empty.push_back(o.files[i]);
    // (the bytes path counts a JSON input's empty documents as it writes them)
  }
  for (int64_t n : per_file) r.documents += n;
  const int64_t val = std::llround(o.val_frac * double(total)), train = total - val;
  if (train < 2 || (o.val_frac > 0 && val < 2))
    throw std::runtime_error("prepare: " + std::to_string(total) + " tokens give a train split of " + std::to_string(train) +
                             (o.val_frac > 0 ? " and, at --val-frac " + float_text(float(o.val_frac)) + ", a val split of " +
                                                   std::to_string(val)
                                             : "") +
                             " (each needs >= 2 tokens): " +
                             (train < 2 ? std::string("give more text") : "use --val-frac 0 (no val split) or a larger one"));

  ShardWriter train_w(o.out, "train", train, o.shard_tokens, vocab, eot),
      val_w(o.out, "val", val, o.shard_tokens, vocab, eot);
  int64_t k = 0;  // tokens of the stream so far: the first `train` go to the train split
  auto push = [&](uint32_t t) { (k++ < train ? train_w : val_w).push(t); };
  if (spill) {
    // Cut from the token file's end, the last shard first, the file shortened after each: the disk
    // holds the tokens once and a shard (a 10B-token corpus in uint16: 20 GB, not 40).
    using clock = std::chrono::steady_clock;
    auto last = clock::now();
    for (ShardWriter* w : {&val_w, &train_w}) {
      const int64_t split_start = w == &val_w ? train : 0;
      for (size_t i = w->count(); i-- > 0;) {
        w->open(i);
        spill->take_tail(split_start + w->first_token(i), [&](const uint8_t* le, size_t n) { w->write_raw(le, n); });
        w->close(i);
        const auto now = clock::now();
        if (progress && now - last > std::chrono::seconds(5)) {  // a large corpus: minutes of copying
          std::printf("prepare | shards written: %.0f of %.0f MB\n", double(total - spill->count()) * w->width() / 1e6,
                      double(total) * w->width() / 1e6);
          std::fflush(stdout);
          last = now;
        }
      }
    }
    spill.reset();  // empty now: the shards hold the tokens
  }
  int64_t copied = 0;  // input bytes written as byte tokens so far
  int64_t all_bytes = 0;
  for (int64_t b : sizes) all_bytes += b;
  for (size_t i = 0; i < o.files.size() && !tok; i++) {
    if (forms[i] != JsonForm::none) {
      int64_t none = 0;
      auto write = [&](const std::string& text, const JsonDocReader&) {
        every_5s("inputs written to shards", copied += int64_t(text.size()), all_bytes);
        push(uint32_t(eot));
        for (char c : text) push(uint8_t(c));
        none += text.empty();
      };
      const auto [n, size] = json_documents(o.files[i], o.json_key, forms[i], write);
      if (n != per_file[i] || size != sizes[i])
        throw changed_while_read(o.files[i], std::to_string(per_file[i]) + " documents of " + std::to_string(sizes[i]) +
                                                 " bytes", std::to_string(n) + " of " + std::to_string(size));
      if (none > 0) r.empty_docs.push_back({o.files[i], {none, n}});
      continue;
    }
    push(uint32_t(eot));
    std::ifstream f(o.files[i], std::ios::binary);
    std::vector<char> chunk(1 << 20);
    int64_t size = 0;
    while (f.read(chunk.data(), std::streamsize(chunk.size())) || f.gcount() > 0) {
      for (std::streamsize j = 0; j < f.gcount(); j++) push(uint8_t(chunk[size_t(j)]));
      size += f.gcount();
      every_5s("inputs written to shards", copied += f.gcount(), all_bytes);
    }
    if (!f.eof() || size != sizes[i])
      throw changed_while_read(o.files[i], std::to_string(sizes[i]) + " bytes", std::to_string(size));
  }
  r.inputs = o.files.size();
  r.repeated = repeated_inputs(o.files);
  r.train_tokens = train;
  r.val_tokens = val;
  r.vocab = vocab;
  r.eot = eot;
  if (tok) r.encoding = std::string(tok->splitter()) + " BPE of " + o.tokenizer;
  // The set appears whole or not at all: every file is made durable first (the slow part), then
  // they are renamed with the stop signals held back (SLURM's SIGUSR1 too), so that one cannot leave
  // some shards in place and others not (a later run would train on part of the data without a
  // word). A signal that arrives meanwhile is delivered once the renames are done. What no signal
  // mask holds back (kill -9, the OOM killer, a lost node) finds kPrepareIncomplete in --out, listing
  // the shards, until the last rename is durable: shards: refuses the directory, a rerun clears it.
  train_w.sync();
  val_w.sync();
  const std::string marker = (fs::path(o.out) / kPrepareIncomplete).string();
  {
    std::string listed;
    for (const std::string& name : train_w.names()) listed += fs::path(name).filename().string() + "\n";
    for (const std::string& name : val_w.names()) listed += fs::path(name).filename().string() + "\n";
    write_file_atomic(marker, listed);
  }
  sigset_t held, before;
  sigemptyset(&held);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) sigaddset(&held, sig);
  pthread_sigmask(SIG_BLOCK, &held, &before);
  // TEST HOOK: ULYSSES_TEST_RAISE="prepare renames" sends this process SIGTERM here, held back
  // as any signal now is (the only way a test lands one inside the renames).
  if (const char* t = std::getenv("ULYSSES_TEST_RAISE"); t && std::string(t) == "prepare renames") std::raise(SIGTERM);
  try {
    train_w.commit(r.shards);
    val_w.commit(r.shards);
    if (::unlink(marker.c_str()) != 0) throw std::runtime_error(marker + ": cannot remove it: " + std::strerror(errno));
    fsync_dir(o.out);
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw;
  }
  // A signal held back meanwhile ends the process as the mask lifts, before the summary: say that
  // the set it leaves is whole (else the user finds out only from a rerun's refusal).
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  // (Only one that will end it: a signal the caller ignores or blocks is pending too, and then
  // discarded or kept waiting as the mask lifts, and prepare goes on to its summary.)
  const std::pair<int, const char*> ends[] = {
      {SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}, {SIGQUIT, "SIGQUIT"}, {SIGUSR1, "SIGUSR1"}};
  for (const auto& [sig, name] : ends) {
    struct sigaction action {};
    if (sigismember(&pending, sig) == 1 && sigismember(&before, sig) == 0 && sigaction(sig, nullptr, &action) == 0 &&
        action.sa_handler == SIG_DFL) {
      std::fprintf(stderr, "prepare | %s came during the final renames and was held until they were done: the %zu "
                   "shard(s) under %s are complete; stopping\n", name, r.shards.size(), o.out.c_str());
      std::fflush(stderr);
      break;
    }
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  out.kept();
  r.cleared = out.cleared();
  return r;
}

int prepare_main(int argc, char** argv) {
  // --help anywhere; -h too, but not where a flag's value goes (`--out -h` printed the help and
  // exited 0, writing nothing a script asked for: it is refused as a value forgotten).
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const bool value_place = i > 1 && std::find(std::begin(kWithValue), std::end(kWithValue), std::string(argv[i - 1])) !=
                                          std::end(kWithValue);
    if (a == "--help" || (a == "-h" && !value_place)) {
      std::fputs(prepare_usage(), stdout);
      return 0;
    }
  }
  const PrepareOptions o = parse_prepare_options(argc, argv);
  const PrepareResult r = prepare_shards(o, true);
  if (r.cleared)
    std::printf("prepare | removed %d shard(s) an interrupted prepare left in %s (%s listed them)\n", r.cleared,
                o.out.c_str(), kPrepareIncomplete);
  std::printf("prepare | %zu file(s), %lld document(s) -> %lld train + %lld val tokens in %zu shard(s) under %s (%s, "
              "vocab %d, EOT %d)\n",
              r.inputs, (long long)r.documents, (long long)r.train_tokens, (long long)r.val_tokens, r.shards.size(), o.out.c_str(),
              r.encoding.c_str(), r.vocab, r.eot);
  // An empty input is no error (a corpus may hold some), but a typo'd or truncated file shows here.
  for (const std::string& f : r.empty)
    std::printf(json_form(f, o.raw) == JsonForm::lines
                    ? "note    | %s holds no document (no line that is not blank): it adds nothing\n"
                    : "note    | %s is empty: it adds nothing but a document boundary\n",
                f.c_str());
  for (const auto& [f, n] : r.repeated)
    std::printf("note    | %s is given %d times (by these or other paths): its documents are in the shards %d times\n",
                f.c_str(), n, n);
  for (const auto& [f, n] : r.empty_docs)
    std::printf("note    | %s: empty documents: %lld of %lld (each adds nothing but a document boundary)\n",
                f.c_str(), (long long)n.first, (long long)n.second);
  // A sequence never crosses a shard (data/shards.h): small shards bound --seq and waste each one's tail.
  if (r.train_tokens > o.shard_tokens && o.shard_tokens < 1048576)
    std::printf("note    | shards of %lld tokens: a training sequence lies within one shard, so --seq must be below "
                "that, and each shard's last partial sequence goes unused\n", (long long)o.shard_tokens);
  // The headers name the vocab and the EOT: the run takes them from there.
  // (--doc-mask for several documents: one alone has no boundary to mask, and the run's note would
  // then ask whether --eot is right)
  std::printf("train with: train --data %s%s\n", shards_argument(o.out).c_str(), r.documents > 1 ? " --doc-mask" : "");
  return 0;
}

}  // namespace ul
