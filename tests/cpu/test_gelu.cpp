#include "layers/gelu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/context.h"
#include "layers/cpu_exp.h"
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

// The float kernels' exp (layers/cpu_exp.h) against libm's double exp, in units of the float's last
// place: at most 2 over [-87, 88], and what it does beyond.
TEST_CASE("gelu's float exp (the CPU kernels') is within 2 ulp of exp over [-87, 88]", "[gelu][exp]") {
  double worst = 0;
  float worst_z = 0;
  for (int i = 0; i <= 2000000; i++) {
    const float z = -87.f + 175.f * float(i) / 2000000.f;
    const double want = std::exp(double(z));
    const float got = ul::cpu::exp_simd(z);
    // In double: the float difference of neighbours near 2^-126 is a subnormal, 0 under the
    // flush every test (and train) runs with (engine/float_env.h).
    const double ulp = std::ldexp(1.0, std::ilogb(float(want)) - 23);
    const double err = std::fabs(double(got) - want) / ulp;
    if (err > worst) worst = err, worst_z = z;
  }
  INFO("worst " << worst << " ulp at z = " << worst_z);
  CHECK(worst <= 2.0);
  CHECK(ul::cpu::exp_simd(0.f) == 1.f);
  CHECK(std::isinf(ul::cpu::exp_simd(88.5f)));  // overflows, as exp does
  CHECK(std::isnan(ul::cpu::exp_simd(std::nanf(""))));  // NaN propagates (and converts no NaN to an int)
  CHECK(std::isinf(ul::cpu::exp_simd(INFINITY)));
  CHECK(ul::cpu::exp_simd(-200.f) == ul::cpu::exp_simd(-87.f));  // held at the smallest normal result
  CHECK(ul::cpu::exp_simd(-INFINITY) > 0.f);
}

// float GELU (vectorized, exp_simd) against the double kernels (libm), forward and backward,
// from the far tails through 0; and the vectorized loop body against its scalar remainder, bit for
// bit, since the split between them moves with the length and the thread count. The tolerance is
// the problem's condition: u = k (x + a x^3) is rounded to float before exp(-2 u), and exp turns
// that rounding (relative 2^-24 of u) into a relative error of about 2 |u| 2^-24 of its result.
// (The former float kernel, 0.5 x (1 + tanhf(u)), lost digits to the cancellation in 1 + tanhf(u):
// relative error 4.5e-4 at x = -4, 0.3 at x = -5, and it returned 0 from about -5.3 on, where
// tanhf(u) rounds to -1. These checks fail it from x = -3.)
TEST_CASE("float gelu matches the double kernels and does not depend on where the loop splits", "[gelu]") {
  const int n = 4001;
  std::vector<double> xd(n), dyd(n);
  for (int i = 0; i < n; i++) {
    xd[i] = -20.0 + 40.0 * i / (n - 1);
    dyd[i] = std::cos(0.37 * i);
  }
  xd[0] = -1e4, xd[n - 1] = 1e4;
  std::vector<float> xf(xd.begin(), xd.end()), dyf(dyd.begin(), dyd.end());
  std::vector<double> xr(xf.begin(), xf.end()), dyr(dyf.begin(), dyf.end());  // what float sees
  std::vector<double> yd(n), dxd(n, 0.0);
  std::vector<float> yf(n), dxf(n, 0.f);
  ul::cpu::gelu_forward(yd.data(), xr.data(), n);
  ul::cpu::gelu_backward(dxd.data(), dyr.data(), xr.data(), n);
  ul::cpu::gelu_forward(yf.data(), xf.data(), n);
  ul::cpu::gelu_backward(dxf.data(), dyf.data(), xf.data(), n);
  for (int i = 0; i < n; i++) {
    INFO("x = " << xf[i]);
    REQUIRE(std::isfinite(yf[i]));
    REQUIRE(std::isfinite(dxf[i]));
    const double u = 0.7978845608028654 * (xr[i] + 0.044715 * xr[i] * xr[i] * xr[i]);
    const double rel = 1e-6 * (1 + 2 * std::fabs(u));
    // The slope s + 2 x s (1 - s) k (1 + 3 a x^2) is a difference near x = -0.75 (GELU's minimum):
    // its error scales with its two terms, not with their sum.
    const double s = 1 / (1 + std::exp(-2 * u)), x = xr[i];
    const double terms = s + std::fabs(2 * x * s * (1 - s) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x));
    // Where exp(-2 u) overflows (u < -44) the float sigmoid is 0 and the double one under 6e-39;
    // the slope multiplies it by at most a few hundred there before it vanishes: 1e-35 absolute.
    CHECK(std::fabs(yf[i] - yd[i]) <= rel * std::fabs(yd[i]) + 1e-35);
    CHECK(std::fabs(dxf[i] - dxd[i]) <= rel * terms * std::fabs(dyr[i]) + 1e-35);
  }
  for (int i = 0; i < n; i++) {
    float y1, dx1 = 0.f;
    ul::cpu::gelu_forward(&y1, &xf[i], 1);
    ul::cpu::gelu_backward(&dx1, &dyf[i], &xf[i], 1);
    INFO("x = " << xf[i]);
    REQUIRE(std::memcmp(&y1, &yf[i], 4) == 0);
    REQUIRE(std::memcmp(&dx1, &dxf[i], 4) == 0);
  }
}
