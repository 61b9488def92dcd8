#include "engine/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"

namespace ul {

KvDecoder::KvDecoder(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* params, int max_len)
    : cfg_(cfg), specs_(specs), params_(params), max_len_(max_len) {
  cfg_.validate();
  // With a window in every layer only the W newest positions are ever read: a ring of W slots holds them.
  slots_ = cfg_.sliding_window > 0 && !cfg_.full_every ? std::min(max_len, cfg_.sliding_window) : max_len;
  if (max_len < 1) throw std::runtime_error("sample: the KV cache needs room for at least one position");
  if (!cfg_.is_llama() && max_len > cfg_.max_seq)
    throw std::runtime_error("sample: " + std::to_string(max_len) + " positions exceed the model's max sequence " +
                             std::to_string(cfg_.max_seq) + " (gpt2 has learned positions)");
  const size_t C = size_t(cfg_.dim), D = size_t(cfg_.head_dim()), F = size_t(cfg_.ffn_dim());
  const size_t cache = size_t(cfg_.layers) * size_t(slots_) * size_t(cfg_.kv_heads) * D;
  kcache_.assign(cache, 0.0f);
  vcache_.assign(cache, 0.0f);
  x_.resize(C), h_.resize(C), att_.resize(C), proj_.resize(C), stat_.resize(2);
  qkv_.resize(size_t(cfg_.heads + 2 * cfg_.kv_heads) * D);
  fc_.resize(cfg_.is_llama() ? 2 * F : F), act_.resize(F);
  scores_.resize(size_t(slots_));
  logits_.resize(size_t(cfg_.vocab));
}

const float* KvDecoder::param(const std::string& name, int layer) const {
  for (const ParamSpec& s : specs_) {
    if (s.name != name) continue;
    if (!s.stacked) return params_ + s.offset;
    return params_ + s.offset + size_t(layer) * size_t(s.shape.numel() / s.shape[0]);
  }
  throw std::runtime_error("sample: the model has no parameter '" + name + "'");
}

void KvDecoder::norm(float* y, const float* x, const char* w, const char* b, int layer) {
  if (cfg_.is_llama()) cpu::rmsnorm_forward(y, stat_.data(), x, param(w, layer), 1, cfg_.dim, cfg_.norm_eps);
  else cpu::layernorm_forward(y, stat_.data(), stat_.data() + 1, x, param(w, layer), param(b, layer), 1, cfg_.dim);
}

// The attention of the newest token: for each query head h (kv head g = h / (Hq / Hkv)),
//   s_t = q . k_t / sqrt(D) for t = t0..pos,  out = sum_t softmax(s)_t v_t
// over the cache — causal by construction, since only positions up to this one are in it. t0 is 0,
// or with a sliding window W, pos - W + 1: the W newest positions, this one included. Position t
// lives in slot t % slots_ (a ring when there is a window; else slot t).
void KvDecoder::attend(float* out, const float* q, int layer) {
  const int D = cfg_.head_dim(), Hq = cfg_.heads, Hkv = cfg_.kv_heads, W = cfg_.window_of(layer);
  const int t0 = W > 0 ? std::max(0, pos_ - W + 1) : 0, n = pos_ + 1;
  const float scale = 1.0f / std::sqrt(float(D));
  const size_t row = size_t(Hkv) * D;
  const float* K = kcache_.data() + size_t(layer) * slots_ * row;
  const float* V = vcache_.data() + size_t(layer) * slots_ * row;
  for (int h = 0; h < Hq; h++) {
    const int g = h / (Hq / Hkv);
    const float* qh = q + size_t(h) * D;
    float m = -INFINITY;
    for (int t = t0; t < n; t++) {  // scores_[i]: position t0 + i
      const float* k = K + size_t(t % slots_) * row + size_t(g) * D;
      float s = 0;
      for (int d = 0; d < D; d++) s += qh[d] * k[d];
      scores_[size_t(t - t0)] = s * scale;
      m = std::max(m, scores_[size_t(t - t0)]);
    }
    float sum = 0;
    for (int i = 0; i < n - t0; i++) sum += (scores_[size_t(i)] = std::exp(scores_[size_t(i)] - m));
    float* o = out + size_t(h) * D;
    std::fill(o, o + D, 0.0f);
    for (int t = t0; t < n; t++) {
      const float p = scores_[size_t(t - t0)] / sum;
      const float* v = V + size_t(t % slots_) * row + size_t(g) * D;
      for (int d = 0; d < D; d++) o[d] += p * v[d];
    }
  }
}

const std::vector<float>& KvDecoder::step(int token) {
  if (token < 0 || token >= cfg_.vocab)
    throw std::runtime_error("sample: token " + std::to_string(token) + " is outside the vocab of " + std::to_string(cfg_.vocab));
  if (pos_ >= max_len_) throw std::runtime_error("sample: the KV cache is full (" + std::to_string(max_len_) + " positions)");
  const int C = cfg_.dim, D = cfg_.head_dim(), Hq = cfg_.heads, Hkv = cfg_.kv_heads, F = cfg_.ffn_dim();
  const int QKV = (Hq + 2 * Hkv) * D;
  const bool llama = cfg_.is_llama();
  const int32_t tok = token, pos = pos_;
  cpu::embedding_forward(x_.data(), &tok, &pos, param("wte"), llama ? nullptr : param("wpe"), 1, C);
  for (int l = 0; l < cfg_.layers; l++) {
    norm(h_.data(), x_.data(), "ln1w", "ln1b", l);
    cpu::linear_forward(qkv_.data(), h_.data(), param("qkvw", l), cfg_.has_qkv_bias() ? param("qkvb", l) : nullptr, 1, C,
                        QKV);
    if (llama) cpu::rope_forward(qkv_.data(), qkv_.data(), &pos, 1, Hq, Hkv, D, cfg_.rope());
    const size_t row = size_t(Hkv) * D, at = (size_t(l) * slots_ + size_t(pos % slots_)) * row;
    std::copy_n(qkv_.data() + size_t(Hq) * D, row, kcache_.data() + at);
    std::copy_n(qkv_.data() + size_t(Hq + Hkv) * D, row, vcache_.data() + at);
    attend(att_.data(), qkv_.data(), l);
    cpu::linear_forward(proj_.data(), att_.data(), param("attprojw", l), llama ? nullptr : param("attprojb", l), 1, C, C);
    for (int c = 0; c < C; c++) x_[size_t(c)] += proj_[size_t(c)];
    norm(h_.data(), x_.data(), "ln2w", "ln2b", l);
    if (llama) {
      cpu::linear_forward(fc_.data(), h_.data(), param("fcw", l), static_cast<const float*>(nullptr), 1, C, 2 * F);
      cpu::swiglu_forward(act_.data(), fc_.data(), 1, F);
    } else {
      cpu::linear_forward(fc_.data(), h_.data(), param("fcw", l), param("fcb", l), 1, C, F);
      cpu::gelu_forward(act_.data(), fc_.data(), int64_t(F));
    }
    cpu::linear_forward(proj_.data(), act_.data(), param("fcprojw", l), llama ? nullptr : param("fcprojb", l), 1, F, C);
    for (int c = 0; c < C; c++) x_[size_t(c)] += proj_[size_t(c)];
  }
  norm(h_.data(), x_.data(), "lnfw", "lnfb", -1);
  // The head's first V rows are the real vocabulary; the padded rows are never scored.
  const float* head = param(cfg_.head_name());
  cpu::linear_forward(logits_.data(), h_.data(), head, static_cast<const float*>(nullptr), 1, C, cfg_.vocab);
  pos_++;
  return logits_;
}

int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng) {
  const int V = int(logits.size());
  if (V == 0) throw std::runtime_error("sample: empty logits");
  // Highest logit first; equal logits by lower id, so top-k 1 and greedy agree on ties.
  auto before = [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  if (temperature == 0.0f || top_k == 1) {
    int best = 0;
    for (int v = 1; v < V; v++)
      if (before(v, best)) best = v;
    return best;
  }
  const int k = top_k > 0 && top_k < V ? top_k : V;
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[size_t(i)] = std::exp((double(logits[size_t(ids[size_t(i)])]) - logits[size_t(ids[0])]) / temperature);
  double u = rng.uniform() * sum;
  for (int i = 0; i < k; i++) {
    if (u < p[size_t(i)]) return ids[size_t(i)];
    u -= p[size_t(i)];
  }
  return ids[size_t(k - 1)];  // rounding left u at the very top
}

std::vector<int> generate(KvDecoder& dec, const std::vector<int>& prompt, const SampleSettings& s) {
  if (prompt.empty()) throw std::runtime_error("sample: the prompt is empty (give --prompt)");
  if (s.tokens < 0 || !(s.temperature >= 0) || s.top_k < 0)
    throw std::runtime_error("sample: needs tokens >= 0, temperature >= 0 and top-k >= 0");
  Rng rng(s.seed);
  dec.reset();
  const std::vector<float>* logits = nullptr;
  for (int t : prompt) logits = &dec.step(t);
  std::vector<int> out;
  for (int i = 0; i < s.tokens; i++) {
    out.push_back(sample_token(*logits, s.temperature, s.top_k, rng));
    if (i + 1 < s.tokens) logits = &dec.step(out.back());  // the last token needs no forward
  }
  return out;
}

}  // namespace ul
