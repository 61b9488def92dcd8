#include "engine/planner.h"

#include "layers/classifier.h"
#include "layers/scratch_sizes.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "data/dataset.h"
#include "engine/export.h"
#include "engine/offload.h"
#include "engine/options.h"
#include "parallel/ulysses.h"
#include "parallel/zero.h"

#include "parallel/comm_util.h"
#include "parallel/launcher.h"

namespace ul {

namespace {

// The arena's accounting without memory: engine/arena.cpp's used() (64-byte rounding, marks).
// The trainer reserves this peak as one block, so no block tail is ever skipped.
struct SimArena {
  size_t used = 0, peak = 0;
  struct Mark { size_t used; };

  void alloc(size_t bytes) {
    used += (std::max<size_t>(bytes, 1) + 63) & ~size_t(63);
    peak = std::max(peak, used);
  }
  Mark mark() const { return {used}; }
  void release(const Mark& m) { used = m.used; }
};

// The classifier's rows per chunk: the op's own rule.
int64_t classifier_rows(int64_t V, int64_t valid, Device d) { return classifier_chunk_rows(int(V), valid, d); }

// One rank's micro-batch, op by op, in the order layers/transformer.cpp runs it. Sizes in bytes:
// a = activation element (f32, or bf16 under --precision bf16); statistics (mean, rstd, lse) are f32.
struct Walk {
  const PlanConfig& c;
  SimArena A;
  int64_t B, T, P, Tl, N, C, F, F1, D, QKV, Hql, W, a;
  bool llama, cuda;
  size_t kept = 0;

  explicit Walk(const PlanConfig& pc) : c(pc) {
    const ModelConfig& m = c.model;
    B = c.batch, T = c.seq, P = c.sp, Tl = T / P, N = B * Tl, C = m.dim, D = m.head_dim();
    llama = m.is_llama(), cuda = c.device == Device::cuda;
    F = m.ffn_dim(), F1 = llama ? 2 * F : F;
    QKV = int64_t(m.heads + 2 * m.kv_heads) * D;
    Hql = m.heads / P;
    const int64_t kvl = m.kv_heads >= P ? m.kv_heads / P : 1;  // kv heads replicated when fewer than P
    W = P > 1 ? Hql + 2 * kvl : m.heads + 2 * m.kv_heads;      // heads wide after the scatter
    a = int64_t(dtype_size(c.dtype));
    // A bound on what the walk adds up, in doubles (no wrap): every layer's activations at a
    // generous width per token, the classifier's logits, each of them with its gradient. Past 2^62
    // bytes the size_t sums below could wrap; no machine holds a tenth of that.
    const double width = double(F1) + double(QKV) + double(W) * double(D) + 16.0 * double(C);
    const double bound = 2 * double(N) * (double(m.layers + 2) * width + double(m.padded_vocab)) * double(std::max<int64_t>(a, 4));
    if (bound > 0x1p62)
      throw PlanTooLarge("the activations of --batch " + std::to_string(B) + " x --seq " + std::to_string(T) +
                         " on this model (" + m.describe() + ") pass 2^62 bytes a rank (about " +
                         std::to_string(int64_t(bound / 0x1p60)) + " EiB): a shorter --seq, a smaller --batch or a "
                         "larger --sp");
  }
  void act(int64_t elems) { A.alloc(size_t(elems) * a); }  // an activation (or its gradient)
  void f32(int64_t elems) { A.alloc(size_t(elems) * 4); }
  void norm(int64_t rows) { act(rows * C), f32(rows), llama ? void() : f32(rows); }  // y, rrms | mean, rstd
  // parallel/ulysses.cpp: send and recv scratch in a scope; with batch 1 a buffer whose layout is
  // already the chunks' is used as it is (pass false for it).
  void exchange(int64_t elems, bool send, bool recv) {
    auto m = A.mark();
    if (send) act(elems);
    if (recv) act(elems);
    A.release(m);
  }
  // A backward kernel's scratch on cuda (layers/scratch_sizes.h): taken after the op's gradients,
  // released when it returns.
  void transient(size_t bytes) {
    if (!cuda) return;
    auto m = A.mark();
    A.alloc(bytes);
    A.release(m);
  }
  // A linear with a bias sums its output gradient's columns through scratch: gpt2's every linear,
  // llama's q/k/v projection with a bias (Qwen 2).
  void linear_scratch(int64_t rows, int64_t OC, bool bias) { if (bias) transient(scratch::linear_backward(rows, OC)); }
  void norm_scratch(int64_t rows) {
    transient(llama ? scratch::rmsnorm_backward(rows, C) : scratch::layernorm_backward(rows, C));
  }
  // The MLP on `rows` rows, forward: fc, act, proj outputs.
  void mlp_fwd(int64_t rows) { act(rows * F1), act(rows * F), act(rows * C); }
  // Its backward when the output gradient exists: d(act), d(fc); d(input) only when `dx`.
  void mlp_bwd(int64_t rows, bool dx) {
    act(rows * F), linear_scratch(rows, C, !llama);             // proj
    act(rows * F1);                                             // gelu | swiglu
    if (dx) act(rows * C);                                      // fc
    linear_scratch(rows, F1, !llama);
  }
  int64_t chunk_rows() const { return (N + std::min<int64_t>(c.mlp_chunks, N) - 1) / std::min<int64_t>(c.mlp_chunks, N); }
  bool tiled() const { return std::min<int64_t>(c.mlp_chunks, N) > 1; }

