#include "layers/layernorm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "engine/optimizer.h"
#include "layers/rmsnorm.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("layernorm backward matches float64 central differences", "[layernorm]") {
  for (auto shape : {std::pair{3, 8}, std::pair{5, 33}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), C = std::get<1>(shape);
    Vec x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3);
    Vec mean(N), rstd(N);
    gradcheck("layernorm", {&x, &w, &b},
        [&](Vec& y) { y.resize(N * C); ul::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C); },
        [&](const Vec& dy, std::vector<Vec>& d) {
          Vec y(N * C);
          ul::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
          ul::cpu::layernorm_backward(d[0].data(), d[1].data(), d[2].data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
        });
  }
}

TEST_CASE("layernorm forward matches a hand loop", "[layernorm]") {
  // The definition, in double: mean, the biased variance (over C, not C - 1), eps 1e-5 inside the
  // square root; the kernel's mean and rstd are what the backward reads.
  const int N = 6, C = 37;
  Vec x = randn(N * C, 4, 3.0), w = randn(C, 5), b = randn(C, 6);
  for (int c = 0; c < C; c++) x[c] += 10.0;  // a row far from zero mean
  Vec y(N * C), mean(N), rstd(N);
  ul::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end()), yf(N * C), mf(N), rf(N);
  ul::cpu::layernorm_forward(yf.data(), mf.data(), rf.data(), xf.data(), wf.data(), bf.data(), N, C);
  for (int n = 0; n < N; n++) {
    double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c] / C;
    for (int c = 0; c < C; c++) var += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double r = 1.0 / std::sqrt(var + 1e-5);
    CHECK(mean[n] == Approx(m).epsilon(1e-12));
    CHECK(rstd[n] == Approx(r).epsilon(1e-12));
    CHECK(mf[n] == Approx(m).epsilon(1e-6).margin(1e-6));
    CHECK(rf[n] == Approx(r).epsilon(1e-5));
    for (int c = 0; c < C; c++) {
      const double want = (x[n * C + c] - m) * r * w[c] + b[c];
      CHECK(y[n * C + c] == Approx(want).epsilon(1e-12).margin(1e-12));
      CHECK(yf[n * C + c] == Approx(want).epsilon(1e-5).margin(1e-5));
    }
  }
}

TEST_CASE("layernorm forward keeps its precision on rows far from zero mean", "[layernorm]") {
  // A float mean summed in float is off by about C ulps of the offset, and every output moves by
  // that error times rstd: a constant row near 12345.6 gave outputs near 1 (exactly 0 is right),
  // a row near 1000 with spread 0.1 was 8e-3 off. Against the definition in double, on the same
  // float inputs.
  const int C = 768;
  struct Row { double offset, spread; };
  for (Row r : {Row{12345.6, 0.0}, Row{100.1, 0.0}, Row{1000.0, 0.1}, Row{50.0, 0.01}}) {
    INFO("offset " << r.offset << " spread " << r.spread);
    Vec z = randn(C, 7);
    std::vector<float> x(C), w(C, 1.f), b(C, 0.f), y(C);
    for (int c = 0; c < C; c++) x[c] = float(r.offset + r.spread * z[c]);
    float mean = 0, rstd = 0;
    ul::cpu::layernorm_forward(y.data(), &mean, &rstd, x.data(), w.data(), b.data(), 1, C);
    double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += double(x[c]) / C;
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m) / C;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    double err = 0;
    for (int c = 0; c < C; c++) err = max_err(err, std::fabs(y[c] - (x[c] - m) * s));
    // The mean itself is a float: half an ulp of the offset times rstd is what is left.
    CHECK(err <= 1e-6 + 0.5 * std::ldexp(1.0, std::ilogb(r.offset) - 23) * s * 1.01);
  }
}

