// The command-line parsers: train's flags (parse_options, then model_config as train runs it) and
// `train prepare`'s (parse_prepare_options). The input is argv, its words separated by NUL bytes.
#include "data/prepare.h"
#include "engine/options.h"
#include "fuzz_util.h"

#include <stdexcept>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words{"train"};
  std::string w;
  for (size_t i = 0; i < size; i++) {
    if (data[i]) w += char(data[i]);
    else words.push_back(w), w.clear();
  }
  if (!w.empty()) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& s : words) argv.push_back(&s[0]);
  argv.push_back(nullptr);
  const int argc = int(words.size());
  try {
    ul::Options o = ul::parse_options(argc, argv.data());
    FUZZ_CHECK(o.batch >= 1 && o.seq >= 1 && o.sp >= 1 && o.grad_accum >= 1);
    FUZZ_CHECK(ul::model_config(o, 256).sliding_window >= 0);
  } catch (const std::exception&) {
  }
  try {
    ul::PrepareOptions p = ul::parse_prepare_options(argc, argv.data());
    FUZZ_CHECK(!p.out.empty() && (!p.files.empty() || !p.files_from.empty()) && p.shard_tokens >= 1 && p.eot >= 0 &&
               p.eot <= 256);
  } catch (const std::exception&) {
  }
  return 0;
}
