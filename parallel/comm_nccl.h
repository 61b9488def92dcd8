// The NCCL communicator: ranks are GPUs (one per process), collectives run on device buffers.
// Built with the real CUDA backend (-DULYSSES_CUDA=ON) when NCCL is found, and in the emulation
// build on the emulated NCCL (engine/cuda_emu/nccl.h: shared memory between processes), where CI
// runs it. Bootstrap: the NCCL unique id comes from rank 0 over MPI, or through a shared file for
// launchers without MPI. Host buffers (the trainer's loss and count scalars) are staged through a
// device buffer. Every collective is enqueued on the default stream and waited for with a deadline:
// if a peer dies the wait times out, the communicator is aborted and CommError is thrown, so no
// rank hangs.
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace ul {

// Every rank of `bootstrap` (e.g. the MPI world) calls this; rank i drives CUDA device `device`.
std::unique_ptr<Comm> nccl_world_from(Comm& bootstrap, int device, double timeout_s = 60);
// Without MPI: rank 0 writes the unique id to `id_file` (atomically), the others wait for it.
std::unique_ptr<Comm> nccl_world_from_file(const std::string& id_file, int rank, int size, int device,
                                           double timeout_s = 60);

}  // namespace ul
