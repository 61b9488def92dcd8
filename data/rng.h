// A tiny, fast, seedable RNG for the data sources. Counter-based seeding (mix of seed, stream and
// index) is what makes every sequence a pure function of its index: no generator state to carry.
#pragma once
#include <cstdint>

namespace ul {

// splitmix64's finaliser: a bijective 64-bit mix with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct DataRng {
  uint64_t s;
  // Distinct (seed, stream, index) triples give independent-looking streams.
  DataRng(uint64_t seed, uint64_t stream, uint64_t index) : s(mix64(mix64(seed ^ mix64(stream)) + index)) {}
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n); the modulo bias is < n / 2^64, irrelevant for the small n used here.
  uint32_t below(uint32_t n) { return uint32_t(next() % n); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
};

}  // namespace ul
