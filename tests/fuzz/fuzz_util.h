// Shared by the libFuzzer targets (tests/fuzz/run.sh builds and runs them).
// The parsers under test read paths, so each input is written to one scratch file per process
// first. A parser may reject an input by throwing std::exception — that is a clean refusal; a
// crash, a sanitizer report, a hang, a blown memory limit or a failed FUZZ_CHECK is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include <cstring>
#include <vector>

#include "engine/file_io.h"
#include "engine/llmc_format.h"

// Aborts (a finding) when a parser accepted an input but broke a promise of its header.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace fuzz {

// This process' scratch file of that name (removed at exit), holding exactly `data`.
inline const std::string& input_file(const uint8_t* data, size_t size, const char* name) {
  static std::map<std::string, std::string> paths;  // name -> path (a map: its strings stay put)
  static const bool removed_at_exit = [] {
    return std::atexit([] {
      for (const auto& [_, p] : paths) std::remove(p.c_str());
    }) == 0;
  }();
  (void)removed_at_exit;
  auto [it, fresh] = paths.try_emplace(name);
  if (fresh)
    it->second = (std::filesystem::temp_directory_path() / ("ulysses_fuzz_" + std::to_string(getpid()) + "_" + name)).string();
  const std::string& path = it->second;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();  // the scratch directory itself failed: not the parser's fault, but stop
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Our checkpoint files (engine/checkpoint_files.h) store at bytes [12, 16) the crc32 of the
// header (with that field zero) and the payload: recompute it so the input gets past the checksum.
inline void fix_crc(std::vector<uint8_t>& b, size_t header_bytes) {
  if (b.size() < header_bytes) return;
  std::memset(b.data() + 12, 0, 4);
  const uint32_t crc = ul::crc32(0, b.data(), b.size());
  std::memcpy(b.data() + 12, &crc, 4);
}

// The model the debug-state target reads states for (make_seeds.cpp writes a matching seed).
inline ul::LlmcConfig tiny_llmc_config() {
  ul::LlmcConfig c;
  c.max_seq = 4, c.vocab = 5, c.padded_vocab = 8, c.layers = 1, c.heads = 1, c.channels = 2;
  return c;
}

}  // namespace fuzz
