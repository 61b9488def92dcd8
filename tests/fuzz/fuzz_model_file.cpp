// Our checkpoint's model.bin (engine/checkpoint_files.h).
#include "engine/checkpoint_files.h"
#include "fuzz_util.h"

#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "model.bin");
  try {
    std::vector<float> params;
    ul::ModelConfig c = ul::read_model_file(path, params);
    FUZZ_CHECK(size == 80 + params.size() * sizeof(float));
    ul::check_model_config(path, c, c);  // a config always matches itself
  } catch (const std::exception&) {
  }
  return 0;
}
