// A benchmark's main(): runs run(argc, argv), turning an exception (no device, out of memory, a
// failed launch) into one line naming the program and the error, and exit status 1; stdout is
// line-buffered.
#pragma once
#include <cstdio>
#include <exception>

inline int guarded_main(int (*run)(int, char**), int argc, char** argv) {
  // Line by line even into a file: a benchmark stopped at a time limit keeps the rows it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
