// safetensors files (engine/safetensors.h): read, then every float tensor converted; and read for
// the header only, which must reach the same verdict with the same tensors.
#include "engine/safetensors.h"
#include "fuzz_util.h"

#include <memory>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "model.safetensors");
  std::unique_ptr<ul::SafetensorsFile> whole, header;
  try {
    whole = std::make_unique<ul::SafetensorsFile>(path);
  } catch (const std::exception&) {
  }
  try {
    header = std::make_unique<ul::SafetensorsFile>(path, true);
  } catch (const std::exception&) {
  }
  FUZZ_CHECK(bool(whole) == bool(header));
  if (!whole) return 0;
  FUZZ_CHECK(whole->tensors().size() == header->tensors().size() && whole->metadata() == header->metadata());
  for (const ul::SafeTensorInfo& t : whole->tensors()) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= size);
    FUZZ_CHECK(whole->find(t.name) != nullptr);
    const ul::SafeTensorInfo* h = header->find(t.name);
    FUZZ_CHECK(h && h->begin == t.begin && h->end == t.end && h->shape == t.shape);
    if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16")
      FUZZ_CHECK(whole->to_f32(t).size() == size_t(t.numel()));
  }
  return 0;
}
