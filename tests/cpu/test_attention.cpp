#include "layers/attention.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>

#include <omp.h>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

// ThreadSanitizer's runtime defines the global operator new itself: there the heap is not counted.
#if defined(__SANITIZE_THREAD__)
#define UL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UL_TSAN 1
#endif
#endif

#ifndef UL_TSAN
// Heap bytes in use and their peak, through a replaced global operator new, so the memory test can
// see every std::vector the kernels allocate. Sizes come from malloc_usable_size, so a pointer from
// any allocator path is freed correctly. (GCC cannot tell this malloc/free pair is matched.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long long> g_heap{0}, g_heap_peak{0};
void* operator new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  long long now = g_heap += (long long)malloc_usable_size(p), peak = g_heap_peak.load();
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {}
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept {
  if (!p) return;
  g_heap -= (long long)malloc_usable_size(p);
  std::free(p);
}
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }
// The nothrow forms too (Catch2 allocates with them): every new of this program pairs with the
// replaced delete above, which AddressSanitizer checks.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return operator new(n, std::nothrow); }
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { operator delete(p); }
#else
static std::atomic<long long> g_heap{0}, g_heap_peak{0};  // stay 0: nothing counts
#endif

namespace {

struct Cfg { int B, Tn, Hq, Hkv, D; };
size_t qkv_size(const Cfg& c) { return size_t(c.B) * c.Tn * (c.Hq + 2 * c.Hkv) * c.D; }
size_t out_size(const Cfg& c) { return size_t(c.B) * c.Tn * c.Hq * c.D; }

// The definition, in double, with an explicit T x T softmax per (b, h): out, lse and (when dout is
// given) the gradient added into dqkv. window: 0, or query t sees only keys u > t - window.
void naive(const Cfg& c, const Vec& qkv, const int32_t* doc, Vec& out, Vec& lse, const Vec* dout = nullptr,
           Vec* dqkv = nullptr, int window = 0) {
  const int H3 = c.Hq + 2 * c.Hkv, T = c.Tn, D = c.D;
  const double scale = 1.0 / std::sqrt(double(D));
  out.assign(out_size(c), 0.0);
  lse.assign(size_t(c.B) * c.Hq * T, 0.0);
  auto at = [&](int b, int t, int head) { return (size_t(b) * T + t) * H3 * D + size_t(head) * D; };
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.Hq; h++) {
      const int kh = c.Hq + h / (c.Hq / c.Hkv), vh = kh + c.Hkv;
      std::vector<Vec> P(T, Vec(T, 0.0));
      for (int t = 0; t < T; t++) {
        double mx = -1e300;
        Vec s(T, -1e300);
        for (int u = 0; u <= t; u++) {
          if (doc && doc[b * T + u] != doc[b * T + t]) continue;
          if (window && t - u >= window) continue;
          double d = 0;
          for (int i = 0; i < D; i++) d += qkv[at(b, t, h) + i] * qkv[at(b, u, kh) + i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; u++)
          if (s[u] > -1e299) sum += std::exp(s[u] - mx);
        lse[(size_t(b) * c.Hq + h) * T + t] = mx + std::log(sum);
        for (int u = 0; u <= t; u++) {
          P[t][u] = s[u] > -1e299 ? std::exp(s[u] - mx) / sum : 0.0;
          for (int i = 0; i < D; i++) out[(size_t(b) * T + t) * c.Hq * D + size_t(h) * D + i] += P[t][u] * qkv[at(b, u, vh) + i];
        }
      }
      if (!dout) continue;
      for (int t = 0; t < T; t++) {
        const double* dO = dout->data() + (size_t(b) * T + t) * c.Hq * D + size_t(h) * D;
        Vec dP(T, 0.0);
        double rowsum = 0;
        for (int u = 0; u <= t; u++) {
          for (int i = 0; i < D; i++) dP[u] += dO[i] * qkv[at(b, u, vh) + i];
          rowsum += P[t][u] * dP[u];
        }
        for (int u = 0; u <= t; u++) {
          const double dS = P[t][u] * (dP[u] - rowsum) * scale;
          for (int i = 0; i < D; i++) {
            (*dqkv)[at(b, t, h) + i] += dS * qkv[at(b, u, kh) + i];
            (*dqkv)[at(b, u, kh) + i] += dS * qkv[at(b, t, h) + i];
            (*dqkv)[at(b, u, vh) + i] += P[t][u] * dO[i];
          }
        }
      }
    }
}

std::vector<float> to_f(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// max |a - b| relative to max |b| (floored at 1e-3 so all-tiny references do not inflate it)
double rel_err(const std::vector<float>& a, const Vec& b) {
  double m = 0, r = 1e-3;
  for (size_t i = 0; i < b.size(); i++) {
    m = ul_test::max_err(m, std::fabs(double(a[i]) - b[i]));
    r = std::max(r, std::fabs(b[i]));
  }
  return m / r;
}

}  // namespace

TEST_CASE("attention forward matches the naive softmax (MHA, GQA, MQA, ragged tiles)", "[attention]") {
  for (Cfg shape : {Cfg{2, 0, 2, 2, 8}, Cfg{2, 0, 4, 2, 16}, Cfg{1, 0, 4, 1, 20}})
    for (int Tn : {1, 7, 64, 65, 130, 200}) {
      Cfg c = shape;
      c.Tn = Tn;
      Vec qkv = randn(qkv_size(c), 100 + Tn);
      Vec out, lse;
      naive(c, qkv, nullptr, out, lse);
      auto qf = to_f(qkv);
      std::vector<float> of(out_size(c), NAN), lf(lse.size(), NAN);  // poisoned: unwritten entries fail
      ul::cpu::attention_forward(of.data(), lf.data(), qf.data(), nullptr, 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
      INFO("T=" << Tn << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D);
      CHECK(rel_err(of, out) < 1e-5);
      CHECK(rel_err(lf, lse) < 1e-5);
    }
}

TEST_CASE("attention CPU kernels refuse a negative window and Hq not a multiple of Hkv", "[attention]") {
  // The op refuses these first; the kernels too, for a caller of their own (a window of -1 made
  // every row NaN with an lse of -inf).
  const int B = 1, T = 4, D = 8;
  std::vector<float> qkv(size_t(B) * T * (4 + 2 * 2) * D, 0.1f), out(size_t(B) * T * 4 * D), lse(size_t(B) * 4 * T);
  std::vector<float> dout(out.size(), 1.0f), dqkv(qkv.size());
  CHECK_THROWS_WITH(ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), nullptr, -1, B, T, 4, 2, D),
                    Catch::Contains("the sliding window must be >= 0, got -1"));
  CHECK_THROWS_WITH(ul::cpu::attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), nullptr, -1,
                                                B, T, 4, 2, D),
                    Catch::Contains("the sliding window must be >= 0, got -1"));
  CHECK_THROWS_WITH(ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), nullptr, 0, B, T, 3, 2, D),
                    Catch::Contains("Hq (3) must be a multiple of Hkv (2)"));
  CHECK_NOTHROW(ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), nullptr, 0, B, T, 4, 2, D));
}

