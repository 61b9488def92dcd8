// The MPI communicator: ranks are processes (launched by mpirun), collectives are the MPI ones.
// Only compiled when CMake finds MPI (ULYSSES_HAVE_MPI=1). Buffers on a device other than the
// host are staged through host memory (a GPU build uses NCCL between GPUs instead).
// Errors: the communicators return MPI errors (MPI_ERRORS_RETURN), which become CommError with
// MPI's message. A dead peer usually makes mpirun end the whole job, so nobody hangs; a peer alive
// but never coming is what mpi_world's timeout is for.
#pragma once
#include <memory>
#include <utility>

#include "parallel/communicator.h"

namespace ul {

// MPI_Init_thread (MPI_THREAD_FUNNELED: only the thread that made it calls MPI) for the lifetime of
// this object, MPI_Finalize at its end. If MPI is already initialised (e.g. by a test's main), it
// does neither.
class MpiRuntime {
 public:
  MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

// All processes: a duplicate of MPI_COMM_WORLD (so its error handler is ours). MPI must be
// initialised. device: where the buffers handed to the collectives live. timeout_s > 0: a rank
// still inside one call that waits on the peers (a collective, a split) after that many seconds
// says which call and exits with status 1 (`--comm-timeout`; mpirun then ends the job); 0: none.
// notice_s > 0 (with a timeout): every notice_s seconds of such a wait, the process that set
// wait_notice() (the lead's: parallel/wait_notice.h) says what it waits in.
std::unique_ptr<Comm> mpi_world(Device device = Device::cpu, double timeout_s = 0, double notice_s = 0);

// The most elements one MPI call carries: MPI counts are ints, and some MPI stacks mishandle
// messages past 2 GiB, so a collective of more (a ZeRO shard of an 8B model over 2 ranks, an
// all-to-all of a long sequence) goes in pieces of at most this many elements and 1 GiB. INT_MAX
// unless lowered, which tests do to run the pieces on small buffers.
void set_mpi_max_count(size_t elements);

// For a rank that failed (an exception), after it printed why: a job of several processes is ended
// with MPI_Abort, since the others may be waiting for it in a collective they would never leave (a
// damaged rank_R.json read by one rank alone, a full disk under rank 0's save). Returns when MPI is
// not running or the job has one process, for the caller's own exit.
void abort_job_if_shared(int code);
// This process's rank in MPI's world and the world's size ({-1, 0} when MPI is not running).
std::pair<int, int> mpi_world_place();

}  // namespace ul
