// safetensors files (engine/safetensors.h): read, then every float tensor converted.
#include "engine/safetensors.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "model.safetensors");
  try {
    ul::SafetensorsFile f(path);
    for (const ul::SafeTensorInfo& t : f.tensors()) {
      FUZZ_CHECK(t.begin <= t.end && t.end <= size);
      FUZZ_CHECK(f.find(t.name) != nullptr);
      if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16")
        FUZZ_CHECK(f.to_f32(t).size() == size_t(t.numel()));
    }
  } catch (const std::exception&) {
  }
  return 0;
}
