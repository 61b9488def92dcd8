// The linear layer on CUDA (kernels and the op on Device::cuda) against the CPU backend. Written
// only against the CUDA runtime API and the engine, so the same cases run emulated (tests/emu) and
// on a GPU (tests/gpu); the including file picks the Catch2 tag.
//   - y is poisoned (NaN) before the forward, so an element it fails to write fails;
//   - dx, dw, db start from random values, so a backward that overwrites instead of adding fails;
//   - shapes include 1, sizes that are no multiple of a warp or tile, and enough rows for several
//     row chunks in db's reduction; db is reduced in a fixed order: a rerun gives the same bits;
//   - f32 is held to 1e-5 relative (of the element, or of the sums' scale where terms cancel);
//     bf16 to 2^-8 relative for bf16 outputs (y, dx), 1e-5 for the fp32 dw, db (bf16 inputs).
#pragma once
#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"
#include "layers/linear.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including linear_cuda_cases.h"
#endif

namespace linear_cases {
using namespace cuda_cases;

struct Dims {
  int N, C, OC;
};
const Dims kDims[] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 40}, {130, 24, 70}, {200, 64, 3}};

// Scale of a sum of n terms of magnitude ~|a||b|: the tolerance floor where terms cancel.
inline double sum_scale(const std::vector<float>& a, const std::vector<float>& b, int n) {
  return std::max(1.0, max_abs(a) * max_abs(b) * n);
}

template <class T>
void check_kernels(Dims dm, bool with_bias) {
  const int N = dm.N, C = dm.C, OC = dm.OC;
  const bool bf = is_bf16<T>();
  INFO(type_name<T>() << " N=" << N << " C=" << C << " OC=" << OC << (with_bias ? " bias" : " no bias"));
  const size_t NC = size_t(N) * C, NO = size_t(N) * OC, OCC = size_t(OC) * C;
  const std::vector<float> x = inputs<T>(NC, 1 + N), w = inputs<T>(OCC, 2 + C), b = inputs<T>(OC, 3 + OC),
                           dy = inputs<T>(NO, 4 + N), dx0 = inputs<T>(NC, 5), dw0 = ul_test::randn_f(OCC, 6),
                           db0 = ul_test::randn_f(OC, 7);

  std::vector<float> y_ref(NO), dx_ref = dx0, dw_ref = dw0, db_ref = db0;
  ul::cpu::linear_forward(y_ref.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
  ul::cpu::linear_backward(dx_ref.data(), dw_ref.data(), with_bias ? db_ref.data() : nullptr, dy.data(), x.data(),
                           w.data(), N, C, OC);

  DeviceBuffer<T> d_x(NC), d_w(OCC), d_b(OC), d_y(NO), d_dy(NO), d_dx(NC);
  DeviceBuffer<float> d_dw(OCC), d_db(OC), scratch(ul::cuda::linear_backward_scratch_bytes(N, OC) / sizeof(float));
  d_x.set(to_elem<T>(x));
  d_w.set(to_elem<T>(w));
  d_b.set(to_elem<T>(b));
  ul::cuda::linear_forward<T>(d_y.p, d_x.p, d_w.p, with_bias ? d_b.p : nullptr, N, C, OC, nullptr);
  const double rel = bf ? 1.0 / 256 : 1e-5;
  expect_close("y", to_f32(d_y.get()), y_ref, rel, 1e-5 * sum_scale(x, w, C));

  d_dy.set(to_elem<T>(dy));
  auto run_backward = [&] {
    d_dx.set(to_elem<T>(dx0));
    d_dw.set(dw0);
    d_db.set(db0);
    ul::cuda::linear_backward<T>(d_dx.p, d_dw.p, with_bias ? d_db.p : nullptr, d_dy.p, d_x.p, d_w.p, scratch.p, N, C,
                                 OC, nullptr);
  };
  run_backward();
  const std::vector<float> dw1 = d_dw.get(), db1 = d_db.get();
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, 1e-5 * sum_scale(dy, w, OC));
  expect_close("dw", dw1, dw_ref, 1e-5, 1e-5 * sum_scale(dy, x, N));
  expect_close("db", db1, db_ref, 1e-5, 1e-5 * std::max(1.0, max_abs(dy) * N));
  if (!with_bias) CHECK(same_bits(db1, db0));  // no bias: db untouched

  // db's reduction has a fixed order: the same bits again.
  run_backward();
  CHECK(same_bits(d_db.get(), db1));

  // Null gradients are skipped, and only those: dx alone leaves dw and db as they were.
  d_dx.set(to_elem<T>(dx0));
  d_dw.set(dw0);
  d_db.set(db0);
  ul::cuda::linear_backward<T>(d_dx.p, nullptr, nullptr, d_dy.p, d_x.p, d_w.p, nullptr, N, C, OC, nullptr);
  expect_close("dx alone", to_f32(d_dx.get()), dx_ref, rel, 1e-5 * sum_scale(dy, w, OC));
  CHECK(same_bits(d_dw.get(), dw0));
  CHECK(same_bits(d_db.get(), db0));

  // dx's first writer (accumulate_dx false) stores dy w into a buffer it never reads: NaN before
  // (an unzeroed gradient), the CPU's dx from zeros after.
  std::vector<float> dx_first(NC, 0.f);
  ul::cpu::linear_backward(dx_first.data(), (float*)nullptr, (float*)nullptr, dy.data(), x.data(), w.data(), N, C,
                           OC);
  d_dx.set(to_elem<T>(std::vector<float>(NC, NAN)));
  ul::cuda::linear_backward<T>(d_dx.p, nullptr, nullptr, d_dy.p, d_x.p, d_w.p, nullptr, N, C, OC, nullptr,
                               /*accumulate_dx=*/false);
  expect_close("dx, first writer", to_f32(d_dx.get()), dx_first, rel, 1e-5 * sum_scale(dy, w, OC));
}

