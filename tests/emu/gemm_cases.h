// ul::cuda::gemm against a float64 loop, for every combination the layers use: types (f32 -> f32,
// bf16 -> bf16, bf16 -> f32), all four transpose pairs, with and without the bias epilogue, with
// and without accumulation, sizes that are not multiples of any tile, and operands at offsets
// that are not 16-byte aligned (chunked callers pass such row offsets). Emulated (tests/emu:
// the Eigen twin) and on a GPU (tests/gpu/test_cublaslt_gpu.cpp: cuBLASLt).
//   - D is poisoned (NaN) when not accumulating, so an unwritten element fails; when accumulating
//     it starts from random values, so `=` instead of `+=` fails;
//   - tolerance: 1e-5 of sum_k |a b| (+ |bias| + |D0|) for fp32 accumulation; bf16 outputs add
//     their final rounding, 2^-8 of |D|.
#pragma once
#include "emu/cuda_cases_util.h"
#include "engine/gemm.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including gemm_cases.h"
#endif

namespace gemm_cases {
using namespace cuda_cases;

struct Dims {
  int M, N, K;
};
const Dims kDims[] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 40}, {64, 48, 32}, {37, 129, 65}};

// pad > 0: every stored row of A, B and D is `pad` elements longer than its width (GemmStrides),
// the gaps NaN: a gap read makes a NaN result, a gap written is found after the call.
template <class TA, class TD>
void check(Dims dm, bool ta, bool tb, bool with_bias, bool accumulate, size_t offset, int pad = 0) {
  const int M = dm.M, N = dm.N, K = dm.K;
  INFO(type_name<TA>() << " -> " << type_name<TD>() << " M=" << M << " N=" << N << " K=" << K << (ta ? " A^T" : "")
                       << (tb ? " B^T" : "") << (with_bias ? " +bias" : "") << (accumulate ? " +=" : "")
                       << " offset " << offset << " row padding " << pad);
  const size_t nA = size_t(M) * K, nB = size_t(K) * N, nD = size_t(M) * N;
  const std::vector<float> a = inputs<TA>(nA, 10 + M + K), b = inputs<TA>(nB, 20 + N + K),
                           bias = inputs<TD>(N, 30 + N), d0 = inputs<TD>(nD, 40 + M);
  // Reference in double: want = (acc ? d0 : 0) + bias + sum_k A'[m][k] B'[k][n], and the scale of the terms.
  std::vector<float> want(nD);
  std::vector<double> scale(nD);
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = accumulate ? d0[size_t(m) * N + n] : 0.0, mag = std::fabs(s);
      if (with_bias) s += bias[n], mag += std::fabs(bias[n]);
      for (int k = 0; k < K; k++) {
        const double x = ta ? a[size_t(k) * M + m] : a[size_t(m) * K + k];
        const double y = tb ? b[size_t(n) * K + k] : b[size_t(k) * N + n];
        s += x * y;
        mag += std::fabs(x * y);
      }
      want[size_t(m) * N + n] = float(s);
      scale[size_t(m) * N + n] = mag;
    }

  // Each operand at `offset` elements into its buffer, so its address is only offset*sizeof aligned;
  // stored (rows, width) in rows of width + pad.
  struct Shape {
    size_t rows, width;
    size_t stride(int p) const { return width + size_t(p); }
  };
  const Shape sa{size_t(ta ? K : M), size_t(ta ? M : K)}, sb{size_t(tb ? N : K), size_t(tb ? K : N)},
              sd{size_t(M), size_t(N)};
  DeviceBuffer<TA> d_a(sa.rows * sa.stride(pad) + offset), d_b(sb.rows * sb.stride(pad) + offset);
  DeviceBuffer<TD> d_bias(N + offset), d_d(sd.rows * sd.stride(pad) + offset);
  auto place = [&](auto& buf, const auto& host, Shape sh) {
    using E = typename std::decay_t<decltype(host)>::value_type;
    std::vector<E> full = buf.get();  // keep the poisoned head and gaps
    for (size_t r = 0; r < sh.rows; r++)
      std::copy(host.begin() + long(r * sh.width), host.begin() + long((r + 1) * sh.width),
                full.begin() + long(offset + r * sh.stride(pad)));
    buf.set(full);
  };
  place(d_a, to_elem<TA>(a), sa);
  place(d_b, to_elem<TA>(b), sb);
  place(d_bias, to_elem<TD>(bias), Shape{1, size_t(N)});
  if (accumulate) place(d_d, to_elem<TD>(d0), sd);
  const ul::cuda::GemmStrides ld = pad ? ul::cuda::GemmStrides{int64_t(sa.stride(pad)), int64_t(sb.stride(pad)),
                                                               int64_t(sd.stride(pad))}
                                       : ul::cuda::GemmStrides{};
  ul::cuda::gemm<TA, TD>(d_d.p + offset, d_a.p + offset, d_b.p + offset, with_bias ? d_bias.p + offset : nullptr, M,
                         N, K, ta, tb, accumulate, "gemm test", nullptr, ld);
  const std::vector<TD> out_full = d_d.get();
  std::vector<TD> out(nD);
  size_t gaps_written = 0;
  for (size_t r = 0; r < sd.rows; r++) {
    const size_t row = offset + r * sd.stride(pad);
    std::copy(out_full.begin() + long(row), out_full.begin() + long(row + sd.width), out.begin() + long(r * sd.width));
    if (pad)
      for (float g : to_f32(std::vector<TD>(out_full.begin() + long(row + sd.width), out_full.begin() + long(row + sd.stride(pad)))))
        gaps_written += !std::isnan(g);
  }
  CHECK(gaps_written == 0);  // D's gaps keep their poison
  const std::vector<float> got = to_f32(out);
  const bool bf_out = is_bf16<TD>();
  size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  for (size_t i = 0; i < nD; i++) {
    const double tol = 1e-5 * scale[i] + (bf_out ? std::fabs(double(want[i])) / 256 : 0.0) + 1e-30;
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double ratio = err <= tol ? err / tol : 1e300;  // NaN lands here
    if (!(err <= tol)) bad++;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  INFO(bad << " of " << nD << " out of tolerance; worst at " << worst << ": got " << got[worst] << ", want "
           << want[worst]);
  CHECK(bad == 0);
  // The head before D is not written.
  if (offset) CHECK(std::isnan(to_f32(std::vector<TD>(out_full.begin(), out_full.begin() + offset))[0]));
}

