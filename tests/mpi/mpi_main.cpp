// Catch2 main for the MPI tests (instead of catch_main's CATCH_CONFIG_MAIN): every process runs
// every test case in the same order, so their collectives match up. Run under
// `mpirun -np 4 test_comm_mpi`; the exit status is non-zero if any rank failed a check.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  int failed = session.applyCommandLine(argc, argv);
  if (failed == 0) failed = session.run();
  // Every rank prints its own summary; the status is the worst over the ranks.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
