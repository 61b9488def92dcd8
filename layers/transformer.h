// GPT-2 and Llama-style decoder-only transformers assembled from the ops in layers/.
//
// gpt2  (llm.c compatible): x = wte[idx] + wpe[pos]; per layer
//         x += attnproj(attention(qkv(ln1(x))));  x += fcproj(gelu(fc(ln2(x))))
//       logits = lnf(x) wte^T  (tied embeddings); LayerNorm, biases everywhere.
// llama: x = wte[idx]; per layer
//         x += attnproj(attention(rope(qkv(rms1(x)))));  x += fcproj(swiglu(fc(rms2(x))))
//       logits = rmsf(x) lm_head^T; RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases
//       (except, with qkv_bias, on the q/k/v projection: Qwen 2's attention); with sliding_window W
//       each query attends only to the last W positions, itself included (Mistral's attention), in
//       every layer or all but every full_every-th (hybrid local/global attention).
//
// Under Ulysses sequence parallelism (sp group of P ranks) the block sees this rank's T/P tokens;
// around attention, ulysses_scatter_heads trades "my tokens, all heads" for "all tokens, my heads"
// and ulysses_gather_heads trades back (parallel/ulysses.h). Everything else is per token.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/offload.h"
#include "engine/params.h"
#include "layers/classifier.h"
#include "layers/rope.h"

namespace ul {

class Comm;

// The largest vocabulary a model takes (2^30; the largest real ones are about 2^18): its padding
// to a multiple of 128 and the embedding's sort keys (row < 2^31) stay within int.
constexpr int kMaxVocab = 1 << 30;
// At most this many layers (--layers, a file's header or config.json): a file naming 2^30 of
// width 2 stays under 2^50 parameters, and took minutes of per-layer work, or gigabytes, to refuse.
constexpr int kMaxLayers = 100000;

struct ModelConfig {
  std::string arch = "gpt2";  // gpt2 | llama
  int layers = 2, dim = 128, heads = 4, kv_heads = 4;
  int vocab = 64, padded_vocab = 128, max_seq = 256;
  int ffn = 0;                // llama SwiGLU hidden size (0: derived from dim)
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;   // llama: --rope-scaling / HF's rope_scaling (layers/rope.h)
  bool tie_embeddings = false;  // llama: the output head is wte (Llama 3.2, SmolLM); gpt2 always ties
  bool qkv_bias = false;        // llama: a bias on the q/k/v projection (Qwen 2); gpt2 has all biases
  float norm_eps = 1e-5f;       // llama: RMSNorm's eps (Qwen 2: 1e-6); gpt2's LayerNorm keeps llm.c's 1e-5
  int sliding_window = 0;       // llama: query t sees keys t - W < t' <= t (Mistral's); 0: all of t' <= t
  // With a window, hybrid local/global attention: layers full_first, full_first + full_every, ...
  // see every earlier token (Gemma 3: every 6 from 5, GPT-OSS: 2 from 1, Ministral: 4 from 0).
  int full_every = 0, full_first = 0;  // 0: every layer has the window

