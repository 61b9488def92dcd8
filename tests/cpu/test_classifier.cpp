#include "layers/classifier.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;
using ul::CrossEntropyStats;

namespace {

// The full (N, V) logits in double: the definition the chunked kernel must agree with.
struct Reference {
  double loss_sum = 0;
  int64_t n_valid = 0, n_correct = 0;
  std::vector<int> argmax;
};
template <class T>
Reference reference(const T* x, const T* w, const std::vector<int32_t>& tg, int N, int C, int V) {
  Reference r;
  r.argmax.assign(N, 0);
  std::vector<double> z(V);
  for (int n = 0; n < N; n++) {
    double mx = -INFINITY;
    for (int v = 0; v < V; v++) {
      double s = 0;
      for (int c = 0; c < C; c++) s += double(x[size_t(n) * C + c]) * double(w[size_t(v) * C + c]);
      z[v] = s;
      if (s > mx) mx = s, r.argmax[n] = v;
    }
    if (tg[n] < 0) continue;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += std::exp(z[v] - mx);
    r.loss_sum += std::log(sum) - (z[tg[n]] - mx);
    r.n_valid++;
    r.n_correct += r.argmax[n] == tg[n];
  }
  return r;
}

std::vector<int32_t> random_targets(int N, int V, uint64_t seed, int every_ignored) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; n++) t[n] = (every_ignored && n % every_ignored == 1) ? -1 : int32_t(g() % V);
  return t;
}

}  // namespace

TEST_CASE("classifier gradient matches float64 central differences of the mean loss", "[classifier]") {
  // w has Vp = V + 3 rows; the padding rows are poisoned and must never be read.
  const int N = 7, C = 5, V = 11, Vp = 14;
  Vec x = randn(size_t(N) * C, 1), w = randn(size_t(Vp) * C, 2);
  for (size_t i = size_t(V) * C; i < w.size(); i++) w[i] = NAN;
  std::vector<int32_t> tg = random_targets(N, V, 3, 3);  // rows 1 and 4 ignored
  tg[0] = V - 1;                                          // the last scored class is a target
  int64_t n_valid = 0;
  for (int t : tg) n_valid += t >= 0;

  // L = loss_sum / n_valid, whose gradient is the kernel's with grad_scale = 1 / n_valid.
  auto loss = [&] {
    CrossEntropyStats s = ul::cpu::classifier_forward_backward<double>(nullptr, nullptr, x.data(), w.data(), tg.data(),
                                                                       N, C, V, 1.0, 3);
    return s.loss_sum / double(s.n_valid);
  };
  Vec dx(x.size(), 0.0), dw(w.size(), 0.0);
  CrossEntropyStats st = ul::cpu::classifier_forward_backward<double>(dx.data(), dw.data(), x.data(), w.data(),
                                                                      tg.data(), N, C, V, 1.0 / n_valid, 3);
  CHECK(st.n_valid == n_valid);
  CHECK(std::isfinite(st.loss_sum));

  const double h = 1e-6;
  auto check = [&](Vec& p, const Vec& g, size_t n_scored, const char* what) {
    double max_ref = 0, worst = 0;
    for (size_t i = 0; i < n_scored; i++) max_ref = std::max(max_ref, std::fabs(g[i]));
    for (size_t i = 0; i < n_scored; i++) {
      double keep = p[i];
      p[i] = keep + h;
      double lp = loss();
      p[i] = keep - h;
      double lm = loss();
      p[i] = keep;
      worst = ul_test::max_err(worst, std::fabs((lp - lm) / (2 * h) - g[i]) / std::max(1.0, max_ref));
    }
    INFO(what << ": worst error " << worst << " relative to max |grad| " << max_ref);
    CHECK(worst < 1e-6);
    CHECK(max_ref > 0);
  };
  check(x, dx, x.size(), "dx");
  check(w, dw, size_t(V) * C, "dw");
  for (int n = 0; n < N; n++)
    if (tg[n] < 0)
      for (int c = 0; c < C; c++) CHECK(dx[size_t(n) * C + c] == 0.0);  // ignored rows: no gradient
  for (size_t i = size_t(V) * C; i < dw.size(); i++) CHECK(dw[i] == 0.0);  // padding rows untouched
}

