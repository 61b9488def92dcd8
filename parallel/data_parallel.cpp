#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace ul {

void all_reduce_gradients(Comm& world, float* grads, size_t n) {
  if (world.size() == 1 || n == 0) return;
  world.all_reduce(grads, n, DType::f32, ReduceOp::sum);
}

int64_t global_count(Comm& world, int64_t local) { return global_count(world, local, ""); }

int64_t global_count(Comm& world, int64_t local, const std::string& local_error) {
  // There is no 64-bit integer dtype; a double holds every integer up to 2^53 exactly.
  const int64_t kExact = int64_t(1) << 53;
  if (local_error.empty() && (local < 0 || local >= kExact))
    throw std::runtime_error("global_count: local count " + std::to_string(local) + " is outside [0, 2^53)");
  double v = local_error.empty() ? double(local) : std::nan("");  // NaN + anything is NaN
  world.all_reduce(&v, 1, DType::f64, ReduceOp::sum);
  if (!std::isnan(v)) {
    if (v >= double(kExact)) throw std::runtime_error("global_count: the global count exceeds 2^53");
    return int64_t(v);
  }
  // Some rank failed: which (the highest), then its message.
  int32_t who = local_error.empty() ? -1 : world.rank();
  world.all_reduce(&who, 1, DType::i32, ReduceOp::max);
  const std::string message = broadcast_text(world, local_error, who);
  throw JobError(world.size() == 1 ? message : "rank " + std::to_string(who) + ": " + message);
}

std::string broadcast_text(Comm& world, const std::string& text, int root) {
  const bool mine = world.rank() == root;
  size_t keep = mine ? std::min<size_t>(text.size(), 4096) : 0;
  while (mine && keep < text.size() && keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xc0) == 0x80)
    keep--;  // not inside a UTF-8 character
  int32_t len = int32_t(keep);
  if (world.size() > 1) world.broadcast(&len, 1, DType::i32, root);
  std::vector<int32_t> chars(static_cast<size_t>(len), 0);
  if (mine)
    for (int32_t i = 0; i < len; i++) chars[size_t(i)] = static_cast<unsigned char>(text[size_t(i)]);
  if (world.size() > 1 && len > 0) world.broadcast(chars.data(), chars.size(), DType::i32, root);
  return std::string(chars.begin(), chars.end());
}

}  // namespace ul
