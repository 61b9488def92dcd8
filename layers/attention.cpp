#include "layers/attention.h"

#include <Eigen/Dense>
#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/flash_tile.h"
#include "layers/op_util.h"

namespace ul {
namespace cpu {
namespace {

constexpr int kTile = 64;  // query and key tile size (rows); the same for both keeps causal tile skipping simple

// Index arithmetic for the packed layouts.
struct Layout {
  int B, Tn, Hq, Hkv, D, group;
  int64_t qkv_row() const { return int64_t(Hq + 2 * Hkv) * D; }  // stride between tokens in qkv
  int64_t out_row() const { return int64_t(Hq) * D; }             // stride between tokens in out
  // offset of token t, packed head `head` (q: h, k: Hq + g, v: Hq + Hkv + g) in qkv
  int64_t qkv(int b, int t, int head) const { return (int64_t(b) * Tn + t) * qkv_row() + int64_t(head) * D; }
  int64_t out(int b, int t, int h) const { return (int64_t(b) * Tn + t) * out_row() + int64_t(h) * D; }
  int64_t lse(int b, int h, int t) const { return (int64_t(b) * Hq + h) * Tn + t; }
  int ntiles() const { return (Tn + kTile - 1) / kTile; }
  int tile_len(int i) const { return std::min(kTile, Tn - i * kTile); }
};

enum class Mask { none, partial, all };

// Query q sees key k: causal, in the same document (doc: ids or nullptr) and, with a window W > 0,
// one of the W latest keys (q - W < k, itself included: Mistral's rule, as transformers applies it).
inline bool visible(int q, int k, const int32_t* doc, int window) {
  return k <= q && (!doc || doc[k] == doc[q]) && (!window || q - k < window);
}

// How the (query tile qt, key tile kt) block of S is masked. doc: this sequence's ids or nullptr.
// Disjoint id ranges mean no query-key pair shares a document, so the block is skipped entirely;
// so is a block whose keys are all older than the window (0: none) for its first query.
Mask tile_mask(int qt, int kt, const Layout& L, const int32_t* doc, int window) {
  if (kt > qt) return Mask::all;
  bool partial = kt == qt;
  if (window) {
    const int q0 = qt * kTile, k0 = kt * kTile;
    if (q0 - (k0 + L.tile_len(kt) - 1) >= window) return Mask::all;
    if (q0 + L.tile_len(qt) - 1 - k0 >= window) partial = true;  // the last query's window ends inside
  }
  if (doc) {
    const int q0 = qt * kTile, k0 = kt * kTile;
    auto qr = std::minmax_element(doc + q0, doc + q0 + L.tile_len(qt));
    auto kr = std::minmax_element(doc + k0, doc + k0 + L.tile_len(kt));
    if (*qr.second < *kr.first || *kr.second < *qr.first) return Mask::all;
    if (!(*qr.first == *qr.second && *kr.first == *kr.second)) partial = true;
  }
  return partial ? Mask::partial : Mask::none;
}

// Writes `value` into the masked entries of a partial S block (nq x nk) at tiles (qt, kt).
template <class T>
void apply_mask(Tile<T>& S, int qt, int kt, const int32_t* doc, int window, T value) {
  const int q0 = qt * kTile, k0 = kt * kTile;
  for (int i = 0; i < S.rows(); i++)
    for (int j = 0; j < S.cols(); j++)
      if (!visible(q0 + i, k0 + j, doc, window)) S(i, j) = value;
}

// One sequence's document ids: where they rise along it (each document one run of positions, as
// packing makes them), the tiles outside a query's document are found by bisection, not visited:
// with 2K-token documents at T = 256K, testing every earlier tile pair cost more than the work.
struct Docs {
  const int32_t* ids;  // (T) or nullptr: no document mask
  bool rising;         // ids never fall along the sequence
  Docs(const int32_t* doc, int b, int Tn) : ids(doc ? doc + int64_t(b) * Tn : nullptr), rising(false) {
    if (ids) rising = std::is_sorted(ids, ids + Tn);
  }
};

std::vector<Docs> sequence_docs(const int32_t* doc, int B, int Tn) {
  std::vector<Docs> docs;
  for (int b = 0; b < B; b++) docs.emplace_back(doc, b, Tn);
  return docs;
}

// The key tiles query tile qt can see: [first, qt]. A window skips the tiles wholly before the
// first query's window without visiting them (at T = 1M and W = 4K, most of them); rising
// documents skip those before the tile's first row's document began.
int first_key_tile(int qt, int window, const Docs& d) {
  int first = window ? std::max(0, qt * kTile - window + 1) / kTile : 0;
  if (d.rising) {
    const int q0 = qt * kTile;
    first = std::max(first, int(std::lower_bound(d.ids, d.ids + q0, d.ids[q0]) - d.ids) / kTile);
  }
  return first;
}
// The query tiles key tile kt is seen by: [kt, last]; rising documents end it at the tile where
// its last key's document ends.
int last_query_tile(int kt, const Layout& L, int window, const Docs& d) {
  int last = L.ntiles() - 1;
  if (window) last = std::min(last, int((int64_t(kt) * kTile + L.tile_len(kt) - 1 + window - 1) / kTile));
  if (d.rising) {
    const int k_end = kt * kTile + L.tile_len(kt) - 1;
    last = std::min(last, int(std::upper_bound(d.ids + k_end, d.ids + L.Tn, d.ids[k_end]) - d.ids - 1) / kTile);
  }
  return last;
}

}  // namespace

// The kernels' own check (the op refuses these first, with its flags' names): for a fork calling
// them directly, a negative window masked every key into NaN rows, and Hq % Hkv != 0 read past
// the kv heads.
static void check_kernel_args(int B, int Tn, int Hq, int Hkv, int D, int window) {
  if (B < 0 || Tn < 0 || D <= 0 || Hq <= 0 || Hkv <= 0)
    throw std::invalid_argument("attention (CPU): bad shape B=" + std::to_string(B) + " T=" + std::to_string(Tn) +
                                " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D));
  if (Hq % Hkv != 0)
    throw std::invalid_argument("attention (CPU): Hq (" + std::to_string(Hq) + ") must be a multiple of Hkv (" +
                                std::to_string(Hkv) + ")");
  if (window < 0)
    throw std::invalid_argument("attention (CPU): the sliding window must be >= 0, got " + std::to_string(window));
}

template <class T>
void attention_forward(T* out, T* lse, const T* qkv, const int32_t* doc, int window, int B, int Tn, int Hq, int Hkv,
                       int D) {
  check_kernel_args(B, Tn, Hq, Hkv, D, window);
  const Layout L{B, Tn, Hq, Hkv, D, Hq / Hkv};
  const T scale = T(1) / std::sqrt(T(D)), ninf = -std::numeric_limits<T>::infinity();
  const int nt = L.ntiles();
  const std::vector<Docs> docs = sequence_docs(doc, B, Tn);
#pragma omp parallel
  {
    Scratch<T> s_buf(kTile * kTile), acc_buf(size_t(kTile) * D);
    std::vector<T> m(kTile), l(kTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < int64_t(B) * Hq * nt; task++) {
      // Within each (b, h), later query tiles (more key tiles to walk) are handed out first.
      const int qt = nt - 1 - int(task % nt), h = int(task / nt % Hq), b = int(task / nt / Hq);
      const int g = h / L.group, q0 = qt * kTile, nq = L.tile_len(qt);
      const int32_t* docb = docs[b].ids;
      auto Q = rows(qkv, L.qkv(b, q0, h), nq, D, L.qkv_row());
      Tile<T> acc(acc_buf.data, nq, D);  // (nq, D) unnormalised output
      acc.setZero();
      std::fill(m.begin(), m.end(), ninf);  // running row max of S
      std::fill(l.begin(), l.end(), T(0));  // running row sum of exp(S - m)
      for (int kt = first_key_tile(qt, window, docs[b]); kt <= qt; kt++) {
        const Mask mk = tile_mask(qt, kt, L, docb, window);
        if (mk == Mask::all) continue;
        const int k0 = kt * kTile, nk = L.tile_len(kt);
        auto K = rows(qkv, L.qkv(b, k0, Hq + g), nk, D, L.qkv_row());
        auto V = rows(qkv, L.qkv(b, k0, Hq + Hkv + g), nk, D, L.qkv_row());
        Tile<T> S(s_buf.data, nq, nk);  // (nq, nk) scores, then probabilities
        S.noalias() = Q * K.transpose();
        S *= scale;
        if (mk == Mask::partial) apply_mask(S, qt, kt, docb, window, ninf);
        online_softmax_tile(S, m.data(), l.data(), acc);
        if (mk == Mask::partial) apply_mask(S, qt, kt, docb, window, T(0));  // exp(-inf) is not exactly 0 in Eigen
        acc.noalias() += S * V;
      }
      // Every query sees at least itself, so l > 0.
      auto O = rows(out, L.out(b, q0, h), nq, D, L.out_row());
      for (int i = 0; i < nq; i++) {
        O.row(i) = acc.row(i) / l[i];
        lse[L.lse(b, h, q0 + i)] = m[i] + std::log(l[i]);
      }
    }
  }
}

namespace {
std::atomic<int> g_backward_passes{0};  // set_attention_backward_passes

// For query tile qt of head h against key tile kt of kv head g: recompute P = exp(S - lse) into S,
// and dS = P * (dP - Di) into dS (dP = dout v^T). Both (nq, nk).
template <class T>
void probs_and_dscores(Tile<T>& S, Tile<T>& dS, const T* qkv, const T* dout, const T* lse, const T* Di,
                       const int32_t* docb, int window, const Layout& L, int b, int h, int qt, int kt, Mask mk,
                       T scale) {
  const int q0 = qt * kTile, k0 = kt * kTile, nq = S.rows(), nk = S.cols(), D = L.D, g = h / L.group;
  auto Q = rows(qkv, L.qkv(b, q0, h), nq, D, L.qkv_row());
  auto K = rows(qkv, L.qkv(b, k0, L.Hq + g), nk, D, L.qkv_row());
  auto V = rows(qkv, L.qkv(b, k0, L.Hq + L.Hkv + g), nk, D, L.qkv_row());
  auto dO = rows(dout, L.out(b, q0, h), nq, D, L.out_row());
  S.noalias() = Q * K.transpose();
  for (int i = 0; i < nq; i++) S.row(i) = (S.row(i).array() * scale - lse[L.lse(b, h, q0 + i)]).exp();
  if (mk == Mask::partial) apply_mask(S, qt, kt, docb, window, T(0));
  dS.noalias() = dO * V.transpose();
  for (int i = 0; i < nq; i++) dS.row(i) = S.row(i).array() * (dS.row(i).array() - Di[L.lse(b, h, q0 + i)]);
}
}  // namespace

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, const int32_t* doc,
                        int window, int B, int Tn, int Hq, int Hkv, int D) {
  check_kernel_args(B, Tn, Hq, Hkv, D, window);
  const Layout L{B, Tn, Hq, Hkv, D, Hq / Hkv};
  const T scale = T(1) / std::sqrt(T(D));
  const int nt = L.ntiles();
  const std::vector<Docs> docs = sequence_docs(doc, B, Tn);
  // Di = rowsum(dout * out) per (b, h, t), laid out like lse: O(T) memory.
  std::vector<T> Di(size_t(B) * Hq * Tn);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tn; t++)
      for (int h = 0; h < Hq; h++) {
        const T* o = out + L.out(b, t, h);
        const T* d = dout + L.out(b, t, h);
        T s = 0;
        for (int c = 0; c < D; c++) s += o[c] * d[c];
        Di[L.lse(b, h, t)] = s;
      }

