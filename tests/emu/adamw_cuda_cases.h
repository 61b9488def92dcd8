// AdamW and the gradient norm on CUDA against the CPU backend. Written only against the CUDA
// runtime API and the engine, so the same cases run emulated (tests/emu) and on a GPU (tests/gpu).
//   - f32: params, m, v equal cpu::adamw_update within 1e-6 relative over several steps, with
//     weight decay, a clipping scale and n no multiple of a block;
//   - bf16: the fp32 master equals the CPU update within 1e-6; every parameter is the master
//     rounded down or up to a neighbouring bf16 (within one bf16 ulp); the rounding is unbiased
//     (the mean of many roundings of one value is that value, within 5 standard errors, where
//     round-to-nearest would be off by 100) and the same seed gives the same bits;
//   - sum_squares: within 1e-5 relative of the CPU's float64 sum, and the same bits on a rerun.
#pragma once
#include "dtype_codec.h"
#include "emu/cuda_cases_util.h"
#include "engine/optimizer.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including adamw_cuda_cases.h"
#endif

namespace adamw_cases {
using namespace cuda_cases;

constexpr float kLr = 3e-3f, kB1 = 0.9f, kB2 = 0.95f, kEps = 1e-8f, kWd = 0.1f, kScale = 0.7f;

using ul_test::bf16_neighbours;

// f32 AdamW state twice: on the host for the CPU update, on the device for the kernel. Parameters
// random (from seed), moments zero; g is the step's gradient, on both sides.
struct F32State {
  std::vector<float> p, m, v, g;
  DeviceBuffer<float> d_p, d_g, d_m, d_v;
  F32State(size_t n, uint64_t seed)
      : p(ul_test::randn_f(n, seed)), m(n, 0.f), v(n, 0.f), d_p(n), d_g(n), d_m(n), d_v(n) {
    d_p.set(p);
    d_m.set(m);
    d_v.set(v);
  }
  void new_gradient(uint64_t seed) {
    g = ul_test::randn_f(p.size(), seed, 0.5f);
    d_g.set(g);
  }
  void expect_same() const {
    expect_close("params", d_p.get(), p, 1e-6, 1e-9);
    expect_close("m", d_m.get(), m, 1e-6, 1e-9);
    expect_close("v", d_v.get(), v, 1e-6, 1e-12);
  }
};

inline void check_f32(size_t n) {
  INFO("f32 n=" << n);
  F32State s(n, 1);
  for (int t = 1; t <= 3; t++) {
    INFO("step " << t);
    s.new_gradient(10 + t);
    ul::cpu::adamw_update(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, kLr, kB1, kB2, kEps, kWd, kScale, t);
    ul::cuda::adamw_update<float>(s.d_p.p, nullptr, s.d_g.p, s.d_m.p, s.d_v.p, n, kLr, kB1, kB2, kEps, kWd, kScale,
                                  t, 42, nullptr);
    s.expect_same();
  }
}

inline void check_bf16(size_t n) {
  INFO("bf16 n=" << n);
  std::vector<float> master = ul_test::randn_f(n, 2), m(n, 0.f), v(n, 0.f);
  DeviceBuffer<__nv_bfloat16> d_p(n);
  DeviceBuffer<float> d_master(n), d_g(n), d_m(n), d_v(n);
  d_p.set(to_elem<__nv_bfloat16>(master));
  d_master.set(master);
  d_m.set(m);
  d_v.set(v);
  for (int t = 1; t <= 3; t++) {
    INFO("step " << t);
    const std::vector<float> g = ul_test::randn_f(n, 20 + t, 0.5f);
    d_g.set(g);
    ul::cpu::adamw_update(master.data(), g.data(), m.data(), v.data(), n, kLr, kB1, kB2, kEps, kWd, kScale, t);
    d_p.poison();
    ul::cuda::adamw_update<__nv_bfloat16>(d_p.p, d_master.p, d_g.p, d_m.p, d_v.p, n, kLr, kB1, kB2, kEps, kWd, kScale,
                                          t, 7, nullptr);
    const std::vector<float> got_master = d_master.get();
    expect_close("master", got_master, master, 1e-6, 1e-9);
    expect_close("m", d_m.get(), m, 1e-6, 1e-9);
    const std::vector<float> got = to_f32(d_p.get());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      const auto [lo, hi] = bf16_neighbours(got_master[i]);
      if (!(got[i] == lo || got[i] == hi)) bad++;  // NaN (unwritten) fails too
    }
    INFO(bad << " of " << n << " parameters are not a bf16 neighbour of their master weight");
    CHECK(bad == 0);
  }
}

