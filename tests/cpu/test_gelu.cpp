#include "layers/gelu.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("gelu backward matches float64 central differences", "[gelu]") {
  for (int n : {1, 7, 64, 301}) {
    Vec x = randn(n, 11 + n, 2.5);
    gradcheck("gelu", {&x},
        [&](Vec& y) { y.resize(n); ul::cpu::gelu_forward(y.data(), x.data(), n); },
        [&](const Vec& dy, std::vector<Vec>& d) { ul::cpu::gelu_backward(d[0].data(), dy.data(), x.data(), n); });
  }
}

TEST_CASE("gelu forward hits known values of the tanh approximation", "[gelu]") {
  // Reference values of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed independently.
  // gelu(1) differs from the exact (erf) GELU, 0.8413447, by 1.5e-4: this pins the approximation.
  const Vec x = {0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 10.0, -10.0};
  const Vec want = {0.0, 0.8411919906082768, -0.15880800939172324, 0.34571400982514394,
                    1.954597694087775, -0.0036373920817729943, 10.0, 0.0};
  Vec y(x.size());
  ul::cpu::gelu_forward(y.data(), x.data(), int64_t(x.size()));
  std::vector<float> xf(x.begin(), x.end()), yf(x.size());
  ul::cpu::gelu_forward(yf.data(), xf.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); i++) {
    INFO("x = " << x[i]);
    CHECK(y[i] == Approx(want[i]).epsilon(1e-14).margin(1e-14));
    CHECK(yf[i] == Approx(want[i]).epsilon(1e-6).margin(1e-6));
  }
  // Slopes: 1/2 at 0, 1 far right, 0 far left.
  const Vec xs = {0.0, 10.0, -10.0}, ones(3, 1.0);
  Vec d(3, 0.0);
  ul::cpu::gelu_backward(d.data(), ones.data(), xs.data(), 3);
  CHECK(d[0] == Approx(0.5).epsilon(1e-14));
  CHECK(d[1] == Approx(1.0).epsilon(1e-12));
  CHECK(d[2] == Approx(0.0).margin(1e-12));
}

TEST_CASE("gelu op records a backward that accumulates", "[gelu]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int n = 2 * 3 * 5;
  auto xv = randn_f(n, 21, 2.f), dyv = randn_f(n, 22);
  ul::Tensor x = c.tape.track(c.empty({2, 3, 5}));
  std::copy(xv.begin(), xv.end(), x.f32());
  ul::Tensor y = ul::gelu(x);
  REQUIRE(y.requires_grad());
  REQUIRE(y.shape == x.shape);
  std::vector<float> yr(n), dx0(n, 0.f);
  ul::cpu::gelu_forward(yr.data(), xv.data(), n);
  CHECK(max_abs_diff(y.f32(), yr.data(), n) == 0.0);
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dx = c.tape.gradf(x);
  for (int i = 0; i < n; i++) dx[i] = 1.5f;  // pre-existing gradient must be kept (+=)
  c.tape.backward();
  ul::cpu::gelu_backward(dx0.data(), dyv.data(), xv.data(), n);
  for (int i = 0; i < n; i++) CHECK(dx[i] == Approx(1.5f + dx0[i]));
}

TEST_CASE("gelu op records nothing when no input needs a gradient", "[gelu]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  ul::Tensor x = c.zeros({4});
  ul::Tensor y = ul::gelu(x);
  CHECK(!y.requires_grad());
  CHECK(c.tape.size() == 0);
}