  // Key tile kt of kv head g in sequence b: every query tile of every head of the group that sees it,
  // in order, summed into its dk and dv (scratch a, bb; added into dqkv at the end), each tile's
  // P and dS made in s and ds and handed to per_tile(h, qt, dS) (the one pass's dq).
  auto key_tile = [&](int b, int g, int kt, T* s, T* ds, T* a, T* bb, const auto& per_tile) {
    const int k0 = kt * kTile, nk = L.tile_len(kt);
    const int32_t* docb = docs[b].ids;
    Tile<T> dK(a, nk, D), dV(bb, nk, D);  // (nk, D)
    dK.setZero();
    dV.setZero();
    for (int h = g * L.group; h < (g + 1) * L.group; h++)
      for (int qt = kt, last = last_query_tile(kt, L, window, docs[b]); qt <= last; qt++) {
        const Mask mk = tile_mask(qt, kt, L, docb, window);
        if (mk == Mask::all) continue;
        const int q0 = qt * kTile, nq = L.tile_len(qt);
        Tile<T> S(s, nq, nk), dS(ds, nq, nk);
        probs_and_dscores(S, dS, qkv, dout, lse, Di.data(), docb, window, L, b, h, qt, kt, mk, scale);
        dV.noalias() += S.transpose() * rows(dout, L.out(b, q0, h), nq, D, L.out_row());
        dK.noalias() += dS.transpose() * rows(qkv, L.qkv(b, q0, h), nq, D, L.qkv_row());
        per_tile(h, qt, dS);
      }
    rows(dqkv, L.qkv(b, k0, Hq + g), nk, D, L.qkv_row()) += dK * scale;
    rows(dqkv, L.qkv(b, k0, Hq + Hkv + g), nk, D, L.qkv_row()) += dV;
  };

