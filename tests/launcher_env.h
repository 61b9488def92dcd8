// The variables launchers set to say how many ranks share a node (Open MPI, MPICH, torchrun, SLURM;
// engine/trainer.cpp: ranks_on_this_host), cleared for a test's scope and restored after it: a
// test of what they do must not depend on running under srun or mpirun itself.
#pragma once
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace ul_test {

class ClearLauncherEnv {
 public:
  ClearLauncherEnv() {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}) {
      if (const char* v = std::getenv(name)) saved_.push_back({name, v});
      ::unsetenv(name);
    }
  }
  ~ClearLauncherEnv() {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"})
      ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ClearLauncherEnv(const ClearLauncherEnv&) = delete;
  ClearLauncherEnv& operator=(const ClearLauncherEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

}  // namespace ul_test
