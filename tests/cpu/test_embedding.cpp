#include "layers/embedding.h"

#include <tuple>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("embedding backward matches float64 central differences", "[embedding]") {
  for (auto shape : {std::tuple{6, 5, 4, 3}, std::tuple{11, 3, 7, 9}, std::tuple{1, 1, 1, 1}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), V = std::get<1>(shape), maxT = std::get<2>(shape), C = std::get<3>(shape);
    auto idx = rand_ints(N, V, 61 + C), pos = rand_ints(N, maxT, 62 + C);  // V < N: ids repeat
    Vec wte = randn(V * C, 63), wpe = randn(maxT * C, 64);
    gradcheck("embedding", {&wte, &wpe},
        [&](Vec& y) { y.resize(N * C); ul::cpu::embedding_forward(y.data(), idx.data(), pos.data(), wte.data(), wpe.data(), N, C); },
        [&](const Vec& dy, std::vector<Vec>& d) {
          ul::cpu::embedding_backward(d[0].data(), d[1].data(), dy.data(), idx.data(), pos.data(), N, C);
        });
    // Without a position table (Llama): wpe and dwpe are nullptr, pos is not read.
    gradcheck("embedding, no wpe", {&wte},
        [&](Vec& y) { y.resize(N * C); ul::cpu::embedding_forward<double>(y.data(), idx.data(), nullptr, wte.data(), nullptr, N, C); },
        [&](const Vec& dy, std::vector<Vec>& d) {
          ul::cpu::embedding_backward<double>(d[0].data(), nullptr, dy.data(), idx.data(), nullptr, N, C);
        });
  }
}

TEST_CASE("embedding forward picks the rows of wte and wpe", "[embedding]") {
  const int N = 9, V = 4, maxT = 5, C = 3;
  auto idx = rand_ints(N, V, 65), pos = rand_ints(N, maxT, 66);
  Vec wte = randn(V * C, 67), wpe = randn(maxT * C, 68), y(N * C), y2(N * C);
  ul::cpu::embedding_forward(y.data(), idx.data(), pos.data(), wte.data(), wpe.data(), N, C);
  ul::cpu::embedding_forward<double>(y2.data(), idx.data(), nullptr, wte.data(), nullptr, N, C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      REQUIRE(y[n * C + c] == wte[idx[n] * C + c] + wpe[pos[n] * C + c]);
      REQUIRE(y2[n * C + c] == wte[idx[n] * C + c]);
    }
}

TEST_CASE("embedding backward is bitwise equal to an in-order serial sum", "[embedding]") {
  // Few vocabulary rows and many tokens: every row receives many adds, in float, where the order
  // of the sum changes the result. Several channel chunks (C > 64) so that threads split the work.
  const int N = 500, V = 3, maxT = 2, C = 200;
  auto idx = rand_ints(N, V, 69), pos = rand_ints(N, maxT, 70);
  auto dy = randn_f(N * C, 71);
  std::vector<float> dwte(V * C, 0.5f), dwpe(maxT * C, -0.5f), ref_te = dwte, ref_pe = dwpe;
  ul::cpu::embedding_backward(dwte.data(), dwpe.data(), dy.data(), idx.data(), pos.data(), N, C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      ref_te[idx[n] * C + c] += dy[n * C + c];
      ref_pe[pos[n] * C + c] += dy[n * C + c];
    }
  CHECK(max_abs_diff(dwte.data(), ref_te.data(), dwte.size()) == 0.0);
  CHECK(max_abs_diff(dwpe.data(), ref_pe.data(), dwpe.size()) == 0.0);
}

namespace {
ul::Tensor ids(ul::Context& c, std::vector<int32_t> v, int64_t B, int64_t T) {
  ul::Tensor t = c.empty({B, T}, ul::DType::i32);
  std::copy(v.begin(), v.end(), t.i32());
  return t;
}
}  // namespace

