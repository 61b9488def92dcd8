// RMSNorm, GELU, SwiGLU and the residual add: the CUDA kernels and the ops on Device::cuda against
// the CPU backend. Written only against the CUDA runtime API and the engine, so the same cases run
// emulated (tests/emu, in CI) and on a real GPU (tests/gpu); the including file picks the tag.
//   - outputs are poisoned (NaN) before each kernel, so an element it fails to write fails;
//   - gradients start from random values, so a kernel that overwrites instead of adding fails;
//   - rmsnorm shapes: C below, at and above a warp and not a multiple of 32, N not a multiple of
//     the 8 rows a block handles, several row chunks in the dw reduction; its dw (f32 for bf16
//     too) is held to f32 accuracy and must be bitwise the same on a second run;
//   - elementwise sizes: below, at and above one 16-byte pack (4 f32, 8 bf16) and not multiples
//     of it, on 16-byte aligned buffers (the vector path plus its scalar tail) and on buffers one
//     element off alignment (the scalar path);
//   - f32 is held to 1e-5 relative (plus 1e-6 absolute where a result can cancel to ~0), bf16 to
//     its output rounding: 2^-8 relative, on bf16-representable inputs.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "emu/cuda_op_cases.h"
#include "layers/gelu.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/swiglu.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including pointwise_cuda_cases.h"
#endif

namespace pw_cases {

using namespace op_cases;

// ---- RMSNorm ------------------------------------------------------------------------------------

const std::pair<int, int> kNormShapes[] = {{1, 1}, {3, 32}, {7, 33}, {13, 100}, {9, 768}, {257, 48}, {300, 5}};

template <class T>
void check_rmsnorm(int N, int C) {
  const double rel = rel_tol<T>();
  INFO(type_name<T>() << " N=" << N << " C=" << C);
  const size_t NC = size_t(N) * C;
  const std::vector<float> x = inputs<T>(NC, 21 + N, 2.f), w = inputs<T>(C, 22 + C), dy = inputs<T>(NC, 23 + N),
                           dx0 = inputs<T>(NC, 24), dw0 = randn_f(C, 25);

  std::vector<float> y_ref(NC), rrms_ref(N), dx_ref = dx0, dw_ref = dw0;
  ul::cpu::rmsnorm_forward(y_ref.data(), rrms_ref.data(), x.data(), w.data(), N, C);
  ul::cpu::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(), rrms_ref.data(), N, C);

  DeviceBuffer<T> d_x(NC), d_w(C), d_y(NC), d_dy(NC), d_dx(NC);
  DeviceBuffer<float> d_rrms(N), d_dw(C);
  DeviceBuffer<float> scratch(ul::cuda::rmsnorm_backward_scratch_bytes(N, C) / sizeof(float));
  d_x.set(to_elem<T>(x));
  d_w.set(to_elem<T>(w));
  ul::cuda::rmsnorm_forward(d_y.p, d_rrms.p, d_x.p, d_w.p, N, C, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, is_bf16<T>() ? 1e-4 : 1e-6);
  expect_close("rrms", d_rrms.get(), rrms_ref, 1e-5, 0);

  // Backward from the reference rrms, so that it is checked on its own.
  d_rrms.set(rrms_ref);
  d_dy.set(to_elem<T>(dy));
  auto run_backward = [&] {
    d_dx.set(to_elem<T>(dx0));
    d_dw.set(dw0);
    ul::cuda::rmsnorm_backward(d_dx.p, d_dw.p, d_dy.p, d_x.p, d_w.p, d_rrms.p, scratch.p, N, C, nullptr);
  };
  run_backward();
  const std::vector<float> dw1 = d_dw.get();
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, 1e-5 * std::max(1.0, max_abs(dx_ref)));
  // f32 sums of the same products in another order, whatever T: no bf16 rounding allowed here.
  expect_close("dw", dw1, dw_ref, 1e-5, 1e-5 * std::max(1.0, max_abs(dw_ref)));
  // dw is reduced in a fixed order: a second run gives the same bits.
  run_backward();
  const std::vector<float> dw2 = d_dw.get();
  CHECK(std::memcmp(dw1.data(), dw2.data(), C * sizeof(float)) == 0);
}

// ---- elementwise: GELU, SwiGLU, residual --------------------------------------------------------

const int kSizes[] = {1, 3, 4, 7, 8, 9, 33, 100, 1027, 4099};

