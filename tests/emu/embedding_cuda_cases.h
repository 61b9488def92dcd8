// Token + position embedding: the CUDA kernels and the op on Device::cuda against the CPU backend.
// Written only against the CUDA runtime API and the engine, so the same cases run emulated
// (tests/emu, in CI) and on a real GPU (tests/gpu); the including file picks the Catch2 tag.
//   - outputs are poisoned (NaN) before each kernel, so an element it fails to write fails;
//   - table gradients start from random values, so a kernel that overwrites instead of adding fails;
//   - ids repeat (V much smaller than N), so rows must be summed; N = 1100 takes the sort past one
//     1024-key tile (a global merge pass), and the other N are not powers of two;
//     the sort is also checked key by key on its own; V = 1 makes one run of all N = 2053 rows
//     (whole batches of loads and a tail, a run's end past the first tile);
//   - C below and above a warp, multiples of the 16-byte pack or not, and buffers one element off
//     alignment: the forward's vector and scalar paths;
//   - the forward is a plain sum, and the backward adds the same dy rows in the CPU's order onto
//     the same f32 start values, so both are held to the CPU's bits (bf16: y rounded once, 2^-8).
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "emu/cuda_op_cases.h"
#include "layers/embedding.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including embedding_cuda_cases.h"
#endif

namespace emb_cases {

using namespace op_cases;

// n values in [0, limit), from a fixed-seed LCG.
inline std::vector<int32_t> random_ids(int n, int limit, uint64_t seed) {
  std::vector<int32_t> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = int((s >> 33) % uint64_t(limit));
  }
  return v;
}

struct Shape {
  int N, C, V, maxT;  // maxT = 0: no position table
};
const Shape kShapes[] = {{1, 1, 1, 1},     {7, 33, 5, 0},    {64, 8, 3, 4},
                         {37, 64, 1000, 40}, {300, 48, 50, 0}, {1100, 12, 7, 1100},
                         {2053, 20, 1, 0}};

// offset 1 puts the forward's buffers off 16-byte alignment; the backward (no packs) then is skipped.
template <class T>
void check_kernels(const Shape& sh, int offset) {
  const auto [N, C, V, maxT] = sh;
  const bool has_wpe = maxT > 0;
  INFO(type_name<T>() << " N=" << N << " C=" << C << " V=" << V << " maxT=" << maxT << " offset=" << offset);
  const size_t NC = size_t(N) * C, VC = size_t(V) * C, TC = size_t(maxT) * C;
  const std::vector<int32_t> idx = random_ids(N, V, 71 + N), pos = random_ids(N, has_wpe ? maxT : 1, 72 + N);
  const std::vector<float> wte = inputs<T>(VC, 73 + C), wpe = inputs<T>(TC, 74 + C), dy = inputs<T>(NC, 75 + N),
                           dwte0 = randn_f(VC, 76), dwpe0 = randn_f(TC, 77);

  std::vector<float> y_ref(NC), dwte_ref = dwte0, dwpe_ref = dwpe0;
  const int32_t* pos_ref = has_wpe ? pos.data() : nullptr;
  ul::cpu::embedding_forward(y_ref.data(), idx.data(), pos_ref, wte.data(), has_wpe ? wpe.data() : nullptr, N, C);
  ul::cpu::embedding_backward(dwte_ref.data(), has_wpe ? dwpe_ref.data() : nullptr, dy.data(), idx.data(), pos_ref,
                              N, C);

  DeviceBuffer<int32_t> d_idx(N), d_pos(N);
  OffsetBuffer<T> d_wte(VC, offset), d_wpe(TC, offset), d_y(NC, offset);
  DeviceBuffer<T> d_dy(NC);
  DeviceBuffer<float> d_dwte(VC), d_dwpe(TC);
  DeviceBuffer<unsigned char> scratch(ul::cuda::embedding_backward_scratch_bytes(N));
  d_idx.set(idx);
  d_pos.set(pos);
  d_wte.set(to_elem<T>(wte));
  d_wpe.set(to_elem<T>(wpe));
  ul::cuda::embedding_forward(d_y.p, d_idx.p, has_wpe ? d_pos.p : nullptr, d_wte.p, has_wpe ? d_wpe.p : nullptr, N,
                              C, nullptr);
  // One rounding of an exact f32 sum: f32 is bitwise the CPU's; bf16 within half an ulp of it.
  expect_close("y", to_f32(d_y.get()), y_ref, is_bf16<T>() ? 1.0 / 256 : 0, 0);

  if (offset != 0) return;
  d_dy.set(to_elem<T>(dy));
  auto run_backward = [&] {
    d_dwte.set(dwte0);
    d_dwpe.set(dwpe0);
    ul::cuda::embedding_backward(d_dwte.p, has_wpe ? d_dwpe.p : nullptr, d_dy.p, d_idx.p, d_pos.p, scratch.p, N, C,
                                 nullptr);
  };
  run_backward();
  const std::vector<float> dwte1 = d_dwte.get(), dwpe1 = d_dwpe.get();
  // The CPU's additions in the CPU's order (dy read as the same floats for bf16): the same bits.
  expect_close("dwte", dwte1, dwte_ref, 0, 0);
  expect_close("dwpe", dwpe1, has_wpe ? dwpe_ref : dwpe0, 0, 0);  // untouched without a table
  run_backward();
  CHECK(same_bits(dwte1, d_dwte.get()));
  CHECK(same_bits(dwpe1, d_dwpe.get()));
}

}  // namespace emb_cases

