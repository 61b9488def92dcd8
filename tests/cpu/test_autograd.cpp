// The tape's gradient slots (engine/autograd.h): grad() allocates zeroed on first use, and
// grad_to_overwrite hands a gradient's first writer an unzeroed buffer to store into, while any
// later writer adds to what is there.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/arena.h"
#include "engine/autograd.h"

using namespace ul;

TEST_CASE("tape: the first writer of a gradient stores into an unzeroed buffer, later ones add", "[autograd]") {
  Arena arena(Device::cpu, 1 << 16);
  arena.set_poison(true);  // an unzeroed allocation reads NaN: what the first writer must overwrite
  Tape tape(arena);
  float storage[8] = {};
  Tensor t;
  t.ptr = storage;
  t.shape = Shape{2, 4};
  Tensor a = tape.track(t), b = tape.track(t);

  bool overwrite = false;
  float* ga = static_cast<float*>(tape.grad_to_overwrite(a, overwrite));
  CHECK(overwrite);
  for (int i = 0; i < 8; i++) CHECK(std::isnan(ga[i]));  // not zeroed: no pass of zeros to read back
  for (int i = 0; i < 8; i++) ga[i] = float(i);
  // A second writer (fan-out) and every other use see the same buffer, to add into.
  CHECK(tape.grad_to_overwrite(a, overwrite) == ga);
  CHECK_FALSE(overwrite);
  CHECK(tape.grad(a) == ga);
  CHECK(tape.grad_if_any(a) == ga);
  CHECK(ga[3] == 3.f);

  // A gradient made by grad() first (zeroed) is added into by a later overwriting op.
  float* gb = tape.gradf(b);
  for (int i = 0; i < 8; i++) CHECK(gb[i] == 0.f);
  CHECK(tape.grad_to_overwrite(b, overwrite) == gb);
  CHECK_FALSE(overwrite);

  Tensor untracked = t;
  CHECK_THROWS_WITH(tape.grad_to_overwrite(untracked, overwrite), Catch::Contains("has no gradient slot"));
}

TEST_CASE("tape: a reserved gradient is allocated now but unwritten until its first writer", "[autograd]") {
  Arena arena(Device::cpu, 1 << 16);
  arena.set_poison(true);
  Tape tape(arena);
  float storage[8] = {};
  Tensor t;
  t.ptr = storage;
  t.shape = Shape{2, 4};
  Tensor a = tape.track(t), b = tape.track(t), c = tape.track(t);

  // Reserved, then a first writer that stores: the same buffer, unzeroed, no gradient before.
  tape.reserve_grad(a);
  CHECK(tape.grad_if_any(a) == nullptr);  // nothing has written it: a consumer must not read garbage
  const Arena::Mark above = arena.mark();  // the buffer was taken at the reserve, not later
  bool overwrite = false;
  float* ga = static_cast<float*>(tape.grad_to_overwrite(a, overwrite));
  CHECK(overwrite);
  CHECK(arena.mark().used == above.used);
  for (int i = 0; i < 8; i++) CHECK(std::isnan(ga[i]));
  for (int i = 0; i < 8; i++) ga[i] = float(i);
  CHECK(tape.grad_if_any(a) == ga);
  CHECK(tape.grad_to_overwrite(a, overwrite) == ga);
  CHECK_FALSE(overwrite);  // the second writer adds
  tape.reserve_grad(a);    // a gradient that exists is kept as it is
  CHECK(tape.grad(a) == ga);
  CHECK(ga[5] == 5.f);

  // Reserved, then a writer that adds (grad): zeroed at that moment.
  tape.reserve_grad(b);
  float* gb = tape.gradf(b);
  for (int i = 0; i < 8; i++) CHECK(gb[i] == 0.f);
  CHECK(tape.grad_to_overwrite(b, overwrite) == gb);
  CHECK_FALSE(overwrite);

  // Reserved and never written: moving it hands on zeros (its value), not the poisoned memory.
  tape.reserve_grad(c);
  float dst[8];
  for (float& v : dst) v = NAN;
  tape.move_grad(c, dst);
  for (int i = 0; i < 8; i++) CHECK(dst[i] == 0.f);
}
