// train: the command-line front of ulysses. Flags -> world -> one training job per rank.
//   ./build/train                       the default job (tiny model, passkey retrieval)
//   ./build/train --help                every flag
//   mpirun -np 4 ./build/train --comm mpi --sp 2 ...
//   ./build/train prepare --out DIR a.txt b.txt   text files -> shards (data/prepare.h)
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include "data/prepare.h"
#include "engine/check_state.h"
#include "engine/checkpoint.h"
#include "engine/float_env.h"
#include "engine/options.h"
#include "engine/planner.h"
#include "engine/stop_signal.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#if ULYSSES_HAVE_MPI
#include "parallel/comm_mpi.h"
#include "parallel/watchdog.h"
#endif
#include "parallel/launcher.h"
#include "parallel/wait_notice.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif
#if ULYSSES_HAVE_NCCL
#include "parallel/comm_nccl.h"
#endif

using namespace ul;

// A failed host allocation that no start-up check foresaw: what they do not count.
static const char* kOutOfMemory =
    "out of host memory: an allocation failed (the machine's memory, a cgroup's limit, or a process limit such as "
    "`ulimit -v` or a scheduler's h_vmem, which the start-up checks do not count)";

// --comm local: a rank is still running --comm-timeout after another failed, outside any collective
// (run_local's abandon): the error, then the end of the process.
[[noreturn]] static void exit_abandoned(const std::string& why) {
  // Nothing here may block for long: the stuck rank may be blocked writing to a reader that
  // stalled, holding standard output's lock, and standard error may be that same pipe
  // (`2>&1 | tee`). So each write waits at most a second for room (poll; the descriptors'
  // flags, shared with the shell and the other writers of the pipe, stay as they are), and the
  // process ends whether or not the lines got through.
  // And a last bound: room seen by poll can be taken by another writer before this one's
  // write (the stuck rank's heartbeat, another process on the pipe), which would then block.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    std::_Exit(1);
  }).detach();
  auto room = [](int fd) {
    pollfd p{fd, POLLOUT, 0};
    return ::poll(&p, 1, 1000) == 1 && (p.revents & POLLOUT);
  };
  if (room(STDOUT_FILENO) && ftrylockfile(stdout) == 0) {  // the lines so far (a few KiB at most)
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  const std::string line = "train: error: " + why + "\n";
  if (room(STDERR_FILENO) && ::write(STDERR_FILENO, line.data(), line.size()) < 0) {
    // (nothing more to do: the exit status still says the run failed)
  }
  std::_Exit(1);
}

static int run(const Options& o, Comm& world) {
  if (o.comm != "local" && world.size() > 1) in_multi_process_job(world.rank() == 0);  // (engine/stop_signal.h)
  // The lead says what a collective waits for, at --heartbeat's period (parallel/wait_notice.h).
  std::optional<WaitNoticeScope> notice;
  if (world.rank() == 0 && !o.quiet) notice.emplace(wait_notice_period(o.heartbeat));
  // --auto-resume: resume or start fresh as rank 0 finds --save-dir (engine/checkpoint.h).
  if (o.auto_resume) {
    Options settled = o;
    settle_auto_resume(settled, world);
    return train_rank(settled, world);
  }
  return o.check_state.empty() ? train_rank(o, world) : check_state_rank(o, world);
}

