#include "layers/swiglu.h"

#include <cmath>
#include <limits>
#include <vector>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("swiglu backward matches float64 central differences", "[swiglu]") {
  for (auto shape : {std::pair{3, 4}, std::pair{5, 7}, std::pair{1, 1}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), F = std::get<1>(shape);
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

// The float kernels (vectorized, layers/cpu_exp.h) against the double ones (libm), forward and
// backward, gates from -100 to 100, and F = 37 so rows end in the loops' scalar remainder. The
// sigmoid of a float gate is good to a few ulp of its own (exp's relative error is |g| times the
// gate's rounding, 2^-24); where it falls below the smallest normal float (g < -87.3) the float
// sigmoid is 0 (subnormals flush to zero, engine/float_env.h; past g < -88 exp(-g) overflows too),
// so each output may be off by its other factors times FLT_MIN.
TEST_CASE("float swiglu matches the double kernels from -100 to 100", "[swiglu]") {
  const int N = 50, F = 37;
  std::vector<double> xd(size_t(N) * 2 * F), dyd(size_t(N) * F);
  for (size_t i = 0; i < xd.size(); i++) xd[i] = -100.0 + 200.0 * double((i * 7919) % xd.size()) / xd.size();
  for (size_t i = 0; i < dyd.size(); i++) dyd[i] = std::cos(0.3 * double(i));
  std::vector<float> xf(xd.begin(), xd.end()), dyf(dyd.begin(), dyd.end());
  std::vector<double> xr(xf.begin(), xf.end()), dyr(dyf.begin(), dyf.end());  // what float sees
  std::vector<double> yd(size_t(N) * F), dxd(xd.size(), 0.0);
  std::vector<float> yf(size_t(N) * F), dxf(xd.size(), 0.f);
  ul::cpu::swiglu_forward(yd.data(), xr.data(), N, F);
  ul::cpu::swiglu_backward(dxd.data(), dyr.data(), xr.data(), N, F);
  ul::cpu::swiglu_forward(yf.data(), xf.data(), N, F);
  ul::cpu::swiglu_backward(dxf.data(), dyf.data(), xf.data(), N, F);
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const size_t gi = size_t(n) * 2 * F + f, ui = gi + F, yi = size_t(n) * F + f;
      const double g = xr[gi], u = xr[ui], s = 1 / (1 + std::exp(-g)), rel = 1e-6 * (1 + std::fabs(g));
      const double tiny = std::numeric_limits<float>::min();  // a sigmoid below it is 0 in float
      INFO("gate " << g << ", up " << u);
      REQUIRE(std::isfinite(yf[yi]));
      CHECK(std::fabs(yf[yi] - yd[yi]) <= rel * std::fabs(yd[yi]) + std::fabs(g * u) * tiny);
      // dgate = dy u s (1 + g (1 - s)): a difference of its terms for negative g.
      const double terms = std::fabs(dyr[yi] * u) * s * (1 + std::fabs(g) * (1 - s));
      CHECK(std::fabs(dxf[gi] - dxd[gi]) <= rel * terms + std::fabs(dyr[yi] * u) * (1 + std::fabs(g)) * tiny);
      CHECK(std::fabs(dxf[ui] - dxd[ui]) <= rel * std::fabs(dxd[ui]) + std::fabs(dyr[yi] * g) * tiny);
    }
}