  // One pass where the tasks (sequences x kv heads) keep every thread busy and dq's scratch is
  // small; else two, whose tasks are per tile (a long sequence on few heads: llama at T = 1M).
  const size_t head_elems = (size_t(Tn) * D + 15) / 16 * 16;  // a head's dq: 64-byte aligned in the scratch
  const size_t dq_elems = size_t(L.group) * head_elems;
  const int passes = g_backward_passes.load() ? g_backward_passes.load()
                     : int64_t(B) * Hkv >= omp_get_max_threads() && dq_elems * sizeof(T) <= (size_t(32) << 20) ? 1
                                                                                                               : 2;
  if (passes == 1) {
#pragma omp parallel
    {
      Scratch<T> s_buf(kTile * kTile), ds_buf(kTile * kTile), a_buf(size_t(kTile) * D), b_buf(size_t(kTile) * D);
      std::unique_ptr<Scratch<T>> dq_scratch;  // at a thread's first task: a thread without one holds none
      // One task owns kv head g of sequence b: the dk, dv rows of its key tiles and the dq rows of
      // its group's query heads. Key tiles in order, each as pass 1 below takes it (the same sums
      // into dk and dv); each query tile's dq gets its key tiles in order, as pass 2's does: the
      // two-pass bits.
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < int64_t(B) * Hkv; task++) {
        const int g = int(task % Hkv), b = int(task / Hkv);
        if (!dq_scratch) dq_scratch = std::make_unique<Scratch<T>>(dq_elems);
        T* const dq_buf = dq_scratch->data;
        std::fill(dq_buf, dq_buf + dq_elems, T(0));
        auto dq_of = [&](int h, int qt, int nq) {  // (nq, D): head h's dq rows of query tile qt
          return Tile<T>(dq_buf + size_t(h - g * L.group) * head_elems + size_t(qt) * kTile * D, nq, D);
        };
        for (int kt = 0; kt < nt; kt++) {
          const auto K = rows(qkv, L.qkv(b, kt * kTile, Hq + g), L.tile_len(kt), D, L.qkv_row());
          key_tile(b, g, kt, s_buf.data, ds_buf.data, a_buf.data, b_buf.data, [&](int h, int qt, const Tile<T>& dS) {
            Tile<T> dQ = dq_of(h, qt, int(dS.rows()));
            dQ.noalias() += dS * K;
          });
        }
        for (int h = g * L.group; h < (g + 1) * L.group; h++)
          for (int qt = 0; qt < nt; qt++) {
            const int nq = L.tile_len(qt);
            rows(dqkv, L.qkv(b, qt * kTile, h), nq, D, L.qkv_row()) += dq_of(h, qt, nq) * scale;
          }
      }
    }
    return;
  }

#pragma omp parallel
  {
    Scratch<T> s_buf(kTile * kTile), ds_buf(kTile * kTile), a_buf(size_t(kTile) * D), b_buf(size_t(kTile) * D);
    // Pass 1: dk, dv. One task owns one key tile of one kv head, so it alone writes those rows of
    // dqkv; it walks every query tile from it up to the last one whose window reaches it (causal: to
    // the end), for every query head of the group.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < int64_t(B) * Hkv * nt; task++) {
      const int kt = int(task % nt), g = int(task / nt % Hkv), b = int(task / nt / Hkv);
      key_tile(b, g, kt, s_buf.data, ds_buf.data, a_buf.data, b_buf.data, [](int, int, const Tile<T>&) {});
    }
    // Pass 2: dq. One task owns one query tile of one query head (disjoint from pass 1's rows, so
    // no barrier is needed between the passes).
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < int64_t(B) * Hq * nt; task++) {
      const int qt = nt - 1 - int(task % nt), h = int(task / nt % Hq), b = int(task / nt / Hq);
      const int q0 = qt * kTile, nq = L.tile_len(qt), g = h / L.group;
      const int32_t* docb = docs[b].ids;
      Tile<T> dQ(a_buf.data, nq, D);  // (nq, D)
      dQ.setZero();
      for (int kt = first_key_tile(qt, window, docs[b]); kt <= qt; kt++) {
        const Mask mk = tile_mask(qt, kt, L, docb, window);
        if (mk == Mask::all) continue;
        const int k0 = kt * kTile, nk = L.tile_len(kt);
        Tile<T> S(s_buf.data, nq, nk), dS(ds_buf.data, nq, nk);
        probs_and_dscores(S, dS, qkv, dout, lse, Di.data(), docb, window, L, b, h, qt, kt, mk, scale);
        dQ.noalias() += dS * rows(qkv, L.qkv(b, k0, Hq + g), nk, D, L.qkv_row());
      }
      rows(dqkv, L.qkv(b, q0, h), nq, D, L.qkv_row()) += dQ * scale;
    }
  }
}