// GELU forward and backward on n elements; offset 1 puts every buffer off 16-byte alignment.
template <class T>
void check_gelu(int n, int offset) {
  const double rel = rel_tol<T>();
  INFO(type_name<T>() << " n=" << n << " offset=" << offset);
  const std::vector<float> x = inputs<T>(n, 31 + n, 2.f), dy = inputs<T>(n, 32 + n), dx0 = inputs<T>(n, 33);
  std::vector<float> y_ref(n), dx_ref = dx0;
  ul::cpu::gelu_forward(y_ref.data(), x.data(), n);
  ul::cpu::gelu_backward(dx_ref.data(), dy.data(), x.data(), n);

  OffsetBuffer<T> d_x(n, offset), d_y(n, offset), d_dy(n, offset), d_dx(n, offset);
  d_x.set(to_elem<T>(x));
  d_dy.set(to_elem<T>(dy));
  d_dx.set(to_elem<T>(dx0));
  ul::cuda::gelu_forward(d_y.p, d_x.p, n, nullptr);
  ul::cuda::gelu_backward(d_dx.p, d_dy.p, d_x.p, n, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, 1e-6);
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, 1e-5);
  // The first writer (accumulate false) never reads dx: NaN before, the CPU's dx from zeros after.
  std::vector<float> dx_first(n, 0.f);
  ul::cpu::gelu_backward(dx_first.data(), dy.data(), x.data(), n);
  d_dx.set(to_elem<T>(std::vector<float>(n, NAN)));
  ul::cuda::gelu_backward(d_dx.p, d_dy.p, d_x.p, n, nullptr, /*accumulate=*/false);
  expect_close("dx, first writer", to_f32(d_dx.get()), dx_first, rel, 1e-5);
}

// The far left tail, x from -4 to -12, relative to the CPU's: GELU there is 1e-4 down to 1e-30,
// and a kernel computing 0.5 x (1 + tanh(u)) loses it to cancellation (0.3 relative at x = -5, and
// 0 from -5.3 on) where both backends' x sigmoid(2 u) keep it (f32; 1e-4 leaves room for __expf's
// error, which grows with its argument; 1e-35 absolute for where one backend's exp overflows a
// little before the other's: the sigmoid is then 0 against at most 6e-39).
inline void check_gelu_tail() {
  const int n = 801;
  std::vector<float> x(n), dy(n, 1.f), y_ref(n), dx_ref(n, 0.f);
  for (int i = 0; i < n; i++) x[i] = -4.f - 8.f * float(i) / float(n - 1);
  ul::cpu::gelu_forward(y_ref.data(), x.data(), n);
  ul::cpu::gelu_backward(dx_ref.data(), dy.data(), x.data(), n);
  DeviceBuffer<float> d_x(n), d_y(n), d_dy(n), d_dx(n);
  d_x.set(x);
  d_dy.set(dy);
  d_dx.set(std::vector<float>(n, 0.f));
  ul::cuda::gelu_forward(d_y.p, d_x.p, n, nullptr);
  ul::cuda::gelu_backward(d_dx.p, d_dy.p, d_x.p, n, nullptr);
  expect_close("y (tail)", d_y.get(), y_ref, 1e-4, 1e-35);
  expect_close("dx (tail)", d_dx.get(), dx_ref, 1e-4, 1e-35);
}

// SwiGLU forward and backward on x: (N, 2F); offset as for GELU.
template <class T>
void check_swiglu(int N, int F, int offset) {
  const double rel = rel_tol<T>();
  INFO(type_name<T>() << " N=" << N << " F=" << F << " offset=" << offset);
  const size_t NX = size_t(N) * 2 * F, NY = size_t(N) * F;
  const std::vector<float> x = inputs<T>(NX, 41 + N, 2.f), dy = inputs<T>(NY, 42 + F), dx0 = inputs<T>(NX, 43);
  std::vector<float> y_ref(NY), dx_ref = dx0;
  ul::cpu::swiglu_forward(y_ref.data(), x.data(), N, F);
  ul::cpu::swiglu_backward(dx_ref.data(), dy.data(), x.data(), N, F);

  OffsetBuffer<T> d_x(NX, offset), d_y(NY, offset), d_dy(NY, offset), d_dx(NX, offset);
  d_x.set(to_elem<T>(x));
  d_dy.set(to_elem<T>(dy));
  d_dx.set(to_elem<T>(dx0));
  ul::cuda::swiglu_forward(d_y.p, d_x.p, N, F, nullptr);
  ul::cuda::swiglu_backward(d_dx.p, d_dy.p, d_x.p, N, F, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, 1e-6);
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, 1e-5);
  // The first writer (accumulate false) never reads dx: NaN before, the CPU's dx from zeros after.
  std::vector<float> dx_first(NX, 0.f);
  ul::cpu::swiglu_backward(dx_first.data(), dy.data(), x.data(), N, F);
  d_dx.set(to_elem<T>(std::vector<float>(NX, NAN)));
  ul::cuda::swiglu_backward(d_dx.p, d_dy.p, d_x.p, N, F, nullptr, /*accumulate=*/false);
  expect_close("dx, first writer", to_f32(d_dx.get()), dx_first, rel, 1e-5);
}

