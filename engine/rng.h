// A small seeded RNG (splitmix64): reproducible across platforms and compilers, unlike
// std::normal_distribution, so that the same seed gives the same initial weights everywhere.
#pragma once
#include <cmath>
#include <cstdint>

namespace ul {

class Rng {
 public:
  static constexpr uint64_t kIncrement = 0x9E3779B97F4A7C15ull;  // the state's step: k numbers on is s + k x this
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next_u64() {
    uint64_t z = (s_ += kIncrement);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Box-Muller, one draw per call (the pair's second value is dropped for simplicity).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t state() const { return s_; }
  void set_state(uint64_t s) { s_ = s; }

 private:
  uint64_t s_;
};

}  // namespace ul