int set_attention_backward_passes(int passes) {
  if (passes < 0 || passes > 2)
    throw std::invalid_argument("attention: backward passes must be 0 (as the shapes pick), 1 or 2, got " +
                                std::to_string(passes));
  return g_backward_passes.exchange(passes);
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int, int, int, int,
                                        int);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int, int, int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*,
                                         const int32_t*, int, int, int, int, int, int);
}  // namespace cpu

// qkv (B, T, Hq + 2 Hkv, D) and the optional doc ids (B, T) on qkv's device: checked here for both
// backends; returns (B, T, D) and the doc ids' pointer (null without them).
struct AttentionShape {
  int B, Tn, D;
  const int32_t* doc;
};
static AttentionShape check_attention_inputs(const Tensor& qkv, int Hq, int Hkv, const Tensor& doc, int window) {
  if (qkv.ndim() != 4) throw std::runtime_error("attention: qkv must be (B, T, Hq + 2*Hkv, D), got " + qkv.shape.str());
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    throw std::runtime_error("attention: query heads (" + std::to_string(Hq) + ") must be a positive multiple of kv heads (" +
                             std::to_string(Hkv) + ")");
  const int B = int(qkv.size(0)), Tn = int(qkv.size(1)), D = int(qkv.size(3));
  if (qkv.size(2) != Hq + 2 * Hkv)
    throw std::runtime_error("attention: qkv " + qkv.shape.str() + " needs dim 2 = Hq + 2*Hkv = " +
                             std::to_string(Hq + 2 * Hkv));
  if (window < 0)
    throw std::runtime_error("attention: the sliding window must be >= 0 (0: none), got " + std::to_string(window));
  if (!doc.defined()) return {B, Tn, D, nullptr};
  check_shape(doc, {B, Tn}, "attention doc ids");
  if (doc.device != qkv.device)
    throw std::runtime_error(std::string("attention: doc ids on ") + device_name(doc.device) + " but qkv on " +
                             device_name(qkv.device));
  return {B, Tn, D, doc.i32()};
}

