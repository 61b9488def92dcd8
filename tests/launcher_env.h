// The variables launchers set to say where a process stands in its job (torchrun, Open MPI, MPICH,
// srun; parallel/launcher.h), cleared for a test's scope and restored after it: a test of what
// they do must not depend on running under srun or mpirun itself.
#pragma once
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace ul_test {

class ClearLauncherEnv {
 public:
  ClearLauncherEnv() {
    for (const char* name : kNames) {
      if (const char* v = std::getenv(name)) saved_.push_back({name, v});
      ::unsetenv(name);
    }
  }
  ~ClearLauncherEnv() {
    for (const char* name : kNames) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ClearLauncherEnv(const ClearLauncherEnv&) = delete;
  ClearLauncherEnv& operator=(const ClearLauncherEnv&) = delete;

 private:
  static constexpr const char* kNames[] = {
      "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

}  // namespace ul_test
