#include "parallel/data_parallel.h"

#include <stdexcept>
#include <string>

namespace ul {

void all_reduce_gradients(Comm& world, float* grads, size_t n) {
  if (world.size() == 1 || n == 0) return;
  world.all_reduce(grads, n, DType::f32, ReduceOp::sum);
}

int64_t global_count(Comm& world, int64_t local) {
  // There is no 64-bit integer dtype; a double holds every integer up to 2^53 exactly.
  const int64_t kExact = int64_t(1) << 53;
  if (local < 0 || local >= kExact)
    throw std::runtime_error("global_count: local count " + std::to_string(local) + " is outside [0, 2^53)");
  double v = double(local);
  world.all_reduce(&v, 1, DType::f64, ReduceOp::sum);
  if (v >= double(kExact)) throw std::runtime_error("global_count: the global count exceeds 2^53");
  return int64_t(v);
}

}  // namespace ul
