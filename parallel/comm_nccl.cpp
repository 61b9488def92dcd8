#include "parallel/comm_nccl.h"

#include "engine/cuda_launch.h"  // cuda_error_text: a sticky fault says how to find its kernel
#include "engine/cuda_runtime.h"
#if ULYSSES_CUDA_EMULATED
#include "engine/cuda_emu/nccl.h"  // shared memory between the ranks' processes, for CI
#else
#include <nccl.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "parallel/comm_util.h"
#include "parallel/id_file.h"
#include "parallel/wait_notice.h"
#include "parallel/watchdog.h"

namespace ul {
namespace {

// NCCL's own last message (ncclGetLastError, 2.13 on): "Duplicate GPU detected : rank 1 and rank 0
// both on CUDA device ..." where the code alone says "invalid usage (run with NCCL_DEBUG=WARN for
// details)". comm: the communicator, or nullptr for the process's last error (an init's).
std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  // (one buffer for every warning of the process, never cleared: the last one, maybe not this call's)
  if (const char* last = ncclGetLastError(comm); last && *last) s += std::string(" (NCCL's last warning: ") + last + ")";
  return s;
}

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string hint;
  if (r == ncclInvalidUsage && std::string(what) == "init")  // the usual cause at an init
    hint = " (the usual causes: two ranks on one GPU, where each needs its own, picked by the launcher's LOCAL_RANK "
           "or CUDA_VISIBLE_DEVICES; or one RANK given to two processes)";
  throw CommError(std::string("nccl: ") + what + ": " + nccl_error(r, comm) + hint);
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("nccl: ") + what + ": " + cuda_error_text(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::f64: return ncclFloat64;
  }
  throw CommError("nccl: unsupported dtype");
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // plain host memory on old drivers reports an error: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclComm : public Comm {
 public:
  NcclComm(ncclComm_t c, int device, double timeout_s)
      : Comm(Device::cuda), comm_(c), device_(device), timeout_(timeout_s),
        guard_(timeout_s, [this](const char* what) { in_call_expired(what); }) {
    check_nccl(ncclCommUserRank(c, &rank_), "rank", c);
    check_nccl(ncclCommCount(c, &size_), "size", c);
  }
  ~NcclComm() override {
    // Destroyed while an error unwinds the stack: abort, which does not wait for the peers (a
    // destroy may, and the error would never reach the caller that ends the job). Before the
    // staging buffers' cudaFree, which waits for the device.
    if (comm_) std::uncaught_exceptions() > 0 ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    for (void* s : staging_)
      if (s) cudaFree(s);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    own_work_done("all_reduce");
    Staged s(*this, buf, count * dtype_size(t), true);
    {
      Guarded g(guard_, "all_reduce");
      call(ncclAllReduce(s.ptr, s.ptr, count, nccl_type(t), op == ReduceOp::sum ? ncclSum : ncclMax, comm_, nullptr),
           "all_reduce");
    }
    finish("all_reduce");
    s.back();
    stats.all_reduce += comm_volume::all_reduce(count, t, size_);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    own_work_done("all_to_all");
    const size_t all = size_t(size_) * count * dtype_size(t);
    Staged in(*this, const_cast<void*>(send), all, true, 0);
    Staged out(*this, recv, all, false, 1);
    // NCCL >= 2.28 has ncclAlltoAll; older ones get the classic grouped send/recv.
#if NCCL_VERSION_CODE >= 22800
    {
      Guarded g(guard_, "all_to_all");
      call(ncclAlltoAll(in.ptr, out.ptr, count, nccl_type(t), comm_, nullptr), "all_to_all");
    }
#else
    const size_t bytes = count * dtype_size(t);
    call(ncclGroupStart(), "group");
    ncclResult_t r = ncclSuccess;
    for (int j = 0; j < size_ && (r == ncclSuccess || r == ncclInProgress); j++) {
      r = ncclSend(static_cast<const char*>(in.ptr) + j * bytes, count, nccl_type(t), j, comm_, nullptr);
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclRecv(static_cast<char*>(out.ptr) + j * bytes, count, nccl_type(t), j, comm_, nullptr);
    }
    // Ended even after a failed call: a group left open would swallow this thread's next one.
    // (The group's end is where the sends and receives are issued, and may block.)
    ncclResult_t end;
    {
      Guarded g(guard_, "all_to_all");
      end = ncclGroupEnd();
    }
    call(r, "all_to_all's send/recv");
    call(end, "group");
#endif
    finish("all_to_all");
    out.back();
    stats.all_to_all += comm_volume::all_to_all(count, t, size_);
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    own_work_done("all_gather");
    // Host buffers too (the start-up checks gather a few host ints), through two staging buffers.
    Staged in(*this, const_cast<void*>(send), count * dtype_size(t), true, 0);
    Staged out(*this, recv, size_t(size_) * count * dtype_size(t), false, 1);
    {
      Guarded g(guard_, "all_gather");
      call(ncclAllGather(in.ptr, out.ptr, count, nccl_type(t), comm_, nullptr), "all_gather");
    }
    finish("all_gather");
    out.back();
    stats.all_gather += comm_volume::all_gather(count, t, size_);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    own_work_done("reduce_scatter");
    Staged in(*this, const_cast<void*>(send), size_t(size_) * count * dtype_size(t), true, 0);
    Staged out(*this, recv, count * dtype_size(t), false, 1);
    {
      Guarded g(guard_, "reduce_scatter");
      call(ncclReduceScatter(in.ptr, out.ptr, count, nccl_type(t), op == ReduceOp::sum ? ncclSum : ncclMax, comm_,
                             nullptr),
           "reduce_scatter");
    }
    finish("reduce_scatter");
    out.back();
    stats.reduce_scatter += comm_volume::reduce_scatter(count, t, size_);
  }
  void broadcast(void* buf, size_t count, DType t, int root) override {
    own_work_done("broadcast");
    Staged s(*this, buf, count * dtype_size(t), rank_ == root);
    {
      Guarded g(guard_, "broadcast");
      call(ncclBroadcast(s.ptr, s.ptr, count, nccl_type(t), root, comm_, nullptr), "broadcast");
    }
    finish("broadcast");
    s.back();
    stats.broadcast += comm_volume::broadcast(count, t, size_, rank_ == root);
  }
  void barrier() override {
    float x = 0;
    all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  }
  std::unique_ptr<Comm> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    {
      Guarded g(guard_, "split");  // collective over the parent's ranks, as the init is
      check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr), "split", comm_);
    }
    if (!sub) return nullptr;
    try {
      return std::make_unique<NcclComm>(sub, device_, timeout_);
    } catch (...) {  // as the world's in make(): no one else would free it
      ncclCommAbort(sub);
      throw;
    }
  }

 private:
  // A host buffer goes through a device staging buffer (as the local and MPI communicators take
  // either); a device buffer is used as it is.
  struct Staged {
    Staged(NcclComm& c, void* user, size_t bytes, bool copy_in, int slot = 0) : c(c), user(user), bytes(bytes) {
      if (bytes == 0 || on_device(user)) { ptr = user; return; }
      ptr = c.staging(bytes, slot);
      if (copy_in) check_cuda(cudaMemcpy(ptr, user, bytes, cudaMemcpyHostToDevice), "stage in");
    }
    void back() {
      if (ptr != user) check_cuda(cudaMemcpy(user, ptr, bytes, cudaMemcpyDeviceToHost), "stage out");
    }
    NcclComm& c;
    void* user;
    size_t bytes;
    void* ptr = nullptr;
  };

  void* staging(size_t bytes, int slot) {
    if (bytes > staging_bytes_[slot]) {
      if (staging_[slot]) cudaFree(staging_[slot]);
      staging_[slot] = nullptr;
      check_cuda(cudaMalloc(&staging_[slot], bytes), "staging buffer");
      staging_bytes_[slot] = bytes;
    }
    return staging_[slot];
  }

  // This rank's own queued kernels first, with no deadline: the host may run a whole backward ahead
  // of the GPU, and finish()'s clock is for the peers, not for this rank's compute.
  void own_work_done(const char* what) {
    check_cuda(cudaStreamSynchronize(nullptr), (std::string("the kernels queued before ") + what).c_str());
  }

  // A collective that failed leaves the communicator unusable: it is aborted at once (a destroy
  // later may wait for peers that will not come), then the error is thrown.
  [[noreturn]] void fail(const std::string& why) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CommError("nccl: " + why);
  }
  void call(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) fail(std::string(what) + ": " + nccl_error(r, comm_));
  }

  // Waits for the enqueued collective with a deadline, watching NCCL's asynchronous errors.
  void finish(const char* what) {
    auto start = std::chrono::steady_clock::now();
    const double every = wait_notice();  // the lead's process only (parallel/wait_notice.h)
    double next_notice = every;
    for (;;) {
      cudaError_t q = cudaStreamQuery(nullptr);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(std::string(what) + ": " + cuda_error_text(q));
      // "Not ready" is no error, but a runtime may leave it for cudaGetLastError, where the next
      // kernel's launch check would take it for that kernel's failure: taken back, only if it is
      // what is pending (an error of its own stays for its owner).
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      ncclResult_t async = ncclSuccess;
      call(ncclCommGetAsyncError(comm_, &async), what);
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (async != ncclSuccess) fail(std::string(what) + " failed: " + nccl_error(async, comm_));
      if (waited > timeout_) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", timeout_);
        fail(std::string(what) + " timed out after " + secs + " s (--comm-timeout) on rank " + std::to_string(rank_) +
             ": a peer died or hangs");
      }
      if (every > 0 && waited >= next_notice) {
        print_wait_notice(what, waited, "the other ranks", timeout_);
        next_notice += every;
        if (next_notice < waited) next_notice = waited + every;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // NCCL's calls may block on the peers, not only the init: in blocking mode a collective's first
  // use of a peer or an algorithm connects to it inside the call, before finish()'s clock starts. A
  // peer that hangs or died there would hold this rank until the scheduler's limit; the guard gives
  // such a call --comm-timeout, then says which call and exits (nothing returns from inside it).
  using Guarded = RearmableWatchdog::ArmedScope;
  void in_call_expired(const char* what) {
    std::fprintf(stderr, "train: error: nccl: rank %d of %d waited %g s (--comm-timeout) inside NCCL's %s: a peer "
                 "died or hangs (a call connects to its peers at their first use); exiting\n", rank_, size_, timeout_,
                 what);
    std::fflush(stderr);
    std::_Exit(1);
  }

  ncclComm_t comm_;
  int device_, rank_ = 0, size_ = 1;
  double timeout_;
  RearmableWatchdog guard_;  // after what its handler reads; destroyed before them
  void* staging_[2] = {nullptr, nullptr};  // a collective with two host buffers takes both
  size_t staging_bytes_[2] = {0, 0};
};

// What a bootstrap wait that never ends does once --comm-timeout has passed: NCCL's init cannot be
// interrupted and returns only when every rank has joined, so the process says why and exits
// (under mpirun or srun the launcher then ends the job's other ranks).
Watchdog init_deadline(const char* what, int rank, int size, double timeout_s) {
  return Watchdog(timeout_s, [=] {
    std::fprintf(stderr, "train: error: nccl: rank %d of %d waited %.0f s (--comm-timeout) in %s for the job's other "
                 "ranks: one never started, died before joining, or was given another --nccl-id-file or world size; "
                 "exiting\n", rank, size, timeout_s, what);
    std::fflush(stderr);
    std::_Exit(1);
  });
}

std::unique_ptr<Comm> make(const ncclUniqueId& id, int rank, int size, int device, double timeout_s) {
  // NCCL_COMM_BLOCKING=0 would make every communicator non-blocking whatever the code asks: calls
  // then return ncclInProgress before their work is queued, and this communicator, which waits on
  // the stream after each call, would read a collective's buffers before it ran.
  if (const char* b = std::getenv("NCCL_COMM_BLOCKING"); b && std::string(b) != "1")
    throw CommError(std::string("nccl: NCCL_COMM_BLOCKING=") + b + " in the environment: ulysses' NCCL communicator "
                    "is blocking (its calls queue their work before they return); unset it or set it to 1");
  check_cuda(cudaSetDevice(device), "set device");
  ncclComm_t c = nullptr;
  {
    Watchdog deadline = init_deadline("the communicator's init", rank, size, timeout_s);
    check_nccl(ncclCommInitRank(&c, size, id, rank), "init");
  }
  try {
    return std::make_unique<NcclComm>(c, device, timeout_s);
  } catch (...) {  // its rank or size unreadable: the communicator is no one's to free otherwise
    ncclCommAbort(c);
    throw;
  }
}

}  // namespace