// Residual forward, and backward into two buffers and into one (y = x + x); offset as for GELU.
template <class T>
void check_residual(int n, int offset) {
  const double rel = rel_tol<T>();
  INFO(type_name<T>() << " n=" << n << " offset=" << offset);
  const std::vector<float> a = inputs<T>(n, 51 + n), b = inputs<T>(n, 52 + n), dy = inputs<T>(n, 53),
                           da0 = inputs<T>(n, 54), db0 = inputs<T>(n, 55);
  std::vector<float> y_ref(n), da_ref = da0, db_ref = db0, dx_ref = da0;
  ul::cpu::residual_forward(y_ref.data(), a.data(), b.data(), n);
  ul::cpu::residual_backward(da_ref.data(), db_ref.data(), dy.data(), n);
  ul::cpu::residual_backward(dx_ref.data(), dx_ref.data(), dy.data(), n);
  if (is_bf16<T>())  // a bf16 buffer is rounded after each of its two additions
    for (int i = 0; i < n; i++) dx_ref[i] = round_bf16(round_bf16(da0[i] + dy[i]) + dy[i]);

  OffsetBuffer<T> d_a(n, offset), d_b(n, offset), d_y(n, offset), d_dy(n, offset), d_da(n, offset), d_db(n, offset);
  d_a.set(to_elem<T>(a));
  d_b.set(to_elem<T>(b));
  d_dy.set(to_elem<T>(dy));
  d_da.set(to_elem<T>(da0));
  d_db.set(to_elem<T>(db0));
  ul::cuda::residual_forward(d_y.p, d_a.p, d_b.p, n, nullptr);
  ul::cuda::residual_backward(d_da.p, d_db.p, d_dy.p, n, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, 1e-6);
  expect_close("da", to_f32(d_da.get()), da_ref, rel, 1e-6);
  expect_close("db", to_f32(d_db.get()), db_ref, rel, 1e-6);
  // One buffer for both: it must get dy twice.
  d_da.set(to_elem<T>(da0));
  ul::cuda::residual_backward(d_da.p, d_da.p, d_dy.p, n, nullptr);
  expect_close("dx (da == db)", to_f32(d_da.get()), dx_ref, rel, 1e-6);

  // First writers (not accumulated) never read their buffer: NaN before, 0 + dy after; a first
  // writer beside an adding one; and one buffer whose first writer is da (db then adds: 2 dy).
  const std::vector<float> nan(n, NAN);
  std::vector<float> dy_once(n), dy_twice(n);
  for (int i = 0; i < n; i++) {
    dy_once[i] = 0.f + dy[i];
    dy_twice[i] = is_bf16<T>() ? round_bf16(round_bf16(0.f + dy[i]) + dy[i]) : (0.f + dy[i]) + dy[i];
  }
  d_da.set(to_elem<T>(nan));
  d_db.set(to_elem<T>(nan));
  ul::cuda::residual_backward(d_da.p, d_db.p, d_dy.p, n, nullptr, false, false);
  expect_close("da, first writer", to_f32(d_da.get()), dy_once, rel, 1e-6);
  expect_close("db, first writer", to_f32(d_db.get()), dy_once, rel, 1e-6);
  d_da.set(to_elem<T>(da0));
  d_db.set(to_elem<T>(nan));
  ul::cuda::residual_backward(d_da.p, d_db.p, d_dy.p, n, nullptr, true, false);
  expect_close("da, adding beside a first writer", to_f32(d_da.get()), da_ref, rel, 1e-6);
  expect_close("db, first writer beside an adding one", to_f32(d_db.get()), dy_once, rel, 1e-6);
  d_da.set(to_elem<T>(nan));
  ul::cuda::residual_backward(d_da.p, d_da.p, d_dy.p, n, nullptr, false, true);
  expect_close("dx (da == db), da its first writer", to_f32(d_da.get()), dy_twice, rel, 1e-6);
}

}  // namespace pw_cases

