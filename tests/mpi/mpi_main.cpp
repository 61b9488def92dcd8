// Catch2 main for the MPI tests (instead of catch_main's CATCH_CONFIG_MAIN): every process runs
// every test case in the same order, so their collectives match up. Run under
// `mpirun -np 4 test_comm_mpi`; the exit status is non-zero if any rank failed a check. Catch2's
// implementation is tests/catch_impl.cpp.
#include <mpi.h>

#include "catch_session.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = ul_test::run_catch_session(argc, argv, false);
  // Every rank prints its own summary; the status is the worst over the ranks.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