TEST_CASE("attention backward matches float64 central differences", "[attention]") {
  for (Cfg c : {Cfg{1, 5, 2, 2, 8}, Cfg{2, 70, 4, 2, 6}, Cfg{1, 67, 2, 1, 5}}) {
    Vec qkv = randn(qkv_size(c), 7 + c.Tn);
    Vec lse(size_t(c.B) * c.Hq * c.Tn);
    auto fwd = [&](Vec& y) {
      y.resize(out_size(c));
      ul::cpu::attention_forward(y.data(), lse.data(), qkv.data(), nullptr, 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    };
    gradcheck("attention T=" + std::to_string(c.Tn), {&qkv}, fwd, [&](const Vec& dy, std::vector<Vec>& d) {
      Vec y;
      fwd(y);
      ul::cpu::attention_backward(d[0].data(), dy.data(), y.data(), lse.data(), qkv.data(), nullptr, 0, c.B, c.Tn, c.Hq,
                                  c.Hkv, c.D);
    }, 5e-8, 300);  // 8e-9 here with a float64 lse; 7e-8 when lse was float
  }
}

TEST_CASE("attention float backward matches the naive float64 backward at larger T", "[attention]") {
  for (Cfg c : {Cfg{1, 200, 4, 2, 16}, Cfg{2, 130, 3, 3, 20}, Cfg{1, 150, 4, 1, 8}}) {
    Vec qkv = randn(qkv_size(c), 3), dout = randn(out_size(c), 4);
    Vec out, lse, dref(qkv.size(), 0.0);
    naive(c, qkv, nullptr, out, lse, &dout, &dref);
    auto qf = to_f(qkv), df = to_f(dout);
    std::vector<float> of(out_size(c)), lf(lse.size()), dq(qkv.size(), 0.f);
    ul::cpu::attention_forward(of.data(), lf.data(), qf.data(), nullptr, 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    ul::cpu::attention_backward(dq.data(), df.data(), of.data(), lf.data(), qf.data(), nullptr, 0, c.B, c.Tn, c.Hq, c.Hkv,
                                c.D);
    INFO("T=" << c.Tn << " Hq=" << c.Hq << " Hkv=" << c.Hkv);
    CHECK(rel_err(dq, dref) < 2e-5);
  }
}

TEST_CASE("attention document mask equals attending to each document alone", "[attention]") {
  const int Hq = 4, Hkv = 2, D = 12, Tn = 190, H3 = Hq + 2 * Hkv;
  // Two sequences, documents crossing tile boundaries; the second starts a document at token 0 and 64.
  std::vector<std::vector<int>> lens = {{40, 70, 1, 79}, {64, 126}};
  std::vector<int32_t> doc;
  for (auto& seq : lens)
    for (size_t d = 0; d < seq.size(); d++) doc.insert(doc.end(), seq[d], int32_t(7 * d + 3));
  Cfg c{2, Tn, Hq, Hkv, D};
  auto qkv = randn_f(qkv_size(c), 11), dout = randn_f(out_size(c), 12);
  std::vector<float> out(out_size(c)), lse(size_t(2) * Hq * Tn), dqkv(qkv.size(), 0.f);
  ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), doc.data(), 0, 2, Tn, Hq, Hkv, D);
  ul::cpu::attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), doc.data(), 0, 2, Tn, Hq, Hkv, D);
  for (int b = 0; b < 2; b++) {
    int t0 = 0;
    for (int n : lens[b]) {
      // Run the document alone (B = 1, T = n, no mask) on copies of its rows.
      auto slice = [&](const std::vector<float>& v, int width) {
        return std::vector<float>(v.begin() + (size_t(b) * Tn + t0) * width, v.begin() + (size_t(b) * Tn + t0 + n) * width);
      };
      auto q1 = slice(qkv, H3 * D), do1 = slice(dout, Hq * D);
      std::vector<float> o1(size_t(n) * Hq * D), l1(size_t(Hq) * n), d1(q1.size(), 0.f);
      ul::cpu::attention_forward(o1.data(), l1.data(), q1.data(), nullptr, 0, 1, n, Hq, Hkv, D);
      ul::cpu::attention_backward(d1.data(), do1.data(), o1.data(), l1.data(), q1.data(), nullptr, 0, 1, n, Hq, Hkv, D);
      INFO("sequence " << b << " document at " << t0 << " length " << n);
      // Equal up to float rounding: the tiles fall at other offsets, so sums run in another order.
      CHECK(max_abs_diff(o1.data(), slice(out, Hq * D).data(), o1.size()) < 1e-5 * std::max(1.0, max_abs(o1.data(), o1.size())));
      CHECK(max_abs_diff(d1.data(), slice(dqkv, H3 * D).data(), d1.size()) < 1e-5 * std::max(1.0, max_abs(d1.data(), d1.size())));
      for (int h = 0; h < Hq; h++)
        CHECK(max_abs_diff(l1.data() + size_t(h) * n, lse.data() + (size_t(b) * Hq + h) * Tn + t0, n) < 1e-5);
      t0 += n;
    }
  }
}

