// The part of NCCL's API that parallel/comm_nccl.cpp calls, emulated for the CPU build of the CUDA
// backend (-DULYSSES_CUDA_EMULATION=ON), so that `train --device cuda --comm nccl` runs there and
// CI runs the NCCL communicator: its bootstraps (over MPI, or --nccl-id-file), host staging,
// splits, deadlines and errors. Not NCCL: no rings, trees or GPU transports.
//
// A communicator is a POSIX shared-memory segment that its ranks (processes, or threads of one)
// map: a barrier, each rank's process id, and one slot per rank through which every collective
// passes in chunks. Reductions go in rank order with the local communicator's rule
// (parallel/comm_util.h: reduce_many; bf16 summed in f32 and rounded once), so a run gives the
// same bits as under --comm local. Buffers must be device memory (cudaMalloc), as NCCL's must.
// A collective is work on its stream (engine/cuda_emu/runtime.h: it may run late). On a stream
// that runs late, the cudaStreamQuery that reaches it runs it on a thread beside the host's and
// answers cudaErrorNotReady until it ends, as a GPU does: comm_nccl's deadline (--comm-timeout)
// then ends the wait for a peer alive but hung. A peer process that has exited, or a wait of over
// 10 minutes, fails it: at issue, the call returns ncclRemoteError; beside the host, as NCCL's,
// ncclCommGetAsyncError says ncclRemoteError and the collective stays not ready until the caller
// aborts the communicator; run by a call that waits for the stream, the stream's work fails
// (cudaErrorLaunchFailure). Each way the message is on stderr. ncclCommAbort ends the
// collectives it left queued or running, with no error (a later one is ncclInvalidUsage). A
// communicator's collectives run one at a time in each rank. Where it differs from NCCL: a dead
// peer is seen at once (NCCL may see it only at the caller's timeout); on a stream that runs at issue
// the collective runs inside the call, so a peer alive but hung is waited for 10 minutes whatever
// the caller's timeout; host memory is refused (NCCL takes registered host memory); sums go in
// rank order (NCCL's rings and trees may round otherwise). Each collective first compares what
// every rank called (collective, type, reduction, count, root, and how many came before): a
// mismatch, which would hang NCCL or have it read wrong data, is ncclInvalidUsage here, with both
// calls on stderr. So is an init that claims a rank already taken, or another world size than the
// first rank's, while the init is open (the ranks that joined rightly go on waiting for the rank
// still missing; one that comes after the init has ended makes a new segment and waits there).
#pragma once
#include <cstddef>

#include "engine/cuda_emu/runtime.h"

// The version this header says it is: 2.28 (which has ncclAlltoAll), or an older one where a
// translation unit defines ULYSSES_EMU_NCCL_VERSION_CODE first (tests/emu/comm_nccl_pre_2_28.cpp
// builds comm_nccl's grouped send/recv so).
#ifndef ULYSSES_EMU_NCCL_VERSION_CODE
#define ULYSSES_EMU_NCCL_VERSION_CODE 22800
#endif
#define NCCL_VERSION_CODE ULYSSES_EMU_NCCL_VERSION_CODE
#define NCCL_MAJOR (NCCL_VERSION_CODE / 10000)
#define NCCL_MINOR (NCCL_VERSION_CODE / 100 % 100)
#define NCCL_PATCH (NCCL_VERSION_CODE % 100)
#define NCCL_SPLIT_NOCOLOR -1

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt32 = 2,
  ncclInt = 2,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclMax = 2 } ncclRedOp_t;  // NCCL's values (1 and 3 are prod and min)

typedef struct {
  char internal[128];  // here: the name of the shared-memory segment
} ncclUniqueId;

typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfig_v ncclConfig_t;  // only nullptr (the defaults) is taken

const char* ncclGetErrorString(ncclResult_t r);
// The last error's own message (NCCL 2.13 on): here every failure's message goes to stderr as it
// happens, so this is "".
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
// Blocks until all `nranks` ranks have joined (as NCCL's does).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
// Collective over comm: ranks of one color form a communicator, ordered by (key, old rank); a
// rank with NCCL_SPLIT_NOCOLOR gets nullptr.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream);
#if NCCL_VERSION_CODE >= 22800
// count elements to and from each rank: block j of send goes to rank j, block i of recv came from rank i.
ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream);
#endif

// Point-to-point, grouped: the sends and receives between ncclGroupStart and its ncclGroupEnd run
// together at the end (one outside a group is a group of its own). Here a group is collective over
// each communicator it uses: every rank of it ends a group at the same point, with at most one
// send and one receive per peer and one stream per communicator, and every send has the receive
// that matches it (count and type) in the same group (NCCL needs only the peers involved, and
// takes more per peer, in order). Anything else is ncclInvalidUsage. A group over two
// communicators runs their parts one after the other, in the order the group first names them:
// ranks that name them in different orders wait (10 minutes, then fail), where NCCL would not.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream);
