// A sharded checkpoint's model.safetensors.index.json (engine/hf_index.h): read and checked; what
// it accepts names shard files in its own directory only.
#include "engine/hf_index.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "model.safetensors.index.json");
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  try {
    const ul::SafetensorsIndex idx = ul::read_safetensors_index(path);
    FUZZ_CHECK(!idx.files.empty() && !idx.file_of.empty());
    for (const std::string& f : idx.files) {
      FUZZ_CHECK(f.size() > dir.size() && f.compare(0, dir.size(), dir) == 0);
      FUZZ_CHECK(f.find('/', dir.size()) == std::string::npos);  // no way out of the directory
    }
    for (const auto& [name, file] : idx.file_of) FUZZ_CHECK(file < idx.files.size());
  } catch (const std::exception&) {
  }
  return 0;
}
