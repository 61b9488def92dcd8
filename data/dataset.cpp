#include "data/dataset.h"

#include <stdexcept>

#include "data/shards.h"
#include "data/synthetic.h"
#include "data/text.h"

namespace ul {

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

std::unique_ptr<Dataset> open_dataset(const std::string& spec, Split split, uint64_t seed, int model_vocab) {
  std::unique_ptr<Dataset> ds;
  auto arg = [&](const char* prefix) -> const char* {
    size_t n = std::char_traits<char>::length(prefix);
    return spec.compare(0, n, prefix) == 0 ? spec.c_str() + n : nullptr;
  };
  if (spec == "recall") {
    ds = std::make_unique<RecallDataset>(split, seed);
  } else if (spec == "passkey") {
    ds = std::make_unique<PasskeyDataset>(split, seed);
  } else if (const char* file = arg("text:"); file && *file) {
    return std::make_unique<TextDataset>(file, split, model_vocab);  // checks its bytes itself
  } else if (const char* pattern = arg("shards:"); pattern && *pattern) {
    return std::make_unique<ShardDataset>(pattern, split, seed, model_vocab);  // checks ids when read
  } else {
    throw std::runtime_error("unknown dataset \"" + spec +
                             "\": expected one of recall, passkey, text:FILE, shards:GLOB");
  }
  // Synthetic tasks use their whole vocabulary, so the model must cover it.
  if (model_vocab > 0 && ds->vocab() > model_vocab)
    throw std::runtime_error(spec + ": the task's vocab " + std::to_string(ds->vocab()) +
                             " exceeds the model vocab " + std::to_string(model_vocab));
  return ds;
}

}  // namespace ul
