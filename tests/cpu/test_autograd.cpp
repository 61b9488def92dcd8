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
