// Helpers shared by the CUDA case headers (tests/emu/*_cases.h: the GEMM, linear, classifier,
// AdamW, Ulysses, pointwise, embedding, RoPE, norm, attention and large cases; each runs emulated
// from tests/emu and on a GPU from tests/gpu). Written against the
// CUDA runtime API (and the engine's device_copy, for buffers on either device), so they work on both.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/context.h"
#include "engine/cuda_launch.h"
#include "engine/device.h"
#include "gradcheck.h"

namespace cuda_cases {

// h -> n device elements at p, and back (after every stream's work is done).
template <class T>
void upload(T* p, const std::vector<T>& h, size_t n) {
  REQUIRE(h.size() == n);
  UL_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
std::vector<T> download(const T* p, size_t n) {
  UL_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> h(n);
  UL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// A device buffer of n elements, NaN-poisoned (all bits set) on creation, so an element a kernel
// fails to write reads as NaN.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count) : n(count) {
    UL_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    poison();
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  void poison() { UL_CUDA_CHECK(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T))); }
  void set(const std::vector<T>& h) { upload(p, h, n); }
  std::vector<T> get() const { return download(p, n); }
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

// n values at p on `dev` (the op cases run the CPU op as their reference), stored as bf16 or as
// f32, as floats.
inline std::vector<float> read_floats(const void* p, size_t n, bool bf16, ul::Device dev) {
  if (!bf16) {
    std::vector<float> r(n);
    ul::device_copy(r.data(), ul::Device::cpu, p, dev, n * sizeof(float));
    return r;
  }
  std::vector<__nv_bfloat16> h(n);
  ul::device_copy(h.data(), ul::Device::cpu, p, dev, n * sizeof(__nv_bfloat16));
  return to_f32(h);
}

// A tracked tensor of dtype dt on c's device holding v (rounded when dt is bf16). Its gradient
// slot has grad_dt: the tensor's own dtype for activations, f32 for weights (parameter gradients
// are f32 whatever the parameters' dtype).
inline ul::Tensor make_tracked(ul::Context& c, ul::Shape s, ul::DType dt, const std::vector<float>& v,
                               ul::DType grad_dt) {
  ul::Tensor t = c.tape.track(c.empty(s, dt), grad_dt);
  REQUIRE(size_t(t.numel()) == v.size());
  if (dt == ul::DType::bf16) ul::copy_from_host(t, to_elem<__nv_bfloat16>(v).data());
  else ul::copy_from_host(t, v.data());
  return t;
}

inline ul::Tensor make_i32(ul::Context& c, ul::Shape s, const std::vector<int32_t>& v) {
  ul::Tensor t = c.empty(s, ul::DType::i32);
  REQUIRE(size_t(t.numel()) == v.size());
  ul::copy_from_host(t, v.data());
  return t;
}

template <class T> constexpr bool is_bf16() { return !std::is_same<T, float>::value; }
template <class T> const char* type_name() { return is_bf16<T>() ? "bf16" : "f32"; }
// The tolerance of an output rounded to T: f32 1e-5, bf16 half an ulp (2^-8 relative) with margin.
template <class T> double rel_tol() { return is_bf16<T>() ? 1.0 / 256 : 1e-5; }

// Random normal values as T sees them: bf16-representable for bf16, so a float reference on the
// host reads exactly what the kernel reads.
template <class T>
std::vector<float> inputs(size_t n, uint64_t seed, float scale = 1.f) {
  std::vector<float> v = ul_test::randn_f(n, seed, scale);
  return is_bf16<T>() ? rounded(v) : v;
}

// Checks |got - want| <= rel * |want| + abs_tol for every element (NaN fails); reports the worst.
inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                         double rel, double abs_tol) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, worst_i = 0;
  double worst = -1;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double tol = rel * std::fabs(double(want[i])) + abs_tol;
    const bool ok = err <= tol;
    if (!ok) bad++;
    const double score = ok ? err / (tol > 0 ? tol : 1) : 1e300;
    if (score > worst) worst = score, worst_i = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at " << worst_i << ": got "
            << (got.empty() ? 0.f : got[worst_i]) << ", want " << (want.empty() ? 0.f : want[worst_i]));
  CHECK(bad == 0);
}

inline double max_abs(const std::vector<float>& v) { return ul_test::max_abs(v.data(), v.size()); }

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace cuda_cases
