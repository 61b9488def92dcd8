// ZeRO stage 1 over the world: the AdamW state is sharded, each rank updates only its shard of the
// flat parameter buffer, and the updated shards are gathered back. Every rank still holds all
// parameters and the whole gradient buffer (stage 1), but m and v shrink to 1/world.
//
// Shards are contiguous: with s = zero_shard_size(n, world) (n / world rounded down to a multiple
// of 4), rank k owns [k s, (k+1) s), and the last rank also owns the tail [world s, n) (fewer than
// 4 world elements). Every shard then starts on a 4-element boundary of the buffers (16 bytes of
// f32, 8 of bf16), where AdamW's CUDA kernel takes four elements a thread with 16-byte loads. So
// no buffer needs padding:
//   gradients: reduce_scatter of the first world * s elements (sum), all_reduce of the tail;
//   parameters: all_gather of the shards, broadcast of the tail from the last rank (f32 runs;
//   a bf16 run gathers the owners' rounded bf16 weights the same way, and its f32 masters, sharded
//   like m and v, are never gathered except for a host copy: engine/trainer.cpp).
// The bytes sent are those of one all-reduce (reduce-scatter + all-gather) plus the tail.
#pragma once
#include <cstddef>

#include "parallel/communicator.h"

namespace ul {

struct ZeroShard {
  size_t lo = 0, hi = 0;  // this rank's elements [lo, hi)
};

ZeroShard zero_shard(size_t n, int world, int rank);
// s above: the size of every shard but the last.
size_t zero_shard_size(size_t n, int world);
// Scratch both calls need: zero_shard_size(n, world) elements, on the buffers' device (none for one rank, where both
// calls return at once).
size_t zero_scratch_elems(size_t n, int world);

// Collective. After it, grad[lo, hi) of this rank's shard holds the world sum (the rest is stale).
void zero_reduce_gradients(Comm& world, float* grad, size_t n, float* scratch);
// Collective. After it, every rank's params hold every rank's shard.
void zero_gather_params(Comm& world, float* params, size_t n, float* scratch);

}  // namespace ul