#if ULYSSES_HAVE_MPI
// Everything after MPI's start (the world and its checks, NCCL's bootstrap, the run): a process
// that fails alone must not leave the others waiting in a collective (an exception unwinding past
// MpiRuntime would MPI_Finalize first, which waits for them, and the job would hang with no
// message): print why, then end the job.
template <class Body>
static int after_mpi_start(Body&& body) {
  try {
    return body();
  } catch (const JobError& e) {  // every rank has it: each ends, no abort (communicator.h); rank 0 says it
    if (mpi_world_place().first <= 0) std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    const int sigterms = sigterms_so_far();  // (one that came before the failure is not the launcher's answer to it)
    const char* why = dynamic_cast<const std::bad_alloc*>(&e) ? kOutOfMemory : e.what();
    const auto [rank, size] = mpi_world_place();
    if (rank > 0) {
      // A failure every rank meets (one no agreement made a JobError of) is rank 0's to say: it ends
      // the job, and the launcher's SIGTERM reaches this rank within about 2 s (Open MPI 4.1:
      // SIGCONT, then SIGTERM a second later), which then adds no copy of the same message. One
      // this rank met alone is said after that wait, with its rank.
      for (int ms = 0; ms < 2500 && sigterms_so_far() == sigterms; ms += 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (sigterms_so_far() != sigterms) {  // (ended now: MPI_Finalize would wait for ranks being torn down)
        std::fflush(stdout);
        std::_Exit(1);
      }
      std::fprintf(stderr, "train: error: rank %d of %d: %s\n", rank, size, why);
    } else {
      std::fprintf(stderr, "train: error: %s\n", why);
    }
    std::fflush(stderr);
    abort_job_if_shared(1);
    return 1;
  }
}
#endif


#if ULYSSES_HAVE_MPI
// An MPI the launcher did not wire up (srun with an MPI built without its PMI support) starts each
// process as a world of its own: N copies of the run, each rank 0, each writing the same files.
static void check_mpi_world(const Comm& world) {
  const Launcher l = detect_launcher();
  if (world.size() == 1 && started_as_several(l))
    throw std::runtime_error("MPI sees a world of 1 rank, but " + l.name + " started " + std::to_string(l.size) + " (" +
                             l.vars + "): this MPI is not wired to that launcher (under srun it needs Slurm's PMI or "
                             "PMIx support; else start the ranks with mpirun)");
}
#endif

// --comm local runs the whole world in this process: one of several a launcher started (mpirun
// without --comm mpi) would be N copies of the run, each rank 0, each writing the same files.
static void check_local_world(const Options& o) {
  const Launcher l = detect_launcher();
  if (started_as_several(l))
    throw std::runtime_error("--comm local: " + l.name + " started this process as one of " + std::to_string(l.size) +
                             " (" + l.vars + "), but --comm local runs the whole world (--ranks " +
                             std::to_string(o.ranks) + ") inside one process: the job would run " +
                             std::to_string(l.size) + " times over, each writing the same files; give --comm mpi " +
                             "(or --comm nccl), or start one process");
}

#if ULYSSES_HAVE_CUDA
// One GPU per process: its rank on this machine, as its launcher says (parallel/launcher.h), picks
// the device. Before MPI starts: a CUDA-aware MPI would otherwise open a context on GPU 0 in every
// process of the machine. Returns the device; *count: the devices visible.
static int select_gpu(const std::string& flag, const Launcher& l, int* count = nullptr) {
  // (the driver's advice too: these paths come before --device cuda's own check)
  const int devices = visible_cuda_devices(flag);
  const int gpu = std::max(l.local_rank, 0) % devices;
  if (const cudaError_t e = cudaSetDevice(gpu); e != cudaSuccess)  // (exclusive-process mode: "busy or unavailable")
    throw std::runtime_error(flag + ": cannot select GPU " + std::to_string(gpu) + " (" + cudaGetErrorString(e) + ")");
  if (count) *count = devices;
  return gpu;
}
#endif

#if ULYSSES_HAVE_MPI
// MPI's start-up (MPI_Init, then the world's duplicate) waits for every rank of the job: one that
// exited before joining with status 0 (--help, --plan, `prepare`: ranks given other command lines),
// which mpirun does not treat as a failure, would leave the others there for good.
// The launcher's rank 0 (its rank from the environment: MPI has not said yet) says that it waits,
// every `notice_s` (--heartbeat's period): a node slow to start looked like a hang until the deadline.
static std::unique_ptr<Watchdog> mpi_start_deadline(double seconds, double notice_s) {
  const bool lead = detect_launcher().rank == 0;
  return std::make_unique<Watchdog>(
      seconds,
      [seconds] {
        std::fprintf(stderr, "train: error: mpi: waited %g s (--comm-timeout) in MPI's start-up for the job's other "
                     "ranks: one never started, or exited before joining (a rank given --help, --plan or another "
                     "command line); exiting\n", seconds);
        std::fflush(stderr);
        std::_Exit(1);
      },
      lead ? notice_s : 0,
      lead ? std::function<void(double)>([seconds](double lasted) {
        print_wait_notice("MPI's start-up", lasted, "the job's other ranks", seconds);
      })
           : std::function<void(double)>());
}
#endif

// This process's rank in a --comm nccl world bootstrapped over --nccl-id-file (checked against its
// world size), -1 otherwise: a failure the ranks agreed on is its rank 0's to print.
static int g_id_file_rank = -1;

#if ULYSSES_HAVE_NCCL
static int run_nccl(const Options& o, int* argc, char*** argv) {
  const Launcher l = detect_launcher();
  int devices = 0;
  const int gpu = select_gpu("--comm nccl", l, &devices);
  if (o.nccl_id_file.empty()) {
#if ULYSSES_HAVE_MPI
    auto joining = mpi_start_deadline(o.comm_timeout, o.quiet ? 0 : wait_notice_period(o.heartbeat));
    MpiRuntime mpi(argc, argv);
    return after_mpi_start([&] {
      auto boot = mpi_world(Device::cpu, o.comm_timeout, wait_notice_period(o.heartbeat));
      joining.reset();
      check_mpi_world(*boot);
      auto world = nccl_world_from(*boot, gpu, o.comm_timeout);
      return run(o, *world);
    });
#else
    throw std::runtime_error("--comm nccl: this build has no MPI to bootstrap NCCL; give --nccl-id-file");
#endif
  }
  if (l.rank >= 0 && l.size >= 1 && l.rank >= l.size)
    throw std::runtime_error("--nccl-id-file: rank " + std::to_string(l.rank) + " is not below the world size " +
                             std::to_string(l.size) + " (" + l.name + ": read " + l.vars + ")");
  if (l.rank < 0 || l.size < 1)
    throw std::runtime_error("--nccl-id-file: no rank and world size from a launcher: start under torchrun, srun or "
                             "mpirun, or set RANK and WORLD_SIZE (and LOCAL_RANK) to numbers" +
                             (l.name.empty() ? std::string()
                                             : "; read " + l.vars + ", which are unset, not numbers, or below 0 (the "
                                                                    "rank) or 1 (the world size)"));
  // Without its rank on this machine every process would take GPU 0 (NCCL refuses two ranks on one).
  if (l.local_rank < 0 && l.size > 1 && devices > 1)
    throw std::runtime_error("--nccl-id-file: " + l.name + " gives no rank on this machine (read " + l.vars +
                             "), which picks the GPU: set LOCAL_RANK");
  g_id_file_rank = l.rank;
  auto world = nccl_world_from_file(o.nccl_id_file, l.rank, l.size, gpu, o.comm_timeout);
  return run(o, *world);
}
#endif

static int train_main(int argc, char** argv) {
  try {
    // `train prepare ...`: text files -> byte-level llm.c shards (data/prepare.h), no training.
    if (argc > 1 && std::string(argv[1]) == "prepare") return prepare_main(argc - 1, argv + 1);
    Options o;
    try {
      o = parse_options(argc, argv);
    } catch (const std::exception&) {
      // Every process of a launched job parses the same command line and meets the same refusal:
      // the launcher's rank 0 says it (each printed its copy, before MPI starts). The others go
      // a second later, so that their exit does not make the launcher end rank 0 before it prints.
      const Launcher l = detect_launcher();
      if (started_as_several(l) && l.rank > 0) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        return 1;
      }
      throw;
    }
    if (o.help) {
      std::fputs(usage(), stdout);
      return 0;
    }
    if (o.plan) return plan_main(o);  // prints what the run would hold; starts nothing
    // A stop signal from here on stops the run cleanly (before its first step, if it comes during
    // start-up: MPI's, NCCL's, a large checkpoint's load), rather than ending it by default action.
    if (o.check_state.empty()) install_stop_handlers();
    if (o.comm == "nccl") {
#if ULYSSES_HAVE_NCCL
      return run_nccl(o, &argc, &argv);
#else
      throw std::runtime_error("--comm nccl: this build has no NCCL (configure with -DULYSSES_CUDA=ON where NCCL is installed)");
#endif
    }
    if (o.comm == "mpi") {
#if ULYSSES_HAVE_MPI
#if ULYSSES_HAVE_CUDA
      // The GPU first: run_device's check of it (init_cuda_backend) opens a context on the current
      // device, which must be this rank's, not GPU 0 in every process of the machine.
      if (o.device == "cuda") select_gpu("--comm mpi --device cuda", detect_launcher());
#endif
      auto joining = mpi_start_deadline(o.comm_timeout, o.quiet ? 0 : wait_notice_period(o.heartbeat));
      MpiRuntime mpi(&argc, &argv);
      return after_mpi_start([&] {
        // device buffers are staged through the host
        auto world = mpi_world(run_device(o), o.comm_timeout, wait_notice_period(o.heartbeat));
        joining.reset();
        check_mpi_world(*world);
        return run(o, *world);
      });
#else
      throw std::runtime_error("--comm mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    check_local_world(o);
    LocalOptions local;
    local.device = run_device(o);
    local.timeout_s = o.comm_timeout;
    // A rank stuck outside any collective (reading a slow --prompt-file -) once kept the process
    // alive, silent, long after its peers had failed: --comm-timeout after the first failure, the
    // process ends with it, as an MPI job does.
    local.abandon_after_s = o.comm_timeout;
    local.abandon = exit_abandoned;
    int code = 0;
    run_local(o.ranks, [&](Comm& world) {
      int c = run(o, world);
      if (world.rank() == 0) code = c;
    }, local);
    return code;
  } catch (const std::bad_alloc&) {
    // What no start-up check saw (they count the machine's memory and a cgroup's limit, not a
    // process's address-space limit: `ulimit -v`, a scheduler's h_vmem), or an allocation they
    // do not plan.
    std::fprintf(stderr, "train: error: %s\n", kOutOfMemory);
    return 1;
  } catch (const JobError& e) {
    // Every rank has it: under --comm nccl over --nccl-id-file (torchrun, srun, or RANK and
    // WORLD_SIZE set by hand; no MPI) each rank is a process, and rank 0 says it (every process
    // printed its copy).
    if (g_id_file_rank <= 0) std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  flush_subnormals();  // before any thread: every one inherits it (engine/float_env.h)
  guard_process();  // descriptors 0-2 open, SIGXFSZ ignored (engine/stop_signal.h)
  const int code = train_main(argc, argv);
  // What went to a file must have arrived: for --sample, --plan and --help it is all the run makes
  // (`train ... --sample 300 > story.txt` on a full disk once ended 0 with the story cut short).
  // Not a pipe's: its reader gone is SIGPIPE's to tell (a stop), or, where the caller ignores
  // SIGPIPE, a run whose output nobody reads any more, which still trains to its end and saves.
  errno = 0;
  struct stat out;
  const bool pipe = fstat(STDOUT_FILENO, &out) == 0 && (S_ISFIFO(out.st_mode) || S_ISSOCK(out.st_mode));
  if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && !pipe) {
    std::fprintf(stderr, "train: error: writing the standard output: %s\n",
                 errno ? std::strerror(errno) : "an earlier write failed (a full disk? a quota?)");
    return code != 0 ? code : 1;
  }
  return code;
}
