#include "layers/transformer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "engine/context.h"
#include "engine/device.h"
#include "engine/file_io.h"
#include "engine/rng.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"
#include "parallel/communicator.h"
#include "parallel/ulysses.h"

namespace ul {

int ModelConfig::ffn_dim() const {
  // In 64 bits: a file's header may name any dim (checked against the weights only after this).
  const int64_t f = !is_llama() ? 4 * int64_t(dim) : ffn > 0 ? ffn : (8 * int64_t(dim) / 3 + 63) / 64 * 64;
  if (f > INT32_MAX)
    throw std::runtime_error("dim " + std::to_string(dim) + ": the MLP would be " + std::to_string(f) +
                             " wide, more than 2^31 - 1 (give a smaller --dim" + (is_llama() ? " or --ffn)" : ")"));
  return int(f);
}

size_t param_count(const ModelConfig& m) {
  // In 128 bits, so that a shape read from a file (layers, dim, vocab up to 2^31 each) cannot wrap
  // around 2^64 to a small count that matches the file's size. 2^50 (a thousand trillion) is far
  // past any machine, and keeps the planner's sums of 18 bytes a parameter and more within 64 bits
  // (at 2^60 they wrapped, and a model of 10^18 parameters "fit" 24G).
  using W = unsigned __int128;
  const W L = W(m.layers), C = W(m.dim), Vp = W(m.padded_vocab), F = W(m.ffn_dim());
  const W QKV = W(int64_t(m.heads) + 2 * int64_t(m.kv_heads)) * W(m.head_dim());
  const W n = !m.is_llama() ? Vp * C + W(m.max_seq) * C + 2 * C +
                                  L * (2 * C + QKV * C + QKV + C * C + C + 2 * C + F * C + F + C * F + C)
                            : W(m.has_lm_head() ? 2 : 1) * Vp * C + C +
                                  L * (C + QKV * C + (m.qkv_bias ? QKV : 0) + C * C + C + 2 * F * C + C * F);
  if (n > (W(1) << 50))
    throw std::runtime_error("the model's shape (" + m.describe() + ") gives more than 2^50 parameters");
  return size_t(n);
}

void ModelConfig::validate() const {
  auto bad = [](const std::string& m) { throw std::runtime_error(m); };
  if (arch != "gpt2" && arch != "llama") bad("--model: unknown architecture '" + arch + "' (gpt2 or llama)");
  if (layers < 1) bad("--layers must be >= 1");
  if (layers > kMaxLayers) bad("layers " + std::to_string(layers) + ": at most " + std::to_string(kMaxLayers));
  if (dim < 1 || heads < 1) bad("--dim and --heads must be >= 1");
  if (dim % heads) bad("--dim " + std::to_string(dim) + " is not divisible by --heads " + std::to_string(heads));
  if (kv_heads < 1 || heads % kv_heads)
    bad("--kv-heads " + std::to_string(kv_heads) + " must divide --heads " + std::to_string(heads));
  if (!is_llama() && kv_heads != heads) bad("--kv-heads: gpt2 has no grouped-query attention (use --model llama)");
  if (is_llama() && head_dim() % 2) bad("llama: head dim (dim / heads) must be even for RoPE");
  if (vocab < 2) bad("--vocab must be >= 2");
  if (vocab > kMaxVocab) bad("vocab " + std::to_string(vocab) + ": at most " + std::to_string(kMaxVocab));
  if (padded_vocab < vocab) bad("padded vocab smaller than vocab");
  if (max_seq < 1) bad("--max-seq must be >= 1");
  if (!is_llama() && tie_embeddings) bad("--tie-embeddings: gpt2 always ties its embeddings (a llama setting)");
  if (!is_llama() && rope_scaling.kind != RopeScaling::kNone)
    bad("--rope-scaling: gpt2 has learned positions, not RoPE (--model llama)");
  check_rope_scaling(rope_scaling, "--rope-scaling");
  // A config's theta too large for a float reads as inf: every angle then NaN.
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) bad("--rope-theta must be a finite number > 0");
  if (!is_llama() && qkv_bias) bad("--qkv-bias: gpt2 has every bias already (a llama setting)");
  if (!(norm_eps > 0) || !(norm_eps < 1)) bad("--norm-eps must be in (0, 1)");
  if (!is_llama() && norm_eps != 1e-5f) bad("--norm-eps: gpt2's LayerNorm keeps llm.c's 1e-5 (a llama setting)");
  if (sliding_window < 0)
    bad("--sliding-window must be >= 0 (0: attend to every earlier token), got " + std::to_string(sliding_window));
  if (!is_llama() && sliding_window) bad("--sliding-window: gpt2 attends to every earlier token (a llama setting)");
  if (full_every < 0) bad("--full-attention-every must be >= 0, got " + std::to_string(full_every));
  if (full_every && !sliding_window) bad("--full-attention-every: which layers skip the window needs --sliding-window");
  if (full_first < 0 || full_first >= std::max(1, full_every))
    bad("--full-attention-first must be in [0, --full-attention-every), got " + std::to_string(full_first));
  param_count(*this);  // throws past 2^50 parameters (a shape read from a file, or flags like --layers 2^30)
}

