#include "engine/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "engine/planner.h"
#include "layers/embedding.h"
#include "layers/flash_tile.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/linear.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"

namespace ul {

namespace {

// y (n, OC) = x (n, C) w^T (+ b), as cpu::linear_forward, but for the few rows of a decoding step
// threaded over blocks of output rows: Eigen runs a product with one row of x as a matrix-vector
// product on one thread, and decoding reads every weight once per token, so it is bound by how
// fast the cores together stream the weights. Chunks of many rows go to the GEMM.
void linear(float* y, const float* x, const float* w, const float* b, int n, int C, int OC) {
  if (n > 4) return cpu::linear_forward(y, x, w, b, n, C, OC);
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMat> X(x, n, C), W(w, OC, C);
  Eigen::Map<RowMat> Y(y, n, OC);
  constexpr int kBlock = 64;  // output rows per task: the order of every sum is fixed, whatever the threads
  const bool team = int64_t(OC) * C >= (int64_t(1) << 16);
#pragma omp parallel for schedule(static) if (team)
  for (int o0 = 0; o0 < OC; o0 += kBlock) {
    const int m = std::min(kBlock, OC - o0);
    for (int r = 0; r < n; r++) {
      Y.row(r).segment(o0, m).noalias() = X.row(r) * W.middleRows(o0, m).transpose();
      if (b) Y.row(r).segment(o0, m) += Eigen::Map<const Eigen::RowVectorXf>(b + o0, m);
    }
  }
}

// Positions the cache holds. With a window in every layer only the W newest positions before a row
// are ever read: a ring of W + chunk - 1 slots holds those of a chunk's first row and the whole
// chunk. Else every position, in its own slot.
int cache_slots(const ModelConfig& cfg, int max_len, int chunk) {
  if (cfg.sliding_window <= 0 || cfg.full_every) return max_len;
  return int(std::min<int64_t>(max_len, int64_t(cfg.sliding_window) + std::min(chunk, max_len) - 1));
}

}  // namespace

KvDecoder::KvDecoder(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* params, int max_len,
                     int chunk)
    : cfg_(cfg), specs_(specs), params_(params), max_len_(max_len), chunk_(chunk) {
  cfg_.validate();
  if (max_len < 1) throw std::runtime_error("sample: the KV cache needs room for at least one position");
  if (chunk < 1) throw std::runtime_error("sample: the prefill chunk must hold at least one token");
  if (!cfg_.is_llama() && max_len > cfg_.max_seq)
    throw std::runtime_error("sample: " + std::to_string(max_len) + " positions exceed the model's max sequence " +
                             std::to_string(cfg_.max_seq) + " (gpt2 has learned positions)");
  slots_ = cache_slots(cfg_, max_len, chunk);
  chunk_ = std::min(chunk, max_len);
  const size_t C = size_t(cfg_.dim), D = size_t(cfg_.head_dim()), F = size_t(cfg_.ffn_dim()), n = size_t(chunk_);
  const size_t cache = size_t(cfg_.layers) * size_t(slots_) * size_t(cfg_.kv_heads) * D;
  kcache_.assign(cache, 0.0f);
  vcache_.assign(cache, 0.0f);
  tok_.resize(n), pos_rows_.resize(n), doc_rows_.resize(n);
  x_.resize(n * C), h_.resize(n * C), att_.resize(n * C), proj_.resize(n * C), stat_.resize(2 * n);
  qkv_.resize(n * size_t(cfg_.heads + 2 * cfg_.kv_heads) * D);
  fc_.resize(n * (cfg_.is_llama() ? 2 * F : F)), act_.resize(n * F);
  logits_.resize(size_t(cfg_.vocab));
}

size_t KvDecoder::host_bytes(const ModelConfig& cfg, int max_len, bool scoring, int chunk, bool weights_copy) {
  const size_t C = size_t(cfg.dim), D = size_t(cfg.head_dim()), F = size_t(cfg.ffn_dim()), V = size_t(cfg.vocab);
  const size_t n = size_t(std::max(1, std::min(chunk, max_len)));
  const size_t cache = 2 * size_t(cfg.layers) * size_t(cache_slots(cfg, std::max(1, max_len), chunk)) * size_t(cfg.kv_heads) * D;
  const size_t rows = n * (4 * C + size_t(cfg.heads + 2 * cfg.kv_heads) * D + (cfg.is_llama() ? 3 : 2) * F + 2);
  return (cache + rows + V + (scoring ? n * V : 0) + (weights_copy ? param_count(cfg) : 0)) * sizeof(float);
}

const float* KvDecoder::param(const std::string& name, int layer) const {
  for (const ParamSpec& s : specs_) {
    if (s.name != name) continue;
    if (!s.stacked) return params_ + s.offset;
    return params_ + s.offset + size_t(layer) * size_t(s.shape.numel() / s.shape[0]);
  }
  throw std::runtime_error("sample: the model has no parameter '" + name + "'");
}

void KvDecoder::norm(float* y, const float* x, const char* w, const char* b, int layer, int n) {
  if (cfg_.is_llama()) cpu::rmsnorm_forward(y, stat_.data(), x, param(w, layer), n, cfg_.dim, cfg_.norm_eps);
  else cpu::layernorm_forward(y, stat_.data(), stat_.data() + n, x, param(w, layer), param(b, layer), n, cfg_.dim);
}

// For row i (position p) and query head h (kv head g = h / (Hq / Hkv)):
//   s_t = q . k_t / sqrt(D) for t = t0..p,  out = sum_t softmax(s)_t v_t
// over the cache — causal, since a row reads no position after its own. t0 is the start of the
// row's document (0 without packed documents), or with a sliding window W, p - W + 1 when that is
// later: the W newest positions, this one included. Position t lives in slot
// t % slots_ (a ring when every layer has a window; else slot t). Flash style, as the training
// op (layers/attention.cpp): blocks of kRows rows of one head against tiles of up to kKeys cached
// keys, scores by GEMM, an online softmax; a tile ends where the ring wraps, so that its keys are
// rows a fixed stride apart, read in place.
void KvDecoder::attend(float* out, const float* qkv, int layer, int n) {
  constexpr int kRows = 64, kKeys = 64;
  using cpu::Tile;
  const int D = cfg_.head_dim(), Hq = cfg_.heads, Hkv = cfg_.kv_heads, W = cfg_.window_of(layer);
  const float scale = 1.0f / std::sqrt(float(D)), ninf = -std::numeric_limits<float>::infinity();
  const int64_t row = int64_t(Hkv) * D, qkv_row = int64_t(Hq + 2 * Hkv) * D;
  const float* K = kcache_.data() + size_t(layer) * slots_ * row;
  const float* V = vcache_.data() + size_t(layer) * slots_ * row;
  const int blocks = (n + kRows - 1) / kRows;
  const int longest = W > 0 ? std::min(W, pos_ + n) : pos_ + n;  // keys of the last row
  // One decoded token over a short cache is microseconds of work: a thread team would cost more.
  const bool team = int64_t(n) * Hq * longest * D >= (int64_t(1) << 16);
#pragma omp parallel if (team)
  {
    cpu::Scratch<float> s_buf(size_t(kRows) * kKeys), acc_buf(size_t(kRows) * D);
    std::vector<float> m(kRows), l(kRows);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int rb = 0; rb < blocks; rb++)
      for (int h = 0; h < Hq; h++) {
        const int r0 = rb * kRows, nr = std::min(kRows, n - r0), g = h / (Hq / Hkv);
        const int p0 = pos_ + r0, p1 = p0 + nr - 1;  // the block's first and last rows' positions
        const int32_t* doc = doc_rows_.data() + r0;   // each row's document start (non-decreasing)
        // Row i sees keys [first(i), p0 + i]: after its document's start and within the window.
        auto first = [&](int i) { return std::max(doc[i], W > 0 ? p0 + i - W + 1 : 0); };
        const auto Q = cpu::rows(qkv, r0 * qkv_row + int64_t(h) * D, nr, D, qkv_row);
        Tile<float> acc(acc_buf.data, nr, D);  // (nr, D) unnormalised output
        acc.setZero();
        std::fill(m.begin(), m.end(), ninf);
        std::fill(l.begin(), l.end(), 0.0f);
        for (int k0 = first(0); k0 <= p1;) {
          const int slot = k0 % slots_, nk = std::min({kKeys, p1 - k0 + 1, slots_ - slot});
          const auto Kt = cpu::rows(K, slot * row + int64_t(g) * D, nk, D, row);
          const auto Vt = cpu::rows(V, slot * row + int64_t(g) * D, nk, D, row);
          Tile<float> S(s_buf.data, nr, nk);  // (nr, nk) scores, then probabilities
          S.noalias() = Q * Kt.transpose();
          S *= scale;
          // Some row misses some key: one after the first row, or one before the last row's first.
          const bool partial = k0 + nk - 1 > p0 || k0 < first(nr - 1);
          auto mask = [&](float value) {
            for (int i = 0; i < nr; i++) {
              const int lo = first(i), hi = p0 + i;
              for (int j = 0; j < nk; j++)
                if (k0 + j > hi || k0 + j < lo) S(i, j) = value;
            }
          };
          if (partial) mask(ninf);
          cpu::online_softmax_tile(S, m.data(), l.data(), acc);
          if (partial) mask(0.0f);
          acc.noalias() += S * Vt;
          k0 += nk;
        }
        auto O = cpu::rows(out, r0 * int64_t(Hq) * D + int64_t(h) * D, nr, D, int64_t(Hq) * D);
        for (int i = 0; i < nr; i++) O.row(i) = acc.row(i) / l[size_t(i)];  // every row sees itself: l > 0
      }
  }
}

