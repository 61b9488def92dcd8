// exp for the CPU kernels' elementwise loops: branch-free, so that GCC vectorizes the loops that
// call it (libm's expf and tanhf are calls the vectorizer cannot inline; GELU spent a third of the
// default training job in them). float gets the polynomial below; double keeps std::exp (the
// float64 gradient checks want libm's accuracy).
//
// exp(z) = 2^n exp(r) with n = round(z / ln 2) and r = z - n ln 2 (ln 2 split in two parts so that
// n ln 2 is exact to well below float precision), |r| <= ln 2 / 2; exp(r) by its Taylor series to
// r^7 (the first term left out, r^8 / 8!, is under 2^-27 there), in Horner form; 2^n built from its
// exponent bits. Below -87 it returns exp(-87) = 1.6e-38 (the smallest result that stays a normal
// float), above 88 +inf, as exp overflows. Within 2 ulp of the exact value on [-87, 88] (tested).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ul {
namespace cpu {

inline float exp_simd(float z) {
  // A NaN z takes the low clamp (so the integer conversion below stays defined) and is returned
  // as it came at the end: NaN propagates, as std::exp's does.
  const float c = !(z >= -87.f) ? -87.f : (z > 88.f ? 88.f : z);
  // round(c / ln 2) to an integer: adding and taking away 1.5 * 2^23 leaves no fraction bits (exact
  // in float arithmetic, which the compiler may not reassociate without -ffast-math).
  const float n = (c * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = (c - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 = 0.693145752 + 1.42860677e-6
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  std::memcpy(&scale, &bits, 4);
  return z > 88.f ? INFINITY : (z != z ? z : p * scale);
}
inline double exp_simd(double z) { return std::exp(z); }

}  // namespace cpu
}  // namespace ul