void ModelConfig::validate_for(Device d, const std::string& from) const {
  validate();
  // A checkpoint's shape is its own (no shape flag may change it): the message names the file.
  const std::string shape = from.empty() ? "--dim " + std::to_string(dim) + " / --heads " + std::to_string(heads)
                                         : from + ": dim " + std::to_string(dim) + " / heads " + std::to_string(heads);
  if (d == Device::cuda && !attention_cuda_head_dim(head_dim()))
    throw std::runtime_error("--device cuda: head dim " + std::to_string(head_dim()) + " (" + shape +
                             ") is not one the CUDA attention kernels are built for: 16, 32, 64 or 128");
}

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << arch << " layers=" << layers << " dim=" << dim << " heads=" << heads;
  // Floats as the shortest text that reads back to them: two configs that describe alike are alike
  // (the check of a checkpoint's metadata against its config.json compares these lines).
  if (is_llama()) s << " kv_heads=" << kv_heads << " ffn=" << ffn_dim() << " rope_theta=" << float_text(rope_theta);
  if (is_llama() && rope_scaling.kind != RopeScaling::kNone) s << " rope_scaling=" << rope_scaling_str(rope_scaling);
  if (is_llama() && tie_embeddings) s << " tied";
  if (is_llama() && qkv_bias) s << " qkv_bias";
  if (is_llama() && norm_eps != 1e-5f) s << " norm_eps=" << float_text(norm_eps);
  if (is_llama() && sliding_window) s << " sliding_window=" << sliding_window;
  if (full_every) s << " full_attention=every " << full_every << " from " << full_first;
  s << " vocab=" << vocab << " (padded " << padded_vocab << ") max_seq=" << max_seq;
  return s.str();
}

