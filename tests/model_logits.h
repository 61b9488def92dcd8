// A small model with random weights and the full forward's logits: what the KV-cache decoder
// (engine/sample.h) is checked against, in tests/cpu/test_sample.cpp and test_length_probe.cpp.
#pragma once
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/device.h"
#include "data/packing.h"
#include "engine/rng.h"
#include "layers/linear.h"
#include "layers/transformer.h"

namespace ul_test {

// gpt2, or llama with GQA (2 kv heads for 4): 2 layers, dim 32, vocab 50.
inline ul::ModelConfig small(const std::string& arch) {
  ul::ModelConfig c;
  c.arch = arch, c.layers = 2, c.dim = 32, c.heads = 4, c.kv_heads = arch == "llama" ? 2 : 4;
  c.vocab = 50, c.padded_vocab = 128, c.max_seq = 24, c.ffn = arch == "llama" ? 48 : 0;
  return c;
}

// Random weights large enough that the attention is far from uniform and the logits spread out.
inline std::vector<float> host_params(ul::Transformer& m, uint64_t seed) {
  m.init_weights(seed);
  std::vector<float> h = m.params.to_host();
  ul::Rng rng(seed + 1);
  for (const ul::ParamSpec& s : m.params.specs())
    if (s.name != "wte" && s.name != "lm_head")  // norms and biases off their defaults too
      for (size_t i = s.offset; i < s.offset + size_t(s.shape.numel()); i++) h[i] += float(0.1 * rng.normal());
  m.params.load_host(h.data());
  return h;
}

// The full forward's logits (T, V) of one sequence: the model's final hidden state times the head.
// eot >= 0: packed documents, each opened by that token, as --doc-mask trains them.
inline std::vector<float> full_logits(ul::Transformer& m, const std::vector<int32_t>& idx, int32_t eot = -1) {
  using namespace ul;
  Context& c = ctx();
  Recording off(false);
  const int T = int(idx.size());
  std::vector<int32_t> pos(idx.size()), doc(idx.size()), tgt(idx.size(), 0);
  document_layout(idx.data(), T, eot, doc.data(), pos.data());
  auto ints = [&](const std::vector<int32_t>& v) {
    Tensor t = c.empty({1, T}, DType::i32);
    copy_from_host(t, v.data());
    return t;
  };
  m.forward({ints(idx), ints(tgt), ints(pos), ints(pos), eot >= 0 ? ints(doc) : Tensor{}}, 0.0f, nullptr);
  const int C = m.cfg.dim, V = m.cfg.vocab;
  std::vector<float> logits(size_t(T) * V);
  const float* head = m.params.get(m.cfg.head_name()).f32();
  cpu::linear_forward(logits.data(), m.last_hidden.f32(), head, static_cast<const float*>(nullptr), T, C, V);
  return logits;
}

}  // namespace ul_test
