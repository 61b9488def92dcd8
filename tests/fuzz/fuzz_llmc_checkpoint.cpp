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
    FUZZ_CHECK(params.size() == ul::llmc_gpt2_num_params(c));
  } catch (const std::exception&) {
  }
  return 0;
}
