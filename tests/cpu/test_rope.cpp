#include "layers/rope.h"

#include <cmath>
#include <tuple>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("rope backward matches float64 central differences", "[rope]") {
  for (auto [N, Hq, Hkv, D] : {std::tuple{3, 2, 1, 4}, std::tuple{5, 3, 1, 6}, std::tuple{2, 1, 1, 2},
                               std::tuple{4, 4, 2, 10}}) {
    const int H = Hq + 2 * Hkv;
    Vec x = randn(N * H * D, 81 + D);
    auto pos = rand_ints(N, 5000, 82 + D);
    gradcheck("rope", {&x},
        [&](Vec& y) { y.resize(x.size()); ul::cpu::rope_forward(y.data(), x.data(), pos.data(), N, Hq, Hkv, D, 10000.f); },
        [&](const Vec& dy, std::vector<Vec>& d) {
          ul::cpu::rope_backward(d[0].data(), dy.data(), pos.data(), N, Hq, Hkv, D, 10000.f);
        });
  }
}

TEST_CASE("rope pairs i with i + D/2 and uses freq_i = theta^(-2i/D)", "[rope]") {
  // One token, Hq = Hkv = 1, D = 4, theta = 100: freq = (1, 0.1). Position 3.
  // Heads: q = e0, k = e1, v = (1, 2, 3, 4).
  const Vec x = {1, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4};
  const std::vector<int32_t> pos = {3};
  Vec y(12);
  ul::cpu::rope_forward(y.data(), x.data(), pos.data(), 1, 1, 1, 4, 100.f);
  const double c0 = std::cos(3.0), s0 = std::sin(3.0), c1 = std::cos(0.3), s1 = std::sin(0.3);
  const Vec want = {c0, 0, s0, 0,    // e0 rotates into e2 at frequency 1
                    0, c1, 0, s1,    // e1 rotates into e3 at frequency 0.1
                    1, 2, 3, 4};     // v passes through
  for (int i = 0; i < 12; i++) CHECK(y[i] == Approx(want[i]).margin(1e-15));
}

TEST_CASE("rope by p then by -p gives back x, V heads are copied exactly", "[rope]") {
  const int N = 7, Hq = 4, Hkv = 2, D = 16, H = Hq + 2 * Hkv;
  Vec x = randn(N * H * D, 83), y(x.size()), z(x.size());
  auto pos = rand_ints(N, 100000, 84);
  std::vector<int32_t> neg(pos);
  for (auto& p : neg) p = -p;
  ul::cpu::rope_forward(y.data(), x.data(), pos.data(), N, Hq, Hkv, D, 10000.f);
  ul::cpu::rope_forward(z.data(), y.data(), neg.data(), N, Hq, Hkv, D, 10000.f);
  double worst = 0, moved = 0;
  for (size_t i = 0; i < x.size(); i++) {
    worst = std::max(worst, std::fabs(z[i] - x[i]));
    moved = std::max(moved, std::fabs(y[i] - x[i]));
  }
  CHECK(worst < 1e-12);
  CHECK(moved > 0.1);  // the rotation did something
  for (int n = 0; n < N; n++)
    for (int j = (Hq + Hkv) * D; j < H * D; j++) REQUIRE(y[n * H * D + j] == x[n * H * D + j]);
}