void KvDecoder::forward(const int* tokens, int n) {
  const int C = cfg_.dim, D = cfg_.head_dim(), Hq = cfg_.heads, Hkv = cfg_.kv_heads, F = cfg_.ffn_dim();
  const int QKV = (Hq + 2 * Hkv) * D;
  const bool llama = cfg_.is_llama();
  for (int i = 0; i < n; i++) {
    const int p = pos_ + i;
    if (eot_ >= 0 && tokens[i] == eot_ && p > 0) doc_start_ = p;  // the EOT opens its document
    tok_[size_t(i)] = tokens[i], pos_rows_[size_t(i)] = p - doc_start_, doc_rows_[size_t(i)] = doc_start_;
  }
  float *x = x_.data(), *h = h_.data(), *qkv = qkv_.data(), *att = att_.data(), *proj = proj_.data();
  auto add = [&](float* y, const float* a) {  // the residual stream: y += a over (n, C)
    for (size_t k = 0; k < size_t(n) * C; k++) y[k] += a[k];
  };
  cpu::embedding_forward(x, tok_.data(), pos_rows_.data(), param("wte"), llama ? nullptr : param("wpe"), n, C);
  for (int l = 0; l < cfg_.layers; l++) {
    norm(h, x, "ln1w", "ln1b", l, n);
    linear(qkv, h, param("qkvw", l), cfg_.has_qkv_bias() ? param("qkvb", l) : nullptr, n, C, QKV);
    if (llama) cpu::rope_forward(qkv, qkv, pos_rows_.data(), n, Hq, Hkv, D, cfg_.rope());
    const size_t row = size_t(Hkv) * D;
    for (int i = 0; i < n; i++) {  // the chunk's keys and values join the cache before its rows attend
      const size_t at = (size_t(l) * slots_ + size_t((pos_ + i) % slots_)) * row;
      const float* r = qkv + size_t(i) * QKV;
      std::copy_n(r + size_t(Hq) * D, row, kcache_.data() + at);
      std::copy_n(r + size_t(Hq + Hkv) * D, row, vcache_.data() + at);
    }
    attend(att, qkv, l, n);
    linear(proj, att, param("attprojw", l), llama ? nullptr : param("attprojb", l), n, C, C);
    add(x, proj);
    norm(h, x, "ln2w", "ln2b", l, n);
    if (llama) {
      linear(fc_.data(), h, param("fcw", l), nullptr, n, C, 2 * F);
      cpu::swiglu_forward(act_.data(), fc_.data(), n, F);
    } else {
      linear(fc_.data(), h, param("fcw", l), param("fcb", l), n, C, F);
      cpu::gelu_forward(act_.data(), fc_.data(), int64_t(n) * F);
    }
    linear(proj, act_.data(), param("fcprojw", l), llama ? nullptr : param("fcprojb", l), n, F, C);
    add(x, proj);
  }
  pos_ += n;
}

