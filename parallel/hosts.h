// Which ranks share a machine, and which of them share CPU cores: one all-gather at start-up of a
// machine id and a CPU set per rank. Launchers say this in their own variables, and not always
// (srun without --ntasks-per-node, a hand-written hostfile); the ranks themselves always know.
//   - the machine id is the kernel's boot id (containers on one machine share it, and its memory);
//     the host name where it cannot be read;
//   - the CPU set is this process's affinity (sched_getaffinity): mpirun binding each rank to its
//     cores, srun --cpus-per-task, taskset or a container's cpuset all show there.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace ul {

struct HostMap {
  std::vector<int> host;         // host[r]: rank r's machine, numbered in order of first appearance
  std::vector<uint32_t> cpuset;  // cpuset[r]: a hash of rank r's CPU set
  std::vector<int> gpu;          // gpu[r]: rank r's CUDA device on its machine, -1: none given
  int rank = 0;                  // this rank
  int cpus = 1;                  // the CPUs this rank may run on
  int hosts() const;
  int ranks_here() const;        // ranks on this rank's machine, itself included
  int sharing_cpus() const;      // ranks on this machine with the same CPU set, itself included
};

// Collective over `world` (threads of one process are one machine with one CPU set, and share
// their GPU by design: their gpu is -1). gpu: this process's CUDA device, -1 for none.
HostMap host_map(Comm& world, int gpu = -1);
// The same map from given ids (for tests and for host_map).
HostMap host_map_of(const std::vector<uint64_t>& machine, const std::vector<uint32_t>& cpuset,
                    const std::vector<int>& gpu, int rank, int cpus);

// The sequence-parallel groups (sp consecutive ranks, parallel/grid.h) whose ranks are on more than
// one machine: their all-to-alls cross the network. Empty when every group stays on one machine.
std::vector<int> sp_groups_across_hosts(const HostMap& m, int sp);

// "ranks 0 and 1 share GPU 0 of one machine" for the first two ranks that do, else "".
std::string shared_gpu(const HostMap& m);

// Threads for this rank: --threads when given (> 0), else its CPU set shared evenly by the ranks
// of this machine that have the same one.
int threads_for_rank(int threads_flag, const HostMap& m);

// This process's memory limit: the machine's physical memory, or less where a cgroup (SLURM's
// --mem, a container's limit) caps it.
size_t memory_limit();
// The tightest cgroup memory limit for a process whose /proc/self/cgroup reads `proc_cgroup`, with
// the cgroup filesystem mounted at `root` (v2: ROOT/PATH/memory.max and its parents'; v1:
// ROOT/memory/PATH/memory.limit_in_bytes, or ROOT/memory/memory.limit_in_bytes inside a
// container). SIZE_MAX when none applies.
size_t cgroup_memory_limit(const std::string& proc_cgroup, const std::string& root);

}  // namespace ul
