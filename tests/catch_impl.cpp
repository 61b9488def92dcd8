// Catch2's implementation, compiled once for every test executable: it is the largest translation
// unit of the tests, and catch_main.cpp and tests/mpi/mpi_main.cpp each compiled it for their main.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.h"
#include "engine/float_env.h"

int ul_test::run_catch_session(int argc, char** argv, bool warn_no_assertions) {
  ul::flush_subnormals();  // as train computes (engine/float_env.h): before any thread
  Catch::Session session;
  const int bad_args = session.applyCommandLine(argc, argv);
  if (bad_args != 0) return bad_args;
  if (warn_no_assertions) {
    Catch::ConfigData& cfg = session.configData();
    cfg.warnings = static_cast<Catch::WarnAbout::What>(cfg.warnings | Catch::WarnAbout::NoAssertions);
  }
  return session.run();
}
