// Kernels on buffers of more than 2^31 elements: what a book-length context puts in one tensor
// (Llama 3.1 8B at T = 4M over sp 8 holds 2^31 activations a rank; Qwen 2.5 7B's gathered qkv at
// sp 4, 4.8e9). The kernels index with 64-bit offsets where a product can pass int's end; these
// cases check that they reach and write every element past 2^31 at the right place:
//   - residual add over 2^31 + 4099 bf16 elements (16-byte packs and a scalar tail past the end);
//   - layernorm over 2^21 + 3 rows of 1024 (the last rows start past 2^31), rows checked against
//     float64;
//   - the Ulysses sequence -> chunks permute over 2^31 + 4096 elements, every element checked;
//   - a weight-gradient GEMM whose operands each hold 2^31 + 64 elements (cuBLASLt).
// Outputs are NaN-poisoned first, so an element never written fails; every element is checked on
// the host. Each case needs 9-13 GB at that size: a GPU with the memory runs them so (the gpu
// label); the emulator runs the same code at 2^20 elements unless ULYSSES_TEST_LARGE=1 (scale_bits).
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "emu/cuda_cases_util.h"
#include "engine/gemm.h"
#include "layers/layernorm.h"
#include "layers/residual.h"
#include "parallel/ulysses.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including large_cuda_cases.h"
#endif

