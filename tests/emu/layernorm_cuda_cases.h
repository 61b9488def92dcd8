// LayerNorm: the CUDA kernels and the op on Device::cuda against the CPU backend. Written only
// against the CUDA runtime API and the engine, so the same cases run emulated (tests/emu, in CI)
// and on a real GPU (tests/gpu); the including file picks the Catch2 tag.
//   - outputs are poisoned (NaN) before each kernel, so an element it fails to write fails;
//   - gradients start from random values, so a kernel that overwrites instead of adding fails;
//   - shapes include C below, at and above a warp, not a multiple of 32, and N not a multiple of
//     the 8 rows a block handles, with several row chunks in the dw/db reduction;
//   - f32 is held to 1e-5 relative, bf16 to its rounding (2^-8 relative) on bf16-rounded inputs;
//   - dw and db are f32 (parameter gradients) for bf16 too, and held to f32 accuracy there.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"
#include "layers/layernorm.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including layernorm_cuda_cases.h"
#endif

namespace ln_cases {

using namespace cuda_cases;
using ul_test::randn_f;

// N = 1100: 18 chunks of rows for dw and db (one whole batch of the reduce's loads and a tail).
const std::pair<int, int> kShapes[] = {{1, 1},     {3, 32},  {7, 33},  {13, 100},
                                       {9, 768},   {257, 48}, {300, 5}, {1100, 24}};

template <class T>
void check_kernels(int N, int C) {
  const bool bf = !std::is_same<T, float>::value;
  // f32: 1e-5 relative (of the element, or of the tensor's scale where sums can cancel).
  // bf16: the final rounding to bf16 (2^-9 relative), with margin.
  const double rel = bf ? 1.0 / 256 : 1e-5;
  INFO((bf ? "bf16" : "f32") << " N=" << N << " C=" << C);
  const size_t NC = size_t(N) * C;
  const std::vector<float> x = inputs<T>(NC, 1 + N, 2.f), w = inputs<T>(C, 2 + C), b = inputs<T>(C, 3 + C),
                           dy = inputs<T>(NC, 4 + N), dx0 = inputs<T>(NC, 5), dw0 = randn_f(C, 6),
                           db0 = randn_f(C, 7);

  // CPU reference (float, on the same values the kernels read).
  std::vector<float> y_ref(NC), mean_ref(N), rstd_ref(N), dx_ref = dx0, dw_ref = dw0, db_ref = db0;
  ul::cpu::layernorm_forward(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), w.data(), b.data(), N, C);
  ul::cpu::layernorm_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(), x.data(), w.data(),
                              mean_ref.data(), rstd_ref.data(), N, C);

  DeviceBuffer<T> d_x(NC), d_w(C), d_b(C), d_y(NC), d_dy(NC), d_dx(NC);
  DeviceBuffer<float> d_dw(C), d_db(C), d_mean(N), d_rstd(N);  // parameter gradients are f32
  DeviceBuffer<float> scratch(ul::cuda::layernorm_backward_scratch_bytes(N, C) / sizeof(float));
  d_x.set(to_elem<T>(x));
  d_w.set(to_elem<T>(w));
  d_b.set(to_elem<T>(b));
  ul::cuda::layernorm_forward(d_y.p, d_mean.p, d_rstd.p, d_x.p, d_w.p, d_b.p, N, C, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, bf ? 1e-4 : 1e-5);
  expect_close("mean", d_mean.get(), mean_ref, 1e-5, 1e-6);
  expect_close("rstd", d_rstd.get(), rstd_ref, 1e-5, 0);

  // Backward from the reference statistics, so it is checked on its own.
  d_mean.set(mean_ref);
  d_rstd.set(rstd_ref);
  d_dy.set(to_elem<T>(dy));
  auto run_backward = [&] {
    d_dx.set(to_elem<T>(dx0));
    d_dw.set(dw0);
    d_db.set(db0);
    ul::cuda::layernorm_backward(d_dx.p, d_dw.p, d_db.p, d_dy.p, d_x.p, d_w.p, d_mean.p, d_rstd.p, scratch.p, N, C,
                                 nullptr);
  };
  run_backward();
  const std::vector<float> dw1 = d_dw.get(), db1 = d_db.get();
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, 1e-5 * std::max(1.0, max_abs(dx_ref)));
  // f32 sums of the same products in another order, whatever T: no bf16 rounding allowed here.
  expect_close("dw", dw1, dw_ref, 1e-5, 1e-5 * std::max(1.0, max_abs(dw_ref)));
  expect_close("db", db1, db_ref, 1e-5, 1e-5 * std::max(1.0, max_abs(db_ref)));

  // dw and db are reduced in a fixed order: a second run gives the same bits.
  run_backward();
  const std::vector<float> dw2 = d_dw.get(), db2 = d_db.get();
  CHECK(std::memcmp(dw1.data(), dw2.data(), C * sizeof(float)) == 0);
  CHECK(std::memcmp(db1.data(), db2.data(), C * sizeof(float)) == 0);
}

