#include "layers/residual.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("residual backward matches float64 central differences", "[residual]") {
  for (int n : {1, 13, 100}) {
    Vec a = randn(n, 51 + n), b = randn(n, 52 + n);
    gradcheck("residual", {&a, &b},
        [&](Vec& y) { y.resize(n); ul::cpu::residual_forward(y.data(), a.data(), b.data(), n); },
        [&](const Vec& dy, std::vector<Vec>& d) { ul::cpu::residual_backward(d[0].data(), d[1].data(), dy.data(), n); });
  }
}

TEST_CASE("residual forward is the elementwise sum", "[residual]") {
  const int n = 1000;
  Vec a = randn(n, 53), b = randn(n, 54), y(n, -7.0);
  ul::cpu::residual_forward(y.data(), a.data(), b.data(), n);
  for (int i = 0; i < n; i++) REQUIRE(y[i] == a[i] + b[i]);
}

TEST_CASE("residual add op: both gradients accumulate, and x + x counts x twice", "[residual]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int n = 2 * 3 * 4;
  auto av = randn_f(n, 55), bv = randn_f(n, 56), dyv = randn_f(n, 57);
  ul::Tensor a = c.tape.track(c.empty({2, 3, 4})), b = c.tape.track(c.empty({2, 3, 4}));
  std::copy(av.begin(), av.end(), a.f32());
  std::copy(bv.begin(), bv.end(), b.f32());
  ul::Tensor y = ul::add(a, b);
  ul::Tensor z = ul::add(y, y);  // fan-out: y feeds both operands
  REQUIRE(z.requires_grad());
  for (int i = 0; i < n; i++) CHECK(z.f32()[i] == 2 * (av[i] + bv[i]));
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(z));
  float* da = c.tape.gradf(a);
  float* db = c.tape.gradf(b);
  for (int i = 0; i < n; i++) da[i] = 10.f;  // pre-existing gradient must be kept (+=)
  c.tape.backward();
  for (int i = 0; i < n; i++) {
    CHECK(da[i] == Approx(10.f + 2 * dyv[i]));
    CHECK(db[i] == Approx(2 * dyv[i]));
  }
}

TEST_CASE("residual add op rejects operands of different shapes", "[residual]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Tensor a = c.zeros({2, 3}), b = c.zeros({3, 2});
  REQUIRE_THROWS_WITH(ul::add(a, b), "add: operands must have the same shape, got (2, 3) and (3, 2)");
}