#if ULYSSES_HAVE_CUDA
static Tensor attention_cuda(const Tensor& qkv, int Hq, int Hkv, const Tensor& doc, int window) {
  const AttentionShape a = check_attention_inputs(qkv, Hq, Hkv, doc, window);
  const int B = a.B, Tn = a.Tn, D = a.D;  // plain variables: the backward's closure copies them
  const int32_t* docp = a.doc;
  if (!attention_cuda_head_dim(D))
    throw std::runtime_error("attention: the CUDA backend supports head dim D = 16, 32, 64 or 128, got D = " +
                             std::to_string(D) + " (qkv " + qkv.shape.str() + ")");
  Tensor out;
  dispatch_cuda(qkv, {}, "attention", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    out = c.empty({B, Tn, Hq, D}, qkv.dtype);
    Tensor lse = c.empty({B, Hq, Tn});
    {
      ArenaScope scope(c.arena);  // the forward's scratch (documents only): read before the next op writes it
      void* scratch = docp ? c.arena.alloc(cuda::attention_forward_scratch_bytes(B, true)) : nullptr;
      cuda::attention_forward(out.as<T>(), lse.f32(), qkv.as<T>(), docp, window, scratch, B, Tn, Hq, Hkv, D,
                              op_stream());
    }
    if (!needs_grad({&qkv})) return;
    out = c.tape.track(out);
    c.tape.push("attention", [=] {
      const T* dout = static_cast<const T*>(ctx().tape.grad_if_any(out));
      if (!dout) return;
      // The gradient buffer first: one allocated lazily inside the scratch scope would be released with it.
      // Every element of it is written, so as its first writer the backward stores (no zero fill).
      bool overwrite = false;
      T* dqkv = grad_to_overwrite_as<T>(qkv, overwrite);
      ArenaScope scope(ctx().arena);
      const size_t bytes = cuda::attention_backward_scratch_bytes(B, Tn, Hq, docp != nullptr);
      float* scratch = static_cast<float*>(ctx().arena.alloc(bytes));
      cuda::attention_backward(dqkv, dout, out.as<T>(), lse.f32(), qkv.as<T>(), docp, window, scratch, B, Tn, Hq, Hkv,
                               D, op_stream(), !overwrite);
    });
  });
  return out;
}
#endif

