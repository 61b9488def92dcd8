#include "layers/rope.h"

#include <cmath>
#include <tuple>

#include "engine/context.h"
#include "gradcheck.h"

using namespace ul_test;

TEST_CASE("rope backward matches float64 central differences", "[rope]") {
  for (auto shape : {std::tuple{3, 2, 1, 4}, std::tuple{5, 3, 1, 6}, std::tuple{2, 1, 1, 2},
                     std::tuple{4, 4, 2, 10}}) {
    // named copies: a lambda may not capture a structured binding in C++17 (clang refuses)
    const int N = std::get<0>(shape), Hq = std::get<1>(shape), Hkv = std::get<2>(shape), D = std::get<3>(shape);
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
    worst = ul_test::max_err(worst, std::fabs(z[i] - x[i]));
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
  // Against the rotation written out here in double (the op's own double version shares its angle
  // and frequency code: a frequency table rounded to float, 0.09 rad off at 4M, passed that).
  Vec x = randn(N * H * D, 87);
  std::vector<float> xf(x.begin(), x.end()), yf(x.size());
  ul::cpu::rope_forward(yf.data(), xf.data(), pos.data(), N, Hq, Hkv, D, 500000.f);
  double worst = 0;
  for (int n = 0; n < N; n++)
    for (int h = 0; h < Hq + Hkv; h++)  // q and k rotated (v is copied)
      for (int i = 0; i < D / 2; i++) {
        const double a = double(pos[size_t(n)]) * std::pow(500000.0, -2.0 * i / D), c = std::cos(a), sn = std::sin(a);
        const size_t at = (size_t(n) * H + size_t(h)) * D + size_t(i);
        const double x1 = double(xf[at]), x2 = double(xf[at + D / 2]);
        worst = ul_test::max_err(worst, std::fabs(double(yf[at]) - (x1 * c - x2 * sn)));
        worst = ul_test::max_err(worst, std::fabs(double(yf[at + D / 2]) - (x2 * c + x1 * sn)));
      }
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

TEST_CASE("rope scaling: llama3 frequencies match transformers, linear turns p as p / factor", "[rope]") {
  // transformers 5.24's ROPE_INIT_FUNCTIONS["llama3"] for head dim 64, rope_theta 500000, factor 32,
  // low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192 (Llama 3.2 1B's
  // RoPE): its float32 inv_freq at these pairs. Pairs 0-10 are kept (short waves), 18-31 divided
  // by 32 (long waves), 14-17 in the smooth band between.
  ul::Rope r(500000.f);
  r.scaling = ul::parse_rope_scaling("llama3:factor=32,low=1,high=4,orig=8192");
  const std::pair<int, double> hf[] = {
      {0, 1.0}, {5, 0.12868738174438477}, {10, 0.016560440883040428}, {14, 0.0032114461064338684},
      {15, 0.0012905480107292533}, {16, 0.000429556705057621}, {17, 9.708286233944818e-05},
      {18, 1.9461638657958247e-05}, {20, 8.570255886297673e-06}, {25, 1.1028836297555245e-06},
      {31, 9.418306490260875e-08}};
  for (const auto& p : hf) {
    CAPTURE(p.first);
    CHECK(ul::rope_freq(p.first, 64, r) == Approx(p.second).epsilon(2e-6));  // theirs is float32
  }
  // Without scaling, the plain rule; the smooth band lies strictly between its two neighbours' rules.
  const ul::Rope plain(500000.f);
  CHECK(ul::rope_freq(5, 64, r) == ul::rope_freq(5, 64, plain));
  CHECK(ul::rope_freq(20, 64, r) == Approx(ul::rope_freq(20, 64, plain) / 32).epsilon(1e-15));
  CHECK(ul::rope_freq(15, 64, r) < ul::rope_freq(15, 64, plain));
  CHECK(ul::rope_freq(15, 64, r) > ul::rope_freq(15, 64, plain) / 32);

  // linear: position p with factor 4 is rotated exactly as position p / 4 unscaled.
  ul::Rope lin(10000.f);
  lin.scaling = ul::parse_rope_scaling("linear:factor=4");
  const int N = 3, Hq = 2, Hkv = 1, D = 8, H = Hq + 2 * Hkv;
  const Vec x = randn(N * H * D, 7);
  const std::vector<int32_t> p = {0, 40, 1000}, p4 = {0, 10, 250};
  Vec a(x.size()), b(x.size());
  ul::cpu::rope_forward(a.data(), x.data(), p.data(), N, Hq, Hkv, D, lin);
  ul::cpu::rope_forward(b.data(), x.data(), p4.data(), N, Hq, Hkv, D, ul::Rope(10000.f));
  for (size_t i = 0; i < a.size(); i++) CHECK(a[i] == Approx(b[i]).margin(1e-12));
  // And the scaled backward is still the exact inverse: central differences agree.
  gradcheck("rope llama3", {const_cast<Vec*>(&x)},
      [&](Vec& y) { y.resize(x.size()); ul::cpu::rope_forward(y.data(), x.data(), p.data(), N, Hq, Hkv, D, r); },
      [&](const Vec& dy, std::vector<Vec>& d) { ul::cpu::rope_backward(d[0].data(), dy.data(), p.data(), N, Hq, Hkv, D, r); });
}

TEST_CASE("rope scaling: yarn frequencies and attention factor match transformers", "[rope]") {
  // transformers 5.24's ROPE_INIT_FUNCTIONS["yarn"]: its float32 inv_freq and its attention factor.
  // 1. Qwen 2.5's long-context setting: head dim 128, rope_theta 1e6, factor 4, original context
  //    32768, beta_fast 32 / beta_slow 1 (defaults), truncate (default). Pairs 0-16 kept, 40-63 / 4.
  ul::Rope q(1e6f);
  q.scaling = ul::parse_rope_scaling("yarn:factor=4,orig=32768");
  CHECK(q.scaling.attention_factor == Approx(1.138629436111989).epsilon(1e-7));
  const std::pair<int, double> qwen[] = {
      {0, 1.0}, {5, 0.33982083201408386}, {10, 0.11547820270061493}, {16, 0.03162277862429619},
      {17, 0.025482967495918274}, {18, 0.02053525112569332}, {20, 0.01333521492779255},
      {25, 0.004131738096475601}, {30, 0.0010643609566614032}, {35, 0.0002462583943270147},
      {40, 4.4456985051510856e-05}, {63, 3.102344408034696e-07}};
  for (const auto& p : qwen) {
    CAPTURE(p.first);
    CHECK(ul::rope_freq(p.first, 128, q) == Approx(p.second).epsilon(2e-6));  // theirs is float32
  }
  // 2. Every pair of head dim 64, theta 1e4, factor 8, original 512, beta_fast 16, beta_slow 2,
  //    truncate false (the ramp's ends fall between pairs).
  ul::Rope y(10000.f);
  y.scaling = ul::parse_rope_scaling("yarn:factor=8,orig=512,beta_fast=16,beta_slow=2,truncate=0");
  CHECK(y.scaling.attention_factor == Approx(1.2079441541679836).epsilon(1e-7));
  const double hf[32] = {
      1.0, 0.7498942017555237, 0.5623413324356079, 0.4216965138912201, 0.3162277638912201, 0.23713736236095428,
      0.1704140305519104, 0.11164195090532303, 0.07160846143960953, 0.04461664706468582, 0.026647143065929413,
      0.014875289984047413, 0.007324998266994953, 0.0029642169829458, 0.002222849288955331, 0.0016669018659740686,
      0.0012499999720603228, 0.0009373677894473076, 0.0007029266562312841, 0.0005271206027828157,
      0.00039528473280370235, 0.00029642172739841044, 0.00022228492889553308, 0.00016669018077664077,
      0.0001250000059371814, 9.373677312396467e-05, 7.029266271274537e-05, 5.271206100587733e-05,
      3.9528473280370235e-05, 2.9642173103638925e-05, 2.2228492525755428e-05, 1.666901880525984e-05};
  for (int i = 0; i < 32; i++) {
    CAPTURE(i);
    CHECK(ul::rope_freq(i, 64, y) == Approx(hf[i]).epsilon(2e-6));
  }

  // The attention factor scales the rotated q and k heads (their norms), never v; the backward is
  // still the exact transpose (central differences).
  const int N = 3, Hq = 2, Hkv = 1, D = 8, H = Hq + 2 * Hkv;
  const Vec x = randn(N * H * D, 9);
  const std::vector<int32_t> p = {0, 77, 4000};
  Vec out(x.size());
  ul::cpu::rope_forward(out.data(), x.data(), p.data(), N, Hq, Hkv, D, y);
  const double m = y.scaling.attention_factor;
  for (int t = 0; t < N; t++)
    for (int h = 0; h < H; h++) {
      double nx = 0, ny = 0;
      for (int j = 0; j < D; j++) {
        const size_t k = (size_t(t) * H + h) * D + j;
        nx += x[k] * x[k], ny += out[k] * out[k];
      }
      CAPTURE(t, h);
      CHECK(std::sqrt(ny) == Approx((h < Hq + Hkv ? m : 1.0) * std::sqrt(nx)).epsilon(1e-6));
    }
  gradcheck("rope yarn", {const_cast<Vec*>(&x)},
      [&](Vec& o) { o.resize(x.size()); ul::cpu::rope_forward(o.data(), x.data(), p.data(), N, Hq, Hkv, D, y); },
      [&](const Vec& dy, std::vector<Vec>& d) { ul::cpu::rope_backward(d[0].data(), dy.data(), p.data(), N, Hq, Hkv, D, y); });
}

TEST_CASE("rope scaling specs: parsed, printed back, and refused naming the problem", "[rope]") {
  for (const char* s : {"none", "linear:factor=2.5", "llama3:factor=32,low=1,high=4,orig=8192",
                        "llama3:factor=8,low=2,high=16,orig=4096",
                        "yarn:factor=4,orig=32768,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1",
                        "yarn:factor=40,orig=4096,beta_fast=16,beta_slow=0.5,attn=0.707,truncate=0"})
    CHECK(ul::rope_scaling_str(ul::parse_rope_scaling(s)) == s);
  CHECK(ul::parse_rope_scaling("llama3:factor=8").original_max_pos == 8192);  // defaults: Llama 3.1's
  // yarn's defaults: beta 32 / 1, truncate, attention factor 0.1 ln(factor) + 1 (1 when factor <= 1).
  CHECK(ul::rope_scaling_str(ul::parse_rope_scaling("yarn:factor=4,orig=32768")) ==
        "yarn:factor=4,orig=32768,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1");
  CHECK(ul::parse_rope_scaling("yarn:factor=0.5,orig=64").attention_factor == 1.0f);
  const std::pair<const char*, const char*> bad[] = {
      {"dynamic:factor=2", "unknown kind 'dynamic'"}, {"linear", "factor=F is required"},
      {"yarn:factor=2", "yarn needs orig=N"},        {"yarn:factor=2,orig=64,beta_fast=1,beta_slow=2", "0 < beta_slow < beta_fast"},
      {"yarn:factor=2,orig=64,attn=0", "attention_factor > 0"}, {"yarn:factor=2,orig=64,truncate=2", "truncate must be 0 or 1"},
      {"llama3:factor=2,beta_fast=8", "unknown key 'beta_fast' for llama3"},
      {"linear:factor=0", "factor must be > 0"},     {"linear:factor=x", "'x' is not a decimal number"},
      // Decimal as written, as the flags' numbers (strtod took hex and a blank); a float setting
      // past a float's range is said so (it was "must be > 0" for 1e40); orig a count of positions.
      {"linear:factor=0x10", "factor: '0x10' is not a decimal number"},
      {"llama3:factor=8,high= 4", "high: ' 4' is not a decimal number"},
      {"linear:factor=1e40", "factor: 1e40 is outside a float's range"},
      {"linear:factor=1e-50", "factor: 1e-50 is outside a float's range"},
      {"yarn:factor=2,orig=64,attn=1e-50", "attn: 1e-50 is outside a float's range"},
      {"llama3:factor=8,orig=8.192e3", "orig: '8.192e3' is not a whole number of positions in [1, 2^31)"},
      {"yarn:factor=2,orig=2147483648", "orig: '2147483648' is not a whole number"},
      {"linear:low=1,factor=2", "unknown key 'low'"}, {"llama3:factor=8,low=4,high=4", "0 < low_freq_factor < high_freq_factor"},
      {"llama3:factor=8,orig=0.5", "orig: '0.5' is not a whole number"},  {"none:factor=2", "none takes no settings"},
      {"llama3:factor", "not key=value"},          {"linear:factor=2,factor=3", "factor is given twice"}};
  for (const auto& b : bad) {
    CAPTURE(b.first);
    CHECK_THROWS_WITH(ul::parse_rope_scaling(b.first), Catch::Contains("--rope-scaling '" + std::string(b.first) + "'") &&
                                                          Catch::Contains(b.second));
  }
  // As config.json's reader allows it (up to 2^31 - 1; 1e9 once, so a model that loaded from a
  // config.json and was exported could not load again), and a file's spec named by the file.
  CHECK(ul::parse_rope_scaling("yarn:factor=2,orig=1500000000").original_max_pos == 1500000000);
  CHECK_THROWS_WITH(ul::parse_rope_scaling("linear:factor=0", "m.safetensors: __metadata__ rope_scaling"),
                    Catch::Contains("m.safetensors: __metadata__ rope_scaling 'linear:factor=0': ") &&
                        !Catch::Contains("--rope-scaling"));
}
