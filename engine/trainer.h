// The training loop of one rank: batches from the dataset under the dp × sp grid, forward and
// backward per micro-batch, the world-wide loss normalisation and gradient sum, AdamW, logs, evals.
// Trainer is the loop as an object (tests and benchmarks drive it step by step); train_rank() is
// the loop `train` runs, with its logs.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "engine/context.h"
#include "engine/optimizer.h"
#include "engine/options.h"
#include "layers/transformer.h"
#include "parallel/communicator.h"
#include "parallel/grid.h"
#include "parallel/hosts.h"

namespace ul {

// One micro-batch of one rank, on the host: the rank's slice of B sequences.
struct HostBatch {
  int B = 0, T = 0, Tl = 0;               // T: full sequence, Tl = T / sp: this rank's slice
  std::vector<int32_t> idx, targets, pos; // (B, Tl)
  std::vector<int32_t> pos_full;          // (B, T)
  std::vector<int32_t> doc_full;          // (B, T) document ids; empty: no document mask
  int64_t valid = 0;                      // targets != -1 in this slice
  // A whole answer: a maximal run of consecutive valid targets in a whole sequence (a passkey's
  // digits, a recall query's value), numbered over the batch. answer (B, Tl): the one each target
  // of this slice belongs to, -1 where the target is ignored; whole_answers: how many the batch
  // holds (every sp rank counts the same).
  std::vector<int32_t> answer;
  int whole_answers = 0;
};

// Fill `hb` with sequences [first, first + B) of `data`, sliced for sp rank `sp_rank` of `sp`.
// eot >= 0 (--doc-mask): document ids and per-document positions from the EOT tokens of each
// whole sequence (data/packing.h), so every sp rank knows the full layout; eot < 0: pos = t.
void load_batch(const Dataset& data, int64_t first, int B, int T, int sp, int sp_rank, HostBatch& hb,
                int32_t eot = -1);
// The batch on the context's device; doc_full stays undefined when hb has no document ids.
ModelInputs device_inputs(Context& c, const HostBatch& hb);
// The EOT id --doc-mask uses with this data (--eot, else the data's own), -1 without --doc-mask.
// Throws when there is none or it is outside the model's vocabulary.
int32_t doc_mask_eot(const Options& o, const Dataset& data, int model_vocab);

struct StepResult {
  double loss = 0;        // mean over the valid targets of the step, whole world
  double grad_norm = 0;   // before clipping
  float lr = 0;
  double ms = 0;
  size_t act_bytes = 0;   // arena high-water of the step's largest micro-batch (this rank)
  int64_t valid = 0;      // targets with a label in this rank's micro-batches of the step
  CommStats sent;         // bytes this rank sent during the step, by collective
  int64_t packed = 0;     // --doc-mask: this rank's sequences of the step that hold 2+ documents
};

// The val loss over the targets of tokens at positions [lo, hi) (in the document, with --doc-mask).
struct PositionLoss {
  int lo = 0, hi = 0;
  double loss = 0;
  int64_t count = 0;  // valid targets in the band (world)
};
// The bands of --loss-by-position for sequences of T tokens: [0, 64), [64, 128), [128, 256), ...
// doubling up to T (the last one ends at T), the first band widened (and so every later one) until
// there are at most 9: comparable between runs of any length, a few numbers even at T = 1M.
// widest > T: the bands of a sequence of `widest` tokens, cut at T (the --probe-lengths rows all
// take the longest one's, so one table row holds one band).
std::vector<std::pair<int, int>> position_bands(int T, int widest = 0);

struct EvalResult {
  double loss = 0, accuracy = 0;  // accuracy: the share of valid targets that are their row's argmax
  int64_t answers = 0;    // valid targets evaluated (world): on a task, its answer tokens
  // A task's whole answers (HostBatch::answer: a passkey, a recall query's value): the share with
  // every target right, and how many there were (world); 0 on text.
  double whole_accuracy = 0;
  int64_t whole_answers = 0;
  std::vector<PositionLoss> by_position;  // --loss-by-position: position_bands(--seq), empty otherwise
  // After a run's last eval: the accuracy on each of the task's probes (Dataset::probes), by name.
  std::vector<std::pair<std::string, double>> probes;
  // A stop signal (engine/stop_signal.h) came: every rank left the eval before micro-batch
  // `cut_at` (0-based; the ranks agree on it), and the fields above hold nothing.
  int cut_at = -1;
  bool cut_short() const { return cut_at >= 0; }
};

class Trainer {
 public:
  // Must be constructed on the thread that will run it (it installs its Context there), one at a
  // time per thread: step() and evaluate() refuse to run under another trainer's context.
  Trainer(const Options& o, Comm& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // One optimizer step on the G = batch x grad_accum x dp sequences from next_sequence() on
  // (this rank's: micro-batch m of dp rank r starts at next_sequence() + (m dp + r) batch).
  StepResult step();
  // eval_batches micro-batches of the val split, no tape. A stop signal cuts it short between
  // micro-batches (EvalResult::cut_at): an eval of many long sequences can outlast a scheduler's
  // grace period, which is for the checkpoint.
  EvalResult evaluate() { return evaluate(*val_); }
  EvalResult evaluate(const Dataset& data);  // the same on another dataset (a probe of the task)
  int steps_done() const { return step_; }
  // For checkpoints (engine/checkpoint.h): the next step() is step `s` + 1, with its learning rate,
  // training on the sequences from `next_sequence` on; the caller restores the parameters and the
  // optimizer state that go with it.
  void set_steps_done(int s, int64_t next_sequence);
  // Where the data stands: the first sequence the next step trains on. Each step moves it G on, so
  // it is steps_done() x G for a run that never skipped data (--skip-batches) nor changed G
  // (--change-global-batch) or the length (--change-seq: it is mapped to the new one); checkpoints
  // record it.
  int64_t next_sequence() const { return next_seq_; }
  // G: the sequences one step trains on, over the world.
  int64_t sequences_per_step() const;
  // The next step's data moves k steps' sequences (k G) ahead, k >= 0, for this run and every later one.
  void skip_batches(int64_t k);
  AdamW& optimizer() {  // a trainer made for --steps 0 has none
    if (!opt_) throw std::logic_error("Trainer::optimizer: this trainer was made for --steps 0");
    return *opt_;
  }
  // The f32 values of every parameter (a bf16 model's masters) on this rank's host, if `want`
  // (else empty). Collective when the masters are sharded (--zero 1 with bf16): every rank calls
  // it, between steps (the shards are gathered in the gradient buffer, which the next step zeroes).
  std::vector<float> host_params(bool want = true);
  // The same values without a copy where they already are on the host (the CPU: the live buffer,
  // valid until the next step changes it), else copied into `copy`; null when not `want`. Saves,
  // exports and samples of a model that fills the machine need no second model's memory on the CPU.
  const float* host_weights(bool want, std::vector<float>& copy);
  // After a checkpoint restored the masters and AdamW's t: the bf16 weights as the run rounded
  // them (AdamW::round_params), every rank's alike. Collective when the masters are sharded.
  void round_bf16_from_masters();
  size_t planned_arena() const { return planned_arena_; }
  // The host bytes left for a decoder beside what every rank here holds, against this process's
  // limit (with the ranks that share it) and the machine's (with all its ranks), whichever leaves
  // less: for rank 0's alone (a sample), or, `each`, a rank's share when every rank decodes at once
  // (the length probes).
  size_t decoder_room(bool each) const;

  const Options& options() const { return o_; }
  Grid& grid() { return grid_; }
  const HostMap& hosts() const { return hosts_; }  // which ranks share this machine and its cores
  // The --checkpoint's own RoPE scaling that --rope-scaling replaced ("" when none was replaced).
  const std::string& replaced_rope_scaling() const { return replaced_rope_scaling_; }
  int threads() const { return threads_; }
  Context& context() { return ctx_; }
  Transformer& model() { return *model_; }
  const Dataset& train_data() const { return *train_; }
  const Dataset& val_data() const { return *val_; }
  // Tests: train on another source from the next step (one of this model's vocabulary; the checks
  // made at construction, the run's data identity and --doc-mask's id, were made on --data's).
  void replace_train_data_for_test(std::unique_ptr<Dataset> data);
  int32_t document_start() const { return eot_; }  // --doc-mask: the id documents start at; -1: no mask

 private:
  void check_current(const char* what) const;  // throws unless ctx_ is the thread's context
  // load_batch of this run's shape; an error (a token id past the vocabulary) names `flag`.
  void named_load(const Dataset& data, const char* flag, int64_t first, HostBatch& hb) const;
  Options o_;
  Grid grid_;
  HostMap hosts_;
  std::string replaced_rope_scaling_;
  int threads_ = 1;
  Context ctx_;
  ContextGuard guard_;
  std::unique_ptr<Dataset> train_, val_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> opt_;
  float* zero_scratch_ = nullptr;  // --zero 1: the shard buffer of parallel/zero.h, on the context's device
  std::vector<HostBatch> micro_;
  size_t planned_arena_ = 0;  // the arena's reservation: the planner's peak for this run
  // Host memory one rank holds to the end of the run (the whole plan on the CPU; a device's host
  // side): what a sample's or a probe's decoder must fit beside.
  size_t host_resident_ = 0;
  int32_t eot_ = -1;  // --doc-mask: the end-of-text id that splits documents; -1: no mask
  int step_ = 0;
  int64_t next_seq_ = 0;  // next_sequence()
};

// The whole job on this rank, with logs (only rank 0 prints; engine/train_loop.cpp). Returns the exit code.
int train_rank(const Options& o, Comm& world);

// Milliseconds on a steady clock (differences are durations).
double now_ms();

// The peak resident memory of this process (VmHWM), 0 where /proc is not there.
size_t peak_rss_bytes();
struct MemoryPlan;  // engine/planner.h

// Throws (naming every part and what shrinks it) when `ranks_here` ranks need more than `ram`
// bytes of host memory: each the whole plan when it lives on the host (`plan_on_host`: the CPU
// device; its total holds the step's micro-batches), else the plan's host side (the micro-batches,
// --offload's pinned block inputs, collectives staged through host memory), plus `load`: a
// checkpoint's f32 copy while it loads or saves. Linux would grant the memory, then kill the run
// using it. `shrinks`: what would shrink a run on the host (memory_shrinks: the flags it lacks).
void check_host_memory(const MemoryPlan& plan, bool plan_on_host, int ranks_here, size_t ram, size_t load = 0,
                       const std::string& shrinks = "--recompute, --mlp-chunks 8, a larger --sp, a smaller --batch or "
                                                    "--seq, or --zero 1 over more ranks");

// Trainer::decoder_room's arithmetic: `resident` bytes held by each of `sharing` ranks against
// this process's `limit` and by each of `here` ranks against the machine's `physical` bytes; the
// smaller room left, whole (one decoder) or, `each`, a rank's share.
size_t decoder_room(size_t resident, int sharing, size_t limit, int here, size_t physical, bool each);

// Throws (naming every part, the GPU and what shrinks the run) when `ranks_on_gpu` ranks' plans
// exceed `free`, the bytes the GPU had free when this process first checked it: every one of
// those bytes is allocated at start-up, so such a run could only fail at its first cudaMalloc
// too large, with less said.
// `shrink`: what to try (memory_shrinks, engine/planner.h); `masters`: the AdamW row holds bf16's
// f32 master weights too; `processes`: the processes those ranks are (each has the CUDA libraries'
// buffers: --comm local's ranks share one).
void check_device_memory(const MemoryPlan& plan, int ranks_on_gpu, size_t free, const std::string& gpu,
                         const std::string& shrink, bool masters, int processes = 1);

}  // namespace ul
