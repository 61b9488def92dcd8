#include "parallel/hosts.h"

#include <omp.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
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
  return fnv1a("host " + host_name());
}

// A hash of this process's CPU set (which ranks share cores). Its size is not read from here: with
// OMP_PROC_BIND set, the OpenMP runtime pins this thread to one place before main, and the set
// then shows that place alone.
uint32_t this_cpuset() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return uint32_t(fnv1a(std::string(reinterpret_cast<const char*>(&set), sizeof set)));
}

// A number of bytes from a cgroup file; SIZE_MAX for "max", a missing file, or v1's "unlimited"
// (a number near 2^63).
size_t limit_in(const std::string& path) {
  std::ifstream f(path);
  unsigned long long v = 0;
  if (!f || !(f >> v) || v >= (1ull << 62)) return SIZE_MAX;
  return size_t(v);
}

// The tightest limit in `file` on the group DIR/PATH and its ancestors, and the directory that
// set it ("" when none does).
std::pair<size_t, std::string> tightest(const std::string& dir, std::string path, const char* file) {
  std::pair<size_t, std::string> best{SIZE_MAX, ""};
  for (;;) {
    const std::string group = dir + (path == "/" ? "" : path);
    const size_t v = limit_in(group + "/" + file);
    if (v < best.first) best = {v, group};
    if (path.empty() || path == "/") break;
    path = path.substr(0, path.rfind('/'));
    if (path.empty()) path = "/";
  }
  return best;
}

// The memory limit that applies to this process and the cgroup directory that sets it.
std::pair<size_t, std::string> cgroup_limit(const std::string& proc_cgroup, const std::string& root) {
  std::pair<size_t, std::string> best{SIZE_MAX, ""};
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH", v1's memory line names "memory" among its controllers.
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::pair<size_t, std::string> x{SIZE_MAX, ""};
    if (controllers.empty() && line.compare(0, a, "0") == 0) x = tightest(root, path, "memory.max");
    else if (("," + controllers + ",").find(",memory,") != std::string::npos)
      x = tightest(root + "/memory", path, "memory.limit_in_bytes");  // inside a container the root is its group
    if (x.first < best.first) best = x;
  }
  return best;
}

// The CPUs one group's quota allows (rounded up), 0 for none: v2 "QUOTA PERIOD" or "max PERIOD",
// v1 the two files apart.
int cpu_quota_in(const std::string& group, bool v2) {
  long long quota = -1, period = 0;
  if (v2) {
    std::ifstream f(group + "/cpu.max");
    std::string q;
    if (!(f >> q >> period) || q == "max") return 0;
    quota = std::atoll(q.c_str());
  } else {
    std::ifstream fq(group + "/cpu.cfs_quota_us"), fp(group + "/cpu.cfs_period_us");
    if (!(fq >> quota) || !(fp >> period)) return 0;
  }
  if (quota <= 0 || period <= 0) return 0;  // (v1 writes -1 for none)
  return int(std::min<long long>((quota + period - 1) / period, 1 << 20));
}

std::string read_text(const char* path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

// Which memory this process draws from: its cgroup's limit (the directory's inode tells groups
// apart even where namespaces show every container its own as "/"), or the machine's.
uint32_t this_memory_domain() {
  const auto [limit, dir] = cgroup_limit(read_text("/proc/self/cgroup"), "/sys/fs/cgroup");
  struct stat st {};
  if (limit == SIZE_MAX || dir.empty() || ::stat(dir.c_str(), &st) != 0) return 0;  // the machine's
  return uint32_t(fnv1a(std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(limit)));
}

}  // namespace

int cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& root) {
  int best = 0;
  auto take = [&](const std::string& dir, std::string path, bool v2) {
    for (;;) {  // the group and its ancestors
      const int q = cpu_quota_in(dir + (path == "/" ? "" : path), v2);
      if (q > 0 && (best == 0 || q < best)) best = q;
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
      if (path.empty()) path = "/";
    }
  };
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty() && line.compare(0, a, "0") == 0) {
      take(root, path, true);
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      for (const char* mount : {"/cpu", "/cpu,cpuacct"}) take(root + mount, path, false);
    }
  }
  return best;
}

int cpu_quota_here() { return cgroup_cpu_quota(read_text("/proc/self/cgroup"), "/sys/fs/cgroup"); }

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

int HostMap::hosts() const { return host.empty() ? 1 : *std::max_element(host.begin(), host.end()) + 1; }

int HostMap::ranks_here() const {
  return host.empty() ? 1 : int(std::count(host.begin(), host.end(), host[rank]));
}

int HostMap::sharing_cpus() const {
  int n = 0;
  for (size_t r = 0; r < host.size(); r++) n += host[r] == host[rank] && cpuset[r] == cpuset[rank];
  return std::max(1, n);
}

