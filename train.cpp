// train: the command-line front of ulysses. Flags -> world -> one training job per rank.
//   ./build/train                       the default job (tiny model, passkey retrieval)
//   ./build/train --help                every flag
//   mpirun -np 4 ./build/train --comm mpi --sp 2 ...
//   ./build/train prepare --out DIR a.txt b.txt   text files -> shards (data/prepare.h)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <exception>
#include <string>

#include "data/prepare.h"
#include "engine/check_state.h"
#include "engine/options.h"
#include "engine/planner.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#if ULYSSES_HAVE_MPI
#include "parallel/comm_mpi.h"
#endif
#if ULYSSES_HAVE_NCCL
#include <cuda_runtime.h>

#include "parallel/comm_nccl.h"
#endif

using namespace ul;

static int run(const Options& o, Comm& world) {
  return o.check_state.empty() ? train_rank(o, world) : check_state_rank(o, world);
}

#if ULYSSES_HAVE_MPI
// A job of processes: one that fails alone must not leave the others waiting in a collective (an
// exception unwinding past MpiRuntime would MPI_Finalize first, and the job would hang with no
// message): print why, then end the job.
static int run_mpi_job(const Options& o, Comm& world) {
  try {
    return run(o, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    std::fflush(stderr);
    abort_job_if_shared(1);
    return 1;
  }
}
#endif

#if ULYSSES_HAVE_NCCL
// An integer from the first of these environment variables that is set, else `fallback`.
static int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return fallback;
}

// One GPU per process: the process's rank within its node picks the device.
static int run_nccl(const Options& o, int* argc, char*** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw std::runtime_error("--comm nccl: no CUDA device is visible");
  const int local = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}, -1);
  // The GPU first, before MPI starts: a CUDA-aware MPI would otherwise open a context on GPU 0 in
  // every process of the node.
  if (cudaSetDevice(std::max(local, 0) % devices) != cudaSuccess)
    throw std::runtime_error("--comm nccl: cannot select GPU " + std::to_string(std::max(local, 0) % devices));
  if (o.nccl_id_file.empty()) {
#if ULYSSES_HAVE_MPI
    MpiRuntime mpi(argc, argv);
    auto boot = mpi_world();
    auto world = nccl_world_from(*boot, std::max(local, 0) % devices, o.comm_timeout);
    return run_mpi_job(o, *world);
#else
    throw std::runtime_error("--comm nccl: this build has no MPI to bootstrap NCCL; give --nccl-id-file");
#endif
  }
  const int rank = env_int({"RANK", "SLURM_PROCID"}, -1), size = env_int({"WORLD_SIZE", "SLURM_NTASKS"}, -1);
  if (rank < 0 || size < 1) throw std::runtime_error("--nccl-id-file: set RANK and WORLD_SIZE (or run under srun)");
  // Without its rank on this machine every process would take GPU 0 (NCCL refuses two ranks on one).
  if (local < 0 && size > 1 && devices > 1)
    throw std::runtime_error("--nccl-id-file: set LOCAL_RANK (or run under srun: SLURM_LOCALID), the process's rank "
                             "on its machine, which picks its GPU");
  auto world = nccl_world_from_file(o.nccl_id_file, rank, size, std::max(local, 0) % devices, o.comm_timeout);
  return run(o, *world);
}
#endif

int main(int argc, char** argv) {
  try {
    // `train prepare ...`: text files -> byte-level llm.c shards (data/prepare.h), no training.
    if (argc > 1 && std::string(argv[1]) == "prepare") return prepare_main(argc - 1, argv + 1);
    Options o = parse_options(argc, argv);
    if (o.help) {
      std::fputs(usage(), stdout);
      return 0;
    }
    if (o.plan) return plan_main(o);  // prints what the run would hold; starts nothing
    if (o.comm == "nccl") {
#if ULYSSES_HAVE_NCCL
      return run_nccl(o, &argc, &argv);
#else
      throw std::runtime_error("--comm nccl: this build has no NCCL (configure with -DULYSSES_CUDA=ON where NCCL is installed)");
#endif
    }
    if (o.comm == "mpi") {
#if ULYSSES_HAVE_MPI
      MpiRuntime mpi(&argc, &argv);
      auto world = mpi_world(run_device(o));  // device buffers are staged through the host
      return run_mpi_job(o, *world);
#else
      throw std::runtime_error("--comm mpi: this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    LocalOptions local;
    local.device = run_device(o);
    local.timeout_s = o.comm_timeout;
    int code = 0;
    run_local(o.ranks, [&](Comm& world) {
      int c = run(o, world);
      if (world.rank() == 0) code = c;
    }, local);
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 1;
  }
}