  void block_fwd() {
    norm(N);
    if (P > 1) {  // the scatter's output, then the local qkv in a scope with the exchange
      act(B * T * W * D);
      auto m = A.mark();
      act(N * QKV), exchange(B * T * W * D, true, B > 1);
      A.release(m);
    } else {
      act(N * QKV);
    }
    if (llama) act(P > 1 ? B * T * W * D : N * QKV);   // rope
    act(B * T * Hql * D), f32(B * Hql * T);            // attention out, lse
    if (c.doc_mask) transient(scratch::attention_forward(B, true));  // (the CUDA op's, with documents)
    if (P > 1) act(N * C), exchange(N * C, B > 1, true);  // gather
    act(N * C), act(N * C);                            // attproj, residual
    norm(N);
    if (!tiled()) {
      mlp_fwd(N);
    } else {
      act(N * C);
      for (int64_t r0 = 0; r0 < N; r0 += chunk_rows()) {
        auto m = A.mark();
        mlp_fwd(std::min(N - r0, chunk_rows()));
        A.release(m);
      }
    }
    act(N * C);  // residual
  }

  // The block's backward nodes in reverse; the output's and the input's gradients exist.
  void block_bwd() {
    act(N * C), act(N * C);  // residual 2: d(x1), d(mlp out)
    if (!tiled()) {
      mlp_bwd(N, true);
    } else {
      act(N * C);  // d(h), before the slices
      for (int64_t r0 = 0; r0 < N; r0 += chunk_rows()) {
        auto m = A.mark();
        const int64_t r = std::min(N - r0, chunk_rows());
        mlp_fwd(r);
        mlp_bwd(r, false);  // the slice's input gradient is h's, no allocation
        A.release(m);
      }
    }
    norm_scratch(N);                                             // norm 2
    act(N * C);                                                  // residual 1: d(attproj out)
    act(N * C), linear_scratch(N, C, !llama);                    // attproj: d(att)
    if (P > 1) act(B * T * Hql * D), exchange(N * C, true, true);  // gather
    act(P > 1 ? B * T * W * D : N * QKV);                        // attention: d(qkv as it saw it)
    transient(scratch::attention_backward(B, T, Hql, c.doc_mask));
    if (llama) act(P > 1 ? B * T * W * D : N * QKV);             // rope
    // scatter: the local qkv's gradient, which at batch 1 reuses the sent gradient's memory
    if (P > 1) B > 1 ? act(N * QKV) : void(), exchange(B * T * W * D, B > 1, true);
    act(N * C), linear_scratch(N, QKV, c.model.has_qkv_bias());  // qkv linear: d(norm1 out)
    norm_scratch(N);                                             // norm 1
  }

