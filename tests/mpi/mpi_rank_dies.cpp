// A process that dies or hangs mid-collective: run as `mpirun -np 4 mpi_rank_dies abort|kill|hang`.
// Rank 1 joins a few all-reduces, then calls abort(), sends itself SIGKILL, or sleeps (alive, never
// calling again: what mpirun cannot see) while the other ranks keep all-reducing. The job must end
// with a non-zero status instead of hanging (expect_failure.sh): for `hang`, by the communicator's
// 2 s deadline (--comm-timeout in train).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/comm_mpi.h"
#include "parallel/wait_notice.h"

int main(int argc, char** argv) {
  ul::MpiRuntime mpi(&argc, &argv);
  const std::string how = argc > 1 ? argv[1] : "abort";
  // hang: rank 0 also says what it waits for every 0.5 s (parallel/wait_notice.h), as train's lead does.
  auto world = ul::mpi_world(ul::Device::cpu, how == "hang" ? 2.0 : 0.0, how == "hang" ? 0.5 : 0.0);
  if (how == "hang" && world->rank() == 0) ul::set_wait_notice(0.5);
  std::vector<float> buf(1 << 16, 1.f);
  for (int it = 0; it < 1000000; it++) {
    if (world->rank() == 1 && it == 20) {
      std::fprintf(stderr, "rank 1: %s now, as planned\n",
                   how == "kill" ? "SIGKILL" : how == "hang" ? "hanging" : "abort()");
      if (how == "hang") sleep(600);  // mpirun ends it once another rank gives up
      if (how == "kill") kill(getpid(), SIGKILL);
      std::abort();
    }
    world->all_reduce(buf.data(), buf.size(), ul::DType::f32, ul::ReduceOp::max);
  }
  std::fprintf(stderr, "rank %d: finished every all-reduce although rank 1 died\n", world->rank());
  return 0;
}