TEST_CASE("attention document mask with interleaved ids matches the naive mask", "[attention]") {
  Cfg c{1, 150, 2, 1, 8};
  std::vector<int32_t> doc(c.Tn);
  for (int t = 0; t < c.Tn; t++) doc[t] = (t / 5) % 3;  // ids recur: masks inside every tile
  Vec qkv = randn(qkv_size(c), 21), dout = randn(out_size(c), 22);
  Vec out, lse, dref(qkv.size(), 0.0);
  naive(c, qkv, doc.data(), out, lse, &dout, &dref);
  auto qf = to_f(qkv), df = to_f(dout);
  std::vector<float> of(out_size(c)), lf(lse.size()), dq(qkv.size(), 0.f);
  ul::cpu::attention_forward(of.data(), lf.data(), qf.data(), doc.data(), 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
  ul::cpu::attention_backward(dq.data(), df.data(), of.data(), lf.data(), qf.data(), doc.data(), 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
  CHECK(rel_err(of, out) < 1e-5);
  CHECK(rel_err(lf, lse) < 1e-5);
  CHECK(rel_err(dq, dref) < 2e-5);
}

TEST_CASE("attention with rising document ids at tile edges, beside returning ones, matches the naive mask", "[attention]") {
  // Rising ids let the kernels skip, by bisection, the key tiles before a query tile's first
  // document and the query tiles past a key tile's last one. Documents start one before, at and one
  // after tile edges (some of one token) and cross others (128, 256, and 320 and 384 in one). In
  // the second sequence documents return (runs of 37 tokens cycling through 3 ids: a query sees
  // an earlier run of its document across others), which only the walk gets right: its own flag
  // must say so.
  Cfg c{2, 400, 4, 2, 8};
  std::vector<int32_t> doc(size_t(c.B) * c.Tn);
  const int starts[] = {1, 63, 64, 65, 100, 127, 129, 191, 192, 193, 255, 257, 300, 399};
  for (int t = 0, id = 0, next = 0; t < c.Tn; t++) {
    if (next < int(std::size(starts)) && t == starts[next]) id++, next++;
    doc[t] = 10 * id;
    doc[size_t(c.Tn) + t] = t / 37 % 3;
  }
  for (int window : {0, 65}) {
    Vec qkv = randn(qkv_size(c), 31 + window), dout = randn(out_size(c), 32);
    Vec out, lse, dref(qkv.size(), 0.0);
    naive(c, qkv, doc.data(), out, lse, &dout, &dref, window);
    auto qf = to_f(qkv), df = to_f(dout);
    std::vector<float> of(out_size(c), NAN), lf(lse.size(), NAN), dq(qkv.size(), 0.f);
    ul::cpu::attention_forward(of.data(), lf.data(), qf.data(), doc.data(), window, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    ul::cpu::attention_backward(dq.data(), df.data(), of.data(), lf.data(), qf.data(), doc.data(), window, c.B, c.Tn,
                                c.Hq, c.Hkv, c.D);
    INFO("window " << window);
    CHECK(rel_err(of, out) < 1e-5);
    CHECK(rel_err(lf, lse) < 1e-5);
    CHECK(rel_err(dq, dref) < 2e-5);
  }
}

TEST_CASE("attention sliding window matches the naive windowed softmax (ragged tiles, GQA, documents)", "[attention]") {
  // Windows below, at and across the 64-row tile, longer than T, and 1 (each token sees itself only).
  for (Cfg c : {Cfg{1, 200, 4, 2, 16}, Cfg{2, 130, 2, 1, 8}})
    for (int window : {1, 2, 5, 63, 64, 65, 100, 129, 500})
      for (bool docs : {false, true}) {
        std::vector<int32_t> doc(size_t(c.B) * c.Tn);
        for (size_t t = 0; t < doc.size(); t++) doc[t] = int32_t(t % c.Tn / 70);  // documents of 70 tokens
        const int32_t* docp = docs ? doc.data() : nullptr;
        Vec qkv = randn(qkv_size(c), 50 + window), dout = randn(out_size(c), 51);
        Vec out, lse, dref(qkv.size(), 0.0);
        naive(c, qkv, docp, out, lse, &dout, &dref, window);
        auto qf = to_f(qkv), df = to_f(dout);
        std::vector<float> of(out_size(c), NAN), lf(lse.size(), NAN), dq(qkv.size(), 0.f);
        ul::cpu::attention_forward(of.data(), lf.data(), qf.data(), docp, window, c.B, c.Tn, c.Hq, c.Hkv, c.D);
        ul::cpu::attention_backward(dq.data(), df.data(), of.data(), lf.data(), qf.data(), docp, window, c.B, c.Tn,
                                    c.Hq, c.Hkv, c.D);
        INFO("T=" << c.Tn << " window=" << window << " docs=" << docs);
        CHECK(rel_err(of, out) < 1e-5);
        CHECK(rel_err(lf, lse) < 1e-5);
        CHECK(rel_err(dq, dref) < 2e-5);
      }
}

TEST_CASE("attention sliding window: float64 central differences, and a window of T or more is no window", "[attention]") {
  Cfg c{1, 70, 2, 1, 6};
  Vec qkv = randn(qkv_size(c), 61);
  Vec lse(size_t(c.B) * c.Hq * c.Tn);
  auto fwd = [&](Vec& y) {
    y.resize(out_size(c));
    ul::cpu::attention_forward(y.data(), lse.data(), qkv.data(), nullptr, 9, c.B, c.Tn, c.Hq, c.Hkv, c.D);
  };
  gradcheck("attention window 9", {&qkv}, fwd, [&](const Vec& dy, std::vector<Vec>& d) {
    Vec y;
    fwd(y);
    ul::cpu::attention_backward(d[0].data(), dy.data(), y.data(), lse.data(), qkv.data(), nullptr, 9, c.B, c.Tn, c.Hq,
                                c.Hkv, c.D);
  }, 5e-8, 300);  // as above

  // Every key is then inside the window: the same tiles, the same sums, the same bits.
  Cfg w{2, 150, 4, 2, 8};
  auto q = randn_f(qkv_size(w), 62), dy = randn_f(out_size(w), 63);
  auto run = [&](int window, std::vector<float>& out, std::vector<float>& dqkv) {
    std::vector<float> l(size_t(w.B) * w.Hq * w.Tn);
    out.assign(out_size(w), 0.f);
    dqkv.assign(q.size(), 0.f);
    ul::cpu::attention_forward(out.data(), l.data(), q.data(), nullptr, window, w.B, w.Tn, w.Hq, w.Hkv, w.D);
    ul::cpu::attention_backward(dqkv.data(), dy.data(), out.data(), l.data(), q.data(), nullptr, window, w.B, w.Tn,
                                w.Hq, w.Hkv, w.D);
  };
  std::vector<float> o0, d0, o1, d1, o2, d2;
  run(0, o0, d0);
  run(w.Tn, o1, d1);
  run(w.Tn - 1, o2, d2);
  CHECK(std::memcmp(o0.data(), o1.data(), o0.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(d0.data(), d1.data(), d0.size() * sizeof(float)) == 0);
  // The last query loses its first key (finite: a NaN counts as a large difference).
  CHECK(std::all_of(o2.begin(), o2.end(), [](float x) { return std::isfinite(x); }));
  CHECK(max_abs_diff(o0.data(), o2.data(), o0.size()) > 1e-4);
}

TEST_CASE("attention passes a NaN key on to every row that sees it, and to no other", "[attention]") {
  // A NaN in the first visible column of a row's first key tile once read as a fully masked tile:
  // the tile's other keys were dropped and the output came out finite and wrong.
  Cfg c{1, 130, 2, 1, 8};
  const int H3 = c.Hq + 2 * c.Hkv;
  std::vector<int32_t> docs(c.Tn);
  for (int t = 0; t < c.Tn; t++) docs[t] = t < 64 ? 0 : 1;  // the second document starts a tile
  struct Case { int bad; bool doc; int window; };
  // (63 with a window of 2: row 64 sees only the NaN key, its tile's last column, which a vectorised
  // max skips: the one case where the row's max reads -inf and only a look for a NaN finds it.)
  for (Case k : {Case{0, false, 0}, Case{64, true, 0}, Case{5, false, 0}, Case{64, false, 40}, Case{63, false, 2},
                 Case{127, false, 2}}) {
    INFO("NaN key at token " << k.bad << (k.doc ? ", documents" : "") << ", window " << k.window);
    auto qkv = randn_f(qkv_size(c), 31);
    qkv[size_t(k.bad) * H3 * c.D + size_t(c.Hq) * c.D] = std::nanf("");  // key head 0, element 0
    const int32_t* doc = k.doc ? docs.data() : nullptr;
    std::vector<float> out(out_size(c)), lse(size_t(c.Hq) * c.Tn);
    ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), doc, k.window, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    int wrong = 0;
    for (int t = 0; t < c.Tn; t++) {
      const bool sees = t >= k.bad && (!doc || doc[t] == doc[k.bad]) && (!k.window || t - k.bad < k.window);
      for (int i = 0; i < c.Hq * c.D; i++) wrong += std::isnan(out[size_t(t) * c.Hq * c.D + i]) != sees;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("attention is deterministic: bitwise equal for 1 and many threads", "[attention]") {
  Cfg c{2, 300, 4, 2, 16};
  std::vector<int32_t> doc(size_t(c.B) * c.Tn);
  for (size_t t = 0; t < doc.size(); t++) doc[t] = int32_t(t / 90);
  auto qkv = randn_f(qkv_size(c), 41), dout = randn_f(out_size(c), 42);
  auto run = [&](int threads, std::vector<float>& out, std::vector<float>& dqkv) {
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> lse(size_t(c.B) * c.Hq * c.Tn);
    out.assign(out_size(c), 0.f);
    dqkv.assign(qkv.size(), 0.f);
    ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), doc.data(), 0, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    ul::cpu::attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), doc.data(), 0, c.B, c.Tn,
                                c.Hq, c.Hkv, c.D);
    omp_set_num_threads(keep);
  };
  std::vector<float> o1, d1, o4, d4;
  run(1, o1, d1);
  run(4, o4, d4);
  CHECK(std::memcmp(o1.data(), o4.data(), o1.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(d1.data(), d4.data(), d1.size() * sizeof(float)) == 0);
}

// The backward's one pass (each score tile once, a task per sequence and kv head) and its two passes
// (dk/dv, then dq) give the same bits, so which the shapes and threads pick changes no result.
TEST_CASE("attention backward: one pass and two passes give the same bits", "[attention]") {
  struct Shape {
    Cfg c;
    int window, doc_len;
  };
  for (const Shape& s : {Shape{{2, 300, 4, 2, 16}, 0, 0}, Shape{{1, 777, 4, 4, 24}, 100, 50},
                         Shape{{2, 1000, 6, 2, 32}, 0, 100}, Shape{{3, 130, 8, 1, 64}, 70, 0},
                         Shape{{1, 64, 2, 2, 16}, 0, 0}}) {
    const Cfg& c = s.c;
    CAPTURE(c.B, c.Tn, c.Hq, c.Hkv, c.D, s.window, s.doc_len);
    std::vector<int32_t> doc;
    if (s.doc_len > 0)
      for (size_t t = 0; t < size_t(c.B) * c.Tn; t++) doc.push_back(int32_t(t / size_t(s.doc_len)));
    const int32_t* docp = doc.empty() ? nullptr : doc.data();
    auto qkv = randn_f(qkv_size(c), 43), dout = randn_f(out_size(c), 44);
    std::vector<float> out(out_size(c)), lse(size_t(c.B) * c.Hq * c.Tn);
    ul::cpu::attention_forward(out.data(), lse.data(), qkv.data(), docp, s.window, c.B, c.Tn, c.Hq, c.Hkv, c.D);
    auto backward = [&](int passes) {
      const int keep = ul::cpu::set_attention_backward_passes(passes);
      std::vector<float> dqkv = randn_f(qkv.size(), 45);  // onto a gradient already there
      ul::cpu::attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), docp, s.window, c.B,
                                  c.Tn, c.Hq, c.Hkv, c.D);
      ul::cpu::set_attention_backward_passes(keep);
      return dqkv;
    };
    const std::vector<float> one = backward(1), two = backward(2);
    CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    CHECK(one != randn_f(qkv.size(), 45));  // the backward did add
  }
  CHECK_THROWS_WITH(ul::cpu::set_attention_backward_passes(3), Catch::Contains("must be 0 (as the shapes pick), 1 or 2"));
}

namespace {
// Arena high-water of the autograd op's forward + backward, and the heap peak inside the kernels.
void attention_memory(int Tn, size_t& arena_bytes, long long& heap_bytes) {
  ul::Context c;
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  const int Hq = 4, Hkv = 2, D = 32;
  ul::Tensor qkv = c.tape.track(c.empty({1, Tn, Hq + 2 * Hkv, D}));
  auto v = randn_f(qkv.numel(), 5);
  std::copy(v.begin(), v.end(), qkv.f32());
  const long long heap0 = g_heap.load();
  g_heap_peak = heap0;
  ul::Tensor out = ul::attention(qkv, Hq, Hkv, ul::Tensor());
  float* dout = c.tape.gradf(out);
  for (int64_t i = 0; i < out.numel(); i++) dout[i] = 1e-3f * float(i % 7);
  c.tape.backward();
  heap_bytes = g_heap_peak.load() - heap0;
  arena_bytes = c.arena.high_water();
}
}  // namespace

TEST_CASE("attention memory is linear in T (arena and kernel heap)", "[attention]") {
  // The backward's two passes (what 4 threads over B x kv heads = 2 tasks pick) and its one pass,
  // whose dq scratch (group x T x D a task: 2 x 2048 x 32 floats, two tasks) the bound adds.
  for (const int passes : {0, 1}) {
    CAPTURE(passes);
    size_t a1, a2;
    long long h1, h2;
    // Four threads, whatever the machine: the per-thread scratch is in the bound below, which on a
    // many-core machine would otherwise let a T x T buffer through.
    const int saved = omp_get_max_threads(), keep = ul::cpu::set_attention_backward_passes(passes);
    omp_set_num_threads(4);
    attention_memory(1024, a1, h1);
    attention_memory(2048, a2, h2);
    omp_set_num_threads(saved);
    ul::cpu::set_attention_backward_passes(keep);
    INFO("arena " << a1 << " -> " << a2 << " bytes; kernel heap " << h1 << " -> " << h2 << " bytes");
    CHECK(double(a2) / double(a1) <= 2.2);
#ifdef UL_TSAN
    WARN("ThreadSanitizer build: the kernel heap is not counted (its runtime owns operator new)");
#endif
    // Heap: O(T) row sums plus per-thread tile scratch; a T x T float buffer at T = 2048 would be 16 MiB.
    // (one pass: the two tasks may fall to one thread or two, one dq scratch or two, at either T)
    const double dq_task = passes == 1 ? 2.0 * 2048 * 32 * 4 : 0;
    CHECK(double(h2) <= 2.2 * double(h1) + 4096 + dq_task);
    CHECK(double(h2) < (1 << 20) + (256 << 10) * 4 + 2 * dq_task);
  }
}

TEST_CASE("attention op checks shapes and accumulates into existing gradients", "[attention]") {
  ul::Context c;
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  const int B = 2, Tn = 70, Hq = 4, Hkv = 2, D = 8, H3 = Hq + 2 * Hkv;
  CHECK_THROWS_WITH(ul::attention(c.empty({B, Tn, H3 + 1, D}), Hq, Hkv, ul::Tensor()), Catch::Contains("Hq + 2*Hkv"));
  CHECK_THROWS_WITH(ul::attention(c.empty({B, Tn, 3 + 2 * 2, D}), 3, 2, ul::Tensor()), Catch::Contains("multiple"));
  CHECK_THROWS_WITH(ul::attention(c.empty({B * Tn, H3, D}), Hq, Hkv, ul::Tensor()), Catch::Contains("qkv must be"));
  CHECK_THROWS(ul::attention(c.empty({B, Tn, H3, D}), Hq, Hkv, c.empty({B, Tn + 1}, ul::DType::i32)));
  CHECK_THROWS_WITH(ul::attention(c.empty({B, Tn, H3, D}), Hq, Hkv, ul::Tensor(), -1), Catch::Contains("window"));

  ul::Tensor qkv = c.tape.track(c.empty({B, Tn, H3, D}));
  ul::Tensor doc = c.empty({B, Tn}, ul::DType::i32);
  for (int i = 0; i < B * Tn; i++) doc.i32()[i] = i / 30;
  auto qv = randn_f(qkv.numel(), 31), dov = randn_f(size_t(B) * Tn * Hq * D, 32), pre = randn_f(qkv.numel(), 33);
  std::copy(qv.begin(), qv.end(), qkv.f32());
  ul::Tensor out = ul::attention(qkv, Hq, Hkv, doc);
  REQUIRE(out.requires_grad());
  REQUIRE(out.shape == ul::Shape({B, Tn, Hq, D}));
  std::copy(dov.begin(), dov.end(), c.tape.gradf(out));
  float* g = c.tape.gradf(qkv);
  std::copy(pre.begin(), pre.end(), g);  // an existing gradient the op must add to
  c.tape.backward();

  std::vector<float> o(dov.size()), l(size_t(B) * Hq * Tn), want(pre);
  ul::cpu::attention_forward(o.data(), l.data(), qv.data(), doc.i32(), 0, B, Tn, Hq, Hkv, D);
  CHECK(max_abs_diff(o.data(), out.f32(), o.size()) == 0);
  ul::cpu::attention_backward(want.data(), dov.data(), o.data(), l.data(), qv.data(), doc.i32(), 0, B, Tn, Hq, Hkv, D);
  CHECK(max_abs_diff(want.data(), g, want.size()) < 1e-6);
}
