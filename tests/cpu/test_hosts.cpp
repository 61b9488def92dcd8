// Where a process stands in its job: its launcher's variables (parallel/launcher.h), the machines
// and CPU sets of the ranks (parallel/hosts.h), and the memory a cgroup leaves it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher_env.h"
#include "parallel/comm_local.h"
#include "parallel/hosts.h"
#include "parallel/launcher.h"
#include "temp_dir.h"

using namespace ul;

TEST_CASE("the innermost launcher's variables are read together, never mixed", "[hosts]") {
  const ul_test::ClearLauncherEnv clean;
  auto set = [](std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) ::setenv(k, v, 1);
  };
  CHECK(detect_launcher().name.empty());
  CHECK(detect_launcher().local_rank == -1);
  // srun alone.
  set({{"SLURM_PROCID", "9"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_LOCALID", "1"}});
  Launcher l = detect_launcher();
  CHECK((l.name == "srun" && l.rank == 9 && l.size == 16 && l.local_rank == 1));
  // torchrun under srun: every worker inherits SLURM_LOCALID 1 (its srun task's); LOCAL_RANK is its own.
  set({{"RANK", "13"}, {"WORLD_SIZE", "32"}, {"LOCAL_RANK", "5"}});
  l = detect_launcher();
  CHECK((l.name == "torchrun" && l.rank == 13 && l.size == 32 && l.local_rank == 5));
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(k);
  // mpirun inside the allocation: the orted's SLURM_PROCID is inherited, Open MPI's own win.
  set({{"OMPI_COMM_WORLD_RANK", "11"}, {"OMPI_COMM_WORLD_SIZE", "24"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
  l = detect_launcher();
  CHECK((l.name == "Open MPI" && l.rank == 11 && l.size == 24 && l.local_rank == 3));
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}) ::unsetenv(k);
  // MPICH's mpiexec through srun-started proxies: its own local rank, not the proxy's SLURM_LOCALID.
  set({{"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "2"}});
  l = detect_launcher();
  CHECK((l.name == "MPICH" && l.rank == 6 && l.size == 8 && l.local_rank == 2));
  // srun --mpi=pmi2 starts the ranks itself: no MPI_LOCALRANKID, and SLURM_PROCID is the rank.
  ::unsetenv("MPI_LOCALRANKID");
  CHECK(detect_launcher().local_rank == -1);  // SLURM_PROCID 9 is another process's rank here
  set({{"SLURM_PROCID", "6"}});
  CHECK(detect_launcher().local_rank == 1);
  for (const char* k : {"PMI_RANK", "PMI_SIZE"}) ::unsetenv(k);
  // A batch script's own shell (no srun step) is one process, not a task of one.
  ::unsetenv("SLURM_STEP_ID");
  CHECK(detect_launcher().name.empty());
  // Set by hand; junk is not a number.
  set({{"RANK", "1"}, {"WORLD_SIZE", "2x"}});
  l = detect_launcher();
  CHECK((l.name == "RANK and WORLD_SIZE" && l.rank == 1 && l.size == -1 && l.local_rank == -1));
}

TEST_CASE("the host map counts the ranks and CPU sets of each machine", "[hosts]") {
  // Ranks 0-3 on machine A, 4-7 on B; A's ranks bound to their own cores in pairs, B's unbound.
  const std::vector<uint64_t> machine = {7, 7, 7, 7, 9, 9, 9, 9};
  const std::vector<uint32_t> cpus = {1, 1, 2, 2, 5, 5, 5, 5};
  const std::vector<int> gpu = {0, 1, 2, 3, 0, 1, 2, 3};
  const std::vector<uint32_t> mem(8, 0);  // no cgroup limit: each machine's memory
  HostMap a = host_map_of(machine, cpus, mem, gpu, 2, 16);
  CHECK(a.hosts() == 2);
  CHECK(a.ranks_here() == 4);
  CHECK(a.sharing_cpus() == 2);
  CHECK(a.sharing_memory() == 4);
  // Two containers on machine 7 with limits of their own (ranks 0-1 and 2-3): each counts its own.
  CHECK(host_map_of(machine, cpus, {3, 3, 4, 4, 0, 0, 0, 0}, gpu, 2, 16).sharing_memory() == 2);
  CHECK(host_map_of(machine, cpus, {3, 3, 4, 4, 0, 0, 0, 0}, gpu, 2, 16).ranks_here() == 4);
  CHECK(threads_for_rank(0, a) == 8);  // 16 cores shared by 2 ranks
  CHECK(threads_for_rank(3, a) == 3);  // --threads wins
  CHECK(threads_for_rank(0, a, 5) == 5);  // then OMP_NUM_THREADS
  CHECK(threads_for_rank(3, a, 5) == 3);
  for (const auto& [value, want] : std::vector<std::pair<const char*, int>>{
           {"6", 6}, {"4,2", 4}, {"", 0}, {"x", 0}, {"0", 0}, {"-2", 0}, {"2000", 0}, {"3x", 0}}) {
    ::setenv("OMP_NUM_THREADS", value, 1);
    CAPTURE(value);
    CHECK(omp_num_threads_env() == want);
  }
  ::setenv("OMP_NUM_THREADS", "8", 1);
  CHECK(omp_threads_per_rank(1) == 8);
  CHECK(omp_threads_per_rank(4) == 2);  // --comm local's 4 ranks share the process's 8
  CHECK(omp_threads_per_rank(16) == 1);
  ::unsetenv("OMP_NUM_THREADS");
  CHECK(omp_num_threads_env() == 0);
  CHECK(omp_threads_per_rank(4) == 0);
  HostMap b = host_map_of(machine, cpus, mem, gpu, 5, 64);
  CHECK(b.sharing_cpus() == 4);
  CHECK(threads_for_rank(0, b) == 16);
  CHECK(threads_for_rank(0, host_map_of(machine, cpus, mem, gpu, 5, 3)) == 1);  // never 0
  // sp groups of consecutive ranks: 4 stays on a machine, 8 spans both; so do 3's groups 1.
  CHECK(sp_groups_across_hosts(a, 4).empty());
  CHECK(sp_groups_across_hosts(a, 8) == std::vector<int>{0});
  CHECK(sp_groups_across_hosts(host_map_of({7, 7, 7, 9, 9, 9}, std::vector<uint32_t>(6), std::vector<uint32_t>(6), std::vector<int>(6, -1), 0, 1), 2) ==
        std::vector<int>{1});
  // Round-robin placement (mpirun --map-by node): every pair spans.
  CHECK(sp_groups_across_hosts(host_map_of({7, 9, 7, 9}, std::vector<uint32_t>(4), std::vector<uint32_t>(4), std::vector<int>(4, -1), 0, 1), 2) ==
        std::vector<int>{0, 1});
  CHECK(shared_gpu(a).empty());
  CHECK(shared_gpu(host_map_of({7, 7, 9}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, 0, 1)) == "ranks 0 and 1 share GPU 0 of one machine");
  CHECK(shared_gpu(host_map_of({7, 9}, {1, 1}, {0, 0}, {0, 0}, 0, 1)).empty());       // two machines' GPU 0
  CHECK(shared_gpu(host_map_of({7, 7}, {1, 1}, {0, 0}, {-1, -1}, 0, 1)).empty());     // no GPU
  // Ranks on one GPU draw on its memory together (the start-up check of a GPU run counts them).
  CHECK(host_map_of({7, 7, 9}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, 0, 1).sharing_gpu() == 2);
  CHECK(host_map_of({7, 7, 7}, {1, 1, 1}, {0, 0, 0}, {0, 1, 0}, 1, 1).sharing_gpu() == 1);
  // Each process sees its own GPU as GPU 0 (srun --gpus-per-task, one-GPU containers): the GPUs'
  // UUIDs tell them apart, so no note and no count of three on one GPU.
  const HostMap own = host_map_of({7, 7, 7}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, 0, 1, {11, 12, 13});
  CHECK(shared_gpu(own).empty());
  CHECK(own.sharing_gpu() == 1);
  CHECK(shared_gpu(host_map_of({7, 7}, {1, 1}, {0, 0}, {0, 3}, 0, 1, {11, 11})) == "ranks 0 and 1 share GPU 0 of one machine");
}

TEST_CASE("host_map: the local communicator's ranks are one machine", "[hosts]") {
  std::vector<int> here(3), threads(3), sharing(3);
  run_local(3, [&](Comm& w) {
    const HostMap m = host_map(w, 0);
    here[w.rank()] = m.ranks_here();
    sharing[w.rank()] = m.sharing_gpu();
    threads[w.rank()] = threads_for_rank(0, m);
  });
  for (int r = 0; r < 3; r++) {
    CHECK(here[r] == 3);
    CHECK(sharing[r] == 3);  // threads of one process: its one GPU
    CHECK(threads[r] >= 1);
  }
  CHECK(shared_gpu(host_map_of({1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {-1, -1, -1}, 0, 2)).empty());
}

TEST_CASE("a cgroup's memory limit caps the memory a run may plan on", "[hosts]") {
  ul_test::TempDir dir, v1;  // two cgroup trees
  const std::string root = dir.path.string(), r1 = v1.path.string();
  auto write_in = [](const std::string& tree, const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(tree + rel).parent_path());
    std::ofstream(tree + rel) << text;
  };
  auto write = [&](const std::string& rel, const std::string& text) { write_in(root, rel, text); };
  auto write1 = [&](const std::string& rel, const std::string& text) { write_in(r1, rel, text); };
  // v2: the job's own group says max, its parent (SLURM's job step) 8 GiB.
  write("/slurm/job_1/step_0/memory.max", "max\n");
  write("/slurm/job_1/memory.max", "8589934592\n");
  CHECK(cgroup_memory_limit("0::/slurm/job_1/step_0\n", root) == size_t(8) << 30);
  CHECK(cgroup_memory_limit("0::/other\n", root) == SIZE_MAX);
  // v1: the memory controller's line; inside a container its group is the root.
  write("/memory/docker/abc/memory.limit_in_bytes", "4294967296\n");
  CHECK(cgroup_memory_limit("4:memory:/docker/abc\n3:cpuset:/\n", root) == size_t(4) << 30);
  write("/memory/memory.limit_in_bytes", "2147483648\n");
  CHECK(cgroup_memory_limit("4:cpu,memory:/elsewhere\n", root) == size_t(2) << 30);
  CHECK(cgroup_memory_limit("", root) == SIZE_MAX);
  // v1 under SLURM: --mem on the job's group, the task's own unlimited (v1 writes ~2^63 for that).
  write1("/memory/slurm/job_7/memory.limit_in_bytes", "1073741824\n");
  write1("/memory/slurm/job_7/step_0/task_0/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(cgroup_memory_limit("4:memory:/slurm/job_7/step_0/task_0\n", r1) == size_t(1) << 30);
  write1("/memory/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK(cgroup_memory_limit("4:memory:/other\n", r1) == SIZE_MAX);
  CHECK(memory_limit() <= physical_memory_bytes());
}

TEST_CASE("a cgroup's CPU quota is read from its v1 or v2 files, the tightest ancestor's", "[hosts]") {
  ul_test::TempDir dir, v1;
  const std::string root = dir.path.string(), r1 = v1.path.string();
  auto write_in = [](const std::string& tree, const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(tree + rel).parent_path());
    std::ofstream(tree + rel) << text;
  };
  // v2: docker --cpus=2.5 on the container's group, none on its child; "max" is none.
  write_in(root, "/docker/abc/cpu.max", "250000 100000\n");
  write_in(root, "/docker/abc/task/cpu.max", "max 100000\n");
  CHECK(cgroup_cpu_quota("0::/docker/abc/task\n", root) == 3);  // 2.5 CPUs: rounded up
  CHECK(cgroup_cpu_quota("0::/elsewhere\n", root) == 0);
  write_in(root, "/cpu.max", "100000 100000\n");  // a tighter ancestor wins
  CHECK(cgroup_cpu_quota("0::/docker/abc/task\n", root) == 1);
  // v1: the cpu controller's files, quota -1 for none.
  write_in(r1, "/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "400000\n");
  write_in(r1, "/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", "100000\n");
  write_in(r1, "/cpu,cpuacct/kubepods/cpu.cfs_quota_us", "-1\n");
  write_in(r1, "/cpu,cpuacct/kubepods/cpu.cfs_period_us", "100000\n");
  CHECK(cgroup_cpu_quota("5:cpu,cpuacct:/kubepods/pod1\n", r1) == 4);
  CHECK(cgroup_cpu_quota("5:cpu,cpuacct:/kubepods\n", r1) == 0);
  CHECK(cgroup_cpu_quota("", r1) == 0);
}