template <class TA, class TD>
void check_all(bool bias_allowed) {
  for (const Dims& dm : kDims)
    for (int tr = 0; tr < 4; tr++)
      for (int acc = 0; acc < 2; acc++)
        for (int bias = 0; bias < (bias_allowed && !acc ? 2 : 1); bias++)  // a bias only without accumulate
          check<TA, TD>(dm, tr & 1, tr & 2, bias, acc, (dm.M + tr) % 2 ? 1 : 0);
  // Strided rows (the classifier's logits): without a bias, which a strided D does not take.
  for (const Dims& dm : kDims)
    for (int tr = 0; tr < 4; tr++)
      for (int acc = 0; acc < 2; acc++) check<TA, TD>(dm, tr & 1, tr & 2, false, acc, tr % 2, 3 + tr);
}

}  // namespace gemm_cases

TEST_CASE("gemm f32 -> f32 matches float64: transposes, bias, accumulation, odd sizes", UL_CUDA_TEST_TAG "[gemm]") {
  gemm_cases::check_all<float, float>(true);
}

TEST_CASE("gemm bf16 -> bf16 matches float64: transposes, bias, accumulation, odd sizes", UL_CUDA_TEST_TAG "[gemm]") {
  gemm_cases::check_all<__nv_bfloat16, __nv_bfloat16>(true);
}

TEST_CASE("gemm bf16 -> f32 (parameter gradients, logits) matches float64", UL_CUDA_TEST_TAG "[gemm]") {
  gemm_cases::check_all<__nv_bfloat16, float>(true);
}

