// Host values of a dtype <-> doubles, for the communicator tests: they send small integers, which
// every dtype (f32, f64, i32, bf16) holds exactly, so a test compares doubles whatever was sent.
// And the two bf16 values around a float, for the tests of stochastic rounding.
#pragma once
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "parallel/comm_util.h"  // f32_to_bf16, bf16_to_f32

namespace ul_test {

inline std::vector<char> encode(const std::vector<double>& v, ul::DType t) {
  using ul::DType;
  std::vector<char> out(v.size() * ul::dtype_size(t));
  for (size_t i = 0; i < v.size(); i++) {
    char* p = out.data() + i * ul::dtype_size(t);
    if (t == DType::f32) { float x = float(v[i]); std::memcpy(p, &x, 4); }
    if (t == DType::f64) std::memcpy(p, &v[i], 8);
    if (t == DType::i32) { int32_t x = int32_t(v[i]); std::memcpy(p, &x, 4); }
    if (t == DType::bf16) { uint16_t x = ul::f32_to_bf16(float(v[i])); std::memcpy(p, &x, 2); }
  }
  return out;
}

inline std::vector<double> decode(const std::vector<char>& b, ul::DType t) {
  using ul::DType;
  std::vector<double> v(b.size() / ul::dtype_size(t));
  for (size_t i = 0; i < v.size(); i++) {
    const char* p = b.data() + i * ul::dtype_size(t);
    if (t == DType::f32) { float x; std::memcpy(&x, p, 4); v[i] = x; }
    if (t == DType::f64) std::memcpy(&v[i], p, 8);
    if (t == DType::i32) { int32_t x; std::memcpy(&x, p, 4); v[i] = x; }
    if (t == DType::bf16) { uint16_t x; std::memcpy(&x, p, 2); v[i] = ul::bf16_to_f32(x); }
  }
  return v;
}

// The two bf16 values around x (x itself twice when it is one): toward zero, and away from it.
inline std::pair<float, float> bf16_neighbours(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lo = u & 0xffff0000u, hi = (u & 0xffffu) ? lo + 0x10000u : lo;
  float a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  return {a, b};
}

}  // namespace ul_test