int HostMap::sharing_memory() const {
  int n = 0;
  for (size_t r = 0; r < host.size(); r++) n += host[r] == host[rank] && memory[r] == memory[rank];
  return std::max(1, n);
}

int HostMap::sharing_gpu() const {
  int n = 0;
  for (size_t r = 0; r < host.size(); r++) n += host[r] == host[rank] && gpu_id[r] == gpu_id[rank];
  return std::max(1, n);
}

// A device number as an identity, where no UUID is known: 0 for none.
static uint32_t id_of_number(int gpu) { return gpu >= 0 ? uint32_t(gpu) + 1 : 0; }

HostMap host_map_of(const std::vector<uint64_t>& machine, const std::vector<uint32_t>& cpuset,
                    const std::vector<uint32_t>& memory, const std::vector<int>& gpu, int rank, int cpus,
                    const std::vector<uint32_t>& gpu_id) {
  HostMap m;
  m.rank = rank, m.cpus = std::max(1, cpus), m.cpuset = cpuset, m.memory = memory, m.gpu = gpu, m.gpu_id = gpu_id;
  if (m.gpu_id.empty())
    for (int g : gpu) m.gpu_id.push_back(id_of_number(g));
  std::vector<uint64_t> seen;
  for (uint64_t id : machine) {
    auto it = std::find(seen.begin(), seen.end(), id);
    m.host.push_back(int(it - seen.begin()));
    if (it == seen.end()) seen.push_back(id);
  }
  return m;
}

HostMap host_map(Comm& world, int gpu, uint32_t gpu_id) {
  if (gpu_id == 0) gpu_id = id_of_number(gpu);
  const int P = world.size();
  const uint32_t set = this_cpuset(), mem = this_memory_domain();
  // The CPU set as the process started, before any pinning; at most what a cgroup's CPU quota
  // allows (a container limited to 2 of 64 cores would run 64 threads a rank, throttled).
  int cpus = omp_get_num_procs();
  if (const int quota = cpu_quota_here(); quota > 0) cpus = std::min(cpus, quota);
  // The local communicator's ranks are threads of this process: one machine, one CPU set, one
  // memory; their GPU is one by design (gpu -1: not a sharing to note).
  if (P == 1 || std::strcmp(world.backend(), "local") == 0)
    return host_map_of(std::vector<uint64_t>(P, 0), std::vector<uint32_t>(P, set), std::vector<uint32_t>(P, mem),
                       std::vector<int>(P, P == 1 ? gpu : -1), world.rank(), cpus,
                       std::vector<uint32_t>(P, P == 1 ? gpu_id : 0));
  const uint64_t id = this_machine_id();
  constexpr int K = 6;
  int32_t mine[K] = {int32_t(uint32_t(id)), int32_t(uint32_t(id >> 32)), int32_t(set), int32_t(mem), gpu,
                     int32_t(gpu_id)};
  std::vector<int32_t> all(size_t(K) * P);
  world.all_gather(mine, all.data(), K, DType::i32);
  std::vector<uint64_t> machine(P);
  std::vector<uint32_t> sets(P), mems(P);
  std::vector<int> gpus(P);
  std::vector<uint32_t> ids(P);
  for (int r = 0; r < P; r++) {
    const int32_t* x = &all[size_t(K) * r];
    machine[r] = uint64_t(uint32_t(x[0])) | uint64_t(uint32_t(x[1])) << 32;
    sets[r] = uint32_t(x[2]), mems[r] = uint32_t(x[3]), gpus[r] = x[4], ids[r] = uint32_t(x[5]);
  }
  return host_map_of(machine, sets, mems, gpus, world.rank(), cpus, ids);
}

std::string shared_gpu(const HostMap& m) {
  for (size_t a = 0; a < m.gpu.size(); a++)
    for (size_t b = a + 1; b < m.gpu.size(); b++)
      if (m.gpu_id[a] != 0 && m.gpu_id[a] == m.gpu_id[b] && m.host[a] == m.host[b])
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

int threads_for_rank(int threads_flag, const HostMap& m, int omp_env) {
  if (threads_flag > 0) return threads_flag;
  if (omp_env > 0) return omp_env;
  return std::max(1, m.cpus / m.sharing_cpus());
}

int omp_threads_per_rank(int ranks_in_process) {
  const int env = omp_num_threads_env();
  return env > 0 ? std::max(1, env / std::max(1, ranks_in_process)) : 0;
}

int omp_num_threads_env() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v) return 0;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (end == v || errno || (*end != '\0' && *end != ',') || n < 1 || n > 1024) return 0;
  return int(n);
}

size_t cgroup_memory_limit(const std::string& proc_cgroup, const std::string& root) {
  return cgroup_limit(proc_cgroup, root).first;
}

size_t physical_memory_bytes() { return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE)); }

size_t memory_limit() {
  return std::min(physical_memory_bytes(), cgroup_memory_limit(read_text("/proc/self/cgroup"), "/sys/fs/cgroup"));
}

}  // namespace ul