Transformer::Transformer(const ModelConfig& c, DType dtype, MasterRange masters, bool grads) : cfg(c) {
  cfg.validate();
  const int64_t L = cfg.layers, C = cfg.dim, Vp = cfg.padded_vocab, D = cfg.head_dim();
  const int64_t QKV = (cfg.heads + 2 * cfg.kv_heads) * D, F = cfg.ffn_dim();
  Params& p = params;
  if (!cfg.is_llama()) {  // llm.c's order and shapes, so checkpoints map byte for byte
    p.add("wte", {Vp, C}, false, true);
    p.add("wpe", {cfg.max_seq, C}, false, true);
    p.add("ln1w", {L, C}, true, false);
    p.add("ln1b", {L, C}, true, false);
    p.add("qkvw", {L, QKV, C}, true, true);
    p.add("qkvb", {L, QKV}, true, false);
    p.add("attprojw", {L, C, C}, true, true);
    p.add("attprojb", {L, C}, true, false);
    p.add("ln2w", {L, C}, true, false);
    p.add("ln2b", {L, C}, true, false);
    p.add("fcw", {L, F, C}, true, true);
    p.add("fcb", {L, F}, true, false);
    p.add("fcprojw", {L, C, F}, true, true);
    p.add("fcprojb", {L, C}, true, false);
    p.add("lnfw", {C}, false, false);
    p.add("lnfb", {C}, false, false);
  } else {
    p.add("wte", {Vp, C}, false, true);
    p.add("ln1w", {L, C}, true, false);
    p.add("qkvw", {L, QKV, C}, true, true);
    if (cfg.qkv_bias) p.add("qkvb", {L, QKV}, true, false);
    p.add("attprojw", {L, C, C}, true, true);
    p.add("ln2w", {L, C}, true, false);
    p.add("fcw", {L, 2 * F, C}, true, true);  // rows: [gate (F) | up (F)]
    p.add("fcprojw", {L, C, F}, true, true);
    p.add("lnfw", {C}, false, false);
    if (cfg.has_lm_head()) p.add("lm_head", {Vp, C}, false, true);
  }
  p.allocate(ctx().device, ctx().tape, dtype, masters, grads);
}

void Transformer::init_weights(uint64_t seed) {
  std::vector<float> host(params.numel(), 0.0f);
  const double std0 = 0.02, std_res = 0.02 / std::sqrt(2.0 * cfg.layers);
  // One stream of normal draws over the drawn tensors in order, each draw two of splitmix64's
  // numbers: the k-th draw starts at state seed + 2k x its increment, so the OpenMP threads each
  // start their own block there and the weights are the same bits as one thread drawing them all
  // (which took 25 ns a weight: 3 minutes at 8B).
  uint64_t draws = 0;  // before this tensor
  for (const ParamSpec& s : params.specs()) {
    float* w = host.data() + s.offset;
    const int64_t n = s.shape.numel();
    bool norm_weight = s.name == "ln1w" || s.name == "ln2w" || s.name == "lnfw";
    bool bias = !s.decay && !norm_weight;
    if (norm_weight) {
      std::fill(w, w + n, 1.0f);
    } else if (!bias) {
      const double sd = (s.name == "attprojw" || s.name == "fcprojw") ? std_res : std0;
      constexpr int64_t kBlock = int64_t(1) << 16;
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < n; b += kBlock) {
        Rng rng(seed + 2 * (draws + uint64_t(b)) * Rng::kIncrement);
        for (int64_t i = b; i < std::min(n, b + kBlock); i++) w[i] = float(sd * rng.normal());
      }
      draws += uint64_t(n);
    }
    if (s.name == "wte" || s.name == "lm_head")  // vocabulary padding rows stay zero, as in llm.c
      for (int64_t i = int64_t(cfg.vocab) * cfg.dim; i < n; i++) w[i] = 0.0f;
  }
  params.load_host(host.data());
}

