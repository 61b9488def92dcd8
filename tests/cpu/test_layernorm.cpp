#include "layers/layernorm.h"

#include <omp.h>

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

TEST_CASE("layernorm op records a backward that accumulates", "[layernorm]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int N = 4, C = 16;
  auto xv = randn_f(N * C, 7), wv = randn_f(C, 8), bv = randn_f(C, 9);
  ul::Tensor x = c.tape.track(c.empty({N, C})), w = c.tape.track(c.empty({C})), b = c.tape.track(c.empty({C}));
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  std::copy(bv.begin(), bv.end(), b.f32());
  ul::Tensor y = ul::layernorm(x, w, b);
  REQUIRE(y.requires_grad());
  float* dy = c.tape.gradf(y);
  for (int i = 0; i < N * C; i++) dy[i] = 1.f;
  float* db = c.tape.gradf(b);
  db[0] = 100.f;  // pre-existing gradient must be kept (+=)
  c.tape.backward();
  CHECK(db[0] == Approx(100.f + N));
  CHECK(db[1] == Approx(float(N)));
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
  for (int threads : {2, 3, 4, 4, 4, 7}) CHECK(run(threads) == one);
  omp_set_num_threads(1);
}
