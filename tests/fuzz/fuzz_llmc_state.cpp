// llm.c debug states (engine/llmc_format.h) for a fixed tiny model (fuzz_util.h).
#include "engine/llmc_format.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "state.bin");
  const ul::LlmcConfig cfg = fuzz::tiny_llmc_config();
  try {
    ul::DebugState s = ul::read_debug_state(path, cfg);
    const size_t bt = size_t(s.B) * size_t(s.T);
    FUZZ_CHECK(s.B > 0 && s.T > 0);
    FUZZ_CHECK(s.inputs.size() == bt && s.targets.size() == bt);
    FUZZ_CHECK(s.logits.size() == bt * size_t(cfg.vocab));
    FUZZ_CHECK(s.grads.size() == ul::llmc_gpt2_num_params(cfg));
  } catch (const std::exception&) {
  }
  return 0;
}