Tensor Transformer::attention_block(const Tensor& h, int l, const ModelInputs& in, Comm* sp) {
  const int64_t B = h.size(0), Tl = h.size(1);
  const int D = cfg.head_dim();
  int Hq = cfg.heads, Hkv = cfg.kv_heads;
  Tensor bias = cfg.has_qkv_bias() ? params.get("qkvb", l) : Tensor{};
  Tensor qkv;
  if (sp && sp->size() > 1) {
    // (B, Tl, Hq + 2 Hkv, D) -> (B, T, Hq/P + 2 KVl, D): every token, this rank's heads.
    // The local qkv is only the all-to-all's input (the linear's backward reads its input, not
    // its output, and the scatter's backward writes d(qkv) afresh), so it lives in a scope and
    // the scatter writes into a buffer allocated below it: (Hq + 2 Hkv) D values per token per layer
    // not kept (3 C for multi-head attention).
    Context& c = ctx();
    const HeadSplit hs{Hq, Hkv, sp->size()};
    Tensor out = c.empty({B, Tl * sp->size(), hs.width(), D}, h.dtype);
    {
      ArenaScope scratch(c.arena);
      Tensor local = linear(h, params.get("qkvw", l), bias).view({B, Tl, Hq + 2 * Hkv, D});
      qkv = ulysses_scatter_heads(local, Hq, Hkv, *sp, &out);
    }
    // From here attention sees local head counts, and its rule "query h reads kv h / (Hq / Hkv)"
    // still picks the right kv head: with Hkv >= P each rank holds whole groups (Hq/P queries,
    // Hkv/P kv heads, the same group size); with Hkv < P a rank's Hq/P queries all lie in one
    // group, whose kv head is the one replica it received.
    Hkv = hs.kv_local();
    Hq = hs.q_local();
  } else {
    qkv = linear(h, params.get("qkvw", l), bias).view({B, Tl, Hq + 2 * Hkv, D});
  }
  // RoPE is per token and could run before the scatter; here it runs once on what attention
  // reads, with the global positions (pos_full; restarting per document under --doc-mask). With
  // Hkv < P each replicated kv head is rotated on each of its P / Hkv ranks.
  if (cfg.is_llama()) qkv = rope(qkv, in.pos_full, Hq, Hkv, cfg.rope());
  // Under SP the op sees the whole sequence for its heads, so the window needs nothing more here.
  Tensor att = attention(qkv, Hq, Hkv, in.doc_full, cfg.window_of(l));  // (B, T, Hq_local, D)
  if (sp && sp->size() > 1) att = ulysses_gather_heads(att, cfg.heads, *sp);  // (B, Tl, H, D)
  att = att.view({B, Tl, int64_t(cfg.dim)});
  Tensor pb = cfg.is_llama() ? Tensor{} : params.get("attprojb", l);
  return linear(att, params.get("attprojw", l), pb);
}

Tensor Transformer::mlp_ops(const Tensor& h, int l) {
  if (cfg.is_llama()) return linear(swiglu(linear(h, params.get("fcw", l), Tensor{})), params.get("fcprojw", l), Tensor{});
  Tensor u = gelu(linear(h, params.get("fcw", l), params.get("fcb", l)));
  return linear(u, params.get("fcprojw", l), params.get("fcprojb", l));
}

// Tiled MLP. Forward: each slice of rows goes through fc -> act -> proj unrecorded, inside an arena
// scope, and only its C-wide output is kept. Backward: each slice is replayed on the tape (its rows
// view shares h's gradient, so nothing is copied back) and walked at once. The MLP is per row, so
// the result is the untiled one up to rounding (a product of fewer rows may block its sums
// otherwise; the weight gradients add slice by slice); the F-wide intermediate exists for one
// slice at a time.
Tensor Transformer::mlp_block(const Tensor& h, int l) {
  const int64_t C = h.size(-1), N = h.numel() / C;
  const int64_t chunks = std::min<int64_t>(mlp_chunks, N);
  if (chunks <= 1) return mlp_ops(h, l);
  const int64_t R = (N + chunks - 1) / chunks;
  Context& c = ctx();
  Tensor y = c.empty(h.shape, h.dtype);
  const size_t row_bytes = size_t(C) * dtype_size(h.dtype);
  {
    Recording off(false);
    Tensor hv = h;
    hv.gid = -1;  // a plain view: no gradient slot while nothing records
    for (int64_t r0 = 0; r0 < N; r0 += R) {
      ArenaScope scope(c.arena);
      Tensor yc = mlp_ops(c.tape.rows(hv, r0, std::min(N, r0 + R)), l);
      device_copy(static_cast<char*>(y.ptr) + size_t(r0) * row_bytes, y.device, yc.ptr, yc.device, yc.nbytes());
    }
  }
  if (!c.tape.recording) return y;
  y = c.tape.track(y);
  c.tape.push("tiled_mlp", [=] {
    Tape& tape = ctx().tape;
    char* dy = static_cast<char*>(tape.grad(y));
    if (h.requires_grad()) tape.grad(h);  // before the scopes: it outlives every replay
    for (int64_t r0 = 0; r0 < N; r0 += R) {
      ArenaScope scope(ctx().arena);
      tape.replay([&] { return mlp_ops(tape.rows(h, r0, std::min(N, r0 + R)), l); }, dy + size_t(r0) * row_bytes);
    }
  });
  return y;
}