  void inputs() {
    f32(N), f32(N), f32(N), f32(B * T);  // idx, targets, pos, pos_full (i32)
    if (c.doc_mask) f32(B * T);          // doc_full
  }
  // The classifier's chunk of scratch, in a scope of its own. The CUDA op sizes its chunks by all
  // rows, the CPU op by the scored ones (layers/classifier.cpp).
  void classifier() {
    auto m = A.mark();
    const int64_t rows = cuda || c.valid_rows < 0 ? N : c.valid_rows;
    const int64_t V = c.model.vocab, R = classifier_rows(V, rows, c.device);
    if (cuda) A.alloc(scratch::classifier(N, V, R, size_t(a)));
    else f32(R * V + 2 * R * C);
    A.release(m);
  }

  // An eval's forward (--steps 0 plans this alone): nothing records, so every block runs in a
  // scope and writes its output into one of two buffers (layers/transformer.cpp, Transformer::block),
  // whatever --recompute says; the classifier makes no gradient.
  void eval() {
    inputs();
    act(N * C);              // embedding
    act(N * C), act(N * C);  // the two buffers the block outputs alternate through
    for (int l = 0; l < c.model.layers; l++) {
      auto m = A.mark();
      block_fwd();
      A.release(m);
    }
    norm(N);
    kept = A.used;
    classifier();
  }

