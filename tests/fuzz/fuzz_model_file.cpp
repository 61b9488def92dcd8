// Our checkpoint's model.bin (engine/checkpoint_files.h).
#include "engine/checkpoint_files.h"
#include "fuzz_util.h"

#include <cstring>
#include <stdexcept>
#include <vector>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Without a matching crc32 nearly every mutation would stop at the checksum; the header and
  // size checks behind it are what a corrupt file must not get past, so fix the crc first.
  std::vector<uint8_t> bytes(data, data + size);
  fuzz::fix_crc(bytes, 80);
  const std::string& path = fuzz::input_file(bytes.data(), bytes.size(), "model.bin");
  try {
    std::vector<float> params;
    ul::ModelConfig c = ul::read_model_file(path, params);
    FUZZ_CHECK(size == 80 + params.size() * sizeof(float));
    ul::check_model_config(path, c, c);  // a config always matches itself
  } catch (const std::exception&) {
  }
  return 0;
}