Tensor attention(const Tensor& qkv, int Hq, int Hkv, const Tensor& doc, int window) {
#if ULYSSES_HAVE_CUDA
  if (qkv.device == Device::cuda) return attention_cuda(qkv, Hq, Hkv, doc, window);
#endif
  require_cpu_f32(qkv, "attention");
  const AttentionShape a = check_attention_inputs(qkv, Hq, Hkv, doc, window);
  const int B = a.B, Tn = a.Tn, D = a.D;  // plain variables: the backward's closure copies them
  const int32_t* docp = a.doc;
  Context& c = ctx();
  Tensor out = c.empty({B, Tn, Hq, D});
  Tensor lse = c.empty({B, Hq, Tn});
  cpu::attention_forward(out.f32(), lse.f32(), qkv.f32(), docp, window, B, Tn, Hq, Hkv, D);
  if (needs_grad({&qkv})) {
    out = c.tape.track(out);
    c.tape.push("attention", [=] {
      const float* dout = static_cast<const float*>(ctx().tape.grad_if_any(out));
      if (!dout) return;
      cpu::attention_backward(grad_or_scratch(qkv), dout, out.f32(), lse.f32(), qkv.f32(), docp, window, B, Tn, Hq, Hkv,
                              D);
    });
  }
  return out;
}

}  // namespace ul