void KvDecoder::check_tokens(const int* tokens, int n) const {
  if (n < 1) throw std::runtime_error("sample: nothing to run (no tokens)");
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
      throw std::runtime_error("sample: token " + std::to_string(tokens[i]) + " is outside the vocab of " +
                               std::to_string(cfg_.vocab));
  if (int64_t(pos_) + n > max_len_)
    throw std::runtime_error("sample: the KV cache is full (" + std::to_string(max_len_) + " positions; " +
                             std::to_string(pos_) + " used, " + std::to_string(n) + " more asked for)");
}

void KvDecoder::score(const int* tokens, const int32_t* targets, int n, float* nll,
                      const std::function<void(int)>& progress) {
  check_tokens(tokens, n);
  const int C = cfg_.dim, V = cfg_.vocab;
  for (int i = 0; i < n; i++)
    if (targets[i] >= V)
      throw std::runtime_error("sample: target " + std::to_string(targets[i]) + " is outside the vocab of " +
                               std::to_string(V));
  row_logits_.resize(size_t(chunk_) * V);
  const float* head = param(cfg_.head_name());
  for (int done = 0; done < n;) {
    const int rows = std::min(chunk_, n - done);
    forward(tokens + done, rows);
    norm(h_.data(), x_.data(), "lnfw", "lnfb", -1, rows);
    cpu::linear_forward(row_logits_.data(), h_.data(), head, static_cast<const float*>(nullptr), rows, C, V);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) {
      const int32_t t = targets[done + i];
      if (t < 0) {
        nll[done + i] = 0.0f;
        continue;
      }
      nll[done + i] = float(token_nll(row_logits_.data() + size_t(i) * V, V, t));
    }
    done += rows;
    if (progress) progress(done);
  }
}

