// llm.c GPT-2 checkpoints (engine/llmc_format.h): version 3 (fp32) and 5 (bf16).
#include "engine/llmc_format.h"
#include "fuzz_util.h"

#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "model.bin");
  try {
    std::vector<float> params;
    ul::LlmcConfig c = ul::read_llmc_checkpoint(path, params);
    // The count in exact arithmetic (128 bits cannot wrap for int32 sizes) is what was read.
    unsigned __int128 n = 0;
    for (auto& [name, shape] : ul::llmc_gpt2_param_shapes(c)) {
      unsigned __int128 k = 1;
      for (int64_t d : shape) k *= uint64_t(d);
      n += k;
    }
    FUZZ_CHECK(n == params.size());
  } catch (const std::exception&) {
  }
  return 0;
}
