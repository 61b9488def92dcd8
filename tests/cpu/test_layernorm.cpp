#include "layers/layernorm.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("layernorm backward matches float64 central differences", "[layernorm]") {
  for (auto [N, C] : {std::pair{3, 8}, std::pair{5, 33}}) {
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
