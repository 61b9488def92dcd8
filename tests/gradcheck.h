// Float64 central-difference gradient checks for the CPU backward kernels.
// The CPU kernels are templates; instantiated for double, a central difference with h = 1e-6 has
// truncation and rounding error around 1e-9, so the analytic gradient is held to 1e-6 of the
// larger of 1 and the largest gradient element (absolute for gradients below 1).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace ul_test {

using Vec = std::vector<double>;

// The larger of a running worst error and a new one, a NaN counting as infinitely large:
// std::max(m, NaN) is m, so a NaN difference (a poisoned output never written, a kernel that
// produced NaN) would be dropped and the comparison pass. For differences, not for scales.
inline double max_err(double m, double err) { return std::isnan(err) ? INFINITY : std::max(m, err); }

inline Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<float> randn_f(size_t n, uint64_t seed, float scale = 1.f) {
  Vec v = randn(n, seed, scale);
  return std::vector<float>(v.begin(), v.end());
}

// n integers uniform in [0, limit): token ids, positions.
inline std::vector<int32_t> rand_ints(int n, int limit, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(n);
  for (auto& i : v) i = int32_t(g() % uint64_t(limit));
  return v;
}

// Checks d/d(inputs) of L = sum(y .* wy), where y = forward(inputs) and wy is a fixed random
// weighting (so every output element matters). `backward(dy, dinputs)` must ADD into dinputs,
// which arrive zeroed. Each input entry is perturbed by +-h: every one, or every (size / max_probe)-th
// (integer division: up to twice max_probe entries of a large input).
inline void gradcheck(const std::string& name, std::vector<Vec*> inputs,
                      const std::function<void(Vec& y)>& forward,
                      const std::function<void(const Vec& dy, std::vector<Vec>& dx)>& backward,
                      double rel_tol = 1e-6, size_t max_probe = 200, double h = 1e-6) {
  Vec y;
  forward(y);
  Vec wy = randn(y.size(), 12345);
  auto loss = [&] {
    Vec yy;
    forward(yy);
    double L = 0;
    for (size_t i = 0; i < yy.size(); i++) L += yy[i] * wy[i];
    return L;
  };
  std::vector<Vec> dx(inputs.size());
  for (size_t k = 0; k < inputs.size(); k++) dx[k].assign(inputs[k]->size(), 0.0);
  backward(wy, dx);

  for (size_t k = 0; k < inputs.size(); k++) {
    Vec& x = *inputs[k];
    double max_ref = 0;
    for (double g : dx[k]) max_ref = std::max(max_ref, std::fabs(g));
    size_t stride = std::max<size_t>(1, x.size() / max_probe);
    double worst = 0;
    for (size_t i = 0; i < x.size(); i += stride) {
      double keep = x[i];
      x[i] = keep + h;
      double lp = loss();
      x[i] = keep - h;
      double lm = loss();
      x[i] = keep;
      double num = (lp - lm) / (2 * h);
      double err = std::fabs(num - dx[k][i]) / std::max(1.0, max_ref);
      worst = max_err(worst, err);
    }
    INFO(name << ": input " << k << " worst error " << worst << " (relative to max |grad| " << max_ref << ")");
    CHECK(worst < rel_tol);
    CHECK(max_ref > 0);  // a gradient that is identically zero checks nothing
  }
}

inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = max_err(m, double(std::fabs(a[i] - b[i])));
  return m;
}
inline double max_abs(const float* a, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

}  // namespace ul_test
