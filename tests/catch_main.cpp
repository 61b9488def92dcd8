// Catch2 main for the cpu, emu and gpu tests. Every run warns about (and so fails on) a test case
// that checked nothing: a test returning early before its assertions must not pass unnoticed.
// ctest adds --warn NoTests (tests/CMakeLists.txt); Catch2 v2 takes --warn once, so this one is
// set here.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  Catch::Session session;
  const int bad_args = session.applyCommandLine(argc, argv);
  if (bad_args != 0) return bad_args;
  Catch::ConfigData& cfg = session.configData();
  cfg.warnings = static_cast<Catch::WarnAbout::What>(cfg.warnings | Catch::WarnAbout::NoAssertions);
  return session.run();
}