struct OpResult {
  std::vector<float> y, dx, dw, db;
};

// y = linear(x, w, b), then backward from dy, on one device and dtype, read back as float. Weights
// are tracked with an f32 gradient slot (parameter gradients are f32 whatever their dtype).
inline OpResult run_op(ul::Device dev, ul::DType dt, int B, int T, int C, int OC, bool with_bias,
                       const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                       const std::vector<float>& dy) {
  ul::Context c(dev);
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  const bool bf = dt == ul::DType::bf16;
  // Activations get a gradient slot of their own dtype; weights an f32 one, as every parameter has.
  auto make = [&](ul::Shape s, const std::vector<float>& v, bool param) {
    return make_tracked(c, s, dt, v, param ? ul::DType::f32 : dt);
  };
  auto read = [&](const void* p, size_t n, bool elem) { return read_floats(p, n, elem && bf, dev); };
  ul::Tensor tx = make({B, T, C}, x, false), tw = make({OC, C}, w, true);
  ul::Tensor tb = with_bias ? make({OC}, b, true) : ul::Tensor{};
  ul::Tensor y = ul::linear(tx, tw, tb);
  REQUIRE(y.device == dev);
  REQUIRE(y.dtype == dt);
  REQUIRE(y.shape == ul::Shape({B, T, OC}));
  void* gy = c.tape.grad(y);
  if (bf) ul::device_copy(gy, dev, to_elem<__nv_bfloat16>(dy).data(), ul::Device::cpu, y.nbytes());
  else ul::device_copy(gy, dev, dy.data(), ul::Device::cpu, y.nbytes());
  void* gx = c.tape.grad(tx);
  void* gw = c.tape.grad(tw);
  void* gb = with_bias ? c.tape.grad(tb) : nullptr;
  c.tape.backward();
  const size_t N = size_t(B) * T;
  OpResult r{read(y.ptr, N * OC, true), read(gx, N * C, true), read(gw, size_t(OC) * C, false), {}};
  if (with_bias) r.db = read(gb, OC, false);
  return r;
}

}  // namespace linear_cases

TEST_CASE("linear CUDA kernels match the CPU backend (f32)", UL_CUDA_TEST_TAG "[linear]") {
  for (const auto& dm : linear_cases::kDims)
    for (bool bias : {true, false}) linear_cases::check_kernels<float>(dm, bias);
}

TEST_CASE("linear CUDA kernels match the CPU backend (bf16, fp32 weight gradients)", UL_CUDA_TEST_TAG "[linear]") {
  for (const auto& dm : linear_cases::kDims)
    for (bool bias : {true, false}) linear_cases::check_kernels<__nv_bfloat16>(dm, bias);
}

TEST_CASE("linear op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[linear]") {
  using namespace cuda_cases;
  ul::init_cuda_backend();
  const int B = 2, T = 13, C = 24, OC = 37;
  for (ul::DType dt : {ul::DType::f32, ul::DType::bf16})
    for (bool bias : {true, false}) {
      const bool bf = dt == ul::DType::bf16;
      INFO(ul::dtype_name(dt) << (bias ? " bias" : " no bias"));
      auto in = [&](size_t n, uint64_t seed) {
        std::vector<float> v = ul_test::randn_f(n, seed);
        return bf ? rounded(v) : v;
      };
      const std::vector<float> x = in(size_t(B) * T * C, 11), w = in(size_t(OC) * C, 12), b = in(OC, 13),
                               dy = in(size_t(B) * T * OC, 14);
      const auto ref = linear_cases::run_op(ul::Device::cpu, ul::DType::f32, B, T, C, OC, bias, x, w, b, dy);
      const auto got = linear_cases::run_op(ul::Device::cuda, dt, B, T, C, OC, bias, x, w, b, dy);
      const double rel = bf ? 1.0 / 128 : 1e-5;
      expect_close("y", got.y, ref.y, rel, 1e-5 * C);
      expect_close("dx", got.dx, ref.dx, rel, 1e-5 * OC);
      expect_close("dw", got.dw, ref.dw, 1e-5, 1e-5 * B * T);
      if (bias) expect_close("db", got.db, ref.db, 1e-5, 1e-5 * B * T);
    }
}

TEST_CASE("linear op on Device::cuda refuses mixed devices, dtypes and shapes", UL_CUDA_TEST_TAG "[linear]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor x = c.zeros({4, 8}), w = c.zeros({3, 8}), b16 = c.zeros({3}, ul::DType::bf16);
  CHECK_THROWS_WITH(ul::linear(x, w, b16), Catch::Contains("linear") && Catch::Contains("bf16"));
  ul::Context host;
  ul::Tensor wh = host.zeros({3, 8});
  CHECK_THROWS_WITH(ul::linear(x, wh, ul::Tensor{}), Catch::Contains("linear") && Catch::Contains("cpu"));
  CHECK_THROWS_WITH(ul::linear(x, c.zeros({3, 7}), ul::Tensor{}), Catch::Contains("linear: weight"));
  CHECK_THROWS_WITH(ul::linear(x, w, c.zeros({4})), Catch::Contains("linear bias"));
}
