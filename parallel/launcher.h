// Which launcher started this process, and what it says of the process's place in the job: its
// rank, the job's size, its rank on this machine (which picks its GPU).
//
// One launcher's variables are read together, never mixed: launchers nest and their children
// inherit the outer one's variables. torchrun under srun leaves every worker SLURM_LOCALID = 0;
// mpirun or MPICH's mpiexec inside a SLURM allocation leave SLURM_PROCID of the daemon that started
// the process. So the innermost launcher wins: torchrun (LOCAL_RANK with RANK and WORLD_SIZE), then
// Open MPI (OMPI_COMM_WORLD_*), then MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID; under
// srun --mpi=pmi2 its SLURM_LOCALID when its SLURM_PROCID is PMI_RANK), then srun's task variables
// (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID).
#pragma once
#include <string>

namespace ul {

struct Launcher {
  std::string name;  // "torchrun", "Open MPI", "MPICH", "srun", or "" (no launcher: one process)
  int rank = -1, size = -1, local_rank = -1;  // -1: not said (or not a number)
  std::string vars;  // the variables read, for messages: "RANK, WORLD_SIZE, LOCAL_RANK"
};

// From this process's environment, read each time.
Launcher detect_launcher();

// Whether a launcher started this process as one of several (RANK and WORLD_SIZE alone may be a
// pod's leftovers, not a launcher's).
bool started_as_several(const Launcher& l);

// An environment variable's value, or nullptr when it is unset or empty.
const char* env_value(const char* name);

}  // namespace ul