TEST_CASE("embedding CUDA kernels match the CPU backend bit for bit", UL_CUDA_TEST_TAG "[embedding]") {
  for (int offset : {0, 1})
    for (const emb_cases::Shape& sh : emb_cases::kShapes) {
      emb_cases::check_kernels<float>(sh, offset);
      emb_cases::check_kernels<__nv_bfloat16>(sh, offset);
    }
}

TEST_CASE("embedding backward sorts rows by table row, then position in the batch", UL_CUDA_TEST_TAG "[embedding]") {
  // ids in order of n already leave a half-done sort looking right to the backward (each row's n
  // stay increasing), so the sort is checked on its own: every key in place, for one tile
  // (N <= 1024) and for one (N = 1100) and three (N = 5000) levels of merges across tiles.
  for (int N : {1, 5, 1024, 1100, 5000}) {
    for (int V : {7, 1000}) {
      INFO("N=" << N << " V=" << V);
      const std::vector<int32_t> ids = emb_cases::random_ids(N, V, 85 + N + V);
      std::vector<uint64_t> want(N);
      for (int n = 0; n < N; n++) want[n] = uint64_t(ids[n]) << 32 | uint64_t(n);
      std::sort(want.begin(), want.end());
      cuda_cases::DeviceBuffer<int32_t> d_ids(N);
      cuda_cases::DeviceBuffer<uint64_t> keys(ul::cuda::embedding_backward_scratch_bytes(N) / sizeof(uint64_t));
      d_ids.set(ids);
      ul::cuda::embedding_sort_keys(keys.p, d_ids.p, N, nullptr);
      std::vector<uint64_t> got = keys.get();
      got.resize(N);
      CHECK(got == want);
    }
  }
}

TEST_CASE("embedding range check finds the first id out of range", UL_CUDA_TEST_TAG "[embedding]") {
  using cuda_cases::DeviceBuffer;
  for (int N : {1, 5, 300, 3000}) {
    INFO("N=" << N);
    std::vector<int32_t> v = emb_cases::random_ids(N, 10, 81);
    DeviceBuffer<int32_t> d_v(N);
    DeviceBuffer<int> scratch(1);
    d_v.set(v);
    CHECK(ul::cuda::embedding_first_out_of_range(d_v.p, N, 10, scratch.p, nullptr) == -1);
    int first_nonzero = 0;  // the first out of [0, 1)
    while (first_nonzero < N && v[first_nonzero] == 0) first_nonzero++;
    CHECK(ul::cuda::embedding_first_out_of_range(d_v.p, N, 1, scratch.p, nullptr) ==
          (first_nonzero == N ? -1 : first_nonzero));
    // Several bad ids, the last one first in thread order: the smallest index wins.
    v[N - 1] = 10;
    if (N > 3) v[N / 2] = -7, v[N / 3] = 1 << 30;
    d_v.set(v);
    CHECK(ul::cuda::embedding_first_out_of_range(d_v.p, N, 10, scratch.p, nullptr) == (N > 3 ? N / 3 : N - 1));
  }
}

TEST_CASE("embedding op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[embedding]") {
  const int B = 3, T = 13, V = 20, maxT = 16, C = 24;
  const std::vector<int32_t> idx = emb_cases::random_ids(B * T, V, 91), pos = emb_cases::random_ids(B * T, maxT, 92);
  using Ts = std::vector<ul::Tensor>;
  op_cases::compare_op("embedding with wpe", {{V, C}, {maxT, C}}, {true, true}, {B, T, C},
                       [&](ul::Context& c, Ts& t) {
                         return ul::embedding(op_cases::make_i32(c, {B, T}, idx), op_cases::make_i32(c, {B, T}, pos),
                                              t[0], t[1]);
                       });
  op_cases::compare_op("embedding without wpe", {{V, C}}, {true}, {B, T, C}, [&](ul::Context& c, Ts& t) {
    return ul::embedding(op_cases::make_i32(c, {B, T}, idx), ul::Tensor{}, t[0], ul::Tensor{});
  });
}

TEST_CASE("embedding op on Device::cuda names an out-of-range token id or position as the CPU op does",
          UL_CUDA_TEST_TAG "[embedding]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard g(c);
  using op_cases::make_i32;
  ul::Tensor wte = c.zeros({50304, 2}), wpe = c.zeros({8, 2});
  std::vector<int32_t> v(16, 7), p(16, 3);
  v[12] = 70000;
  REQUIRE_THROWS_WITH(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, wpe),
                      "embedding: token id 70000 at index 12 is outside the vocabulary [0, 50304)");
  v[3] = -1;  // now the first of two
  REQUIRE_THROWS_WITH(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, wpe),
                      "embedding: token id -1 at index 3 is outside the vocabulary [0, 50304)");
  v[3] = v[12] = 7;
  p[9] = 8;
  REQUIRE_THROWS_WITH(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, wpe),
                      "embedding: position 8 at index 9 is outside the position table [0, 8)");
  CHECK_NOTHROW(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, ul::Tensor{}));  // no table
  CHECK_THROWS_WITH(ul::embedding(c.zeros({2, 8}), make_i32(c, {2, 8}, p), wte, wpe),
                    Catch::Contains("embedding token ids") && Catch::Contains("i32"));
  ul::Context host;
  CHECK_THROWS_WITH(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, host.zeros({8, 2})),
                    Catch::Contains("embedding") && Catch::Contains("cpu"));
  CHECK_THROWS_WITH(ul::embedding(make_i32(c, {2, 8}, v), make_i32(c, {2, 8}, p), wte, c.zeros({8, 2}, ul::DType::bf16)),
                    Catch::Contains("embedding") && Catch::Contains("bf16"));
}
