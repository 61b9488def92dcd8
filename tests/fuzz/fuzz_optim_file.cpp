// Our checkpoint's optim.bin / optim_rank_R.bin (engine/checkpoint_files.h). The resume code
// writes m and v into [offset, offset + count) of the parameter buffer, so an accepted header must
// keep that range inside numel without wrapping around.
#include "engine/checkpoint_files.h"
#include "fuzz_util.h"

#include <cstring>
#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Without a matching crc32 nearly every mutation would stop at the checksum; the header and
  // size checks behind it are what a corrupt file must not get past, so fix the crc first.
  std::vector<uint8_t> bytes(data, data + size);
  fuzz::fix_crc(bytes, 56);
  const std::string& path = fuzz::input_file(bytes.data(), bytes.size(), "optim.bin");
  try {
    ul::OptimShard s = ul::read_optim_file(path);
    FUZZ_CHECK(s.m.size() == s.count && s.v.size() == s.count);
    FUZZ_CHECK(s.offset <= s.numel && s.count <= s.numel - s.offset);
    FUZZ_CHECK(s.shards >= 1 && s.shard >= 0 && s.shard < s.shards && s.t >= 0);
  } catch (const std::exception&) {
  }
  // A resuming rank's read: a window of the buffer, straight into its own arrays (which AddressSanitizer
  // guards: a kept element outside them is a finding).
  // Half the time as load_checkpoint reads: a shard outside the window by its header alone.
  const uint64_t lo = size ? data[0] % 64 : 0, hi = lo + 64;
  const bool skip_disjoint = size > 1 && (data[1] & 1);
  std::vector<float> m(hi - lo), v(hi - lo);
  try {
    ul::OptimShard s = ul::read_optim_file(path, lo, hi, m.data(), v.data(), skip_disjoint);
    FUZZ_CHECK(s.payload_checked || (skip_disjoint && s.kept_count == 0 && s.count > 0));
    FUZZ_CHECK(s.m.empty() && s.v.empty());
    FUZZ_CHECK(s.kept_count <= hi - lo);
    FUZZ_CHECK(s.kept_count == 0 || (s.kept >= lo && s.kept + s.kept_count <= hi));
  } catch (const std::exception&) {
  }
  return 0;
}
