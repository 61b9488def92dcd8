#include "parallel/grid.h"

#include <stdexcept>
#include <string>

namespace ul {

Grid::Grid(Comm& w, int sp_size) : world(w) {
  const int n = w.size();
  if (sp_size < 1 || n % sp_size != 0) {
    std::string valid;
    for (int s = 1; s <= n; s++)
      if (n % s == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(s);
    throw std::runtime_error("grid: sequence-parallel size " + std::to_string(sp_size) +
                             " does not divide the world size " + std::to_string(n) + " (world = dp x sp); sp values that divide it: " +
                             valid + " (the model's heads and --seq must allow them too)" +
                             (n == 1 ? std::string("; this world has one rank: give --ranks N (--comm local) or start N "
                                                   "processes (mpirun -np N, --comm mpi), N a multiple of --sp")
                                     : std::string()));
  }
  sp = sp_size;
  dp = n / sp;
  dp_rank = w.rank() / sp;
  sp_rank = w.rank() % sp;
  // key = sp_rank: rank j of the sp group holds token slice j ([j Tl, (j+1) Tl)); the batch
  // loader and the all-to-all's chunk order (chunk j = rank j's tokens) both rely on it.
  sp_group = w.split(/*color=*/dp_rank, /*key=*/sp_rank);
  dp_group = w.split(/*color=*/sp_rank, /*key=*/dp_rank);
}

}  // namespace ul
