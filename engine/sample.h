// Text generation with a KV cache. Tokens run through the layers in chunks: the prompt in chunks of
// up to `chunk` rows (prefill: every weight is read once per chunk, one GEMM per weight, so a long
// prompt goes at GEMM speed rather than one matrix-vector product per token), then each new token
// as a chunk of one. A chunk's rows attend over the keys and values earlier tokens left in the cache
// and over their own chunk's, causally (with a sliding window W, over the last W positions, itself
// included), so a token costs O(T * C) (O(W * C) with a window; plus the weights), never a forward
// of the whole prefix. It reuses the CPU kernels (embedding, norms, linear, RoPE at the rows'
// positions, GELU / SwiGLU); only the attention over the cache is written here, a short loop
// threaded over (row, head). fp32, on the host, from a copy of the parameters.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/params.h"
#include "engine/rng.h"
#include "layers/transformer.h"

namespace ul {

class KvDecoder {
 public:
  // params: the whole parameter buffer in host memory, laid out as `specs` says (Transformer's
  // Params); it must outlive the decoder. max_len: how many positions it decodes; the cache holds
  // them all, or with a sliding window W in every layer only the W + chunk - 1 newest (a ring:
  // memory O(W), not O(max_len)). chunk: the most rows one forward takes (the prefill's
  // activations are O(chunk * (C + FFN)), whatever the prompt's length).
  KvDecoder(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* params, int max_len,
            int chunk = kDefaultChunk);
  static constexpr int kDefaultChunk = 256;
  // What decoding max_len positions takes in host memory: the cache, the chunk's buffers (with
  // `scoring`, score()'s logits of a chunk too) and, with `weights_copy`, the f32 copy of the
  // weights the decoder reads (made by its caller: a device's; the CPU's are read in place).
  static size_t host_bytes(const ModelConfig& cfg, int max_len, bool scoring = false, int chunk = kDefaultChunk,
                           bool weights_copy = true);

  // Runs tokens[0, n) at the next n positions, `chunk` rows at a time, appending their K and V to
  // the cache; returns the logits of the token that follows the last (cfg.vocab values, the padded
  // rows excluded). progress, if given, is called after each chunk with the tokens done so far.
  // Throws, before running anything, when an id is outside the vocabulary or the cache is too small.
  const std::vector<float>& prefill(const int* tokens, int n, const std::function<void(int)>& progress = {});
  const std::vector<float>& step(int token) { return prefill(&token, 1); }
  // Runs tokens[0, n) as prefill does, with the head on every row: nll[i] = -log p(targets[i] |
  // tokens[0..i]) for each i with targets[i] >= 0 (0 where it is < 0). Same refusals as prefill,
  // and a target outside the vocabulary.
  void score(const int* tokens, const int32_t* targets, int n, float* nll,
             const std::function<void(int)>& progress = {});  // progress(rows done), as prefill's
  int position() const { return pos_; }
  void reset() { pos_ = 0, doc_start_ = 0; }
  // Packed documents, as --doc-mask trains them (data/packing.h): from now on each `eot` token
  // opens a new document, whose rows attend only within it and count positions from 0 there
  // (the RoPE angle, gpt2's learned position). -1: one document (the default).
  void set_document_token(int32_t eot) { eot_ = eot; }

 private:
  const float* param(const std::string& name, int layer = -1) const;
  void norm(float* y, const float* x, const char* w, const char* b, int layer, int n);
  void check_tokens(const int* tokens, int n) const;  // prefill's refusals, before anything runs
  void forward(const int* tokens, int n);  // n <= chunk_ rows at positions pos_ .. pos_ + n - 1
  // Row i of the chunk (position p = pos_ + i), one query per head, over positions [0, p] (with a
  // window W: (p - W, p]) in the cache, which already holds the chunk's own keys and values.
  void attend(float* out, const float* qkv, int layer, int n);

  ModelConfig cfg_;
  std::vector<ParamSpec> specs_;
  const float* params_;
  int max_len_, chunk_, pos_ = 0;
  // Positions the cache holds: max_len, or with a window W in every layer min(W + chunk - 1,
  // max_len), as a ring: a chunk's first row still reads W - 1 positions before the chunk.
  int slots_;
  std::vector<float> kcache_, vcache_;  // (L, slots, KV, D) each
  int32_t eot_ = -1;
  int doc_start_ = 0;  // the position where the document of the last row run so far starts
  std::vector<int32_t> tok_, pos_rows_, doc_rows_;  // (chunk): token, position in its document, document start
  std::vector<float> x_, h_, qkv_, att_, proj_, fc_, act_, stat_, logits_;  // (chunk, width) each
  std::vector<float> row_logits_;  // (chunk, V): score()'s, made on its first call
};

struct SampleSettings {
  int tokens = 0;            // how many to generate
  float temperature = 1.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 1337;
  float top_p = 1.0f;        // nucleus: 1 = off
  int vocab = 0;             // >0: only ids below it are drawn (a tokenizer smaller than the model's
                             // vocab: Qwen 2.5's 151665 tokens for 151936 rows); 0: every id
};

// The next token from `logits`: argmax when temperature is 0 or top_k is 1 (ties: lowest id);
// else a draw from softmax(logits / temperature) restricted to the top_k highest and, with
// top_p < 1, further to the fewest of those (most likely first) whose probabilities, renormalised
// over the top_k, add up to top_p or more (nucleus sampling; at least one token).
int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng, float top_p = 1.0f);

// -log softmax(z)[target] over the V logits z, summed in double: log sum exp(z - max) + max - z[target].
double token_nll(const float* z, int V, int target);

// Feeds the prompt (prefill, in chunks; progress as KvDecoder::prefill's), then samples s.tokens
// tokens one at a time (progress(prompt size + tokens drawn) after each one's forward); returns
// only the new ones. Throws when the prompt is empty, holds an id
// outside the vocabulary, or prompt + tokens exceeds the cache.
std::vector<int> generate(KvDecoder& dec, const std::vector<int>& prompt, const SampleSettings& s,
                          const std::function<void(int)>& progress = {});

}  // namespace ul
