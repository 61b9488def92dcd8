// Options from a command line written as one string, as `train` would parse it: tests build their
// runs the way users write them.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "engine/options.h"

namespace ul_test {

inline ul::Options options(const std::string& args) {
  std::istringstream in(args);
  std::vector<std::string> words{"train"};
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(&w[0]);
  return ul::parse_options(int(argv.size()), argv.data());
}

}  // namespace ul_test