  void step() {
    inputs();
    act(N * C);                          // embedding
    const bool offload = c.recompute && c.offload;
    if (offload) act(N * C), act(N * C);  // the two buffers the block outputs rotate through
    for (int l = 0; l < c.model.layers; l++) {
      if (!c.recompute) { block_fwd(); continue; }
      if (!offload) act(N * C);  // the kept output; the block runs in a scope
      auto m = A.mark();
      block_fwd();
      A.release(m);
    }
    norm(N);
    act(N * C);  // d(final norm out), before the classifier's scope
    kept = A.used;
    classifier();
    act(N * C), norm_scratch(N);  // final norm backward: d(last block out)
    // Each block's backward: d(x), [the replay,] the nodes; then d(x) moves into d(y)'s memory
    // and the arena drops back to where it was (layers/transformer.cpp, bracketed_backward).
    for (int l = c.model.layers - 1; l >= 0; l--) {
      auto m = A.mark();
      act(N * C);
      if (c.recompute) block_fwd();
      block_bwd();
      A.release(m);
    }
    transient(scratch::embedding_backward(N));
  }
};

}  // namespace

MemoryPlan plan_memory(const PlanConfig& c) {
  MemoryPlan p;
  const ModelConfig& m = c.model;
  const bool cuda = c.device == Device::cuda;
  const size_t n = param_count(m), world = size_t(c.world);
  const bool zero = c.zero && c.trains;  // a model only evaluated has nothing to shard
  // The largest shard: the last rank's (parallel/zero.h).
  const size_t shard = zero ? n - zero_shard_size(n, c.world) * (world - 1) : n;
  const bool bf16 = c.dtype == DType::bf16;
  p.params = n * dtype_size(c.dtype), p.grads = c.trains ? n * 4 : 0;
  p.optim = shard * (bf16 ? 12 : 8);  // m, v (+ the fp32 master weights when the weights are bf16;
                                       // ZeRO-1 shards them too: Trainer's MasterRange)
  if (!c.trains) p.optim = bf16 && c.host_weights ? n * 4 : 0;  // the masters alone, for a host copy
  Walk w(c);
  if (c.trains) w.step();
  else if (c.evaluates) w.eval();  // else nothing runs on the device: exports and samples read a host copy
  p.kept = w.kept, p.arena_peak = w.A.peak;
  p.transient = p.arena_peak - p.kept;
  // Outside the arena: the CPU attention backward's row sums (none in an eval) and, when it runs
  // in one pass (a task's dq scratch of group x T x D at most 32 MiB), its dq scratch: at most one
  // a task, which is at most a q-sized tensor whatever the threads; cuBLASLt's workspace on cuda.
  // The group a rank's attention runs: its query heads over its kv heads (one, replicated, when
  // kv heads are fewer than --sp: a smaller group than the model's).
  const int64_t kv_local = c.model.kv_heads >= c.sp ? c.model.kv_heads / c.sp : 1;
  const size_t group = size_t(w.Hql / kv_local), dq_task = group * size_t(c.seq) * w.D * 4;
  const size_t dq = dq_task <= (size_t(32) << 20) ? size_t(c.batch) * w.Hql * c.seq * w.D * 4 : 0;
  p.workspace = cuda ? scratch::kCublasLtWorkspace : c.trains ? size_t(c.batch) * w.Hql * c.seq * 4 + dq : 0;
  // ZeRO's shard buffer (device memory on a device); the local communicator's all-reduce keeps one
  // rank's slice of the gradient (host memory). On a device the local communicator and MPI stage
  // each collective through host memory (parallel/comm_local.cpp, comm_util.h's Staged): the
  // gradient's whole buffer with the slice (MPI: with ZeRO's shard), or an all-to-all's send and
  // receive buffers, whichever is larger; not device memory.
  const size_t slice = ((n + world - 1) / world) * 4;
  if (c.world > 1) p.comm = zero ? zero_scratch_elems(n, c.world) * 4 : c.local_comm && !cuda && c.trains ? slice : 0;
  if (c.world > 1 && (c.local_comm || c.mpi_comm) && cuda) {
    // An all-to-all's buffers hold every rank's W heads of the whole sequence: B T W D each, more
    // than N QKV when kv heads are replicated (fewer than sp).
    // (sp 1 runs no all-to-all.)
    // (the local communicator keeps its all-reduce slice between calls: under the all-to-alls too)
    const size_t a2a = c.sp > 1 ? size_t(2) * size_t(w.B * w.T * w.W * w.D) * size_t(w.a) : 0;
    p.host_comm = c.local_comm && c.trains ? slice + std::max(n * 4, a2a) : std::max(c.trains ? n * 4 + slice : 0, a2a);
  }
  if (c.trains && c.recompute && c.offload) p.pinned_host = offload_host_bytes(m.layers, size_t(w.N) * w.C * w.a);
  // A step's micro-batches are loaded before its first forward (HostBatch: tokens, targets,
  // positions and answer numbers of this rank's T / sp, all T positions, and with --doc-mask all T
  // documents), in host memory whatever the device.
  const size_t ints = 4 * size_t(c.seq / c.sp) + (1 + size_t(c.doc_mask)) * size_t(c.seq);  // a sequence's
  p.batches = size_t(c.grad_accum) * size_t(c.batch) * ints * sizeof(int32_t);
  p.total = p.params + p.grads + p.optim + p.arena_peak + p.workspace + p.comm + (cuda ? 0 : p.batches);

  // Bytes sent per step (Trainer::step and parallel/ulysses.cpp, with communicator.h's formulas).
  const DType adt = c.dtype;
  const int P = c.sp, W = c.world;
  if (P > 1) {
    const size_t scatter = size_t(w.B) * w.Tl * w.W * w.D, gather = size_t(w.B) * w.Tl * w.Hql * w.D;
    p.a2a_layer_fwd = comm_volume::all_to_all(scatter, adt, P) + comm_volume::all_to_all(gather, adt, P);
    // forward, backward, and with recompute the replayed forward: per layer, per micro-batch (an
    // eval-only run: one forward a batch)
    p.sent.all_to_all = p.a2a_layer_fwd * (c.trains ? (c.recompute ? 3 : 2) * c.grad_accum : 1) * m.layers;
  }
  if (W > 1) {
    p.sent.all_reduce = 2 * comm_volume::all_reduce(1, DType::f64, W);  // valid count, loss
    if (c.trains) {  // (an eval-only run has no gradients to reduce)
      // the squared gradient norm, summed shard by shard with or without ZeRO (engine/trainer.cpp)
      p.sent.all_reduce += comm_volume::all_reduce(1, DType::f64, W);
      if (!c.zero) {
        p.sent.all_reduce += comm_volume::all_reduce(n, DType::f32, W);
      } else {  // parallel/zero.h: equal shards by reduce-scatter / all-gather, the tail by the world
        const size_t s = zero_shard_size(n, W), tail = n - s * world;
        p.sent.reduce_scatter = comm_volume::reduce_scatter(s, DType::f32, W);
        p.sent.all_gather = comm_volume::all_gather(s, c.dtype, W);
        if (tail) p.sent.all_reduce += comm_volume::all_reduce(tail, DType::f32, W);
        if (tail) p.sent.broadcast = comm_volume::broadcast(tail, c.dtype, W, false);
        // bf16: the masters are sharded, so the check that the update left them finite adds up
        // the ranks' sums of squares (engine/trainer.cpp)
        if (c.dtype == DType::bf16) p.sent.all_reduce += comm_volume::all_reduce(1, DType::f64, W);
      }
    }
  }
  return p;
}

namespace {
// The longest --seq gpt2's learned positions take when they are fixed (--max-seq, a checkpoint's):
// a multiple of sp; -1 when nothing fixes them (llama, or a gpt2 sized to its --seq).
int64_t positions_hold(const PlanConfig& c) {
  return !c.model.is_llama() && c.max_seq_fixed ? c.model.max_seq / c.sp * c.sp : -1;
}
}  // namespace

int64_t longest_seq(PlanConfig c, double budget) {
  const int64_t unit = 64 * int64_t(c.sp);
  auto fits = [&](int64_t T) {
    PlanConfig x = c;
    x.seq = int(T);
    // gpt2's learned positions follow T (train sets them to --seq past the preset's 1024, every
    // gpt2 preset's, when --max-seq is not given: the asked --seq's table, its gradient and AdamW
    // state once weighed on every shorter T); given, or a checkpoint's, they bound it: train
    // refuses a longer --seq
    if (!x.model.is_llama() && c.max_seq_fixed && x.model.max_seq < T) return false;
    if (T < c.min_seq) return false;  // (the task refuses it: passkey below 12)
    if (!x.model.is_llama() && !c.max_seq_fixed) x.model.max_seq = int(std::max<int64_t>(T, std::min(c.model.max_seq, 1024)));
    try {
      return double(plan_memory(x).total) <= budget;
    } catch (const PlanTooLarge&) {
      return false;  // (past any machine: shorter fits first)
    }
  };
  // The longest k x step (k in [k0, most], k0 the first the task takes) that fits, 0 when none
  // (above the task's minimum, what fits is monotone in T).
  auto longest = [&](int64_t step, int64_t most) -> int64_t {
    const int64_t k0 = std::max<int64_t>(1, (c.min_seq + step - 1) / step);
    if (most < k0 || !fits(k0 * step)) return 0;
    int64_t lo = k0, hi = 2 * k0;  // in steps: lo fits
    while (hi <= most && fits(hi * step)) lo = hi, hi *= 2;
    hi = std::min(hi, most + 1);  // hi does not fit, or is past the cap
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (fits(mid * step) ? lo : hi) = mid;
    }
    return lo * step;
  };
  // No longer than train accepts: a step's grad_accum x batch x seq tokens fit an int (options.cpp).
  const int64_t cap = std::min<int64_t>(int64_t(1) << 30, INT32_MAX / (int64_t(c.batch) * c.grad_accum)) / unit;
  // Fixed learned positions: the longest multiple of sp they hold, when it fits (below 64 sp the
  // search in units found nothing, "not even 64 sp", as if memory were short); else the units.
  // Shorter than one unit, what fits is searched in multiples of sp (a --seq that fits said it did
  // not: "0 (not even 64)").
  if (const int64_t held = positions_hold(c); held >= 0) {
    const int64_t T = std::min(held, cap * unit);
    if (T > 0 && fits(T)) return T;
    if (held < unit) return longest(c.sp, held / c.sp);
  }
  if (cap < 1) return 0;
  // The first unit tried (one, or the first at the task's minimum): where it does not fit, the
  // multiples of sp below it (a minimum of 6002 fitted while 6016 did not: "not even 6002" was said)
  const int64_t first_unit = std::max<int64_t>(1, (c.min_seq + unit - 1) / unit) * unit;
  if (!fits(first_unit)) return longest(c.sp, first_unit / c.sp - 1);
  return longest(unit, cap);
}

