// RoPE: the CUDA kernels and the op on Device::cuda against the CPU backend. Written only against
// the CUDA runtime API and the engine, so the same cases run emulated (tests/emu, in CI) and on a
// real GPU (tests/gpu); the including file picks the Catch2 tag.
//   - outputs are poisoned (NaN) before each kernel, so an element it fails to write fails (the
//     value heads included: they are copied, not rotated);
//   - dqkv starts from random values, so a kernel that overwrites instead of adding fails;
//   - positions go up to ~2*10^6: in float the angle there would be off by ~0.1 rad, far outside
//     the tolerance, so the kernel must keep the angle in double as the CPU does;
//   - head dims from 2 (one pair) to 128, D/2 not a multiple of anything, GQA and MHA head counts;
//   - the forward also runs in place (y == qkv), which the op's contract allows;
//   - f32 is held to 1e-5 relative plus 1e-6 absolute (a rotated pair can cancel to ~0), bf16 to
//     its output rounding: 2^-8 relative, on bf16-representable inputs.
#pragma once
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "emu/cuda_op_cases.h"
#include "layers/rope.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including rope_cuda_cases.h"
#endif

namespace rope_cases {

using namespace op_cases;

constexpr float kTheta = 10000.f;

// n positions: a few fixed far ones (2^20, 10^6 - 1, 2^21 - 1), the rest spread over [0, 2^21).
inline std::vector<int32_t> positions(int n, uint64_t seed) {
  std::vector<int32_t> p(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = int32_t((s >> 33) % (1u << 21));
  }
  const int32_t fixed[] = {0, 1 << 20, 999999, (1 << 21) - 1};
  for (int i = 0; i < n && i < 4; i++) p[i] = fixed[i];
  return p;
}

struct Shape {
  int N, Hq, Hkv, D;
};
const Shape kShapes[] = {{1, 1, 1, 2}, {7, 4, 2, 16}, {13, 3, 1, 6}, {33, 2, 2, 64}, {5, 8, 8, 128}, {70, 6, 3, 10}};

template <class T>
void check_kernels(const Shape& sh, const ul::Rope& rope = ul::Rope(kTheta)) {
  const auto [N, Hq, Hkv, D] = sh;
  const double rel = is_bf16<T>() ? 1.0 / 256 : 1e-5;
  INFO(type_name<T>() << " N=" << N << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D);
  const size_t n = size_t(N) * (Hq + 2 * Hkv) * D;
  const std::vector<int32_t> pos = positions(N, 101 + N);
  const std::vector<float> x = inputs<T>(n, 102 + D), dy = inputs<T>(n, 103 + D), dx0 = inputs<T>(n, 104);

  std::vector<float> y_ref(n), dx_ref = dx0;
  ul::cpu::rope_forward(y_ref.data(), x.data(), pos.data(), N, Hq, Hkv, D, rope);
  ul::cpu::rope_backward(dx_ref.data(), dy.data(), pos.data(), N, Hq, Hkv, D, rope);

  DeviceBuffer<int32_t> d_pos(N);
  DeviceBuffer<T> d_x(n), d_y(n), d_dy(n), d_dx(n);
  d_pos.set(pos);
  d_x.set(to_elem<T>(x));
  ul::cuda::rope_forward(d_y.p, d_x.p, d_pos.p, N, Hq, Hkv, D, rope, nullptr);
  expect_close("y", to_f32(d_y.get()), y_ref, rel, 1e-6);
  // In place: the same result in qkv's own buffer.
  ul::cuda::rope_forward(d_x.p, d_x.p, d_pos.p, N, Hq, Hkv, D, rope, nullptr);
  expect_close("y in place", to_f32(d_x.get()), y_ref, rel, 1e-6);

  d_dy.set(to_elem<T>(dy));
  d_dx.set(to_elem<T>(dx0));
  ul::cuda::rope_backward(d_dx.p, d_dy.p, d_pos.p, N, Hq, Hkv, D, rope, nullptr);
  expect_close("dqkv", to_f32(d_dx.get()), dx_ref, rel, 1e-5);
}

}  // namespace rope_cases

TEST_CASE("rope CUDA kernels match the CPU backend, at positions up to 2^21", UL_CUDA_TEST_TAG "[rope]") {
  for (const rope_cases::Shape& sh : rope_cases::kShapes) {
    rope_cases::check_kernels<float>(sh);
    rope_cases::check_kernels<__nv_bfloat16>(sh);
  }
}

TEST_CASE("rope CUDA kernels match the CPU backend with linear, llama3 and yarn scaling", UL_CUDA_TEST_TAG "[rope]") {
  // Llama 3.2's rule (theta 500000, factor 32, original context 8192): with D = 64 and 128 the
  // pairs fall in all three bands (kept, smoothed, divided), at positions up to 2^21. YaRN's
  // ramp likewise spans the middle pairs, and its attention factor scales q and k.
  for (const char* spec : {"llama3:factor=32,low=1,high=4,orig=8192", "linear:factor=4", "yarn:factor=16,orig=4096",
                           "yarn:factor=4,orig=32768,beta_fast=16,beta_slow=2,truncate=0"}) {
    INFO(spec);
    ul::Rope rope(500000.f);
    rope.scaling = ul::parse_rope_scaling(spec);
    for (const rope_cases::Shape& sh : {rope_cases::Shape{33, 2, 2, 64}, rope_cases::Shape{5, 8, 8, 128}}) {
      rope_cases::check_kernels<float>(sh, rope);
      rope_cases::check_kernels<__nv_bfloat16>(sh, rope);
    }
  }
}

TEST_CASE("rope op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[rope]") {
  const int B = 2, T = 9, Hq = 4, Hkv = 2, D = 12;
  const std::vector<int32_t> pos = rope_cases::positions(B * T, 111);
  op_cases::compare_op("rope", {{B, T, Hq + 2 * Hkv, D}}, {false}, {B, T, Hq + 2 * Hkv, D},
                       [&](ul::Context& c, std::vector<ul::Tensor>& t) {
                         return ul::rope(t[0], op_cases::make_i32(c, {B, T}, pos), Hq, Hkv, rope_cases::kTheta);
                       });
}

TEST_CASE("rope op on Device::cuda refuses bad shapes and host positions", UL_CUDA_TEST_TAG "[rope]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor pos = c.zeros({1, 2}, ul::DType::i32);
  CHECK_THROWS_WITH(ul::rope(c.zeros({1, 2, 5, 4}), pos, 2, 2, 10000.f), Catch::Contains("Hq = 2, Hkv = 2"));
  CHECK_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 5}), pos, 2, 1, 10000.f), Catch::Contains("head dim must be even"));
  CHECK_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 4}), c.zeros({1, 3}, ul::DType::i32), 2, 1, 10000.f),
                    Catch::Contains("rope positions"));
  ul::Context host;
  CHECK_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 4}), host.zeros({1, 2}, ul::DType::i32), 2, 1, 10000.f),
                    Catch::Contains("positions must be i32 on cuda"));
  CHECK_THROWS_WITH(ul::rope(c.zeros({1, 2, 4, 4}, ul::DType::i32), pos, 2, 1, 10000.f),
                    Catch::Contains("rope") && Catch::Contains("i32"));
}
