// Data parallelism (and the sequence-parallel half of the loss): every rank holds all parameters,
// so after backward each parameter gradient is SUMMED over the whole world (dp x sp ranks: the sp
// ranks saw different tokens of the same sequences, the dp ranks different sequences). The loss is
// a mean over the valid targets of the whole step, so the valid count is summed over the world too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallel/communicator.h"

namespace ul {

// grads: the whole contiguous f32 gradient buffer (n elements); one all-reduce (sum) over world.
void all_reduce_gradients(Comm& world, float* grads, size_t n);

// The sum over the world of each rank's `local` count (e.g. valid targets). Exact up to 2^53.
int64_t global_count(Comm& world, int64_t local);
// The same, from ranks some of which may bring an error instead (`local_error` not empty: a bad
// token id in the sequences this rank read): then every rank throws, together, a JobError with the
// message of the highest such rank ("rank R: ..."; the message alone on one rank), so that no rank
// is left waiting in a later collective and rank 0, which keeps the log, can say why. Costs nothing
// more when no rank fails: a failure rides the count's all-reduce as a NaN.
int64_t global_count(Comm& world, int64_t local, const std::string& local_error);

// Rank `root`'s text on every rank (a collective; the others' `text` is not read), cut to 4096
// bytes at a UTF-8 character's start (a rank's error message, which goes into the log's JSON).
// Sent as ints: the dtypes have no bytes.
std::string broadcast_text(Comm& world, const std::string& text, int root);

}  // namespace ul