namespace {
std::string mib(double b) {  // "   12.5 MiB" or "    1.23 GiB"
  char buf[400];  // (a --memory of 1e30T prints 31 digits; a double's largest, 309)
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%9.2f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%9.1f MiB", b / (1024.0 * 1024));
  return buf;
}
}  // namespace

PlanConfig plan_config(const Options& o) {
  if (o.ranks % o.sp)
    throw std::runtime_error("--plan: --ranks " + std::to_string(o.ranks) + " is not a multiple of --sp " +
                             std::to_string(o.sp) + ": give --ranks N, the world size to plan for (under any --comm: "
                             "mpirun's -np, or the GPUs)");
  if (!o.checkpoint.empty()) {  // the run's model is the checkpoint's (with the RoPE flags, as train has it)
    std::vector<float> values;
    ModelConfig cfg = checkpoint_model_config(o.checkpoint, values, false);  // the shape, not the weights
    apply_checkpoint_flags(o, cfg);
    apply_trained_length(o, cfg);
    return plan_config(o, cfg);
  }
  const bool preset_vocab = preset_has_vocab(o.model);
  int data_vocab = o.vocab;  // the data is opened only when it sizes the model
  // (text:FILE is bytes: 256 ids whatever the file, which is not read for them)
  if (!preset_vocab && data_vocab <= 0 && o.data.rfind("text:", 0) == 0) data_vocab = 256;
  if (!preset_vocab && data_vocab <= 0) {
    try {
      data_vocab = open_dataset(o.data, Split::train, o.seed, -1)->vocab();
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--data: ") + e.what());  // as the run names it
    }
  }
  ModelConfig cfg = model_config(o, preset_vocab && data_vocab <= 0 ? 2 : data_vocab);
  apply_trained_length(o, cfg);
  return plan_config(o, cfg);
}