std::unique_ptr<Comm> nccl_world_from(Comm& bootstrap, int device, double timeout_s) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) check_nccl(ncclGetUniqueId(&id), "unique id");
  static_assert(sizeof(ncclUniqueId) % 4 == 0, "the id travels as int32 words");
  {
    Watchdog deadline = init_deadline("the id's broadcast", bootstrap.rank(), bootstrap.size(), timeout_s);
    bootstrap.broadcast(&id, sizeof id / 4, DType::i32, 0);
  }
  return make(id, bootstrap.rank(), bootstrap.size(), device, timeout_s);
}

std::unique_ptr<Comm> nccl_world_from_file(const std::string& id_file, int rank, int size, int device,
                                           double timeout_s) {
  // parallel/id_file.h: the token keeps this job's ranks off a file another job or a dead run left.
  const std::string token = id_file_job_token();
  ncclUniqueId id{};
  std::string bytes;
  if (rank == 0) {
    if (!id_file_token_unique(token))
      std::fprintf(stderr, "warning | --nccl-id-file: no job id tells this run's file from another's (%s): set "
                           "ULYSSES_JOB_ID (or torchrun's --rdzv-id) to something unique per run\n",
                   token.empty() ? "none of ULYSSES_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID is set" : token.c_str());
    check_nccl(ncclGetUniqueId(&id), "unique id");
    bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
    write_id_file(id_file, token, bytes);
  } else {
    bytes = wait_for_id_file(id_file, token, sizeof id, timeout_s);
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  std::unique_ptr<Comm> world = make(id, rank, size, device, timeout_s);
  // Every rank has joined (the init is collective), so every rank has read it: a later job must not.
  if (rank == 0) remove_id_file_if_ours(id_file, token, bytes);
  return world;
}

}  // namespace ul
