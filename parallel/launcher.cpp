#include "parallel/launcher.h"

#include <cstdlib>
#include <string>

namespace ul {

namespace {

bool set(const char* name) { return env_value(name) != nullptr; }

// A non-negative integer, or -1 when unset or not wholly a number.
int number(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x <= 1 << 30 ? int(x) : -1;
}

}  // namespace

const char* env_value(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Launcher detect_launcher() {
  Launcher l;
  if (set("LOCAL_RANK") && set("RANK") && set("WORLD_SIZE")) {
    l = {"torchrun", number("RANK"), number("WORLD_SIZE"), number("LOCAL_RANK"), "RANK, WORLD_SIZE, LOCAL_RANK"};
  } else if (set("OMPI_COMM_WORLD_RANK")) {
    l = {"Open MPI", number("OMPI_COMM_WORLD_RANK"), number("OMPI_COMM_WORLD_SIZE"), number("OMPI_COMM_WORLD_LOCAL_RANK"),
         "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK"};
  } else if (set("PMI_RANK")) {
    l = {"MPICH", number("PMI_RANK"), number("PMI_SIZE"), number("MPI_LOCALRANKID"), "PMI_RANK, PMI_SIZE, MPI_LOCALRANKID"};
    // srun --mpi=pmi2 starts the ranks itself: its own task's local id is then the one to read.
    if (l.local_rank < 0 && l.rank >= 0 && number("SLURM_PROCID") == l.rank) {
      l.local_rank = number("SLURM_LOCALID");
      l.vars = "PMI_RANK, PMI_SIZE, SLURM_LOCALID";
    }
  } else if (set("SLURM_PROCID") && set("SLURM_STEP_ID")) {
    // A task of an srun step (a batch script's own shell has SLURM_PROCID too, but is one process).
    l = {"srun", number("SLURM_PROCID"), number("SLURM_STEP_NUM_TASKS"), number("SLURM_LOCALID"),
         "SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID"};
  } else if (set("RANK") && set("WORLD_SIZE")) {
    // Set by hand (or by a launcher that gives no local rank).
    l = {"RANK and WORLD_SIZE", number("RANK"), number("WORLD_SIZE"), -1, "RANK, WORLD_SIZE"};
  }
  return l;
}

bool started_as_several(const Launcher& l) { return l.size > 1 && l.name != "RANK and WORLD_SIZE"; }

}  // namespace ul
