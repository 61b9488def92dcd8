// The per-step arena (engine/arena.h): bump allocation, marks and release, the high-water mark,
// and poisoning (every uninitialised allocation 0xff: NaN as f32 and bf16, -1 as i32).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/arena.h"

using namespace ul;

TEST_CASE("arena: aligned bump allocation, release to a mark, high-water and reset", "[arena]") {
  Arena a(Device::cpu, 4096);
  char* p = static_cast<char*>(a.alloc(10));
  char* q = static_cast<char*>(a.alloc(100));
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  CHECK(q - p == 64);  // 10 bytes take one 64-byte line
  CHECK(a.used() == 64 + 128);
  const Arena::Mark m = a.mark();
  a.alloc(1000);
  CHECK(a.used() == 64 + 128 + 1024);
  a.release(m);
  CHECK(a.used() == 64 + 128);
  CHECK(a.alloc(8) == q + 128);  // the released bytes are handed out again
  CHECK(a.high_water() == 64 + 128 + 1024);
  a.alloc(5000);  // larger than a block: a block of its own
  CHECK(a.blocks() == 2);
  a.reset();
  CHECK(a.used() == 0);
  CHECK(a.alloc(1) == p);
}

TEST_CASE("arena: poisoned allocations read NaN until written, zeroed ones read zero", "[arena]") {
  Arena a(Device::cpu, 4096);
  a.set_poison(true);
  REQUIRE(a.poison());
  const Arena::Mark m = a.mark();
  float* f = static_cast<float*>(a.alloc(16 * sizeof(float)));
  for (int i = 0; i < 16; i++) CHECK(std::isnan(f[i]));
  f[3] = 1.f;
  a.release(m);
  // The same bytes again, after a write: poisoned again, not what the last user left.
  float* g = static_cast<float*>(a.alloc(16 * sizeof(float)));
  REQUIRE(g == f);
  CHECK(std::isnan(g[3]));
  int32_t* n = a.tensor({4}, DType::i32).i32();
  for (int i = 0; i < 4; i++) CHECK(n[i] == -1);
  const Tensor z = a.zeros({8});
  for (int i = 0; i < 8; i++) CHECK(z.f32()[i] == 0.f);
  float* h = static_cast<float*>(a.alloc_zero(8 * sizeof(float)));
  for (int i = 0; i < 8; i++) CHECK(h[i] == 0.f);

  a.set_poison(false);  // off: an allocation keeps what was there
  a.reset();
  float* k = static_cast<float*>(a.alloc(sizeof(float)));
  *k = 2.f;
  a.reset();
  CHECK(*static_cast<float*>(a.alloc(sizeof(float))) == 2.f);
}

TEST_CASE("arena: what a release or reset frees reads NaN, and marks release in order", "[arena]") {
  // Poisoned at release, not only at the next allocation: a tensor read after its scope ended
  // (nothing allocated over it since) reads NaN, not the values it held.
  Arena a(Device::cpu, 256);  // small blocks: a scope spanning two of them
  a.set_poison(true);
  float* kept = static_cast<float*>(a.alloc(8 * sizeof(float)));
  for (int i = 0; i < 8; i++) kept[i] = 1.f;
  const Arena::Mark outer = a.mark();
  float* x = static_cast<float*>(a.alloc(32 * sizeof(float)));  // the rest of block 0
  float* y = static_cast<float*>(a.alloc(48 * sizeof(float)));  // a second block
  for (int i = 0; i < 32; i++) x[i] = 3.f;
  for (int i = 0; i < 48; i++) y[i] = 4.f;
  REQUIRE(a.blocks() == 2);
  const Arena::Mark inner = a.mark();
  a.release(outer);
  for (int i = 0; i < 32; i++) CHECK(std::isnan(x[i]));
  for (int i = 0; i < 48; i++) CHECK(std::isnan(y[i]));
  for (int i = 0; i < 8; i++) CHECK(kept[i] == 1.f);  // below the mark: untouched
  // The inner mark belonged to the released scope: releasing it now is a bug, said at once.
  CHECK_THROWS_WITH(a.release(inner), Catch::Contains("released out of order"));
  a.reset();
  for (int i = 0; i < 8; i++) CHECK(std::isnan(kept[i]));
}