// lr = 0 leaves each master weight as it is, so the parameters are pure roundings of it.
inline std::vector<__nv_bfloat16> round_only(float value, size_t n, uint64_t seed, int t) {
  DeviceBuffer<__nv_bfloat16> d_p(n);
  DeviceBuffer<float> d_master(n), d_g(n), d_m(n), d_v(n);
  d_master.set(std::vector<float>(n, value));
  d_g.set(std::vector<float>(n, 0.f));
  d_m.set(std::vector<float>(n, 0.f));
  d_v.set(std::vector<float>(n, 0.f));
  ul::cuda::adamw_update<__nv_bfloat16>(d_p.p, d_master.p, d_g.p, d_m.p, d_v.p, n, 0.f, kB1, kB2, kEps, kWd, 1.f, t,
                                        seed, nullptr);
  CHECK(same_bits(d_master.get(), std::vector<float>(n, value)));
  return d_p.get();
}

// Decay segments ending at `ends`, the first decaying, the next not, and so on; on the device too.
struct Segments {
  std::vector<uint8_t> decay;
  cuda_cases::DeviceBuffer<uint64_t> d_ends;
  cuda_cases::DeviceBuffer<uint8_t> d_decay;
  explicit Segments(const std::vector<uint64_t>& ends) : decay(ends.size()), d_ends(ends.size()), d_decay(ends.size()) {
    for (size_t k = 0; k < ends.size(); k++) decay[k] = k % 2 == 0;
    d_ends.set(ends);
    d_decay.set(decay);
  }
  ul::cuda::DecaySegments device() const { return {d_ends.p, d_decay.p, int(decay.size())}; }
};

}  // namespace adamw_cases

TEST_CASE("adamw_update f32 matches the CPU update", UL_CUDA_TEST_TAG "[adamw]") {
  for (size_t n : {size_t(1), size_t(255), size_t(1237), size_t(70001)}) adamw_cases::check_f32(n);
}

TEST_CASE("adamw_update bf16: master matches the CPU, parameters are a neighbouring bf16", UL_CUDA_TEST_TAG "[adamw]") {
  for (size_t n : {size_t(1), size_t(300), size_t(5003)}) adamw_cases::check_bf16(n);
}

TEST_CASE("adamw_update bf16 rounding is stochastic, unbiased and deterministic per seed", UL_CUDA_TEST_TAG "[adamw]") {
  using namespace cuda_cases;
  const size_t n = 100000;
  // 1 + 2^-10 and -(3 + 5 * 2^-9): 1/8 and 5/8 of the way from the bf16 nearer zero to the next.
  for (float value : {1.0f + 0x1p-10f, -(3.0f + 5 * 0x1p-9f)}) {
    INFO("value " << value);
    const auto [lo, hi] = adamw_cases::bf16_neighbours(value);
    const double frac = (double(value) - lo) / (double(hi) - lo), ulp = std::fabs(double(hi) - lo);
    const std::vector<__nv_bfloat16> r = adamw_cases::round_only(value, n, 1234, 5);
    double sum = 0;
    size_t up = 0, other = 0;
    for (const auto& b : r) {
      const float f = __bfloat162float(b);
      other += !(f == lo || f == hi);
      sum += f;
      up += f == hi;
    }
    REQUIRE(other == 0);
    const double mean = sum / n, sigma = ulp * std::sqrt(frac * (1 - frac) / n);
    CHECK(std::fabs(mean - value) < 5 * sigma);
    CHECK(std::fabs(double(up) / n - frac) < 5 * std::sqrt(frac * (1 - frac) / n));
    // Deterministic: the same (seed, step) gives the same bits; another seed or step other bits.
    CHECK(same_bits(adamw_cases::round_only(value, n, 1234, 5), r));
    CHECK(!same_bits(adamw_cases::round_only(value, n, 1235, 5), r));
    CHECK(!same_bits(adamw_cases::round_only(value, n, 1234, 6), r));
  }
  // A value that is a bf16 already stays exactly that.
  const std::vector<__nv_bfloat16> exact = adamw_cases::round_only(1.5f, 300, 1, 1);
  CHECK(std::all_of(exact.begin(), exact.end(), [](__nv_bfloat16 b) { return __bfloat162float(b) == 1.5f; }));
}

