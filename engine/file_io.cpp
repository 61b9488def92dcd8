#include "engine/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace ul {

namespace {

std::runtime_error sys_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw sys_error(tmp_, "cannot create");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

std::string MadeDirs::make(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> missing;  // dir and its parents that are not there yet, the deepest first
  for (fs::path p = fs::absolute(dir, ec); !ec && !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  std::error_code is_ec;
  const bool there = fs::is_directory(dir, is_ec);
  // Listed whether or not the whole path was made (a name part too long fails after its parents
  // were): undo() takes back whatever of it is there. In front: a later, deeper path goes first.
  made_.insert(made_.begin(), missing.begin(), missing.end());
  if (there) return "";
  if (fs::exists(dir, is_ec)) return "something that is not a directory has that name";
  return ec ? ec.message() : "it is not there after creating it";
}

void MadeDirs::undo() {
  std::error_code ec;
  for (const std::string& p : made_) std::filesystem::remove(p, ec);  // fails, harmlessly, unless empty
  made_.clear();
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // 64 MiB at a time: the count a save's heartbeat shows moves as the file grows.
    ssize_t w = ::write(fd_, p, std::min<size_t>(bytes, size_t(64) << 20));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw sys_error(tmp_, "write failed");
    count_io_written(uint64_t(w));
    p += w;
    bytes -= size_t(w);
  }
}

void AtomicFile::sync() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) throw sys_error(tmp_, "fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw sys_error(tmp_, "close failed");  // the destructor removes the file
}

void AtomicFile::commit() {
  if (committed_) return;
  sync();
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::runtime_error e = sys_error(path_, "cannot rename the temporary file into place");
    ::unlink(tmp_.c_str());
    throw e;
  }
  committed_ = true;
  fsync_dir(parent_dir(path_));
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw sys_error(dir, "cannot open directory");
  // Some file systems refuse fsync on a directory (EINVAL); they order metadata anyway.
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;
  const int err = errno;
  ::close(fd);
  errno = err;
  if (!ok) throw sys_error(dir, "fsync of the directory failed");
}

void require_regular_file(const std::string& path, bool allow_pipe) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || (allow_pipe && S_ISFIFO(st.st_mode))) return;
  throw std::runtime_error(path + ": not a regular file (" +
                           (S_ISDIR(st.st_mode)    ? "a directory"
                            : S_ISFIFO(st.st_mode) ? "a pipe"
                                                   : "a device or socket") +
                           ")");
}

std::string read_whole_file(const std::string& path, bool allow_pipe) {
  require_regular_file(path, allow_pipe);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw sys_error(path, "cannot open");
  // In blocks into a string sized once for a regular file (a character at a time, doubling as it
  // went, took 3 times as long for a 50 MB text and left 60% more capacity); a pipe grows as it comes.
  std::string text;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) text.reserve(size_t(size));
  char block[1 << 16];
  while (f.read(block, sizeof block) || f.gcount() > 0) {
    text.append(block, size_t(f.gcount()));
    count_io_read(uint64_t(f.gcount()));  // (a heartbeat's bytes read: a safetensors checkpoint is read so)
  }
  if (f.bad()) throw sys_error(path, "read failed");
  return text;
}

namespace {
std::atomic<uint64_t> g_written{0}, g_read{0};
}  // namespace

std::string bytes_text(double b) {
  char t[48];
  const bool gib = b >= double(1 << 30);
  std::snprintf(t, sizeof t, gib ? "%.2f GiB" : "%.1f MiB", b / double(gib ? 1 << 30 : 1 << 20));
  return t;
}

uint64_t io_bytes_written() { return g_written.load(std::memory_order_relaxed); }
uint64_t io_bytes_read() { return g_read.load(std::memory_order_relaxed); }
void count_io_written(uint64_t bytes) { g_written.fetch_add(bytes, std::memory_order_relaxed); }
void count_io_read(uint64_t bytes) { g_read.fetch_add(bytes, std::memory_order_relaxed); }

uint32_t crc32(uint32_t crc, const void* data, size_t bytes) {
  // Eight bytes a step through eight tables ("slicing by 8"): t[k][b] is byte b's CRC pushed k
  // bytes further. A byte a step ran at 0.5 GB/s: minutes of every save and resume of an 8B
  // model's 96 GB of files.
  static const std::array<std::array<uint32_t, 256>, 8> t = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; k++)
      for (uint32_t i = 0; i < 256; i++) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  for (; bytes >= 8; p += 8, bytes -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFu] ^
          t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