namespace large_cases {

using bf16 = __nv_bfloat16;
using cuda_cases::DeviceBuffer;
constexpr size_t k2e31 = size_t(1) << 31;
constexpr size_t kCycle = 1048573;  // a prime: the fill repeats with a period no power of two divides

// The scale of a case: buffers of 2^bits elements and a little more. 31 (past int's end) on a GPU
// with the memory; under emulation 20 unless ULYSSES_TEST_LARGE=1 asks for 31 (about 13 GB of host
// memory, minutes a case): the same code and checks at 2^20 show that the case itself is sound, so
// a GPU's run of it is not wasted. `bytes_at_31`: the device memory the case needs at 2^31.
inline int scale_bits(size_t bytes_at_31, bool emulated_large_ok = true) {
#if ULYSSES_CUDA_EMULATED
  const char* v = std::getenv("ULYSSES_TEST_LARGE");
  if (!emulated_large_ok || !v || std::string(v) != "1") {
    WARN("buffers of 2^20 elements, not past 2^31, under emulation" << (emulated_large_ok ? " (ULYSSES_TEST_LARGE=1: "
                                                                       "2^31, ~13 GB and minutes)" : ""));
    return 20;
  }
#else
  (void)emulated_large_ok;
#endif
  size_t free_bytes = 0, total = 0;
  UL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  if (free_bytes < bytes_at_31 + (size_t(1) << 30)) {
    WARN("buffers of 2^20 elements, not past 2^31: " << bytes_at_31 / (1 << 20) << " MiB wanted, "
                                                     << free_bytes / (1 << 20) << " MiB free on the device");
    return 20;
  }
  return 31;
}

// p[i] = value(i % kCycle) for i < n, uploaded one cycle at a time (no host copy of the whole).
template <class F>
void fill_cycle(bf16* p, size_t n, F value) {
  std::vector<bf16> cycle(kCycle);
  for (size_t k = 0; k < kCycle; k++) cycle[k] = __float2bfloat16(value(k));
  for (size_t at = 0; at < n; at += kCycle)
    UL_CUDA_CHECK(cudaMemcpy(p + at, cycle.data(), std::min(kCycle, n - at) * sizeof(bf16), cudaMemcpyHostToDevice));
}

// Calls check(i, v) for every element of p, downloaded a piece at a time; counts what it rejects.
template <class Check>
size_t count_bad(const bf16* p, size_t n, Check check) {
  UL_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<bf16> piece(size_t(1) << 24);
  size_t bad = 0;
  for (size_t at = 0; at < n; at += piece.size()) {
    const size_t k = std::min(piece.size(), n - at);
    UL_CUDA_CHECK(cudaMemcpy(piece.data(), p + at, k * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < k; i++) bad += !check(at + i, __bfloat162float(piece[i]));
  }
  return bad;
}

inline float value_a(size_t k) { return float(k % 61); }            // small integers: every sum exact
inline float value_b(size_t k) { return float(k % 5) - 2.f; }

}  // namespace large_cases

TEST_CASE("the residual add writes every element of a buffer past 2^31 elements", UL_CUDA_TEST_TAG "[large]") {
  using namespace large_cases;
  const size_t n = (size_t(1) << scale_bits(3 * (k2e31 + 4099) * sizeof(bf16))) + 4099;
  DeviceBuffer<bf16> a(n), b(n), y(n);  // y NaN-poisoned
  fill_cycle(a.p, n, value_a);
  fill_cycle(b.p, n, value_b);
  ul::cuda::residual_forward<bf16>(y.p, a.p, b.p, int64_t(n), nullptr);
  const size_t bad = count_bad(y.p, n, [](size_t i, float v) {
    const size_t k = i % kCycle;
    return v == value_a(k) + value_b(k);
  });
  CHECK(bad == 0);
}

TEST_CASE("layernorm normalises rows that start past 2^31 elements", UL_CUDA_TEST_TAG "[large]") {
  using namespace large_cases;
  const int C = 1024, N = (1 << (scale_bits(2 * k2e31 * sizeof(bf16)) - 10)) + 3;  // N * C = 2^31 + 3072
  const size_t n = size_t(N) * C;
  DeviceBuffer<bf16> x(n), y(n), w(C), b(C);
  DeviceBuffer<float> mean(N), rstd(N);
  auto xv = [](size_t k) { return float(k % 13) - 6.f + float(k % 7) / 8.f; };  // exact in bf16
  fill_cycle(x.p, n, xv);
  std::vector<float> wh(C), bh(C);
  for (int c = 0; c < C; c++) wh[c] = 0.5f + float(c % 9) / 8.f, bh[c] = float(c % 5) / 4.f - 0.5f;
  w.set(cuda_cases::to_elem<bf16>(wh));
  b.set(cuda_cases::to_elem<bf16>(bh));
  ul::cuda::layernorm_forward<bf16>(y.p, mean.p, rstd.p, x.p, w.p, b.p, N, C, nullptr);
  const std::vector<float> m = mean.get(), r = rstd.get();
  size_t bad = 0;
  std::vector<int> rows;  // the first rows, every 4099th, and the last 8 (past 2^31 from row 2^21)
  for (int row = 0; row < N; row += row < 4 ? 1 : 4099) rows.push_back(row);
  for (int row = N - 8; row < N; row++) rows.push_back(row);
  for (int row : rows) {  // their statistics against float64
    double s = 0, ss = 0;
    for (int c = 0; c < C; c++) s += xv((size_t(row) * C + c) % kCycle);
    const double mu = s / C;
    for (int c = 0; c < C; c++) ss += std::pow(xv((size_t(row) * C + c) % kCycle) - mu, 2);
    const double rs = 1 / std::sqrt(ss / C + 1e-5);
    bad += !(std::fabs(m[row] - mu) <= 1e-5 * (1 + std::fabs(mu)) && std::fabs(r[row] - rs) <= 1e-5 * rs);
  }
  CHECK(bad == 0);
  // Every output element from its row's statistics as the kernel wrote them, to bf16's rounding.
  bad = count_bad(y.p, n, [&](size_t i, float v) {
    const size_t row = i / C, c = i % C;
    const double want = (xv(i % kCycle) - m[row]) * double(r[row]) * wh[c] + bh[c];
    return std::fabs(v - want) <= std::fabs(want) / 128 + 1e-2;
  });
  CHECK(bad == 0);
}

TEST_CASE("the sequence -> chunks permute moves every element of a buffer past 2^31", UL_CUDA_TEST_TAG "[large]") {
  using namespace large_cases;
  const int P = 2, B = 2, Tl = (1 << (scale_bits(2 * k2e31 * sizeof(bf16)) - 12)) + 1, R = 1024;  // 2^31 + 4096
  const size_t n = size_t(P) * B * Tl * R;
  DeviceBuffer<bf16> src(n), send(n);
  fill_cycle(src.p, n, value_a);
  ul::cuda::sequence_to_chunks<bf16>(send.p, src.p, P, B, Tl, R, nullptr);
  // send (P, B, Tl, R) chunk j of sequence b <- src (B, P * Tl, R): element (b, j Tl + t, r)
  const size_t bad = count_bad(send.p, n, [&](size_t i, float v) {
    const size_t r = i % R, t = i / R % Tl, b = i / R / Tl % B, j = i / R / Tl / B;
    return v == value_a((((b * P + j) * Tl + t) * R + r) % kCycle);
  });
  CHECK(bad == 0);
}

TEST_CASE("a weight-gradient GEMM over operands past 2^31 elements", UL_CUDA_TEST_TAG "[large]") {
  using namespace large_cases;
  // dw (64, 64) = dy^T (64, K) x (K, 64), K = 2^25 + 1 tokens: each operand 2^31 + 64 elements.
  // Only the first and the last token are nonzero, so dw is two outer products, exact in fp32:
  // a wrong offset for the last row (past 2^31) changes it.
  // (Emulated at 2^20 always: the emulated GEMM widens both operands to f32 on the host, 17 GB more.)
  const int M = 64, K = (1 << (scale_bits(2 * k2e31 * sizeof(bf16), false) - 6)) + 1;
  const size_t n = size_t(K) * M;
  DeviceBuffer<bf16> dy(n), x(n);
  DeviceBuffer<float> dw(size_t(M) * M);
  UL_CUDA_CHECK(cudaMemset(dy.p, 0, n * sizeof(bf16)));
  UL_CUDA_CHECK(cudaMemset(x.p, 0, n * sizeof(bf16)));
  std::vector<float> dy0(M), dyl(M), x0(M), xl(M);
  for (int i = 0; i < M; i++)
    dy0[i] = float(i % 7) - 3, dyl[i] = float(i % 5) - 2, x0[i] = float(i % 3) - 1, xl[i] = float(i % 11) - 5;
  auto put_row = [&](bf16* p, size_t row, const std::vector<float>& v) {
    const std::vector<bf16> h = cuda_cases::to_elem<bf16>(v);
    UL_CUDA_CHECK(cudaMemcpy(p + row * M, h.data(), M * sizeof(bf16), cudaMemcpyHostToDevice));
  };
  put_row(dy.p, 0, dy0), put_row(dy.p, size_t(K) - 1, dyl), put_row(x.p, 0, x0), put_row(x.p, size_t(K) - 1, xl);
  ul::cuda::gemm<bf16, float>(dw.p, dy.p, x.p, nullptr, M, M, K, true, false, false, "large dw", nullptr);
  const std::vector<float> got = dw.get();
  size_t bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < M; j++) bad += got[size_t(i) * M + j] != dy0[i] * x0[j] + dyl[i] * xl[j];
  CHECK(bad == 0);
}