TEST_CASE("adamw_update in one launch with decay segments matches the CPU update segment by segment",
          UL_CUDA_TEST_TAG "[adamw]") {
  using namespace cuda_cases;
  using namespace adamw_cases;
  // Segments that alternate between decaying and not, one of a single element, over more elements
  // than one pass of the grid (so threads walk several segments).
  for (const std::vector<uint64_t>& ends :
       {std::vector<uint64_t>{300, 301, 1237}, std::vector<uint64_t>{1000, 50000, 50001, 70001, 600001}}) {
    const size_t n = ends.back();
    INFO("n=" << n << ", " << ends.size() << " segments");
    const Segments segs(ends);
    F32State s(n, 3);
    for (int t = 1; t <= 2; t++) {
      s.new_gradient(30 + t);
      for (size_t k = 0, a = 0; k < ends.size(); a = ends[k], k++)
        ul::cpu::adamw_update(s.p.data() + a, s.g.data() + a, s.m.data() + a, s.v.data() + a, ends[k] - a, kLr, kB1,
                              kB2, kEps, segs.decay[k] ? kWd : 0.f, kScale, t);
      ul::cuda::adamw_update<float>(s.d_p.p, nullptr, s.d_g.p, s.d_m.p, s.d_v.p, n, kLr, kB1, kB2, kEps, kWd, kScale,
                                    t, 42, nullptr, 0, segs.device());
      s.expect_same();
    }
  }
}

TEST_CASE("bf16 rounding bits follow the element's index in the whole buffer, however it is cut",
          UL_CUDA_TEST_TAG "[adamw]") {
  using namespace cuda_cases;
  using namespace adamw_cases;
  // One launch over n elements against two launches over [0, k) and [k, n) with index_base k (a
  // ZeRO shard boundary): the same bf16 bits; round_master redraws them. k = 1501 puts the second
  // launch off the 4-element boundary, where the kernel takes one element at a time.
  const size_t n = 4099;
  const size_t k = GENERATE(size_t(1500), size_t(1501));
  INFO("cut at " << k);
  const std::vector<float> master0 = ul_test::randn_f(n, 8), g = ul_test::randn_f(n, 9, 0.5f);
  auto run = [&](bool split) {
    DeviceBuffer<__nv_bfloat16> d_p(n);
    DeviceBuffer<float> d_master(n), d_g(n), d_m(n), d_v(n);
    d_master.set(master0);
    d_g.set(g);
    d_m.set(std::vector<float>(n, 0.f));
    d_v.set(std::vector<float>(n, 0.f));
    if (!split) {
      ul::cuda::adamw_update<__nv_bfloat16>(d_p.p, d_master.p, d_g.p, d_m.p, d_v.p, n, kLr, kB1, kB2, kEps, kWd, 1.f,
                                            3, 99, nullptr);
    } else {
      ul::cuda::adamw_update<__nv_bfloat16>(d_p.p, d_master.p, d_g.p, d_m.p, d_v.p, k, kLr, kB1, kB2, kEps, kWd, 1.f,
                                            3, 99, nullptr, 0);
      ul::cuda::adamw_update<__nv_bfloat16>(d_p.p + k, d_master.p + k, d_g.p + k, d_m.p + k, d_v.p + k, n - k, kLr,
                                            kB1, kB2, kEps, kWd, 1.f, 3, 99, nullptr, k);
    }
    std::vector<__nv_bfloat16> params = d_p.get();
    // round_master over the second part alone, from the masters, gives the same bits again.
    d_p.poison();
    ul::cuda::round_master(d_p.p + k, d_master.p + k, n - k, 3, 99, nullptr, k);
    const std::vector<__nv_bfloat16> redrawn = d_p.get();
    CHECK(same_bits(std::vector<__nv_bfloat16>(redrawn.begin() + k, redrawn.end()),
                    std::vector<__nv_bfloat16>(params.begin() + k, params.end())));
    return params;
  };
  CHECK(same_bits(run(false), run(true)));
}

