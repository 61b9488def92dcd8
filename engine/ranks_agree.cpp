#include "engine/ranks_agree.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/file_io.h"

namespace ul {

void check_ranks_agree(Comm& world, const std::vector<RunField>& fields) {
  const int P = world.size(), F = int(fields.size());
  if (P == 1) return;
  // Each field's key and value; the key too, so that fields out of step cannot match by chance.
  std::vector<int32_t> mine(F), all(size_t(P) * F);
  for (int f = 0; f < F; f++) {
    const std::string text = fields[f].key + "=" + fields[f].json;
    mine[f] = int32_t(crc32(0, text.data(), text.size()));
  }
  world.all_gather(mine.data(), all.data(), size_t(F), DType::i32);
  for (int r = 1; r < P; r++)
    for (int f = 0; f < F; f++)
      if (all[size_t(r) * F + f] != all[f]) {
        const RunField& x = fields[f];
        throw std::runtime_error("rank " + std::to_string(r) + " runs with another " + x.key + " than rank 0 (" +
                                 x.flag + "): every rank must see the same flags, model and data files (a node's own "
                                 "copy of the data, a directory listing that lags on a shared filesystem?); rank " +
                                 std::to_string(world.rank()) + " has " + x.json);
      }
}

void check_same_weights(Comm& world, uint32_t fingerprint, const std::string& source, const std::string& cause) {
  const int P = world.size();
  if (P == 1) return;
  std::vector<uint32_t> all(static_cast<size_t>(P));
  world.all_gather(&fingerprint, all.data(), 1, DType::i32);
  for (int r = 1; r < P; r++)
    if (all[size_t(r)] != all[0])
      throw std::runtime_error("rank " + std::to_string(r) + " holds other weights than rank 0 after " + source +
                               " (a sample of them differs): " + cause);
}

}  // namespace ul
