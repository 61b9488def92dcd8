// train: the command-line front of ulysses. Flags -> world -> one training job per rank.
//   ./build/train                       the default job (tiny model, associative recall)
//   ./build/train --help                every flag
//   mpirun -np 4 ./build/train --comm mpi --sp 2 ...
#include <cstdio>
#include <exception>

#include "engine/check_state.h"
#include "engine/options.h"
#include "engine/planner.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#if ULYSSES_HAVE_MPI
#include "parallel/comm_mpi.h"
#endif

using namespace ul;

static int run(const Options& o, Comm& world) {
  return o.check_state.empty() ? train_rank(o, world) : check_state_rank(o, world);
}

int main(int argc, char** argv) {
  try {
    Options o = parse_options(argc, argv);
    if (o.help) {
      std::fputs(usage(), stdout);
      return 0;
    }
    if (o.plan) return plan_main(o);  // prints what the run would hold; starts nothing
    if (o.comm == "mpi") {
#if ULYSSES_HAVE_MPI
      MpiRuntime mpi(&argc, &argv);
      auto world = mpi_world();
      return run(o, *world);
#else
      throw std::runtime_error("--comm mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    int code = 0;
    run_local(o.ranks, [&](Comm& world) {
      int c = run(o, world);
      if (world.rank() == 0) code = c;
    });
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  }
}
