// Environment variables cleared for a test's scope and restored after it: a test of what they do
// must not depend on running under srun or mpirun itself. ClearLauncherEnv: the variables launchers
// set to say where a process stands in its job (torchrun, Open MPI, MPICH, srun;
// parallel/launcher.h).
#pragma once
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace ul_test {

class ClearEnv {
 public:
  explicit ClearEnv(std::initializer_list<const char*> names) : names_(names.begin(), names.end()) {
    for (const std::string& name : names_) {
      if (const char* v = std::getenv(name.c_str())) saved_.push_back({name, v});
      ::unsetenv(name.c_str());
    }
  }
  ~ClearEnv() {
    for (const std::string& name : names_) ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ClearEnv(const ClearEnv&) = delete;
  ClearEnv& operator=(const ClearEnv&) = delete;

 private:
  std::vector<std::string> names_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

class ClearLauncherEnv : public ClearEnv {
 public:
  ClearLauncherEnv()
      : ClearEnv({"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                  "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                  "SLURM_NTASKS"}) {}
};

}  // namespace ul_test
