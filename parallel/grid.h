// The process-group grid: world = dp x sp. Rank = dp_rank * sp + sp_rank, so a sequence-parallel
// group is `sp` CONSECUTIVE ranks (it stays inside a node, where the all-to-alls are cheap), and a
// data-parallel group is the ranks with the same sp_rank. The gradient is all-reduced over the
// whole world, not a dp group: sp peers hold partial gradients of every weight too (their tokens
// went through it; parallel/data_parallel.h). That is the collective that crosses nodes.
//   world 8, sp 4:  sp groups {0,1,2,3} {4,5,6,7};  dp groups {0,4} {1,5} {2,6} {3,7}
#pragma once
#include <memory>

#include "parallel/communicator.h"

namespace ul {

struct Grid {
  // Collective over world (every rank must build its Grid, in the same order as other collectives).
  // Throws std::runtime_error when sp < 1 or world.size() % sp != 0.
  Grid(Comm& world, int sp);

  Comm& world;                     // not owned
  std::unique_ptr<Comm> sp_group;  // size sp: this rank's slice of the sequence (Ulysses all-to-alls)
  std::unique_ptr<Comm> dp_group;  // size dp: the replicas holding the same slice of other sequences
  int dp = 1, sp = 1, dp_rank = 0, sp_rank = 0;
};

}  // namespace ul
