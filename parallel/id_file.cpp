#include "parallel/id_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "parallel/communicator.h"
#include "parallel/hosts.h"
#include "parallel/launcher.h"

namespace ul {

namespace {

// The file's token line and id, or false when it is not there (yet) or is cut short.
bool read_file(const std::string& path, size_t bytes, std::string& token, std::string& id) {
  std::ifstream f(path, std::ios::binary);
  if (!std::getline(f, token)) return false;
  id.assign(bytes, '\0');
  return bool(f.read(&id[0], std::streamsize(bytes)));
}

}  // namespace

std::string id_file_job_token() {
  std::string t;
  // Open MPI's job id first when it launched us: inside a Slurm allocation mpirun starts the ranks
  // of its own node itself (they keep the batch shell's SLURM_STEP_ID, or none) and those of other
  // nodes through daemons that srun started (a step of their own), so the step differs by node.
  const char* ompi = detect_launcher().name == "Open MPI"
                         ? (env_value("PMIX_NAMESPACE") ? env_value("PMIX_NAMESPACE") : env_value("OMPI_MCA_ess_base_jobid"))
                         : nullptr;
  if (const char* v = env_value("ULYSSES_JOB_ID")) {
    t = std::string("ULYSSES_JOB_ID=") + v;
  } else if (ompi) {
    t = std::string("Open MPI job ") + ompi;
    if (const char* j = env_value("SLURM_JOB_ID")) t += " in SLURM_JOB_ID=" + std::string(j);
  } else if (const char* j = env_value("SLURM_JOB_ID")) {
    t = std::string("SLURM_JOB_ID=") + j;
    if (const char* step = env_value("SLURM_STEP_ID")) t += "." + std::string(step);
  } else if (const char* r = env_value("TORCHELASTIC_RUN_ID")) {
    t = std::string("TORCHELASTIC_RUN_ID=") + r;
  } else {
    return "";
  }
  // Whichever id names the job, a restart of it (a requeue, torchrun restarting its workers under
  // srun) is not the attempt that died.
  if (const char* n = env_value("SLURM_RESTART_COUNT")) t += " slurm restart " + std::string(n);
  if (const char* n = env_value("TORCHELASTIC_RESTART_COUNT")) t += " torchrun restart " + std::string(n);
  return t;
}

bool id_file_token_unique(const std::string& token) {
  return !token.empty() && token.rfind("TORCHELASTIC_RUN_ID=none", 0) != 0;
}

void write_id_file(const std::string& path, const std::string& token, const std::string& id) {
  const std::string tmp = path + ".tmp." + host_name() + "." + std::to_string(::getpid());
  {
    // Readable by this user only: the id is the address and key of rank 0's bootstrap, and the
    // path is on a filesystem other users' jobs may read.
    const std::string text = token + '\n' + id;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    size_t done = 0;
    while (fd >= 0 && done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += size_t(n);
    }
    const bool ok = fd >= 0 && done == text.size() && ::close(fd) == 0;
    if (!ok) {
      if (fd >= 0 && done != text.size()) ::close(fd);
      std::remove(tmp.c_str());
      throw CommError("--nccl-id-file: cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw CommError("--nccl-id-file: cannot rename " + tmp + " to " + path);
  }
}

std::string wait_for_id_file(const std::string& path, const std::string& token, size_t bytes, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::string theirs, id;
    if (read_file(path, bytes, theirs, id) && theirs == token) return id;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s)
      throw CommError("--nccl-id-file: no id file " + path + " from rank 0 of this job" +
                      (token.empty() ? std::string() : " (" + token + ")") + " after " + std::to_string(timeout_s) +
                      " s: the path must be on a filesystem every node shares, and rank 0 must have started");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void remove_id_file_if_ours(const std::string& path, const std::string& token, const std::string& id) {
  std::string theirs, now;
  if (read_file(path, id.size(), theirs, now) && theirs == token && now == id) std::remove(path.c_str());
}

}  // namespace ul