TEST_CASE("rope: a rotated q.k depends only on the relative position", "[rope]") {
  const int D = 32;
  Vec q = randn(D, 85), k = randn(D, 86);
  auto dot_at = [&](int32_t m, int32_t n) {
    // One token holding (q, k, v = k) at position m, another at position n; Hq = Hkv = 1.
    Vec a(3 * D), b(3 * D), ra(3 * D), rb(3 * D);
    for (int i = 0; i < D; i++) a[i] = b[i] = q[i], a[D + i] = b[D + i] = a[2 * D + i] = b[2 * D + i] = k[i];
    ul::cpu::rope_forward(ra.data(), a.data(), &m, 1, 1, 1, D, 10000.f);
    ul::cpu::rope_forward(rb.data(), b.data(), &n, 1, 1, 1, D, 10000.f);
    double s = 0;
    for (int i = 0; i < D; i++) s += ra[i] * rb[D + i];  // q at m, k at n
    return s;
  };
  const double d3 = dot_at(5, 2);
  CHECK(dot_at(105, 102) == Approx(d3).epsilon(1e-10));
  CHECK(dot_at(70003, 70000) == Approx(d3).epsilon(1e-9));
  CHECK(std::fabs(dot_at(5, 5) - d3) > 1e-3);  // a different offset gives a different score
}

TEST_CASE("rope in float keeps its angles accurate at large positions", "[rope]") {
  // An angle computed as float(pos) * float(freq) would be off by ~pos * 6e-8 = 0.03 rad here.
  const int N = 3, Hq = 1, Hkv = 1, D = 64, H = Hq + 2 * Hkv;
  const std::vector<int32_t> pos = {524287, 1000003, 2097151};
  Vec x = randn(N * H * D, 87), y(x.size());
  std::vector<float> xf(x.begin(), x.end()), yf(x.size());
  ul::cpu::rope_forward(y.data(), x.data(), pos.data(), N, Hq, Hkv, D, 500000.f);
  ul::cpu::rope_forward(yf.data(), xf.data(), pos.data(), N, Hq, Hkv, D, 500000.f);
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, std::fabs(double(yf[i]) - y[i]));
  CHECK(worst < 1e-5);
}

TEST_CASE("rope op: backward is the inverse rotation, added into dqkv", "[rope]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int B = 2, T = 3, Hq = 2, Hkv = 1, D = 8, H = Hq + 2 * Hkv, N = B * T, n = N * H * D;
  auto xv = randn_f(n, 88), dyv = randn_f(n, 89);
  ul::Tensor qkv = c.tape.track(c.empty({B, T, H, D}));
  std::copy(xv.begin(), xv.end(), qkv.f32());
  ul::Tensor pos = c.empty({B, T}, ul::DType::i32);
  for (int i = 0; i < N; i++) pos.i32()[i] = 1000 * (i % T) + i;
  ul::Tensor y = ul::rope(qkv, pos, Hq, Hkv, 10000.f);
  REQUIRE(y.requires_grad());
  REQUIRE(y.shape == qkv.shape);
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dx = c.tape.gradf(qkv);
  for (int i = 0; i < n; i++) dx[i] = 0.25f;  // pre-existing gradient must be kept (+=)
  c.tape.backward();
  // Rotating the gradient forward again undoes the inverse rotation: gives back dy (V: dy as is).
  std::vector<float> d(n), back(n);
  for (int i = 0; i < n; i++) d[i] = dx[i] - 0.25f;
  ul::cpu::rope_forward(back.data(), d.data(), pos.i32(), N, Hq, Hkv, D, 10000.f);
  CHECK(max_abs_diff(back.data(), dyv.data(), n) < 1e-5);
  for (int t = 0; t < N; t++)
    for (int j = (Hq + Hkv) * D; j < H * D; j++) CHECK(dx[t * H * D + j] == 0.25f + dyv[t * H * D + j]);
}

TEST_CASE("rope op rejects heads that do not add up and odd head dims", "[rope]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Tensor pos = c.zeros({1, 2}, ul::DType::i32);
  REQUIRE_THROWS_WITH(ul::rope(c.zeros({1, 2, 5, 4}), pos, 2, 2, 10000.f), Catch::Contains("Hq = 2, Hkv = 2"));
  REQUIRE_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 5}), pos, 2, 1, 10000.f), Catch::Contains("head dim must be even"));
  REQUIRE_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 4}), c.zeros({1, 3}, ul::DType::i32), 2, 1, 10000.f),
                      "rope positions: expected shape (1, 2), got (1, 3)");
}
