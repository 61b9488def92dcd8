// What the `train prepare` tests write and read: input files and the shards that come out.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/file_io.h"

namespace ul_test {

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Every file prepare wrote into dir, by name, as bytes.
inline std::vector<std::pair<std::string, std::string>> shards_in(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> s;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    s.push_back({e.path().filename().string(), ul::read_whole_file(e.path().string())});
  std::sort(s.begin(), s.end());
  return s;
}

}  // namespace ul_test