struct OpResult {
  std::vector<float> y, dx, dw, db;
};

// y = layernorm(x, w, b), then backward from dy, on one device and dtype; everything read back as float.
inline OpResult run_op(ul::Device dev, ul::DType dt, int N, int C, const std::vector<float>& x,
                       const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& dy) {
  ul::Context c(dev);
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  // Weights made by hand (not through Params) get an f32 gradient slot, as every parameter has.
  auto make = [&](ul::Shape s, const std::vector<float>& v, ul::DType grad_dt) {
    return make_tracked(c, s, dt, v, grad_dt);
  };
  auto read = [&](const void* p, size_t n, ul::DType as) { return read_floats(p, n, as == ul::DType::bf16, dev); };
  ul::Tensor tx = make({N, C}, x, dt), tw = make({C}, w, ul::DType::f32), tb = make({C}, b, ul::DType::f32);
  ul::Tensor y = ul::layernorm(tx, tw, tb);
  REQUIRE(y.device == dev);
  REQUIRE(y.dtype == dt);
  REQUIRE(y.requires_grad());
  // Gradient buffers are taken (zeroed) before backward; the tape forgets activation slots after it.
  void* gy = c.tape.grad(y);
  if (dt == ul::DType::bf16) ul::device_copy(gy, dev, to_elem<__nv_bfloat16>(dy).data(), ul::Device::cpu, y.nbytes());
  else ul::device_copy(gy, dev, dy.data(), ul::Device::cpu, y.nbytes());
  void* gx = c.tape.grad(tx);
  void* gw = c.tape.grad(tw);
  void* gb = c.tape.grad(tb);
  c.tape.backward();
  const size_t NC = size_t(N) * C;
  return {read(y.ptr, NC, dt), read(gx, NC, dt), read(gw, C, ul::DType::f32), read(gb, C, ul::DType::f32)};
}

}  // namespace ln_cases

TEST_CASE("layernorm CUDA kernels match the CPU backend (f32)", UL_CUDA_TEST_TAG "[layernorm]") {
  for (auto [N, C] : ln_cases::kShapes) ln_cases::check_kernels<float>(N, C);
}

TEST_CASE("layernorm CUDA kernels match the CPU backend (bf16)", UL_CUDA_TEST_TAG "[layernorm]") {
  for (auto [N, C] : ln_cases::kShapes) ln_cases::check_kernels<__nv_bfloat16>(N, C);
}

TEST_CASE("layernorm CUDA forward keeps its precision on rows far from zero mean (f32)", UL_CUDA_TEST_TAG "[layernorm]") {
  // A float sum of the row itself is off by ulps of its offset times C, and every output by that
  // error times rstd (1e-3 on rows near 1000 with spread 0.1); the kernel sums x - x[0]. What is
  // left is the float mean's own rounding: half an ulp of the offset, times rstd.
  using namespace cuda_cases;
  const int N = 8, C = 768;
  const std::vector<float> z = ul_test::randn_f(size_t(N) * C, 17);
  for (double offset : {1000.0, 50.0, 12345.6}) {
    INFO("offset " << offset);
    const double spread = offset > 10000 ? 0.0 : offset > 100 ? 0.1 : 0.01;  // (a constant row too)
    std::vector<float> x(size_t(N) * C), w(C, 1.f), b(C, 0.f);
    for (size_t i = 0; i < x.size(); i++) x[i] = float(offset + spread * z[i]);
    DeviceBuffer<float> d_x(x.size()), d_w(C), d_b(C), d_y(x.size()), d_mean(N), d_rstd(N);
    d_x.set(x), d_w.set(w), d_b.set(b);
    ul::cuda::layernorm_forward(d_y.p, d_mean.p, d_rstd.p, d_x.p, d_w.p, d_b.p, N, C, nullptr);
    const std::vector<float> y = d_y.get();
    double worst = 0, allowed = 0;
    for (int n = 0; n < N; n++) {
      double m = 0, var = 0;
      for (int c = 0; c < C; c++) m += double(x[size_t(n) * C + c]) / C;
      for (int c = 0; c < C; c++) var += (x[size_t(n) * C + c] - m) * (x[size_t(n) * C + c] - m) / C;
      const double s = 1.0 / std::sqrt(var + 1e-5);
      for (int c = 0; c < C; c++)
        worst = ul_test::max_err(worst, std::fabs(y[size_t(n) * C + c] - (x[size_t(n) * C + c] - m) * s));
      allowed = std::max(allowed, 1e-5 + 0.5 * std::ldexp(1.0, std::ilogb(offset) - 23) * s * 1.01);
    }
    CHECK(worst <= (spread == 0 ? 1e-6 : allowed));  // a constant row: x - x[0] is 0, its mean x[0] exactly
  }
}