namespace adamw_cases {
// One update of n elements (with decay segments) on arrays that start `offset` elements into their
// buffers; every array's bits after it (params as f32, or bf16 params then the master), m and v.
template <class Tp>
std::vector<std::vector<uint32_t>> update_bits(size_t n, size_t offset, const std::vector<uint64_t>& ends) {
  using namespace cuda_cases;
  constexpr bool f32 = std::is_same<Tp, float>::value;
  const size_t total = n + offset;
  // The same n values whatever the offset, after `offset` padding elements.
  auto at_offset = [&](std::vector<float> x) {
    x.insert(x.begin(), offset, 0.f);
    return x;
  };
  std::vector<float> v0 = ul_test::randn_f(n, 54, 0.1f);
  for (float& x : v0) x *= x;  // a second moment is not negative
  const std::vector<float> w = at_offset(ul_test::randn_f(n, 51)), g = at_offset(ul_test::randn_f(n, 52, 0.5f)),
                           m0 = at_offset(ul_test::randn_f(n, 53, 0.1f)), v_pos = at_offset(v0);
  const Segments segs(ends);
  DeviceBuffer<Tp> d_p(total);
  DeviceBuffer<float> d_master(total), d_g(total), d_m(total), d_v(total);
  d_p.set(to_elem<Tp>(w));
  d_master.set(w);
  d_g.set(g);
  d_m.set(m0);
  d_v.set(v_pos);
  ul::cuda::adamw_update<Tp>(d_p.p + offset, f32 ? nullptr : d_master.p + offset, d_g.p + offset, d_m.p + offset,
                             d_v.p + offset, n, kLr, kB1, kB2, kEps, kWd, kScale, 5, 77, nullptr, 1000,
                             segs.device());
  auto bits = [&](const std::vector<float>& x) {
    std::vector<uint32_t> b(n);
    std::memcpy(b.data(), x.data() + offset, n * 4);
    return b;
  };
  std::vector<std::vector<uint32_t>> out{bits(to_f32(d_p.get())), bits(d_m.get()), bits(d_v.get())};
  if (!f32) out.push_back(bits(d_master.get()));
  return out;
}
}  // namespace adamw_cases

TEST_CASE("adamw_update gives the same bits four elements a thread and one at a time", UL_CUDA_TEST_TAG "[adamw]") {
  // Arrays on a 4-element boundary take the 16-byte path, one element past it the 4-byte one; n is
  // no multiple of 4 (the last group is partial), the decay segments end inside groups, and n is
  // past what one pass of the largest grid covers four at a time (2048 blocks x 256 threads x 4),
  // so threads go round the grid-stride loop and carry their segment cursor on.
  const size_t n = 2200003;
  const std::vector<uint64_t> ends{5, 6, 4097, 50001, 2097153, n};
  CHECK(adamw_cases::update_bits<float>(n, 0, ends) == adamw_cases::update_bits<float>(n, 1, ends));
  CHECK(adamw_cases::update_bits<__nv_bfloat16>(n, 0, ends) == adamw_cases::update_bits<__nv_bfloat16>(n, 1, ends));
}

TEST_CASE("adamw_update refuses a master buffer that does not fit the parameter type", UL_CUDA_TEST_TAG "[adamw]") {
  using namespace cuda_cases;
  DeviceBuffer<float> buf(4);
  DeviceBuffer<__nv_bfloat16> p16(4);
  auto f32_with_master = [&] {
    ul::cuda::adamw_update<float>(buf.p, buf.p, buf.p, buf.p, buf.p, 4, 1.f, .9f, .95f, 1e-8f, 0.f, 1.f, 1, 0, nullptr);
  };
  auto bf16_without = [&] {
    ul::cuda::adamw_update<__nv_bfloat16>(p16.p, nullptr, buf.p, buf.p, buf.p, 4, 1.f, .9f, .95f, 1e-8f, 0.f, 1.f, 1,
                                          0, nullptr);
  };
  CHECK_THROWS_WITH(f32_with_master(), Catch::Contains("master = null"));
  CHECK_THROWS_WITH(bf16_without(), Catch::Contains("need f32 master"));
}

// In double, as the CPU sums: to 1e-13 relative (a sum kept in float, as it was, is off by ~1e-7
// already at 100003 elements, and by more with the count).
TEST_CASE("sum_squares matches the CPU and is deterministic", UL_CUDA_TEST_TAG "[adamw][norm]") {
  using namespace cuda_cases;
  for (size_t n : {size_t(0), size_t(1), size_t(255), size_t(8193), size_t(100003), size_t(3000017)}) {
    INFO("n=" << n);
    const std::vector<float> x = ul_test::randn_f(n, 5 + n, 0.3f);
    const double want = ul::cpu::sum_squares(x.data(), n);
    DeviceBuffer<float> d_x(n);
    DeviceBuffer<double> scratch(ul::cuda::sum_squares_scratch_bytes(n) / sizeof(double)), out(1);
    d_x.set(x);
    const double got = ul::cuda::sum_squares(d_x.p, n, nullptr);
    CHECK(std::fabs(got - want) <= 1e-13 * want);
    ul::cuda::sum_squares(out.p, d_x.p, n, scratch.p, nullptr);
    const std::vector<double> a = out.get();
    CHECK(std::fabs(a[0] - want) <= 1e-13 * want);
    out.poison();
    ul::cuda::sum_squares(out.p, d_x.p, n, scratch.p, nullptr);
    CHECK(out.get()[0] == a[0]);  // the same bits: poisoned (NaN) first, so a skipped write fails
    CHECK(got == a[0]);
  }
}
