// A process that dies mid-collective: run as `mpirun -np 4 mpi_rank_dies abort|kill`. Rank 1
// joins a few all-reduces, then calls abort() or sends itself SIGKILL while the other ranks keep
// all-reducing. The job must end with a non-zero status instead of hanging (expect_failure.sh).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/comm_mpi.h"

int main(int argc, char** argv) {
  ul::MpiRuntime mpi(&argc, &argv);
  const bool use_kill = argc > 1 && std::strcmp(argv[1], "kill") == 0;
  auto world = ul::mpi_world();
  std::vector<float> buf(1 << 16, 1.f);
  for (int it = 0; it < 1000000; it++) {
    if (world->rank() == 1 && it == 20) {
      std::fprintf(stderr, "rank 1: %s now, as planned\n", use_kill ? "SIGKILL" : "abort()");
      if (use_kill) kill(getpid(), SIGKILL);
      std::abort();
    }
    world->all_reduce(buf.data(), buf.size(), ul::DType::f32, ul::ReduceOp::max);
  }
  std::fprintf(stderr, "rank %d: finished every all-reduce although rank 1 died\n", world->rank());
  return 0;
}
