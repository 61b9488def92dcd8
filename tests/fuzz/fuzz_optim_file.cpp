// Our checkpoint's optim.bin / optim_rank_R.bin (engine/checkpoint_files.h). The resume code
// writes m and v into [offset, offset + count) of the parameter buffer, so an accepted header must
// keep that range inside numel without wrapping around.
#include "engine/checkpoint_files.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "optim.bin");
  try {
    ul::OptimShard s = ul::read_optim_file(path);
    FUZZ_CHECK(s.m.size() == s.count && s.v.size() == s.count);
    FUZZ_CHECK(s.offset <= s.numel && s.count <= s.numel - s.offset);
    FUZZ_CHECK(s.shards >= 1 && s.shard >= 0 && s.shard < s.shards && s.t >= 0);
  } catch (const std::exception&) {
  }
  return 0;
}