TEST_CASE("rmsnorm CUDA kernels match the CPU backend", UL_CUDA_TEST_TAG "[rmsnorm]") {
  for (auto [N, C] : pw_cases::kNormShapes) {
    pw_cases::check_rmsnorm<float>(N, C);
    pw_cases::check_rmsnorm<__nv_bfloat16>(N, C);
  }
}

TEST_CASE("rmsnorm CUDA forward normalises a row whose float sum of squares overflows, as the CPU op",
          UL_CUDA_TEST_TAG "[rmsnorm]") {
  // |x| ~ 3e17 at C = 4096: the float sum of squares is inf, and rsqrt(inf) = 0 made the row's
  // output (and its gradients) silently 0.
  using namespace pw_cases;
  const int N = 2, C = 4096;
  std::vector<float> x(size_t(N) * C), w(C, 1.f), y_ref(x.size()), rrms_ref(N);
  for (size_t i = 0; i < x.size(); i++) x[i] = (i % 2 ? 3e17f : -3e17f) * (i < size_t(C) ? 1.f : 1e-17f);
  ul::cpu::rmsnorm_forward(y_ref.data(), rrms_ref.data(), x.data(), w.data(), N, C);
  REQUIRE(y_ref[0] == Approx(-1.0).epsilon(1e-5));  // the CPU's: each |y| = 1 (x / rms(x))
  DeviceBuffer<float> d_x(x.size()), d_w(C), d_y(x.size()), d_rrms(N);
  d_x.set(x);
  d_w.set(w);
  ul::cuda::rmsnorm_forward(d_y.p, d_rrms.p, d_x.p, d_w.p, N, C, nullptr);
  expect_close("y", d_y.get(), y_ref, 1e-5, 0);
  expect_close("rrms", d_rrms.get(), rrms_ref, 1e-5, 0);
  // The backward of a row of one sign at 2e19: r^2 is below the smallest normal float, and dx
  // lost its projection term (r times the mean first, as the CPU op, keeps it).
  for (size_t i = 0; i < size_t(C); i++) x[i] = 2e19f * (1 + 0.1f * float(i % 7));
  ul::cpu::rmsnorm_forward(y_ref.data(), rrms_ref.data(), x.data(), w.data(), N, C);
  std::vector<float> dy(x.size(), 1.f), dx_ref(x.size(), 0.f), dw_ref(C, 0.f);
  ul::cpu::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(), rrms_ref.data(), N, C);
  // The projection term counts: without it dx would be r (dy = w = 1); with it a quarter of that.
  REQUIRE(std::fabs(dx_ref[0] - rrms_ref[0]) > 0.5f * rrms_ref[0]);
  DeviceBuffer<float> d_dy(x.size()), d_dx(x.size()), d_dw(C), d_r(N);
  DeviceBuffer<float> scratch(ul::cuda::rmsnorm_backward_scratch_bytes(N, C) / sizeof(float));
  d_x.set(x), d_dy.set(dy), d_r.set(rrms_ref);
  d_dx.set(std::vector<float>(x.size(), 0.f)), d_dw.set(std::vector<float>(C, 0.f));
  ul::cuda::rmsnorm_backward(d_dx.p, d_dw.p, d_dy.p, d_x.p, d_w.p, d_r.p, scratch.p, N, C, nullptr);
  // Terms of size r, and mean(x) a float sum of C terms in another order (C x 2^-24 of it, 2.4e-4,
  // through x r^2 ~ 1): an absolute margin of r / 1000. Without the fix dx is off by 0.75 r.
  expect_close("dx", d_dx.get(), dx_ref, 1e-4, 1e-3 * rrms_ref[0]);
}

TEST_CASE("gelu CUDA kernels match the CPU backend", UL_CUDA_TEST_TAG "[gelu]") {
  for (int offset : {0, 1})
    for (int n : pw_cases::kSizes) {
      pw_cases::check_gelu<float>(n, offset);
      pw_cases::check_gelu<__nv_bfloat16>(n, offset);
    }
  pw_cases::check_gelu_tail();
}

