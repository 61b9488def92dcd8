#include "parallel/hosts.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ul {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t this_machine_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (f && std::getline(f, id) && !id.empty()) return fnv1a("boot " + id);
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fnv1a(std::string("host ") + name);
}

// This process's CPU set: its hash and its size.
std::pair<uint32_t, int> this_cpuset() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return {0u, int(std::max(1L, n))};
  }
  std::string bits(reinterpret_cast<const char*>(&set), sizeof set);
  return {uint32_t(fnv1a(bits)), std::max(1, CPU_COUNT(&set))};
}

// A number of bytes from a cgroup file ("max", a missing file: SIZE_MAX).
size_t limit_in(const std::string& path) {
  std::ifstream f(path);
  unsigned long long v = 0;
  if (!f || !(f >> v)) return SIZE_MAX;
  return size_t(v);
}

}  // namespace

int HostMap::hosts() const { return host.empty() ? 1 : *std::max_element(host.begin(), host.end()) + 1; }

int HostMap::ranks_here() const {
  return host.empty() ? 1 : int(std::count(host.begin(), host.end(), host[rank]));
}

int HostMap::sharing_cpus() const {
  int n = 0;
  for (size_t r = 0; r < host.size(); r++) n += host[r] == host[rank] && cpuset[r] == cpuset[rank];
  return std::max(1, n);
}

HostMap host_map_of(const std::vector<uint64_t>& machine, const std::vector<uint32_t>& cpuset,
                    const std::vector<int>& gpu, int rank, int cpus) {
  HostMap m;
  m.rank = rank, m.cpus = std::max(1, cpus), m.cpuset = cpuset, m.gpu = gpu;
  std::vector<uint64_t> seen;
  for (uint64_t id : machine) {
    auto it = std::find(seen.begin(), seen.end(), id);
    m.host.push_back(int(it - seen.begin()));
    if (it == seen.end()) seen.push_back(id);
  }
  return m;
}

HostMap host_map(Comm& world, int gpu) {
  const int P = world.size();
  const auto [set, cpus] = this_cpuset();
  // The local communicator's ranks are threads of this process: one machine, one CPU set.
  if (P == 1 || std::strcmp(world.backend(), "local") == 0)
    return host_map_of(std::vector<uint64_t>(P, 0), std::vector<uint32_t>(P, set), std::vector<int>(P, -1), world.rank(),
                       cpus);
  const uint64_t id = this_machine_id();
  constexpr int K = 4;
  int32_t mine[K] = {int32_t(uint32_t(id)), int32_t(uint32_t(id >> 32)), int32_t(set), gpu};
  std::vector<int32_t> all(size_t(K) * P);
  world.all_gather(mine, all.data(), K, DType::i32);
  std::vector<uint64_t> machine(P);
  std::vector<uint32_t> sets(P);
  std::vector<int> gpus(P);
  for (int r = 0; r < P; r++) {
    const int32_t* x = &all[size_t(K) * r];
    machine[r] = uint64_t(uint32_t(x[0])) | uint64_t(uint32_t(x[1])) << 32;
    sets[r] = uint32_t(x[2]);
    gpus[r] = x[3];
  }
  return host_map_of(machine, sets, gpus, world.rank(), cpus);
}

std::string shared_gpu(const HostMap& m) {
  for (size_t a = 0; a < m.gpu.size(); a++)
    for (size_t b = a + 1; b < m.gpu.size(); b++)
      if (m.gpu[a] >= 0 && m.gpu[a] == m.gpu[b] && m.host[a] == m.host[b])
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share GPU " + std::to_string(m.gpu[a]) +
               " of one machine";
  return "";
}

std::vector<int> sp_groups_across_hosts(const HostMap& m, int sp) {
  std::vector<int> groups;
  for (size_t g = 0; sp > 0 && (g + 1) * size_t(sp) <= m.host.size(); g++)
    for (int j = 1; j < sp; j++)
      if (m.host[g * sp + j] != m.host[g * sp]) {
        groups.push_back(int(g));
        break;
      }
  return groups;
}

int threads_for_rank(int threads_flag, const HostMap& m) {
  if (threads_flag > 0) return threads_flag;
  return std::max(1, m.cpus / m.sharing_cpus());
}

size_t cgroup_memory_limit(const std::string& proc_cgroup, const std::string& root) {
  size_t limit = SIZE_MAX;
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH", v1's memory line names "memory" among its controllers.
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controllers.empty() && line.compare(0, a, "0") == 0) {
      // v2: a limit on any ancestor applies too.
      for (;;) {
        limit = std::min(limit, limit_in(root + path + (path == "/" ? "" : "/") + "memory.max"));
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.rfind('/'));
        if (path.empty()) path = "/";
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      // v1: the group's own file, or inside a container (its group mounted as the root) the root's.
      limit = std::min(limit, limit_in(root + "/memory" + path + (path == "/" ? "" : "/") + "memory.limit_in_bytes"));
      limit = std::min(limit, limit_in(root + "/memory/memory.limit_in_bytes"));
    }
  }
  return limit;
}

size_t memory_limit() {
  const size_t physical = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  std::ifstream f("/proc/self/cgroup");
  std::stringstream text;
  text << f.rdbuf();
  return std::min(physical, cgroup_memory_limit(text.str(), "/sys/fs/cgroup"));
}

}  // namespace ul
