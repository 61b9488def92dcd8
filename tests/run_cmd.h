// Runs a command line through the shell and captures its exit code and output (stdout + stderr).
#pragma once
#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace ul_test {

struct CmdResult {
  int code = -1;
  std::string out;
};

inline CmdResult run_cmd(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

inline std::string train_cmd(const std::string& args) { return std::string(ULYSSES_TRAIN_BIN) + " " + args; }
inline std::string source_path(const std::string& rel) { return std::string(ULYSSES_SOURCE_DIR) + "/" + rel; }

}  // namespace ul_test