Tensor Transformer::block_ops(const Tensor& x, int l, const ModelInputs& in, Comm* sp) {
  auto norm = [&](const Tensor& t, const char* w, const char* b) {
    return cfg.is_llama() ? rmsnorm(t, params.get(w, l), cfg.norm_eps) : layernorm(t, params.get(w, l), params.get(b, l));
  };
  Tensor x1 = add(x, attention_block(norm(x, "ln1w", "ln1b"), l, in, sp));
  return add(x1, mlp_block(norm(x1, "ln2w", "ln2b"), l));
}

// Recompute (activation checkpointing) through the tape: the block runs unrecorded inside an arena
// scope, so of its activations only the output survives the forward (copied below the scope), and
// ONE node replays it in backward. The all-to-alls inside run again on every sp rank, in order.
Tensor Transformer::block(const Tensor& x, int l, const ModelInputs& in, Comm* sp) {
  Context& c = ctx();
  // Nothing records (eval): the same run in an arena scope, so an eval holds one block's
  // activations at a time instead of every layer's. Else (recorded, no recompute) the block as
  // usual, its backward bracketed.
  // scoped: the block runs in an arena scope, unrecorded (an eval; or recompute, whose backward
  // replays it)
  const bool scoped = !c.tape.recording || (recompute && x.requires_grad());
  if (!scoped) return bracketed_backward(x, [&] { return block_ops(x, l, in, sp); });
  BlockOffload* off = c.tape.recording ? offloading_ : nullptr;
  Tensor y = off ? off->output(l) : !c.tape.recording ? eval_out_[l % 2] : c.empty(x.shape, x.dtype);
  {
    ArenaScope scope(c.arena);
    Recording no(false);
    Tensor t = block_ops(x, l, in, sp);
    device_copy(y.ptr, y.device, t.ptr, t.device, t.nbytes());
  }
  if (off) off->stored(l);
  if (!c.tape.recording) return y;
  y = c.tape.track(y);
  c.tape.push("recompute", [=] {
    if (off) off->before_backward(l);  // x is back in its buffer (engine/offload.h)
    Tape& tape = ctx().tape;
    Arena& arena = ctx().arena;
    void* dy = tape.grad(y);
    const Arena::Mark below = arena.mark();
    tape.reserve_grad(x);  // before the replay's scope: x's gradient outlives the replay
    {
      ArenaScope scope(arena);
      tape.replay([&] { return block_ops(x, l, in, sp); }, dy);
    }
    tape.move_grad(x, dy);  // y's gradient is dead: x's takes its place, and the arena drops back
    arena.release(below);
  });
  return y;
}

