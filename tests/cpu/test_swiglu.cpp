#include "layers/swiglu.h"

#include <cmath>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("swiglu backward matches float64 central differences", "[swiglu]") {
  for (auto [N, F] : {std::pair{3, 4}, std::pair{5, 7}, std::pair{1, 1}}) {
    Vec x = randn(N * 2 * F, 31 + F, 2.0);
    gradcheck("swiglu", {&x},
        [&](Vec& y) { y.resize(N * F); ul::cpu::swiglu_forward(y.data(), x.data(), N, F); },
        [&](const Vec& dy, std::vector<Vec>& d) { ul::cpu::swiglu_backward(d[0].data(), dy.data(), x.data(), N, F); });
  }
}

TEST_CASE("swiglu forward is silu(gate) * up with rows laid out [gate | up]", "[swiglu]") {
  // One row, F = 4: gate = (0, 1, 30, -30), up = (5, 2, 3, 4).
  const Vec x = {0.0, 1.0, 30.0, -30.0, 5.0, 2.0, 3.0, 4.0};
  Vec y(4);
  ul::cpu::swiglu_forward(y.data(), x.data(), 1, 4);
  CHECK(y[0] == 0.0);                                               // silu(0) = 0
  CHECK(y[1] == Approx(2.0 / (1.0 + std::exp(-1.0))).epsilon(1e-14));  // silu(1) * 2 = 1.4621...
  CHECK(y[1] == Approx(1.4621171572600098).epsilon(1e-14));
  CHECK(y[2] == Approx(90.0).epsilon(1e-12));                         // silu(g) -> g for large g
  CHECK(y[3] == Approx(0.0).margin(1e-10));                           // silu(g) -> 0 for very negative g
  // Several rows: each row reads its own gate and up.
  const int N = 3, F = 5;
  Vec xs = randn(N * 2 * F, 33), ys(N * F);
  ul::cpu::swiglu_forward(ys.data(), xs.data(), N, F);
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const double g = xs[n * 2 * F + f], u = xs[n * 2 * F + F + f];
      CHECK(ys[n * F + f] == Approx(g / (1.0 + std::exp(-g)) * u).epsilon(1e-13).margin(1e-15));
    }
}

TEST_CASE("swiglu op halves the last dim and its backward accumulates", "[swiglu]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int N = 6, F = 5;
  auto xv = randn_f(N * 2 * F, 41), dyv = randn_f(N * F, 42);
  ul::Tensor x = c.tape.track(c.empty({2, 3, 2 * F}));
  std::copy(xv.begin(), xv.end(), x.f32());
  ul::Tensor y = ul::swiglu(x);
  REQUIRE(y.requires_grad());
  REQUIRE(y.shape == ul::Shape{2, 3, F});
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dx = c.tape.gradf(x);
  for (int i = 0; i < N * 2 * F; i++) dx[i] = -1.f;  // pre-existing gradient must be kept (+=)
  c.tape.backward();
  std::vector<float> dx0(N * 2 * F, 0.f);
  ul::cpu::swiglu_backward(dx0.data(), dyv.data(), xv.data(), N, F);
  for (int i = 0; i < N * 2 * F; i++) CHECK(dx[i] == Approx(-1.f + dx0[i]));
}

TEST_CASE("swiglu op rejects an odd last dim", "[swiglu]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Tensor x = c.zeros({2, 7});
  REQUIRE_THROWS_WITH(ul::swiglu(x), Catch::Contains("odd size 7"));
}
