// Which ranks share a machine, its cores, its memory and its GPUs: one all-gather at start-up of a
// machine id, a CPU set, a memory domain and a GPU per rank. Launchers say some of this in their
// own variables, and not always (srun without --ntasks-per-node, a hand-written hostfile); the
// ranks themselves always know.
//   - the machine id is the kernel's boot id (containers on one machine share it); the host name
//     where it cannot be read;
//   - the CPU set is this process's affinity (sched_getaffinity): mpirun binding each rank to its
//     cores, srun --cpus-per-task, taskset or a container's cpuset all show there;
//   - the memory domain is the cgroup whose limit applies (SLURM's --mem, a container's), or the
//     machine's when none does: two containers on one machine each have their own limit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace ul {

struct HostMap {
  std::vector<int> host;         // host[r]: rank r's machine, numbered in order of first appearance
  std::vector<uint32_t> cpuset;  // cpuset[r]: a hash of rank r's CPU set
  std::vector<uint32_t> memory;  // memory[r]: rank r's memory domain (0: its machine's)
  std::vector<int> gpu;          // gpu[r]: rank r's CUDA device on its machine, -1: none given
  // gpu_id[r]: which physical GPU that is (a hash of its UUID; 0: none). Device numbers repeat
  // where each process sees only its own GPU (srun --gpus-per-task, one-GPU containers: all "GPU 0").
  std::vector<uint32_t> gpu_id;
  int rank = 0;                  // this rank
  int cpus = 1;                  // the CPUs this rank's process may run on
  int hosts() const;
  int ranks_here() const;        // ranks on this rank's machine, itself included
  int sharing_cpus() const;      // ranks on this machine with the same CPU set, itself included
  int sharing_memory() const;    // ranks on this machine drawing on the same memory limit
  int sharing_gpu() const;       // ranks on this machine on this rank's GPU (threads: all of them)
};

// Collective over `world` (threads of one process are one machine with one CPU set and memory, and
// share their GPU by design: their gpu is -1). gpu: this process's CUDA device, -1 for none;
// gpu_id: its identity (a UUID's hash), 0 to take the device number for it.
HostMap host_map(Comm& world, int gpu = -1, uint32_t gpu_id = 0);
// The same map from given ids (for tests and for host_map); gpu_id empty: from the device numbers.
HostMap host_map_of(const std::vector<uint64_t>& machine, const std::vector<uint32_t>& cpuset,
                    const std::vector<uint32_t>& memory, const std::vector<int>& gpu, int rank, int cpus,
                    const std::vector<uint32_t>& gpu_id = {});

// The sequence-parallel groups (sp consecutive ranks, parallel/grid.h) whose ranks are on more than
// one machine: their all-to-alls cross the network. Empty when every group stays on one machine.
std::vector<int> sp_groups_across_hosts(const HostMap& m, int sp);

// "ranks 0 and 1 share GPU 0 of one machine" for the first two ranks that do, else "".
std::string shared_gpu(const HostMap& m);

// Threads for this rank: --threads when given (> 0), else OMP_NUM_THREADS when set (omp_env > 0:
// what a job script or a cluster's module set for each process), else its CPU set shared evenly by
// the ranks of this machine that have the same one.
int threads_for_rank(int threads_flag, const HostMap& m, int omp_env = 0);
// OMP_NUM_THREADS's value (its first entry, "8" of "8,2") when it is a number in [1, 1024], else 0.
int omp_num_threads_env();
// OMP_NUM_THREADS as threads for each of the ranks_in_process ranks this process runs (--comm
// local's are threads of one process: the value, set for the process, is shared among them), at
// least 1; 0 when it is not set.
int omp_threads_per_rank(int ranks_in_process);

// This machine's name (gethostname), "?" when it cannot be read.
std::string host_name();
// The machine's physical memory.
size_t physical_memory_bytes();
// This process's memory limit: the machine's physical memory, or less where a cgroup caps it.
size_t memory_limit();
// The tightest cgroup memory limit for a process whose /proc/self/cgroup reads `proc_cgroup`, with
// the cgroup filesystem mounted at `root`: v2's ROOT/PATH/memory.max, v1's
// ROOT/memory/PATH/memory.limit_in_bytes (inside a container its group is ROOT/memory), each with
// its ancestors' (SLURM sets --mem on the job's group, not the task's). SIZE_MAX when none applies.
size_t cgroup_memory_limit(const std::string& proc_cgroup, const std::string& root);
// The CPUs a cgroup's quota allows (quota / period, rounded up; the tightest of the group and its
// ancestors): v2's ROOT/PATH/cpu.max ("200000 100000"; "max": none), v1's cpu.cfs_quota_us over
// cpu.cfs_period_us under ROOT/cpu (or ROOT/cpu,cpuacct). 0 when none applies (docker --cpus=2, a
// Kubernetes CPU limit: the affinity shows every core, the quota allows two).
int cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& root);
// This process's: cgroup_cpu_quota of /proc/self/cgroup under /sys/fs/cgroup.
int cpu_quota_here();

}  // namespace ul
