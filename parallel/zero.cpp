#include "parallel/zero.h"

#include "engine/device.h"

namespace ul {

size_t zero_shard_size(size_t n, int world) { return n / size_t(world) / 4 * 4; }

ZeroShard zero_shard(size_t n, int world, int rank) {
  const size_t s = zero_shard_size(n, world);
  ZeroShard z{size_t(rank) * s, size_t(rank + 1) * s};
  if (rank == world - 1) z.hi = n;
  return z;
}

// One rank shards nothing: every collective above returns at once, so no buffer (it was a whole
// gradient's worth of device memory the plan never counted).
size_t zero_scratch_elems(size_t n, int world) { return world > 1 ? zero_shard_size(n, world) : 0; }

void zero_reduce_gradients(Comm& world, float* grad, size_t n, float* scratch) {
  const int W = world.size(), k = world.rank();
  const size_t s = zero_shard_size(n, W), tail = n - s * size_t(W);
  if (W == 1) return;
  if (s > 0) {
    // recv may not alias send (MPI), so the summed shard lands in scratch and is copied home.
    world.reduce_scatter(grad, scratch, s, DType::f32, ReduceOp::sum);
    device_copy(grad + size_t(k) * s, world.device(), scratch, world.device(), s * sizeof(float));
  }
  if (tail) world.all_reduce(grad + s * size_t(W), tail, DType::f32, ReduceOp::sum);
}

void zero_gather_params(Comm& world, float* params, size_t n, float* scratch) {
  const int W = world.size(), k = world.rank();
  const size_t s = zero_shard_size(n, W), tail = n - s * size_t(W);
  if (W == 1) return;
  if (s > 0) {
    device_copy(scratch, world.device(), params + size_t(k) * s, world.device(), s * sizeof(float));
    world.all_gather(scratch, params, s, DType::f32);
  }
  if (tail) world.broadcast(params + s * size_t(W), tail, DType::f32, W - 1);
}

}  // namespace ul
