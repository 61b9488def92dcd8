// A Hugging Face config.json (engine/hf_format.h: gpt2, llama, mistral, qwen2 with its sliding-window
// rule): read and checked; what it accepts is a valid model, and the config.json ulysses writes for
// that model reads back as the same model (every setting describe() names, the window included).
#include "engine/hf_format.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ul::ModelConfig c;
  try {
    c = ul::hf_config_from_json(ul::parse_json(text, "config.json"), "config.json");
  } catch (const std::exception&) {
    return 0;
  }
  c.validate();  // accepted: a model the engine builds (throws, a finding, otherwise)
  const std::string written = ul::hf_config_json(c, "float32");
  const ul::ModelConfig back = ul::hf_config_from_json(ul::parse_json(written, "written"), "written");
  ul::ModelConfig want = c;
  want.max_seq = ul::hf_max_position_embeddings(c);  // a YaRN llama's: factor x the original context
  FUZZ_CHECK(back.describe() == want.describe());
  FUZZ_CHECK(back.sliding_window == c.sliding_window && back.norm_eps == c.norm_eps && back.ffn_dim() == c.ffn_dim());
  return 0;
}
