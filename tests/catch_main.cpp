// Catch2 main for the cpu, emu and gpu tests. Every run warns about (and so fails on) a test case
// that checked nothing: a test returning early before its assertions must not pass unnoticed.
// ctest adds --warn NoTests (tests/CMakeLists.txt); Catch2 v2 takes --warn once, so this one is
// set here (tests/catch_impl.cpp).
#include "catch_session.h"

int main(int argc, char** argv) { return ul_test::run_catch_session(argc, argv, true); }