TEST_CASE("layernorm op records a backward that accumulates", "[layernorm]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int N = 4, C = 16;
  auto xv = randn_f(N * C, 7), wv = randn_f(C, 8), bv = randn_f(C, 9), dyv = randn_f(N * C, 10);
  ul::Tensor x = c.tape.track(c.empty({N, C})), w = c.tape.track(c.empty({C})), b = c.tape.track(c.empty({C}));
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  std::copy(bv.begin(), bv.end(), b.f32());
  ul::Tensor y = ul::layernorm(x, w, b);
  REQUIRE(y.requires_grad());
  REQUIRE(y.shape == x.shape);
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dx = c.tape.gradf(x);
  float* dw = c.tape.gradf(w);
  float* db = c.tape.gradf(b);
  for (int i = 0; i < N * C; i++) dx[i] = 2.f;  // pre-existing gradients must be kept (+=)
  for (int i = 0; i < C; i++) dw[i] = -3.f, db[i] = 100.f;
  const std::vector<float> out(y.f32(), y.f32() + N * C);
  c.tape.backward();

  // The kernels run into zeroed buffers, for reference (their own definition: the tests above).
  std::vector<float> yr(N * C), mr(N), rr(N), dx0(N * C, 0.f), dw0(C, 0.f), db0(C, 0.f);
  ul::cpu::layernorm_forward(yr.data(), mr.data(), rr.data(), xv.data(), wv.data(), bv.data(), N, C);
  ul::cpu::layernorm_backward(dx0.data(), dw0.data(), db0.data(), dyv.data(), xv.data(), wv.data(), mr.data(), rr.data(),
                              N, C);
  CHECK(out == yr);
  for (int i = 0; i < N * C; i++) CHECK(dx[i] == Approx(2.f + dx0[i]));
  for (int i = 0; i < C; i++) {
    CHECK(dw[i] == Approx(-3.f + dw0[i]));
    CHECK(db[i] == Approx(100.f + db0[i]));
  }
  CHECK(std::any_of(dw0.begin(), dw0.end(), [](float v) { return std::fabs(v) > 0.1f; }));
}

// The weight gradients are sums over rows, the gradient norm a sum over the buffer: added in an
// order fixed by the sizes alone (layers/row_sums.h), so a step is the same bits whatever the
// thread count or timing (per-thread partials once arrived in whatever order the threads finished).
TEST_CASE("norm weight gradients and the gradient norm are the same bits at any thread count", "[layernorm][rmsnorm]") {
  const int N = 1000, C = 48;
  const std::vector<float> x = randn_f(N * C, 1), w = randn_f(C, 2), b = randn_f(C, 3), dy = randn_f(N * C, 4);
  struct Grads {
    std::vector<float> dx, dw, db, rdx, rdw;
    double norm = 0;
    bool operator==(const Grads& o) const {
      return dx == o.dx && dw == o.dw && db == o.db && rdx == o.rdx && rdw == o.rdw && norm == o.norm;
    }
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Grads g;
    std::vector<float> y(N * C), mean(N), rstd(N), rrms(N);
    ul::cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    g.dx.assign(N * C, 0.f), g.dw.assign(C, 0.f), g.db.assign(C, 0.f);
    ul::cpu::layernorm_backward(g.dx.data(), g.dw.data(), g.db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C);
    ul::cpu::rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C, 1e-5);
    g.rdx.assign(N * C, 0.f), g.rdw.assign(C, 0.f);
    ul::cpu::rmsnorm_backward(g.rdx.data(), g.rdw.data(), dy.data(), x.data(), w.data(), rrms.data(), N, C);
    std::vector<float> big(300000);
    for (size_t i = 0; i < big.size(); i++) big[i] = dy[i % dy.size()] * float(1 + i % 7);
    g.norm = ul::cpu::sum_squares(big.data(), big.size());
    return g;
  };
  const Grads one = run(1);
  // And the norm is the sum it says, against a double loop over the same buffer.
  double want = 0;
  for (size_t i = 0; i < 300000; i++) {
    const double v = double(dy[i % dy.size()] * float(1 + i % 7));
    want += v * v;
  }
  CHECK(one.norm == Approx(want).epsilon(1e-12));
  for (int threads : {2, 3, 4, 4, 4, 7}) CHECK(run(threads) == one);
  omp_set_num_threads(1);
}