#endif
  for (size_t i = 0; i < bytes; i++) crc = t[0][(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

// ---- JSON ----

namespace {

// The length of the well-formed UTF-8 sequence starting at p (left bytes remain), or 0 if none
// does: RFC 3629's forms only (no overlong encodings, no surrogates, nothing past U+10FFFF).
size_t utf8_length(const unsigned char* p, size_t left) {
  const unsigned c = p[0];
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // the second byte's range; the later ones are always 80..BF
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (n > left || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < n; k++)
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  return n;
}

}  // namespace

std::string json_quote(const std::string& s) {
  std::string q = "\"";
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = b[i];
    const size_t n = utf8_length(b + i, s.size() - i);
    char buf[8];
    if (c == '"' || c == '\\') {
      q += '\\';
      q += char(c);
    } else if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      q += buf;
    } else if (n == 0) {
      // A byte that is not UTF-8 (a path's Latin-1 name): as the lone surrogate U+DC00 + byte, the
      // form Python's surrogateescape reads back to the same byte (PEP 383), so the file stays JSON
      // and the path survives a round trip; parse_flat_json maps it back too.
      std::snprintf(buf, sizeof buf, "\\u%04x", 0xDC00u + c);
      q += buf;
    } else {
      q.append(s, i, n);
      i += n;
      continue;
    }
    i++;
  }
  return q + "\"";
}

JsonLine& JsonLine::add_raw(const std::string& key, const std::string& text) {
  if (body_.size() > 1) body_ += ",";
  body_ += json_quote(key) + ":" + text;
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, const std::string& value) { return add_raw(key, json_quote(value)); }
JsonLine& JsonLine::add(const std::string& key, int64_t value) { return add_raw(key, std::to_string(value)); }
JsonLine& JsonLine::add(const std::string& key, uint64_t value) { return add_raw(key, std::to_string(value)); }

JsonLine& JsonLine::add(const std::string& key, double value, int digits) {
  if (!std::isfinite(value)) return add_raw(key, "null");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, value);
  return add_raw(key, buf);
}

std::optional<int64_t> parse_decimal(const std::string& text, int64_t lo, int64_t hi) {
  const size_t digits = text.size() - (!text.empty() && text[0] == '-');
  if (digits == 0 || text.find_first_not_of("0123456789", text.size() - digits) != std::string::npos) return std::nullopt;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) return std::nullopt;
  return int64_t(v);
}

std::map<std::string, std::string> parse_flat_json(const std::string& text, const std::string& where) {
  size_t i = 0;
  auto fail = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error(where + ": " + what + " at character " + std::to_string(i + 1));
  };
  auto skip_ws = [&] { while (i < text.size() && text[i] && std::strchr(" \t\r\n", text[i])) i++; };
  auto string_at = [&]() {
    if (i >= text.size() || text[i] != '"') throw fail("expected a string");
    std::string s;
    for (i++; i < text.size() && text[i] != '"'; i++) {
      if (text[i] != '\\') { s += text[i]; continue; }
      if (++i >= text.size()) break;
      char e = text[i];
      if (e == 'u') {  // only the escapes json_quote writes
        if (i + 4 >= text.size()) throw fail("truncated \\u escape");
        unsigned v = 0;
        for (int k = 1; k <= 4; k++) {
          const char* hex = "0123456789abcdef";
          const char* d = text[i + k] ? std::strchr(hex, std::tolower((unsigned char)text[i + k])) : nullptr;
          if (!d) throw fail("bad \\u escape");
          v = v * 16 + unsigned(d - hex);
        }
        // Control characters, and the U+DC80..U+DCFF json_quote writes for bytes that are not UTF-8.
        if (v > 0x7F && (v < 0xDC80 || v > 0xDCFF)) throw fail("unsupported \\u escape");
        s += char(v & 0xFF);
        i += 4;
      } else {
        const char* from = "\"\\/bfnrt";
        const char* to = "\"\\/\b\f\n\r\t";
        const char* k = std::strchr(from, e);
        if (!k || !e) throw fail("bad escape");
        s += to[k - from];
      }
    }
    if (i >= text.size()) throw fail("unterminated string");
    i++;
    return s;
  };
  std::map<std::string, std::string> out;
  skip_ws();
  if (i >= text.size() || text[i] != '{') throw fail("expected '{'");
  i++;
  skip_ws();
  if (i < text.size() && text[i] == '}') i++;
  else {
    for (;;) {
      skip_ws();
      std::string key = string_at();
      skip_ws();
      if (i >= text.size() || text[i] != ':') throw fail("expected ':'");
      i++;
      skip_ws();
      if (i < text.size() && text[i] == '"') {
        out[key] = string_at();
      } else {
        size_t start = i;
        while (i < text.size() && (std::isalnum((unsigned char)text[i]) || (text[i] && std::strchr("+-.", text[i])))) i++;
        if (i == start) throw fail("expected a string or a number for '" + key + "'");
        out[key] = text.substr(start, i - start);
      }
      skip_ws();
      if (i < text.size() && text[i] == ',') { i++; continue; }
      if (i < text.size() && text[i] == '}') { i++; break; }
      throw fail("expected ',' or '}'");
    }
  }
  skip_ws();
  if (i != text.size()) throw fail("trailing characters");
  return out;
}

std::string float_text(float v) {
  char buf[32];
  for (int digits = 6; digits <= 9; digits++) {  // 9 digits always round-trip a float
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace ul