TEST_CASE("layernorm CUDA forward normalises a row whose float variance overflows, as the CPU op (f32)",
          UL_CUDA_TEST_TAG "[layernorm]") {
  // Alternating +-1e18 at C = 768: the float sum of squares is inf, rsqrt(inf) = 0, and the row
  // came out as its bias with rstd 0 (so zero gradients) where the CPU's double sums normalise it.
  // At +-1e36 the float sum of x - x[0] for the mean overflows too: the mean was -inf, the row NaN.
  // Row 3: half the lanes' sums overflow to +inf, half to -inf (a lane reads 4 elements at a time,
  // c / 4 % 32 is its number: lanes 0-15 hold +2e37, 16-31 -2e37), which add up to NaN, not inf.
  using namespace cuda_cases;
  const int N = 4, C = 768;
  const float scale[N] = {1.f, 1e-18f, 1e18f, 1.f};  // +-1e18, +-1, +-1e36
  std::vector<float> x(size_t(N) * C), w(C, 1.f), b(C, 0.25f), y_ref(x.size()), mean_ref(N), rstd_ref(N);
  for (size_t i = 0; i < x.size(); i++) x[i] = (i % 2 ? 1e18f : -1e18f) * scale[i / size_t(C)];
  for (int c = 0; c < C; c++) x[size_t(3) * C + c] = c == 0 ? 0.f : (c / 4) % 32 < 16 ? 2e37f : -2e37f;
  ul::cpu::layernorm_forward(y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), w.data(), b.data(), N, C);
  REQUIRE(y_ref[0] == Approx(-0.75).epsilon(1e-5));  // -1 + b: the CPU normalises the row
  REQUIRE(y_ref[2 * size_t(C)] == Approx(-0.75).epsilon(1e-5));
  REQUIRE(std::isfinite(y_ref[3 * size_t(C) + 1]));
  DeviceBuffer<float> d_x(x.size()), d_w(C), d_b(C), d_y(x.size()), d_mean(N), d_rstd(N);
  d_x.set(x), d_w.set(w), d_b.set(b);
  ul::cuda::layernorm_forward(d_y.p, d_mean.p, d_rstd.p, d_x.p, d_w.p, d_b.p, N, C, nullptr);
  const std::vector<float> y = d_y.get(), rstd = d_rstd.get();
  for (int n = 0; n < N; n++) CHECK(rstd[size_t(n)] == Approx(rstd_ref[size_t(n)]).epsilon(1e-5));
  for (size_t i = 0; i < y.size(); i++) {
    INFO("element " << i);
    CHECK(y[i] == Approx(y_ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("layernorm op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[layernorm]") {
  ul::init_cuda_backend();
  const int N = 37, C = 80;
  for (ul::DType dt : {ul::DType::f32, ul::DType::bf16}) {
    const bool bf = dt == ul::DType::bf16;
    INFO(ul::dtype_name(dt));
    auto in = [&](size_t n, uint64_t seed) {
      std::vector<float> v = ul_test::randn_f(n, seed);
      return bf ? ln_cases::rounded(v) : v;
    };
    const std::vector<float> x = in(size_t(N) * C, 11), w = in(C, 12), b = in(C, 13), dy = in(size_t(N) * C, 14);
    const ln_cases::OpResult ref = ln_cases::run_op(ul::Device::cpu, ul::DType::f32, N, C, x, w, b, dy);
    const ln_cases::OpResult got = ln_cases::run_op(ul::Device::cuda, dt, N, C, x, w, b, dy);
    const double rel = bf ? 1.0 / 128 : 1e-5;  // bf16: the op also rounds dy and y's stored gradient
    ln_cases::expect_close("y", got.y, ref.y, rel, bf ? 1e-3 : 1e-5);
    ln_cases::expect_close("dx", got.dx, ref.dx, rel, 1e-5 * std::max(1.0, ln_cases::max_abs(ref.dx)));
    ln_cases::expect_close("dw", got.dw, ref.dw, rel, 1e-5 * std::max(1.0, ln_cases::max_abs(ref.dw)));
    ln_cases::expect_close("db", got.db, ref.db, rel, 1e-5 * std::max(1.0, ln_cases::max_abs(ref.db)));
  }
}

TEST_CASE("layernorm op refuses mixed devices and dtypes", UL_CUDA_TEST_TAG "[layernorm]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor x = c.zeros({4, 8}), w = c.zeros({8}), b16 = c.zeros({8}, ul::DType::bf16);
  CHECK_THROWS_WITH(ul::layernorm(x, w, b16), Catch::Contains("layernorm") && Catch::Contains("bf16"));
  ul::Context host;
  ul::Tensor wh = host.zeros({8});
  CHECK_THROWS_WITH(ul::layernorm(x, wh, w), Catch::Contains("layernorm") && Catch::Contains("cpu"));
  CHECK_THROWS_WITH(ul::layernorm(x, w, c.zeros({7})), Catch::Contains("layernorm bias"));
}