TEST_CASE("swiglu CUDA kernels match the CPU backend", UL_CUDA_TEST_TAG "[swiglu]") {
  // F = 4: packs for f32 only; 8, 64: packs for both; 1, 13, 100: no packs (F % 8 != 0 for bf16).
  const std::pair<int, int> shapes[] = {{1, 1}, {3, 4}, {5, 8}, {7, 13}, {17, 64}, {33, 100}};
  for (int offset : {0, 1})
    for (auto [N, F] : shapes) {
      pw_cases::check_swiglu<float>(N, F, offset);
      pw_cases::check_swiglu<__nv_bfloat16>(N, F, offset);
    }
}

TEST_CASE("residual CUDA kernels match the CPU backend", UL_CUDA_TEST_TAG "[residual]") {
  for (int offset : {0, 1})
    for (int n : pw_cases::kSizes) {
      pw_cases::check_residual<float>(n, offset);
      pw_cases::check_residual<__nv_bfloat16>(n, offset);
    }
}

TEST_CASE("rmsnorm, gelu, swiglu and residual add ops on Device::cuda match the ops on the CPU",
          UL_CUDA_TEST_TAG "[rmsnorm][gelu][swiglu][residual]") {
  using Ts = std::vector<ul::Tensor>;
  const int N = 37, C = 80;
  op_cases::compare_op("rmsnorm", {{N, C}, {C}}, {false, true}, {N, C},
                       [](ul::Context&, Ts& t) { return ul::rmsnorm(t[0], t[1]); });
  op_cases::compare_op("gelu", {{3, N, 13}}, {false}, {3, N, 13}, [](ul::Context&, Ts& t) { return ul::gelu(t[0]); });
  op_cases::compare_op("swiglu", {{N, 2 * C}}, {false}, {N, C}, [](ul::Context&, Ts& t) { return ul::swiglu(t[0]); });
  op_cases::compare_op("add", {{N, 7}, {N, 7}}, {false, false}, {N, 7},
                       [](ul::Context&, Ts& t) { return ul::add(t[0], t[1]); });
  // a + a: both gradients land in a's buffer (so a gets 2 dy), on either device.
  op_cases::compare_op("add(a, a)", {{N, 7}}, {false}, {N, 7}, [](ul::Context&, Ts& t) { return ul::add(t[0], t[0]); });
}

TEST_CASE("rmsnorm, gelu, swiglu and residual add ops refuse mixed devices and dtypes and bad shapes",
          UL_CUDA_TEST_TAG "[rmsnorm][gelu][swiglu][residual]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor x = c.zeros({4, 8}), w16 = c.zeros({8}, ul::DType::bf16), i32 = c.zeros({4, 8}, ul::DType::i32);
  CHECK_THROWS_WITH(ul::rmsnorm(x, w16), Catch::Contains("rmsnorm") && Catch::Contains("bf16"));
  CHECK_THROWS_WITH(ul::rmsnorm(x, c.zeros({7})), Catch::Contains("rmsnorm weight"));
  CHECK_THROWS_WITH(ul::gelu(i32), Catch::Contains("gelu") && Catch::Contains("i32"));
  CHECK_THROWS_WITH(ul::swiglu(c.zeros({4, 7})), Catch::Contains("swiglu") && Catch::Contains("odd"));
  CHECK_THROWS_WITH(ul::add(x, c.zeros({4, 8}, ul::DType::bf16)), Catch::Contains("add") && Catch::Contains("bf16"));
  CHECK_THROWS_WITH(ul::add(x, c.zeros({4, 7})), Catch::Contains("same shape"));
  ul::Context host;
  CHECK_THROWS_WITH(ul::add(x, host.zeros({4, 8})), Catch::Contains("add") && Catch::Contains("cpu"));
}

// Buffers 8 bytes off 16-byte alignment (2 floats, 4 bf16): aligned enough for an 8-byte access,
// not for the 16-byte packs, so the kernels must take their scalar path (a GPU faults on a
// misaligned vector access; the emulator throws).
TEST_CASE("gelu, swiglu and residual CUDA kernels on buffers 8 bytes off 16-byte alignment",
          UL_CUDA_TEST_TAG "[gelu][swiglu][residual]") {
  for (int n : {9, 100}) {
    pw_cases::check_gelu<float>(n, 2);
    pw_cases::check_gelu<__nv_bfloat16>(n, 4);
    pw_cases::check_residual<float>(n, 2);
    pw_cases::check_residual<__nv_bfloat16>(n, 4);
  }
  pw_cases::check_swiglu<float>(5, 8, 2);
  pw_cases::check_swiglu<__nv_bfloat16>(5, 8, 4);
}