// The block recorded as usual, with its backward bracketed so that, when it has run, the arena
// holds no more than before it: a node pushed last (so it runs first in backward) allocates the
// input's gradient and marks the arena; one pushed first (so it runs last) moves the input's
// gradient into the output's dead one and releases to below it. Every activation gradient made
// inside the block dies there, instead of every layer's piling up until the step ends.
Tensor Transformer::bracketed_backward(const Tensor& x, const std::function<Tensor()>& ops) {
  Context& c = ctx();
  if (!c.tape.recording || !x.requires_grad()) return ops();
  auto below = std::make_shared<Arena::Mark>();
  auto out = std::make_shared<Tensor>();
  c.tape.push("block_backward_close", [=] {
    Tape& tape = ctx().tape;
    tape.move_grad(x, tape.grad(*out));
    ctx().arena.release(*below);
  });
  Tensor y = ops();
  *out = y;
  c.tape.push("block_backward_open", [=] {
    Tape& tape = ctx().tape;
    // The order matters: y's gradient below the mark, x's above it. At the close, x's gradient is
    // moved into y's dead buffer, so the release drops x's original buffer with the rest.
    tape.grad(y);  // normally made by the block above; made here if not, so that it stays below
    *below = ctx().arena.mark();
    // Above the mark, but unzeroed: the backward of the block's first residual add is x's first
    // writer, and on CUDA stores instead of adding to zeros (Tape::grad_to_overwrite).
    tape.reserve_grad(x);
  });
  return y;
}

CrossEntropyStats Transformer::forward(const ModelInputs& in, float grad_scale, Comm* sp) {
  // --offload's copies of a step that failed midway may still be in flight on the side stream,
  // into arena memory this forward is about to reuse: they land first.
  if (offload_) offload_->wait_side();
  try {
    return forward_ops(in, grad_scale, sp);
  } catch (...) {
    // Its nodes would otherwise run in the next backward, over an arena the next step reuses.
    if (ctx().tape.recording) ctx().tape.clear();
    throw;
  }
}

CrossEntropyStats Transformer::forward_ops(const ModelInputs& in, float grad_scale, Comm* sp) {
  const int64_t B = in.idx.size(0), Tl = in.idx.size(1);
  const int64_t T = sp ? Tl * sp->size() : Tl;
  if (T > cfg.max_seq && !cfg.is_llama())
    throw std::runtime_error("sequence length " + std::to_string(T) + " exceeds --max-seq " +
                             std::to_string(cfg.max_seq) + " (gpt2 has learned positions up to max-seq)");
  Tensor wpe = cfg.is_llama() ? Tensor{} : params.get("wpe");
  Tensor x = embedding(in.idx, in.pos, params.get("wte"), wpe);  // (B, Tl, C)
  offloading_ = nullptr;
  // Nothing records (eval): no block's output is read after the next block has run, so the
  // outputs alternate between two buffers instead of piling up one per layer (which would make an
  // eval outgrow the step's reservation under --offload).
  for (Tensor& t : eval_out_) t = ctx().tape.recording ? Tensor{} : ctx().empty(x.shape, x.dtype);
  if (offload && recompute && ctx().tape.recording && x.requires_grad()) {
    if (!offload_) offload_ = std::make_unique<BlockOffload>();
    offload_->begin(ctx().arena, x, cfg.layers);
    offloading_ = offload_.get();
  }
  const int L = cfg.layers;
  // How many blocks are done, either way ("backward 1/12 blocks" after the last block's: the
  // backward walks them from the top; its block number once read as nearly all done).
  auto done = [L](int n) { return std::to_string(n) + "/" + std::to_string(L) + " blocks"; };
  for (int l = 0; l < L; l++) {
    // Pushed before the block's own nodes, so that in backward it runs once the block is done.
    if (progress && ctx().tape.recording)
      ctx().tape.push("progress", [this, where = "backward " + done(L - l)] { progress(where); });
    x = block(x, l, in, sp);
    if (progress) progress("forward " + done(l + 1));
  }
  x = cfg.is_llama() ? rmsnorm(x, params.get("lnfw"), cfg.norm_eps) : layernorm(x, params.get("lnfw"), params.get("lnfb"));
  last_hidden = x;
  const Tensor& head = params.get(cfg.head_name());  // tied: wte gets the head's gradient too
  (void)B;
  CrossEntropyStats st = classifier_cross_entropy(x, head, in.targets, cfg.vocab, grad_scale, in.row_loss, in.row_hit);
  if (progress) progress("classifier");
  return st;
}

}  // namespace ul