PlanConfig plan_config(const Options& o, const ModelConfig& model) {
  PlanConfig c;
  c.model = model;
  c.device = o.device == "cuda" ? Device::cuda : Device::cpu;
  c.dtype = param_dtype(o);
  c.batch = o.batch, c.seq = o.seq, c.grad_accum = o.grad_accum;
  c.sp = o.sp, c.world = o.ranks;
  c.doc_mask = o.doc_mask;
  c.recompute = o.recompute, c.offload = o.offload, c.mlp_chunks = o.mlp_chunks, c.zero = o.zero;
  c.local_comm = o.comm == "local";
  c.mpi_comm = o.comm == "mpi";
  c.trains = o.steps > 0;
  c.host_weights = o.reads_host_weights();
  c.evaluates = o.evaluates();
  c.max_seq_fixed = o.set_by_user("--max-seq") || !o.checkpoint.empty();
  c.model.validate_for(c.device);
  check_ulysses_config(c.model.heads, c.model.kv_heads, c.seq, c.sp, c.world);
  check_seq_fits(o, c.model);  // as train refuses it: a plan for a run that cannot start would mislead
  // A synthetic task's own minimum length (passkey at --seq 8 needs 12), which longest_seq keeps
  // to as well: it reads no file to say so (a text: or shards: spec is not opened here).
  if ((c.trains || c.evaluates) && synthetic_spec(o.data)) {
    const std::unique_ptr<Dataset> task = open_dataset(o.data, Split::train, o.seed, -1);
    auto takes = [&](int T) {
      try {
        task->num_sequences(T);
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
    try {
      task->num_sequences(c.seq);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--data: ") + e.what());  // as the run names it
    }
    // The shortest it takes, in [1, --seq] (what a task takes is monotone in T: passkey:digits=3000
    // needs 6002, past a search that stopped at 4096)
    if (!takes(1)) {
      int lo = 1, hi = c.seq;  // lo refused, hi taken
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (takes(mid) ? hi : lo) = mid;
      }
      c.min_seq = hi;
    }
  }
  return c;
}

std::string memory_shrinks(const PlanConfig& c) {
  std::string s;
  // (--offload keeps the last two blocks' outputs on the device: with two layers or fewer it moves nothing.)
  if (c.trains)
    s += !c.recompute ? "--recompute, " : !c.offload && c.device == Device::cuda && c.model.layers > 2 ? "--offload, " : "";
  if (c.mlp_chunks < 8) s += "--mlp-chunks 8, ";
  // A rank more on the same GPU (or CPU) holds a whole model more: sp and ZeRO pay over more of them.
  const std::string more = c.device == Device::cuda ? " over more GPUs" : " over more machines";
  // (a larger --sp only where one divides the heads, the kv heads' way and the sequence)
  bool larger_sp = false;
  for (int p = c.sp + 1; p <= c.model.heads && !larger_sp; p++) {
    try {
      check_ulysses_config(c.model.heads, c.model.kv_heads, c.seq, p, 0);
      larger_sp = true;
    } catch (const std::exception&) {
    }
  }
  s += (larger_sp ? "a larger --sp" + more + ", " : std::string()) + "a smaller --batch or --seq";
  if (c.trains && !c.zero) s += c.world > 1 ? ", --zero 1" : ", --zero 1" + more;
  return s;
}

std::string format_plan(const PlanConfig& c, const MemoryPlan& p, double budget) {
  const bool cuda_plan = c.device == Device::cuda;
  std::ostringstream s;
  s << "plan | " << c.model.describe() << "\n";
  s << "plan | per rank: batch " << c.batch << " x seq " << c.seq << " (" << c.seq / c.sp << " tokens here) | world "
    << c.world << " = dp " << c.world / c.sp << " x sp " << c.sp << " | " << device_name(c.device) << " " << dtype_name(c.dtype)
    << (c.recompute ? " | recompute" : "") << (c.offload ? " | offload" : "") << (c.mlp_chunks > 1 ? " | mlp chunks " + std::to_string(c.mlp_chunks) : "")
    << (c.zero && c.trains ? " | zero 1" : "") << (c.trains ? "" : c.evaluates ? " | --steps 0: eval only" : " | --steps 0: no eval (an export or a sample alone)") << "\n";
  auto row = [&](const char* what, double b, const char* why) { s << "  " << what << mib(b) << "  " << why << "\n"; };
  row("parameters         ", p.params, "");
  row("gradients          ", p.grads, c.trains ? "fp32" : "none: --steps 0 trains nothing");
  const std::string state = !c.trains ? (p.optim ? "fp32 master weights alone (--steps 0: a host copy to export, sample or probe)"
                                                 : "none (--steps 0)")
                            : c.dtype == DType::bf16 ? "AdamW m, v + fp32 master weights"
                                                     : "AdamW m, v";
  row("optimizer state    ", p.optim, (c.zero && c.trains ? state + ": this rank's shard" : state).c_str());
  if (c.trains) {
    row("kept activations   ", p.kept, "alive when backward starts (arena)");
    row("peak transient     ", p.transient, "activation gradients + scratch on top (arena)");
  } else {
    row("held activations   ", p.kept, "embedding, two block outputs, final norm (arena)");
    row("peak transient     ", p.transient, "one block's activations or the classifier's chunk (arena)");
  }
  row("workspace          ", p.workspace,
      cuda_plan ? "outside the arena (cuBLASLt)" : "outside the arena (attention backward's row sums and dq)");
  row("comm buffers       ", p.comm, c.zero && c.trains ? "ZeRO shard buffer" : p.comm ? "local all-reduce slice" : "");
  if (!cuda_plan) row("micro-batches      ", p.batches, "a step's token ids, targets, positions (x --grad-accum)");
  row("total              ", p.total, "(+ the process itself: code, threads, data)");
  if (cuda_plan) row("host micro-batches ", p.batches, "a step's token ids, targets, positions, outside the total");
  if (p.pinned_host) row("pinned host memory ", p.pinned_host, "--offload: block inputs, outside the total");
  if (p.host_comm) row("host staging       ", p.host_comm, "--comm local or mpi on a device: collectives through host memory, outside the total");
  s << (c.trains ? "plan | bytes sent per step by this rank:" : "plan | bytes sent per eval batch by this rank:");
  s << " all-to-all " << mib(double(p.sent.all_to_all)) << " (" << mib(double(p.a2a_layer_fwd)) << " per layer per direction)";
  s << " | all-reduce " << mib(double(p.sent.all_reduce));
  if (c.zero && c.trains)
    s << " | reduce-scatter " << mib(double(p.sent.reduce_scatter)) << " | all-gather " << mib(double(p.sent.all_gather));
  s << "\n";
  if (budget > 0) {
    const int64_t T = longest_seq(c, budget);
    // gpt2's positions, fixed (--max-seq, a checkpoint's), may bound it before the memory does
    const int64_t held = positions_hold(c);
    // the shortest tried (longest_seq): sp, or the task's minimum rounded up to a multiple of it
    const int64_t first = held >= 0 && held < c.sp ? held : std::max<int64_t>(1, (c.min_seq + c.sp - 1) / c.sp) * c.sp;
    s << "plan | longest --seq that fits " << mib(budget) << " per rank: " << T;
    if (T == 0 && first == 0)
      s << " (the model's max_seq " << c.model.max_seq << " holds no multiple of --sp " << c.sp << ")";
    else if (T == 0)
      s << " (not even " << first << ": try " << memory_shrinks(c) << ")";
    else if (T == held)
      s << " (the model's learned positions end at max_seq " << c.model.max_seq << ")";
    s << "\n";
    if (double(p.total) > budget)
      s << "plan | --seq " << c.seq << " does not fit " << mib(budget) << " per rank: " << mib(double(p.total) - budget)
        << " over\n";
  }
  if (c.zero && c.trains && c.world == 1)
    s << "plan | note: --zero 1 with one rank shards nothing (its shard is the whole AdamW state): it saves memory only "
         "over several ranks\n";
  return s.str();
}

int plan_main(const Options& given) {
  // Under a launcher (mpirun -np 4 train --comm mpi --plan), its world is the one to plan for, and
  // one process prints it (the plan starts no MPI: each process would print its own copy).
  Options o = given;
  const Launcher l = detect_launcher();
  if (o.comm != "local" && started_as_several(l)) {
    if (!o.set_by_user("--ranks")) o.ranks = l.size;
    if (l.rank > 0) return 0;
  }
  PlanConfig c = plan_config(o);
  std::fputs(format_plan(c, plan_memory(c), o.memory).c_str(), stdout);
  return 0;
}

}  // namespace ul
