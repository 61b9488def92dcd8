#include "layers/linear.h"

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("linear backward matches float64 central differences", "[linear]") {
  // Odd sizes, so no GEMM panel or vector width divides them.
  for (auto shape : {std::tuple{3, 5, 7}, std::tuple{17, 13, 11}, std::tuple{1, 33, 2}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), C = std::get<1>(shape), OC = std::get<2>(shape);
    Vec x = randn(size_t(N) * C, 1), w = randn(size_t(OC) * C, 2), b = randn(OC, 3);
    SECTION("with bias " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC)) {
      gradcheck("linear", {&x, &w, &b},
          [&](Vec& y) { y.resize(size_t(N) * OC); ul::cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC); },
          [&](const Vec& dy, std::vector<Vec>& d) {
            ul::cpu::linear_backward(d[0].data(), d[1].data(), d[2].data(), dy.data(), x.data(), w.data(), N, C, OC);
          });
    }
    SECTION("without bias " + std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC)) {
      gradcheck("linear (no bias)", {&x, &w},
          [&](Vec& y) { y.resize(size_t(N) * OC); ul::cpu::linear_forward(y.data(), x.data(), w.data(), (const double*)nullptr, N, C, OC); },
          [&](const Vec& dy, std::vector<Vec>& d) {
            ul::cpu::linear_backward(d[0].data(), d[1].data(), (double*)nullptr, dy.data(), x.data(), w.data(), N, C, OC);
          });
    }
  }
}

TEST_CASE("linear float forward and backward match naive loops", "[linear]") {
  // Large enough that the GEMMs are blocked and split across threads (at a column boundary that is
  // not a multiple of 16 for OC and C); the wide shapes cross the 4096-column chunks the CPU GEMM
  // multiplies a block in (forward's y for OC = 9001, the backward's dx and dw for C = 8209).
  for (auto shape : {std::tuple{67, 131, 1031}, std::tuple{5, 37, 9001}, std::tuple{3, 8209, 5}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), C = std::get<1>(shape), OC = std::get<2>(shape);
    SECTION(std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC)) {
      auto x = randn_f(size_t(N) * C, 4), w = randn_f(size_t(OC) * C, 5), b = randn_f(OC, 6), dy = randn_f(size_t(N) * OC, 7);
      std::vector<float> y(size_t(N) * OC, NAN);  // poisoned: every element must be written
      ul::cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
      std::vector<float> ref(size_t(N) * OC);
      for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
          double s = b[o];
          for (int c = 0; c < C; c++) s += double(x[size_t(n) * C + c]) * w[size_t(o) * C + c];
          ref[size_t(n) * OC + o] = float(s);
        }
      CHECK(max_abs_diff(y.data(), ref.data(), y.size()) < 1e-4 * max_abs(ref.data(), ref.size()));

      // Gradients start non-zero: the backward must add, not overwrite.
      std::vector<float> dx(size_t(N) * C, 1.f), dw(size_t(OC) * C, 1.f), db(OC, 1.f);
      ul::cpu::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
      std::vector<float> rdx(dx.size()), rdw(dw.size()), rdb(db.size());
      for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
          double s = 1;
          for (int o = 0; o < OC; o++) s += double(dy[size_t(n) * OC + o]) * w[size_t(o) * C + c];
          rdx[size_t(n) * C + c] = float(s);
        }
      for (int o = 0; o < OC; o++) {
        double sb = 1;
        for (int n = 0; n < N; n++) sb += dy[size_t(n) * OC + o];
        rdb[o] = float(sb);
        for (int c = 0; c < C; c++) {
          double s = 1;
          for (int n = 0; n < N; n++) s += double(dy[size_t(n) * OC + o]) * x[size_t(n) * C + c];
          rdw[size_t(o) * C + c] = float(s);
        }
      }
      CHECK(max_abs_diff(dx.data(), rdx.data(), dx.size()) < 1e-4 * max_abs(rdx.data(), rdx.size()));
      CHECK(max_abs_diff(dw.data(), rdw.data(), dw.size()) < 1e-4 * max_abs(rdw.data(), rdw.size()));
      CHECK(max_abs_diff(db.data(), rdb.data(), db.size()) < 1e-4 * max_abs(rdb.data(), rdb.size()));
    }
  }
}

TEST_CASE("linear op: (B, T, C) input, backward accumulates only the wanted gradients", "[linear]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int B = 2, T = 3, C = 5, OC = 4;
  auto xv = randn_f(B * T * C, 8), wv = randn_f(OC * C, 9), bv = randn_f(OC, 10);
  ul::Tensor x = c.tape.track(c.empty({B, T, C}));
  ul::Tensor w = c.tape.track(c.empty({OC, C}));
  ul::Tensor b = c.empty({OC});  // no gradient wanted for the bias
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  std::copy(bv.begin(), bv.end(), b.f32());
  ul::Tensor y = ul::linear(x, w, b);
  REQUIRE(y.shape == ul::Shape({B, T, OC}));
  REQUIRE(y.requires_grad());
  // y[1, 2, 3] against the definition
  double s = bv[3];
  for (int k = 0; k < C; k++) s += double(xv[(1 * T + 2) * C + k]) * wv[3 * C + k];
  CHECK(y.f32()[(1 * T + 2) * OC + 3] == Approx(s).epsilon(1e-5));

  float* dy = c.tape.gradf(y);
  for (int i = 0; i < B * T * OC; i++) dy[i] = 1.f;
  float* dw = c.tape.gradf(w);
  dw[0] = 100.f;  // a pre-existing gradient is kept (+=)
  float* dx = c.tape.gradf(x);  // taken now: backward() drops the activation slots, not their memory
  c.tape.backward();
  double sx = 0;  // dw[0, 0] = 100 + sum_n x[n, 0]
  for (int n = 0; n < B * T; n++) sx += xv[n * C];
  CHECK(dw[0] == Approx(100.0 + sx).epsilon(1e-5));
  double sw = 0;  // dx[n, 0] = sum_o w[o, 0] for every row n
  for (int o = 0; o < OC; o++) sw += wv[o * C];
  CHECK(dx[4 * C] == Approx(sw).epsilon(1e-5));

  // Without a bias, and rejecting a weight of the wrong width.
  ul::Tensor y2 = ul::linear(x, w, ul::Tensor());
  CHECK(y2.f32()[(1 * T + 2) * OC + 3] == Approx(s - bv[3]).epsilon(1e-5));
  CHECK_THROWS_WITH(ul::linear(x, c.empty({OC, C + 1}), b), Catch::Contains("linear"));
}
