#include "engine/ranks_agree.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
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

// After every rank tried its part (mine: its error, "" when it succeeded: its files written, its
// checkpoint loaded). Collective: if any failed, every rank learns who and why and throws the same
// error (the first failing rank's), so that a rank that cannot write (a full disk, a quota) or met
// a damaged file only it reads neither leaves the others waiting in a collective (under NCCL
// without MPI, until --comm-timeout) nor ends an MPI job alone: rank 0's log records the cause. It
// is also the barrier after which a save's files count as written.
void agree_on_errors(Comm& world, const std::string& mine) {
  const int P = world.size();
  if (P == 1) {
    if (!mine.empty()) throw JobError(mine);
    return;
  }
  constexpr size_t kWords = 1024;  // each rank's message, up to 4 KiB (a resume's, with its paths and hint)
  std::vector<int32_t> buf(kWords, 0), all(kWords * size_t(P));
  // (a failure's text is never "": failure_text)
  size_t cut = std::min(mine.size(), kWords * 4 - 1);
  while (cut < mine.size() && cut > 0 && (static_cast<unsigned char>(mine[cut]) & 0xC0) == 0x80) cut--;  // a character's start
  std::memcpy(buf.data(), mine.data(), cut);
  world.all_gather(buf.data(), all.data(), kWords, DType::i32);
  for (int r = 0; r < P; r++) {
    const char* text = reinterpret_cast<const char*>(all.data() + size_t(r) * kWords);
    const std::string what(text, strnlen(text, kWords * 4));
    if (!what.empty()) throw JobError(r == world.rank() ? mine : "rank " + std::to_string(r) + ": " + what);
  }
}

std::string failure_text(const std::exception& e) {
  return *e.what() ? std::string(e.what()) : std::string("(an error with no message)");
}

}  // namespace ul
