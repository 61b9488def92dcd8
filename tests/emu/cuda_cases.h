// What the CUDA-vs-CPU case files (tests/emu/*_cuda_cases.h) share: device buffers poisoned with
// NaN, host conversions between float and the kernels' element type, bf16-representable random
// inputs, and a tolerance check that names the worst element. Written only against the CUDA
// runtime API, so it serves the emulated tests (tests/emu) and the GPU ones (tests/gpu) alike.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cuda_launch.h"
#include "gradcheck.h"

namespace cuda_cases {

using ul_test::randn_f;

// count elements of device memory, every byte 0xff (NaN in f32 and bf16) until set. offset > 0
// places p that many elements past an aligned allocation: a pointer that is not 16-byte aligned.
template <class T>
struct DeviceBuffer {
  T* base = nullptr;
  T* p = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count, size_t offset = 0) : n(count) {
    UL_CUDA_CHECK(cudaMalloc(&base, (n + offset) * sizeof(T) + 1));  // + 1: never a zero-byte request
    UL_CUDA_CHECK(cudaMemset(base, 0xff, (n + offset) * sizeof(T)));
    p = base + offset;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(base); }
  void set(const std::vector<T>& h) {
    REQUIRE(h.size() == n);
    UL_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    UL_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n);
    UL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

inline float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }
inline std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Host float <-> the kernel's element type.
template <class T> std::vector<T> to_elem(const std::vector<float>& v);
template <> inline std::vector<float> to_elem<float>(const std::vector<float>& v) { return v; }
template <> inline std::vector<__nv_bfloat16> to_elem<__nv_bfloat16>(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = __float2bfloat16(v[i]);
  return r;
}
inline std::vector<float> to_f32(const std::vector<float>& v) { return v; }
inline std::vector<float> to_f32(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = __bfloat162float(v[i]);
  return r;
}

template <class T> constexpr bool is_bf16() { return std::is_same<T, __nv_bfloat16>::value; }
template <class T> const char* elem_name() { return is_bf16<T>() ? "bf16" : "f32"; }

// Inputs as the element type sees them: bf16 runs get bf16-representable values, so the CPU
// reference in float sees exactly what the kernel reads.
template <class T>
std::vector<float> inputs(size_t n, uint64_t seed, float scale = 1.f) {
  std::vector<float> v = randn_f(n, seed, scale);
  return is_bf16<T>() ? rounded(v) : v;
}

// Checks |got - want| <= rel * |want| + abs_tol for every element; reports the worst one.
inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         double rel, double abs_tol) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, worst_i = 0;
  double worst = -1;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double tol = rel * std::fabs(double(want[i])) + abs_tol;
    const bool ok = err <= tol;  // false for NaN: an unwritten element fails here
    if (!ok) bad++;
    const double score = ok ? err / tol : 1e300;
    if (score > worst) worst = score, worst_i = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at " << worst_i << ": got "
            << (got.empty() ? 0.f : got[worst_i]) << ", want " << (want.empty() ? 0.f : want[worst_i]));
  CHECK(bad == 0);
}

inline double max_abs(const std::vector<float>& v) { return ul_test::max_abs(v.data(), v.size()); }

}  // namespace cuda_cases
