// The one Catch2 session runner (tests/catch_impl.cpp, where Catch2's implementation is compiled
// once): catch_main.cpp's and tests/mpi/mpi_main.cpp's main call it.
#pragma once

namespace ul_test {

// Parses the command line and runs the selected test cases; returns the exit status. With
// warn_no_assertions, a test case that checked nothing fails (a test returning early before its
// assertions must not pass unnoticed).
int run_catch_session(int argc, char** argv, bool warn_no_assertions);

}  // namespace ul_test