TEST_CASE("embedding op: backward accumulates into wte and wpe", "[embedding]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int B = 2, T = 3, V = 4, maxT = 3, C = 5, N = B * T;
  ul::Tensor idx = ids(c, {1, 1, 3, 0, 1, 2}, B, T), pos = ids(c, {0, 1, 2, 0, 1, 2}, B, T);
  auto tev = randn_f(V * C, 72), pev = randn_f(maxT * C, 73), dyv = randn_f(N * C, 74);
  ul::Tensor wte = c.tape.track(c.empty({V, C})), wpe = c.tape.track(c.empty({maxT, C}));
  std::copy(tev.begin(), tev.end(), wte.f32());
  std::copy(pev.begin(), pev.end(), wpe.f32());
  ul::Tensor y = ul::embedding(idx, pos, wte, wpe);
  REQUIRE(y.shape == ul::Shape{B, T, C});
  REQUIRE(y.requires_grad());
  CHECK(!idx.requires_grad());
  std::copy(dyv.begin(), dyv.end(), c.tape.gradf(y));
  float* dte = c.tape.gradf(wte);
  float* dpe = c.tape.gradf(wpe);
  for (int i = 0; i < V * C; i++) dte[i] = 1.f;  // pre-existing gradient (a tied classifier's) must be kept
  c.tape.backward();
  const int32_t* iv = idx.i32();
  const int32_t* pv = pos.i32();
  for (int v = 0; v < V; v++)
    for (int ch = 0; ch < C; ch++) {
      float want = 1.f;
      for (int n = 0; n < N; n++) want += iv[n] == v ? dyv[n * C + ch] : 0.f;
      CHECK(dte[v * C + ch] == Approx(want));
    }
  for (int p = 0; p < maxT; p++)
    for (int ch = 0; ch < C; ch++) {
      float want = 0.f;
      for (int n = 0; n < N; n++) want += pv[n] == p ? dyv[n * C + ch] : 0.f;
      CHECK(dpe[p * C + ch] == Approx(want));
    }
}

TEST_CASE("embedding op without wpe adds no position term", "[embedding]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Recording rec(true);
  const int B = 1, T = 4, V = 3, C = 2;
  ul::Tensor idx = ids(c, {2, 0, 2, 1}, B, T), pos = ids(c, {0, 1, 2, 3}, B, T);
  ul::Tensor wte = c.tape.track(c.empty({V, C}));
  for (int i = 0; i < V * C; i++) wte.f32()[i] = float(i);
  ul::Tensor y = ul::embedding(idx, pos, wte, ul::Tensor{});
  const float want[] = {4, 5, 0, 1, 4, 5, 2, 3};
  for (int i = 0; i < B * T * C; i++) CHECK(y.f32()[i] == want[i]);
  float* dy = c.tape.gradf(y);
  for (int i = 0; i < B * T * C; i++) dy[i] = 1.f;
  const float* dte = c.tape.gradf(wte);  // slots are dropped by backward(); the buffer stays
  c.tape.backward();
  const float dwant[] = {1, 1, 1, 1, 2, 2};
  for (int i = 0; i < V * C; i++) CHECK(dte[i] == dwant[i]);
}

TEST_CASE("embedding op names an out-of-range token id or position", "[embedding]") {
  ul::Context c;
  ul::ContextGuard g(c);
  ul::Tensor wte = c.zeros({50304, 2}), wpe = c.zeros({8, 2});
  std::vector<int32_t> v(16, 7), p(16, 3);
  v[12] = 70000;
  REQUIRE_THROWS_WITH(ul::embedding(ids(c, v, 2, 8), ids(c, p, 2, 8), wte, wpe),
                      "embedding: token id 70000 at index 12 is outside the vocabulary [0, 50304)");
  v[12] = 7;
  v[3] = -1;
  REQUIRE_THROWS_WITH(ul::embedding(ids(c, v, 2, 8), ids(c, p, 2, 8), wte, wpe),
                      "embedding: token id -1 at index 3 is outside the vocabulary [0, 50304)");
  v[3] = 7;
  p[9] = 8;
  REQUIRE_THROWS_WITH(ul::embedding(ids(c, v, 2, 8), ids(c, p, 2, 8), wte, wpe),
                      "embedding: position 8 at index 9 is outside the position table [0, 8)");
  CHECK_NOTHROW(ul::embedding(ids(c, v, 2, 8), ids(c, p, 2, 8), wte, ul::Tensor{}));  // no table: no limit
  REQUIRE_THROWS_WITH(ul::embedding(c.zeros({2, 8}), ids(c, p, 2, 8), wte, wpe),
                      "embedding token ids: expected i32, got f32");
}
