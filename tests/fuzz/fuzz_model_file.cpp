// Our checkpoint's model.bin (engine/checkpoint_files.h), versions 1, 2 (a RoPE scaling), 3 (YaRN,
// a q/k/v bias, another norm eps) and 4 (a sliding window).
#include "engine/checkpoint_files.h"
#include "fuzz_util.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Without a matching crc32 nearly every mutation would stop at the checksum; the header and
  // size checks behind it are what a corrupt file must not get past, so fix the crc first.
  std::vector<uint8_t> bytes(data, data + size);
  fuzz::fix_crc(bytes, 80);
  const std::string& path = fuzz::input_file(bytes.data(), bytes.size(), "model.bin");
  std::vector<float> params;
  ul::ModelConfig c;
  try {
    c = ul::read_model_file(path, params);
    // The shape as a model: read_model_file checks the file, not the model (a dim too wide for an
    // MLP is refused when the model is made, naming the file: train's "FILE: model config: ...").
    c.validate();
  } catch (const std::exception&) {
    return 0;  // refused: what a damaged file must get
  }
  // What was accepted holds together; outside the try, so a check that throws is a finding.
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  FUZZ_CHECK(version >= 1 && version <= 4);
  // + the RoPE tail, + version 3's, + the window
  const size_t header = version == 1 ? 80 : version == 2 ? 100 : version == 3 ? 120 : 132;
  FUZZ_CHECK(size == header + params.size() * sizeof(float));
  FUZZ_CHECK(version >= 2 || (c.rope_scaling.kind == ul::RopeScaling::kNone && !c.tie_embeddings));
  FUZZ_CHECK(version >= 3 || (c.rope_scaling.kind != ul::RopeScaling::kYarn && !c.qkv_bias && c.norm_eps == 1e-5f));
  FUZZ_CHECK(version == 4 ? c.sliding_window >= 1 : c.sliding_window == 0);
  FUZZ_CHECK(c.full_every >= 0 && c.full_first >= 0 && c.full_first < std::max(1, c.full_every));
  ul::check_model_config(path, c, c);  // a config always matches itself
  return 0;
}
