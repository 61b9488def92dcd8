#include "layers/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("rmsnorm backward matches float64 central differences", "[rmsnorm]") {
  for (auto shape : {std::pair{3, 8}, std::pair{5, 33}, std::pair{7, 1}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), C = std::get<1>(shape);
    Vec x = randn(N * C, 1), w = randn(C, 2), rrms(N);
    gradcheck("rmsnorm", {&x, &w},
        [&](Vec& y) { y.resize(N * C); ul::cpu::rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C); },
        [&](const Vec& dy, std::vector<Vec>& d) {
          Vec y(N * C);
          ul::cpu::rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C);
          ul::cpu::rmsnorm_backward(d[0].data(), d[1].data(), dy.data(), x.data(), w.data(), rrms.data(), N, C);
        });
  }
}

TEST_CASE("rmsnorm forward matches a hand loop", "[rmsnorm]") {
  const int N = 6, C = 37;
  Vec x = randn(N * C, 4, 3.0), w = randn(C, 5);
  Vec y(N * C), rrms(N);
  ul::cpu::rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), yf(N * C), rf(N);
  ul::cpu::rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), N, C);
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c] / C;
    const double r = 1.0 / std::sqrt(ms + 1e-5);
    CHECK(rrms[n] == Approx(r).epsilon(1e-12));
    for (int c = 0; c < C; c++) {
      const double want = x[n * C + c] * r * w[c];
      CHECK(y[n * C + c] == Approx(want).epsilon(1e-12).margin(1e-12));
      CHECK(yf[n * C + c] == Approx(want).epsilon(1e-5).margin(1e-5));
    }
  }
  // With w = 1 each output row has root-mean-square 1 (up to eps).
  Vec ones(C, 1.0);
  ul::cpu::rmsnorm_forward(y.data(), rrms.data(), x.data(), ones.data(), N, C);
  double ms = 0;
  for (int c = 0; c < C; c++) ms += y[c] * y[c] / C;
  CHECK(std::sqrt(ms) == Approx(1.0).epsilon(1e-4));
}

TEST_CASE("rmsnorm normalises a row whose float sum of squares overflows, its gradients too", "[rmsnorm]") {
  // |x| = 3e17 at C = 4096: sum x^2 = 3.7e38 > FLT_MAX. r was 0, so y, dx and dw were silently 0
  // and a run blowing up went on at loss log V instead of stopping on a non-finite loss.
  const int N = 1, C = 4096;
  std::vector<float> x(C), w(C, 1.f), y(C), dy(C, 1.f), dx(C, 0.f), dw(C, 0.f), r(N);
  for (int c = 0; c < C; c++) x[size_t(c)] = c % 2 ? 3e17f : -3e17f;
  ul::cpu::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C);
  CHECK(r[0] == Approx(1.0 / 3e17).epsilon(1e-6));
  for (int c = 0; c < C; c += 1001) CHECK(y[size_t(c)] == Approx(c % 2 ? 1.0 : -1.0).epsilon(1e-5));
  ul::cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
  CHECK(dw[0] == Approx(-1.0).epsilon(1e-5));  // dy x r
  CHECK(dw[1] == Approx(1.0).epsilon(1e-5));
  // dx = r (dy w - x r^2 mean(dy w x)); mean(dy w x) = 0 for alternating signs: dx = r.
  CHECK(dx[0] == Approx(1.0 / 3e17).epsilon(1e-5));
  // A row of one sign at 2e19, so mean(dy w x) is not 0: r ~ 4e-20, and r^2 is below the smallest
  // normal float (0 where subnormals flush): dx lost its projection term, its sign wrong. Against
  // float64.
  for (int c = 0; c < C; c++) x[size_t(c)] = 2e19f * (1 + 0.1f * float(c % 7));
  std::fill(dx.begin(), dx.end(), 0.f), std::fill(dw.begin(), dw.end(), 0.f);
  ul::cpu::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C);
  ul::cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C);
  double ss = 0, gx = 0;
  for (int c = 0; c < C; c++) ss += double(x[size_t(c)]) * x[size_t(c)], gx += double(x[size_t(c)]);
  const double rr = 1 / std::sqrt(ss / C + 1e-5), k = rr * rr * gx / C;
  for (int c = 0; c < C; c += 511) {
    CAPTURE(c);
    CHECK(dx[size_t(c)] == Approx(rr * (1 - x[size_t(c)] * k)).epsilon(1e-4));
  }
}

TEST_CASE("rmsnorm op records a backward that accumulates", "[rmsnorm]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int N = 4, C = 16;
  auto xv = randn_f(N * C, 7), wv = randn_f(C, 8), dyv = randn_f(N * C, 9);
  ul::Tensor x = c.tape.track(c.empty({2, 2, C})), w = c.tape.track(c.empty({C}));
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  ul::Tensor y = ul::rmsnorm(x, w);
  REQUIRE(y.requires_grad());
  REQUIRE(y.shape == x.shape);
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dx = c.tape.gradf(x);
  float* dw = c.tape.gradf(w);
  for (int i = 0; i < N * C; i++) dx[i] = 2.f;   // pre-existing gradients must be kept (+=)
  for (int i = 0; i < C; i++) dw[i] = -3.f;
  c.tape.backward();

  // The same backward run into zeroed buffers, for reference.
  std::vector<float> yr(N * C), rr(N), dx0(N * C, 0.f), dw0(C, 0.f);
  ul::cpu::rmsnorm_forward(yr.data(), rr.data(), xv.data(), wv.data(), N, C);
  ul::cpu::rmsnorm_backward(dx0.data(), dw0.data(), dyv.data(), xv.data(), wv.data(), rr.data(), N, C);
  for (int i = 0; i < N * C; i++) CHECK(dx[i] == Approx(2.f + dx0[i]));
  for (int i = 0; i < C; i++) CHECK(dw[i] == Approx(-3.f + dw0[i]));
}

TEST_CASE("rmsnorm op rejects a weight of the wrong size", "[rmsnorm]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Tensor x = c.zeros({3, 8}), w = c.zeros({7});
  REQUIRE_THROWS_WITH(ul::rmsnorm(x, w), "rmsnorm weight: expected shape (8), got (7)");
}