TEST_CASE("classifier loss and argmax match full logits, padding and ignored rows", "[classifier]") {
  // Big enough that the all-rows chunk runs its GEMMs on several threads; chunks of 1 and 3 rows run
  // them serially.
  const int N = 37, C = 64, V = 3000, Vp = 3011;
  auto x = randn_f(size_t(N) * C, 4), w = randn_f(size_t(Vp) * C, 5, 0.5f);
  for (size_t i = size_t(V) * C; i < w.size(); i++) w[i] = NAN;
  std::vector<int32_t> tg = random_targets(N, V, 6, 4);
  // Make about half the valid targets the argmax, so n_correct is checked on both outcomes.
  Reference r0 = reference(x.data(), w.data(), tg, N, C, V);
  for (int n = 0; n < N; n += 2)
    if (tg[n] >= 0) tg[n] = r0.argmax[n];
  Reference r = reference(x.data(), w.data(), tg, N, C, V);
  REQUIRE(r.n_correct > 0);
  REQUIRE(r.n_correct < r.n_valid);

  std::vector<float> dx0, dw0;
  for (int chunk : {1, 3, N}) {
    std::vector<float> dx(x.size(), 0.f), dw(w.size(), 0.f);
    CrossEntropyStats s = ul::cpu::classifier_forward_backward<float>(dx.data(), dw.data(), x.data(), w.data(),
                                                                      tg.data(), N, C, V, 1.f / r.n_valid, chunk);
    INFO("chunk_rows " << chunk);
    CHECK(s.n_valid == r.n_valid);
    CHECK(s.n_correct == r.n_correct);
    CHECK(s.loss_sum == Approx(r.loss_sum).epsilon(1e-5));
    bool finite = true, pad_zero = true, ignored_zero = true;
    for (float v : dx) finite = finite && std::isfinite(v);
    for (size_t i = 0; i < size_t(V) * C; i++) finite = finite && std::isfinite(dw[i]);
    for (size_t i = size_t(V) * C; i < dw.size(); i++) pad_zero = pad_zero && dw[i] == 0.f;
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C && tg[n] < 0; c++) ignored_zero = ignored_zero && dx[size_t(n) * C + c] == 0.f;
    CHECK(finite);        // NaN padding rows of w were never read
    CHECK(pad_zero);      // nor written
    CHECK(ignored_zero);  // ignored rows get no gradient
    // The loss alone (no gradient buffers) is the same.
    CrossEntropyStats s2 = ul::cpu::classifier_forward_backward<float>(nullptr, nullptr, x.data(), w.data(),
                                                                       tg.data(), N, C, V, 1.f, chunk);
    CHECK(s2.loss_sum == Approx(s.loss_sum).epsilon(1e-6));
    if (dx0.empty()) {
      dx0 = dx, dw0 = dw;
    } else {  // independent of chunk_rows
      CHECK(max_abs_diff(dx.data(), dx0.data(), dx.size()) < 1e-5 * max_abs(dx0.data(), dx0.size()));
      CHECK(max_abs_diff(dw.data(), dw0.data(), dw.size()) < 1e-5 * max_abs(dw0.data(), dw0.size()));
    }
  }
  // Every target ignored: no loss, no gradient.
  std::vector<int32_t> none(N, -1);
  std::vector<float> dx(x.size(), 0.f), dw(w.size(), 0.f);
  CrossEntropyStats s = ul::cpu::classifier_forward_backward<float>(dx.data(), dw.data(), x.data(), w.data(),
                                                                    none.data(), N, C, V, 1.f, 5);
  CHECK(s.n_valid == 0);
  CHECK(s.loss_sum == 0);
  CHECK(max_abs(dx.data(), dx.size()) == 0);
  CHECK(max_abs(dw.data(), size_t(V) * C) == 0);
}

TEST_CASE("classifier argmax is the first maximum, wherever it lies", "[classifier]") {
  // C = 1: logits are x * w[v]. w holds two equal maxima at 300 and 500 (past the first block of
  // 256 the kernel searches), so x = 1 scores 300 and x = -1 scores index 0 (all others tie at 0).
  const int N = 3, C = 1, V = 600;
  std::vector<float> x = {1.f, -1.f, 1.f}, w(V, 0.f);
  w[300] = w[500] = 1.f;
  std::vector<int32_t> tg = {300, 0, 500};
  CrossEntropyStats s = ul::cpu::classifier_forward_backward<float>(nullptr, nullptr, x.data(), w.data(), tg.data(), N,
                                                                    C, V, 1.f, 2);
  CHECK(s.n_valid == 3);
  CHECK(s.n_correct == 2);  // rows 0 and 1; row 2's target ties the maximum but is not the first
  CHECK(s.loss_sum == Approx(2 * (std::log(598.0 + 2 * std::exp(1.0)) - 1.0) + std::log(598.0 + 2 * std::exp(-1.0))).epsilon(1e-6));
  // One maximum alone, at each block's edges: the search by blocks must not step over it.
  for (int at : {0, 1, 255, 256, 257, 511, 512, 599}) {
    CAPTURE(at);
    std::vector<float> one(V, 0.f);
    one[size_t(at)] = 1.f;
    const float x1 = 1.f;
    const int32_t t1 = at;
    const CrossEntropyStats h = ul::cpu::classifier_forward_backward<float>(nullptr, nullptr, &x1, one.data(), &t1, 1, C,
                                                                            V, 1.f, 2);
    CHECK(h.n_correct == 1);
  }
}