TEST_CASE("gemm with K = 0 or an empty output, and bad arguments", UL_CUDA_TEST_TAG "[gemm]") {
  using namespace cuda_cases;
  DeviceBuffer<float> d(6), bias(3);
  bias.set({1.f, 2.f, 3.f});
  // K = 0: D = bias on every row (the product is empty), and nothing is read from A or B.
  ul::cuda::gemm<float, float>(d.p, nullptr, nullptr, bias.p, 2, 3, 0, false, true, false, "gemm test", nullptr);
  CHECK(d.get() == std::vector<float>{1.f, 2.f, 3.f, 1.f, 2.f, 3.f});
  // A bias with accumulate is refused (engine/gemm.h: a bf16 D would be rounded twice), D untouched.
  auto bias_accumulate = [&] {
    ul::cuda::gemm<float, float>(d.p, nullptr, nullptr, bias.p, 2, 3, 0, false, true, true, "gemm test", nullptr);
  };
  CHECK_THROWS_WITH(bias_accumulate(), Catch::Contains("gemm test") && Catch::Contains("a bias and accumulate"));
  CHECK(d.get() == std::vector<float>{1.f, 2.f, 3.f, 1.f, 2.f, 3.f});
  ul::cuda::gemm<float, float>(nullptr, nullptr, nullptr, nullptr, 0, 3, 5, false, false, false, "gemm test", nullptr);
  auto null_a = [&] {
    ul::cuda::gemm<float, float>(d.p, nullptr, d.p, nullptr, 2, 3, 1, false, false, false, "my op", nullptr);
  };
  CHECK_THROWS_WITH(null_a(), Catch::Contains("my op"));
  // A row stride shorter than the rows, or a bias into a strided D, is refused.
  auto short_stride = [&] {
    ul::cuda::gemm<float, float>(d.p, d.p, d.p, nullptr, 2, 3, 1, false, false, false, "my op", nullptr, {0, 2, 0});
  };
  CHECK_THROWS_WITH(short_stride(), Catch::Contains("my op") && Catch::Contains("row stride of B (2) is shorter than its rows (3)"));
  auto strided_bias = [&] {
    ul::cuda::gemm<float, float>(d.p, d.p, d.p, bias.p, 1, 2, 1, false, false, false, "my op", nullptr, {0, 0, 3});
  };
  CHECK_THROWS_WITH(strided_bias(), Catch::Contains("a bias with a strided D"));
}

// An empty product (K = 0) without a bias: D += nothing leaves D as it was (a gradient summed over
// no rows), D = nothing is zero; in both output types.
TEST_CASE("gemm with K = 0 and no bias: accumulate keeps D, overwrite zeroes it", UL_CUDA_TEST_TAG "[gemm]") {
  using namespace cuda_cases;
  const std::vector<float> d0{1.5f, -2.f, 3.f, 4.f, -5.f, 6.25f};  // bf16-representable
  DeviceBuffer<float> d(6);
  d.set(d0);
  ul::cuda::gemm<float, float>(d.p, nullptr, nullptr, nullptr, 2, 3, 0, false, true, true, "gemm test", nullptr);
  CHECK(d.get() == d0);
  ul::cuda::gemm<float, float>(d.p, nullptr, nullptr, nullptr, 2, 3, 0, false, true, false, "gemm test", nullptr);
  CHECK(d.get() == std::vector<float>(6, 0.f));
  DeviceBuffer<__nv_bfloat16> d16(6);
  d16.set(to_elem<__nv_bfloat16>(d0));
  ul::cuda::gemm<__nv_bfloat16, __nv_bfloat16>(d16.p, nullptr, nullptr, nullptr, 3, 2, 0, true, false, true,
                                               "gemm test", nullptr);
  CHECK(to_f32(d16.get()) == d0);
  ul::cuda::gemm<__nv_bfloat16, __nv_bfloat16>(d16.p, nullptr, nullptr, nullptr, 3, 2, 0, true, false, false,
                                               "gemm test", nullptr);
  CHECK(to_f32(d16.get()) == std::vector<float>(6, 0.f));
}