double token_nll(const float* z, int V, int target) {
  const float mx = *std::max_element(z, z + V);
  double sum = 0;
  for (int v = 0; v < V; v++) sum += std::exp(double(z[v] - mx));
  return std::log(sum) + mx - z[target];
}

const std::vector<float>& KvDecoder::prefill(const int* tokens, int n, const std::function<void(int)>& progress) {
  check_tokens(tokens, n);
  for (int done = 0; done < n;) {
    const int rows = std::min(chunk_, n - done);
    forward(tokens + done, rows);
    done += rows;
    if (progress) progress(done);
  }
  // Only the last row's logits are wanted: its final norm, then the head's first V rows (the real
  // vocabulary; the padded rows are never scored).
  const int last = (n - 1) % chunk_;  // its row in the last chunk
  norm(h_.data(), x_.data() + size_t(last) * cfg_.dim, "lnfw", "lnfb", -1, 1);
  linear(logits_.data(), h_.data(), param(cfg_.head_name()), nullptr, 1, cfg_.dim,
                      cfg_.vocab);
  return logits_;
}

int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng, float top_p) {
  const int V = int(logits.size());
  if (V == 0) throw std::runtime_error("sample: empty logits");
  // A diverged model's NaN would defeat every comparison below (and the nucleus would keep nothing).
  for (int v = 0; v < V; v++)
    if (!std::isfinite(logits[size_t(v)]))
      throw std::runtime_error("sample: the model's logit for token " + std::to_string(v) + " is " +
                               std::to_string(logits[size_t(v)]) + ": its weights have diverged");
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
  int keep = k;  // the nucleus: the most likely first, until their share reaches top_p
  if (top_p < 1.0f) {
    double mass = 0;
    for (keep = 0; keep < k && mass < double(top_p) * sum;) mass += p[size_t(keep++)];
    sum = mass;
  }
  double u = rng.uniform() * sum;
  for (int i = 0; i < keep; i++) {
    if (u < p[size_t(i)]) return ids[size_t(i)];
    u -= p[size_t(i)];
  }
  return ids[size_t(keep - 1)];  // rounding left u at the very top
}

std::vector<int> generate(KvDecoder& dec, const std::vector<int>& prompt, const SampleSettings& s,
                          const std::function<void(int)>& progress) {
  if (prompt.empty()) throw std::runtime_error("sample: the prompt is empty (give --prompt)");
  if (s.tokens < 0 || !(s.temperature >= 0) || s.top_k < 0 || !(s.top_p > 0 && s.top_p <= 1))
    throw std::runtime_error("sample: needs tokens >= 0, temperature >= 0, top-k >= 0 and top-p in (0, 1]");
  Rng rng(s.seed);
  dec.reset();
  const std::vector<float>* logits = &dec.prefill(prompt.data(), int(prompt.size()), progress);
  std::vector<int> out;
  std::vector<float> known;  // the logits of the ids below s.vocab
  for (int i = 0; i < s.tokens; i++) {
    if (s.vocab > 0 && size_t(s.vocab) < logits->size()) {
      known.assign(logits->begin(), logits->begin() + s.vocab);
      logits = &known;
    }
    out.push_back(sample_token(*logits, s.temperature, s.top_k, rng, s.top_p));
    if (i + 1 == s.tokens) break;  // the last token needs no forward
    logits = &dec.step(out.back());
    if (progress) progress(int(prompt.size()) + i + 1);
  }
  return out;
}

}  // namespace ul
