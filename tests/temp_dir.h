// A fresh directory under the system temp dir for one test, removed with everything in it when the
// test ends. Unique per process and per instance, so tests can run in parallel.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace ul_test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("ulysses_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }
};

// Damages a file in place: the byte `back` bytes before its end, one bit flipped (a checksum's test).
inline void flip_byte_from_end(const std::string& path, int back) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-back, std::ios::end);
  const int c = f.get();
  f.seekp(-back, std::ios::end);
  f.put(char(c ^ 0x10));
  if (c < 0 || !f) throw std::runtime_error("flip_byte_from_end: cannot change " + path);
}

}  // namespace ul_test