TEST_CASE("classifier op: gradients added now, one chunk of arena scratch, bad targets rejected", "[classifier]") {
  ul::Context c;
  ul::ContextGuard g(c);
  const int B = 2, T = 2048, N = B * T, C = 32, V = 5000, Vp = 5008;
  ul::Tensor x = c.tape.track(c.empty({B, T, C}));
  ul::Tensor w = c.tape.track(c.empty({Vp, C}));
  ul::Tensor tg = c.empty({B, T}, ul::DType::i32);
  auto xv = randn_f(size_t(N) * C, 7), wv = randn_f(size_t(Vp) * C, 8, 0.3f);
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  std::vector<int32_t> tv = random_targets(N, V, 9, 5);
  std::copy(tv.begin(), tv.end(), tg.i32());
  int64_t n_valid = 0;
  for (int t : tv) n_valid += t >= 0;

  // The kernel's result, to hold the op to.
  std::vector<float> rdx(xv.size(), 0.f), rdw(wv.size(), 0.f);
  CrossEntropyStats ref = ul::cpu::classifier_forward_backward<float>(rdx.data(), rdw.data(), xv.data(), wv.data(),
                                                                      tv.data(), N, C, V, 1.f / n_valid, 512);
  ul::Recording rec(true);
  float* dw = c.tape.gradf(w);
  dw[0] += 100.f;  // a pre-existing gradient is kept (+=)
  const size_t used0 = c.arena.used();
  c.arena.reset_high_water();
  CrossEntropyStats s = ul::classifier_cross_entropy(x, w, tg, V, 1.f / n_valid);
  const size_t growth = c.arena.high_water() - used0;
  const size_t full_logits = size_t(N) * V * sizeof(float);
  INFO("arena growth " << growth << " bytes; full logits " << full_logits << " bytes");
  CHECK(growth < full_logits / 2);
  CHECK(c.arena.used() == used0 + x.nbytes());  // only dx's slot stays; the scratch is released
  CHECK(c.tape.size() == 0);                    // terminal: no node pushed

  CHECK(s.n_valid == n_valid);
  CHECK(s.n_correct == ref.n_correct);
  CHECK(s.loss_sum == Approx(ref.loss_sum).epsilon(1e-5));
  const float* dx = static_cast<const float*>(c.tape.grad_if_any(x));
  REQUIRE(dx);
  CHECK(max_abs_diff(dx, rdx.data(), rdx.size()) < 1e-5 * max_abs(rdx.data(), rdx.size()));
  CHECK(dw[0] == Approx(100.f + rdw[0]).epsilon(1e-6));
  CHECK(max_abs_diff(dw + 1, rdw.data() + 1, rdw.size() - 1) < 1e-5 * max_abs(rdw.data(), rdw.size()));

  // Not recording: the loss only, no gradient touched.
  {
    ul::Recording off(false);
    const float dx0 = dx[0];
    CrossEntropyStats e = ul::classifier_cross_entropy(x, w, tg, V, 1.f);
    CHECK(e.loss_sum == Approx(s.loss_sum).epsilon(1e-6));
    CHECK(dx[0] == dx0);
  }

  // Bad targets name the value, its index and V.
  tg.i32()[17] = V;
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, tg, V, 1.f),
                    Catch::Contains("5000") && Catch::Contains("index 17") && Catch::Contains("V = 5000"));
  tg.i32()[17] = -2;
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, tg, V, 1.f), Catch::Contains("-2") && Catch::Contains("17"));
  tg.i32()[17] = -1;
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, tg, Vp + 1, 1.f), Catch::Contains("weight"));
}
