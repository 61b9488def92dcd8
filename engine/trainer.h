// The training loop of one rank: batches from the dataset under the dp × sp grid, forward and
// backward per micro-batch, the world-wide loss normalisation and gradient sum, AdamW, logs, evals.
#pragma once
#include <string>

#include "engine/options.h"

namespace ul {

class Comm;
class Dataset;
class Transformer;
struct Grid;

// One micro-batch of one rank, on the host: the rank's slice of B sequences.
struct HostBatch {
  int B = 0, T = 0, Tl = 0;               // T: full sequence, Tl = T / sp: this rank's slice
  std::vector<int32_t> idx, targets, pos; // (B, Tl)
  std::vector<int32_t> pos_full;          // (B, T)
  int64_t valid = 0;                      // targets != -1 in this slice
};

// Fill `hb` with sequences [first, first + B) of `data`, sliced for sp rank `sp_rank` of `sp`.
void load_batch(const Dataset& data, int64_t first, int B, int T, int sp, int sp_rank, HostBatch& hb);

// Runs the whole job on this rank (world == nullptr: one process, no communicator).
// Returns the process exit code. Only rank 0 prints.
int train_rank(const Options& o, Comm& world);

}  // namespace ul
