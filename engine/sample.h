// Text generation with a KV cache: each new token runs alone through the layers, attending over
// the keys and values that earlier tokens left in the cache (with a sliding window W, over the last
// W positions, itself included), so a token costs O(T * C) (O(W * C) with a window; plus the
// weights), not a forward of the whole prefix. It reuses the CPU kernels (embedding, norms,
// linear, RoPE at the token's position, GELU / SwiGLU); only the one-query attention is written
// here, a short loop. fp32, on the host, from a copy of the parameters.
#pragma once
#include <cstdint>
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
  // them all, or with a sliding window W only the W newest (a ring: memory O(W), not O(max_len)).
  KvDecoder(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* params, int max_len);

  // Runs `token` at the next position and appends its K and V to the cache; returns the logits
  // of the token that follows (cfg.vocab values, the padded rows excluded).
  const std::vector<float>& step(int token);
  int position() const { return pos_; }
  void reset() { pos_ = 0; }

 private:
  const float* param(const std::string& name, int layer = -1) const;
  void norm(float* y, const float* x, const char* w, const char* b, int layer);
  void attend(float* out, const float* q, int layer);  // one query per head over positions [0, pos_]
                                                       // (with a window W: (pos_ - W, pos_])

  ModelConfig cfg_;
  std::vector<ParamSpec> specs_;
  const float* params_;
  int max_len_, pos_ = 0;
  int slots_;  // positions the cache holds: max_len, or with a window W in every layer min(W, max_len), as a ring
  std::vector<float> kcache_, vcache_;  // (L, slots, KV, D) each
  std::vector<float> x_, h_, qkv_, att_, proj_, fc_, act_, scores_, stat_, logits_;
};

struct SampleSettings {
  int tokens = 0;            // how many to generate
  float temperature = 1.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 1337;
};

// The next token from `logits`: argmax when temperature is 0 or top_k is 1 (ties: lowest id);
// else a draw from softmax(logits / temperature) restricted to the top_k highest.
int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng);

// Feeds the prompt, then samples s.tokens tokens; returns only the new ones. Throws when the
// prompt is empty, holds an id outside the vocabulary, or prompt + tokens exceeds the cache.
std::vector<int> generate(KvDecoder& dec, const std::vector<int>& prompt, const SampleSettings& s);

}  // namespace ul