  Rope rope() const {
    Rope r(rope_theta);
    r.scaling = rope_scaling;
    return r;
  }
  int head_dim() const { return dim / heads; }
  int ffn_dim() const;        // gpt2: 4 * dim; llama: ffn or round_up(8 * dim / 3, 64)
  bool is_llama() const { return arch == "llama"; }
  bool full_layer(int l) const { return full_every > 0 && l >= full_first && (l - full_first) % full_every == 0; }
  int window_of(int l) const { return full_layer(l) ? 0 : sliding_window; }  // layer l's attention window
  bool has_lm_head() const { return is_llama() && !tie_embeddings; }  // else the head is wte
  bool has_qkv_bias() const { return !is_llama() || qkv_bias; }
  const char* head_name() const { return has_lm_head() ? "lm_head" : "wte"; }
  void validate() const;      // throws with a message naming the bad flag
  // validate(), and on cuda a head dim the kernels are built for; from: the checkpoint that gave
  // the shape ("": the flags)
  void validate_for(Device d, const std::string& from = "") const;
  std::string describe() const;
};

// Elements of the parameter buffer: the Transformer constructor's shapes, counted (the presets'
// counts are checked against their published models', tests/cpu/test_memory_features.cpp).
// Throws past 2^60 (validate() calls it).
size_t param_count(const ModelConfig& m);

// Round v up to a multiple of m.
inline int round_up(int v, int m) { return (v + m - 1) / m * m; }

// What one rank feeds the model for one micro-batch. Tl = T / P under sequence parallelism.
struct ModelInputs {
  Tensor idx;       // i32 (B, Tl) this rank's tokens
  Tensor targets;   // i32 (B, Tl) next tokens, -1 = ignored
  Tensor pos;       // i32 (B, Tl) global positions of this rank's tokens (restart per document when packing)
  Tensor pos_full;  // i32 (B, T)  positions of the whole sequence (RoPE runs after the scatter)
  Tensor doc_full;  // i32 (B, T)  document ids of the whole sequence, or undefined: no document mask
  float* row_loss = nullptr;  // out, when set: host (B, Tl), each token's loss (0 where its target is ignored)
  uint8_t* row_hit = nullptr;  // out, when set: host (B, Tl), 1 where the argmax is the target (0 where ignored)
};

class Transformer {
 public:
  // Builds the parameter list (llm.c order for gpt2) and allocates it on the current context,
  // the parameters in `dtype` (f32, or bf16 on cuda; gradients and master weights stay f32, the
  // masters of `masters` only: Params::allocate; no gradients at all when `grads` is false).
  explicit Transformer(const ModelConfig& cfg, DType dtype = DType::f32, MasterRange masters = {}, bool grads = true);
  // GPT-2 init: N(0, 0.02), residual projections / sqrt(2L); drawn in f32 on the host, so a bf16
  // model's master weights are these values exactly and its bf16 weights their rounding.
  void init_weights(uint64_t seed);

  // One forward of this rank's micro-batch; when the tape records, the classifier adds the loss
  // gradient (scaled by grad_scale) and the tape holds the rest of the backward. A forward that
  // throws (a target outside the vocabulary, a collective's timeout) drops what it recorded.
  CrossEntropyStats forward(const ModelInputs& in, float grad_scale, Comm* sp = nullptr);

  ModelConfig cfg;
  Params params;
  // Long-context memory (README, "Long context"). recompute: keep only each block's input and
  // replay the block in backward. mlp_chunks > 1: run the MLP over that many slices of the rows,
  // so its F-wide intermediate exists for one slice at a time (forward and backward).
  bool recompute = false;
  bool offload = false;  // with recompute, on cuda: the kept block inputs in pinned host memory
  int mlp_chunks = 1;
  Tensor last_hidden;  // (B, Tl, C): the final norm's output of the last forward (for --check-state)
  // Called as the forward finishes each block ("forward block 3/12") and the classifier, and as
  // the backward finishes each block ("backward block 12/12" first): train's --heartbeat.
  std::function<void(const std::string& where)> progress;

 private:
  CrossEntropyStats forward_ops(const ModelInputs& in, float grad_scale, Comm* sp);
  Tensor block(const Tensor& x, int l, const ModelInputs& in, Comm* sp);       // with recompute
  Tensor block_ops(const Tensor& x, int l, const ModelInputs& in, Comm* sp);   // the block itself
  Tensor attention_block(const Tensor& h, int l, const ModelInputs& in, Comm* sp);
  Tensor mlp_block(const Tensor& h, int l);  // tiled over rows when mlp_chunks > 1
  Tensor mlp_ops(const Tensor& h, int l);
  Tensor bracketed_backward(const Tensor& x, const std::function<Tensor()>& ops);
  std::unique_ptr<BlockOffload> offload_;  // made on the first forward that offloads
  BlockOffload* offloading_ = nullptr;     // this forward's (recorded, recompute, offload) or null
  Tensor eval_out_[2];                     // a forward that records nothing: block outputs alternate
};

}  // namespace ul
