// The --nccl-id-file bootstrap's file (parallel/id_file.h), apart from NCCL: the job token, a
// reader that waits for this job's file and ignores another's, and rank 0 removing only its own.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/id_file.h"
#include "launcher_env.h"
#include "temp_dir.h"

using namespace ul;

namespace {

// The token's variables, cleared for a test and restored after it.
struct TokenEnv : ul_test::ClearEnv {
  TokenEnv()
      : ClearEnv({"ULYSSES_JOB_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_RESTART_COUNT", "OMPI_COMM_WORLD_RANK", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                  "LOCAL_RANK", "RANK", "WORLD_SIZE"}) {}
};

}  // namespace

TEST_CASE("the id file's job token tells a requeued job from its dead first run", "[id_file]") {
  const TokenEnv clean;
  CHECK(id_file_job_token().empty());
  CHECK_FALSE(id_file_token_unique(""));
  ::setenv("SLURM_JOB_ID", "123", 1);
  ::setenv("SLURM_STEP_ID", "0", 1);
  CHECK(id_file_job_token() == "SLURM_JOB_ID=123.0");
  ::setenv("SLURM_RESTART_COUNT", "1", 1);  // the same job id, requeued
  CHECK(id_file_job_token() == "SLURM_JOB_ID=123.0 slurm restart 1");
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);  // torchrun under srun, its workers restarted
  CHECK(id_file_job_token() == "SLURM_JOB_ID=123.0 slurm restart 1 torchrun restart 2");
  ::setenv("ULYSSES_JOB_ID", "mine", 1);  // the user's own wins
  CHECK(id_file_job_token() == "ULYSSES_JOB_ID=mine slurm restart 1 torchrun restart 2");
  for (const char* n : {"ULYSSES_JOB_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"}) ::unsetenv(n);
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun without --rdzv-id: every job's
  CHECK(id_file_job_token() == "TORCHELASTIC_RUN_ID=none torchrun restart 2");
  CHECK_FALSE(id_file_token_unique(id_file_job_token()));
  ::setenv("TORCHELASTIC_RUN_ID", "run7", 1);
  CHECK(id_file_token_unique(id_file_job_token()));
}

TEST_CASE("the id file's job token under mpirun in a Slurm allocation is the same on every node", "[id_file]") {
  // mpirun's own node: its ranks keep the batch shell's variables; another node's are children of
  // a daemon srun started, in a step of its own. Open MPI's job id is the same for both.
  const TokenEnv clean;
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  ::setenv("SLURM_JOB_ID", "77", 1);
  ::setenv("OMPI_MCA_ess_base_jobid", "3141", 1);
  const std::string here = id_file_job_token();
  ::setenv("SLURM_STEP_ID", "0", 1);
  CHECK(id_file_job_token() == here);
  CHECK(here == "Open MPI job 3141 in SLURM_JOB_ID=77");
  ::setenv("PMIX_NAMESPACE", "prterun-node1-4242@1", 1);  // PMIx's name, where it is given, first
  CHECK(id_file_job_token() == "Open MPI job prterun-node1-4242@1 in SLURM_JOB_ID=77");
  CHECK(id_file_token_unique(id_file_job_token()));
  ::setenv("ULYSSES_JOB_ID", "mine", 1);  // the user's own still wins
  CHECK(id_file_job_token() == "ULYSSES_JOB_ID=mine");
  // Not launched by Open MPI (srun): Slurm's job and step, as before.
  for (const char* n : {"ULYSSES_JOB_ID", "OMPI_COMM_WORLD_RANK"}) ::unsetenv(n);
  CHECK(id_file_job_token() == "SLURM_JOB_ID=77.0");
}

TEST_CASE("the id file: the reader waits for its own job's id, rank 0 removes only its own", "[id_file]") {
  ul_test::TempDir dir;
  const std::string path = (dir.path / "nccl.id").string();
  const std::string ours(128, '\x07'), theirs(128, '\x09');
  // A file another job (or a dead run) left: not joined; this job's, written later, is.
  write_id_file(path, "SLURM_JOB_ID=1.0", theirs);
  std::thread rank0([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    write_id_file(path, "SLURM_JOB_ID=2.0", ours);
  });
  CHECK(wait_for_id_file(path, "SLURM_JOB_ID=2.0", ours.size(), 30) == ours);
  rank0.join();
  // No temporary is left beside it.
  const auto entries = std::filesystem::directory_iterator(dir.path);
  CHECK(std::distance(begin(entries), end(entries)) == 1);
  // Readable and writable by its owner only (whatever the umask): the id lets a process join the
  // job's bootstrap.
  CHECK((std::filesystem::status(path).permissions() & std::filesystem::perms::all) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  // Another job given the same path has replaced it since: left for that job's ranks.
  write_id_file(path, "SLURM_JOB_ID=3.0", theirs);
  remove_id_file_if_ours(path, "SLURM_JOB_ID=2.0", ours);
  CHECK(std::filesystem::exists(path));
  write_id_file(path, "SLURM_JOB_ID=2.0", ours);
  remove_id_file_if_ours(path, "SLURM_JOB_ID=2.0", ours);
  CHECK_FALSE(std::filesystem::exists(path));
  // A file cut short is not an id; no file in time names the path and the shared-filesystem rule.
  std::ofstream(path, std::ios::binary) << "SLURM_JOB_ID=2.0\n" << std::string(10, 'x');
  CHECK_THROWS_WITH(wait_for_id_file(path, "SLURM_JOB_ID=2.0", ours.size(), 0.3),
                    Catch::Contains("no id file " + path + " from rank 0 of this job (SLURM_JOB_ID=2.0)") &&
                        Catch::Contains("on a filesystem every node shares"));
  CHECK_THROWS_AS(write_id_file((dir.path / "no/such/dir/id").string(), "t", ours), CommError);
}
