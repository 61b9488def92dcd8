// The memory planner: what one rank of a run holds, before the run. `train --plan` prints it (with
// the same flags as the run) and allocates nothing.
//
// Activation memory is not estimated from a formula: the planner walks the model op by op in the
// order the real code runs it (forward, the classifier, backward with gradients allocated lazily,
// recompute replays, tiled MLP slices, the all-to-all scratch scopes) and feeds every allocation to
// a twin of the arena's accounting (same 64-byte rounding, same marks and releases); a run that
// only evaluates (--steps 0) is planned as its eval's forward, one block at a time. Its
// high-water mark is what Arena::high_water() reports for the step, byte for byte (tests on the
// CPU and the emulated CUDA device), and what the Trainer reserves before its first step. Static memory (parameters, gradients, AdamW state, ZeRO shards) and bytes communicated
// per step follow the Trainer's code and communicator.h's byte formulas.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/tensor.h"
#include "layers/transformer.h"
#include "parallel/communicator.h"

namespace ul {

struct Options;

struct PlanConfig {
  ModelConfig model;
  int batch = 1, seq = 256, grad_accum = 1;  // per rank per micro-batch, as the flags
  int sp = 1, world = 1;                      // dp = world / sp
  bool doc_mask = false;                      // packed documents: one more (B, T) index array
  bool recompute = false;
  bool offload = false;                       // with recompute on cuda: block inputs in pinned host memory
  int mlp_chunks = 1;
  int zero = 0;
  Device device = Device::cpu;
  DType dtype = DType::f32;                   // parameters and activations (bf16: --precision bf16 on cuda)
  bool local_comm = true;                     // the local communicator keeps a slice of the all-reduce
  bool mpi_comm = false;                      // MPI stages a device's collectives through host memory too
  int64_t valid_rows = -1;                    // rows with a valid target (sizes the classifier chunk); -1: all
  bool trains = true;                         // false (--steps 0): no gradients, AdamW state or ZeRO,
                                              // and the arena an eval's forward needs
  bool evaluates = true;                      // --steps 0 without an eval (an export, a sample): no arena
  bool host_weights = true;                   // --steps 0 with bf16: f32 masters kept for a host copy
                                              // (Options::reads_host_weights)
  int min_seq = 1;                            // the shortest --seq the data takes (passkey's 12 at 5 digits)
  bool max_seq_fixed = false;                 // gpt2's positions come from --max-seq or a checkpoint:
                                              // longest_seq may not grow them
};

// plan_memory's refusal of a shape whose activations alone pass 2^62 bytes (no machine holds them,
// and the byte counts would wrap around 2^64 to a small total the memory check would pass).
struct PlanTooLarge : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct MemoryPlan {
  // bytes on one rank
  size_t params = 0, grads = 0, optim = 0;    // optim: AdamW m, v (+ fp32 master weights on cuda)
  size_t kept = 0;       // activations alive at the end of the forward (arena in use then)
  size_t arena_peak = 0; // arena high-water of the step: kept + activation gradients + transients
                         // (--steps 0: of an eval batch's forward)
  size_t transient = 0;  // arena_peak - kept
  size_t workspace = 0;  // heap scratch outside the arena (CPU attention backward)
  size_t comm = 0;       // communication buffers (local all-reduce slice, ZeRO shard buffer)
  size_t batches = 0;    // the step's micro-batches on the host (at most 5 int32 arrays of B x T
                         // each, a bound: HostBatch's tokens, targets and positions hold this
                         // rank's T / sp; in the total on the CPU, host memory beside it on a device)
  size_t total = 0;
  size_t pinned_host = 0;  // --offload: the block inputs in pinned host memory (not in total)
  size_t host_comm = 0;    // a device with --comm local: collectives staged through host memory (not in total)
  // bytes this rank sends per step, by collective
  CommStats sent;
  uint64_t a2a_layer_fwd = 0;  // all-to-all bytes per layer per direction (scatter + gather)
};

MemoryPlan plan_memory(const PlanConfig& c);
// (param_count, the elements of the parameter buffer, is layers/transformer.h's.)

// The longest sequence (a multiple of 64 * sp; under fixed learned positions, the longest multiple
// of sp they hold when that fits) whose plan fits `budget` bytes per rank, or 0.
int64_t longest_seq(PlanConfig c, double budget);

// The flags that would shrink this run's memory, less those it has and those it would not read
// (an eval: no --recompute, no --zero): "--recompute, --mlp-chunks 8, ...".
std::string memory_shrinks(const PlanConfig& c);

// The plan for these options (what `train --plan` prints), and the printing itself.
PlanConfig plan_config(const Options& o);
PlanConfig plan_config(const Options& o, const ModelConfig& model);  // the model already known
std::string format_plan(const PlanConfig& c, const MemoryPlan& p, double budget);
int plan_main(const Options& o);  // prints; returns the exit code

}  // namespace ul
