// The emulated NCCL (engine/cuda_emu/nccl.h): communicators in POSIX shared memory.
#include "engine/cuda_emu/nccl.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/comm_util.h"  // reduce_many: the local communicator's sums, so both give the same bits

namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = size_t(4) << 20;  // what one rank puts in per round of a collective
constexpr double kPeerWaitS = 600;               // a GPU waits for ever; a test must not

// What a rank called, compared across the ranks at the start of every collective.
struct Call {
  char op[16];
  int32_t dtype, redop, root;  // redop, root: -1 where the collective has none
  uint64_t count, seq;  // seq: the communicator's collectives before this one
};
// The start of the shared segment (zero-filled when made); the ranks' slots follow it.
struct Header {
  std::atomic<uint32_t> arrived;     // ranks at the current barrier
  std::atomic<uint32_t> generation;  // barriers passed
  std::atomic<int32_t> nranks;              // as the first rank to join said
  std::atomic<int32_t> pid[kMaxRanks];      // 0 until the rank has joined
  int32_t color[kMaxRanks], key[kMaxRanks];  // ncclCommSplit's exchange
  Call call[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "atomics in memory shared by processes must not need a lock");
constexpr size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

// A peer's exit, or a wait past kPeerWaitS: what NCCL reports as a remote error.
struct PeerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A rank given to two processes (or threads), or ranks that were told different world sizes:
// NCCL's init would hang or fail obscurely.
struct BadInit : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Ranks that called different collectives (or counts, types, roots) at the same point: NCCL would
// hang or read wrong data; here it is said.
struct Mismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // A process that has exited but not been reaped yet (a zombie) still answers kill.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

ul::DType dtype(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return ul::DType::i32;
    case ncclFloat32: return ul::DType::f32;
    case ncclFloat64: return ul::DType::f64;
    case ncclBfloat16: return ul::DType::bf16;
  }
  throw std::invalid_argument("unknown data type " + std::to_string(int(t)));
}

ul::ReduceOp reduce_op(ncclRedOp_t op) {
  if (op == ncclSum) return ul::ReduceOp::sum;
  if (op == ncclMax) return ul::ReduceOp::max;
  throw std::invalid_argument("unknown reduction " + std::to_string(int(op)));
}

}  // namespace

struct ncclComm {
  std::string name;
  int rank = 0, size = 1;
  Header* header = nullptr;
  size_t bytes = 0;
  uint64_t splits = 0, calls = 0;
  std::atomic<bool> aborted{false};
  // Held by a collective while it runs: one queued on a stream may run beside the host thread, and
  // this rank's next (on another stream) must not enter the barriers beside it.
  std::mutex running;
  std::atomic<ncclResult_t> async_error{ncclSuccess};  // set by a collective running beside the host

  char* slot(int r) { return reinterpret_cast<char*>(header) + kHeaderBytes + size_t(r) * kSlotBytes; }

  // Each collective first compares what every rank called (the second barrier: all have read
  // before any writes its next call).
  void agree(const char* op, int dtype, int redop, size_t count, int root) {
    Call& mine = header->call[rank];
    std::snprintf(mine.op, sizeof mine.op, "%s", op);
    mine.dtype = dtype;
    mine.redop = redop;
    mine.root = root;
    mine.count = count;
    mine.seq = calls++;
    barrier(op);
    auto said = [](const Call& c) {
      return std::string(c.op) + " (type " + std::to_string(c.dtype) + ", count " + std::to_string(c.count) +
             (c.redop >= 0 ? ", reduction " + std::to_string(c.redop) : std::string()) +
             (c.root >= 0 ? ", root " + std::to_string(c.root) : std::string()) + ")";
    };
    for (int r = 0; r < size; r++) {
      const Call& c = header->call[r];
      if (std::strcmp(c.op, mine.op) || c.dtype != mine.dtype || c.redop != mine.redop || c.root != mine.root ||
          c.count != mine.count || c.seq != mine.seq)
        throw Mismatch("nccl emu: collective #" + std::to_string(mine.seq) + " of rank " + std::to_string(rank) +
                       " is " + said(mine) + ", but rank " + std::to_string(r) + "'s #" + std::to_string(c.seq) +
                       " is " + said(c) + ": every rank must make the same collectives in the same order");
    }
    barrier(op);
  }

  // Every rank reaches it before any leaves. Throws PeerFailure when a peer process has exited, or
  // after kPeerWaitS.
  void barrier(const char* what) {
    const uint32_t gen = header->generation.load(std::memory_order_acquire);
    if (header->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(size)) {
      header->arrived.store(0, std::memory_order_relaxed);
      header->generation.fetch_add(1, std::memory_order_release);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto checked = start;
    for (int spins = 0; header->generation.load(std::memory_order_acquire) == gen; spins++) {
      if (aborted.load(std::memory_order_relaxed)) throw PeerFailure(std::string(what) + ": the communicator was aborted");
      if (spins < 64) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      const auto now = std::chrono::steady_clock::now();
      if (now - checked < std::chrono::milliseconds(20)) continue;
      checked = now;
      // The barrier may have opened while this rank slept, and the last to arrive gone on and
      // exited since: that is no failure.
      if (header->generation.load(std::memory_order_acquire) != gen) return;
      for (int r = 0; r < size; r++) {
        const pid_t pid = header->pid[r].load(std::memory_order_relaxed);
        if (pid > 0 && pid != getpid() && process_gone(pid))
          throw PeerFailure(std::string(what) + ": rank " + std::to_string(r) + " (process " + std::to_string(pid) +
                            ") has exited");
      }
      if (std::chrono::duration<double>(now - start).count() > kPeerWaitS)
        throw PeerFailure(std::string(what) + ": waited " + std::to_string(int(kPeerWaitS)) + " s for the other ranks");
    }
  }
};

namespace {

// Maps (making it, if this rank is the first) the segment `name` of a communicator of `size`
// ranks, and waits until all have joined.
ncclComm* join(const std::string& name, int size, int rank) {
  const size_t bytes = kHeaderBytes + size_t(size) * kSlotBytes;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("nccl emu: shm_open " + name + ": " + std::strerror(errno));
  // The first rank sizes it; a rank told more ranks grows it (and is refused below): never shrunk,
  // which a rank that has it mapped would see as SIGBUS.
  if (const int e = posix_fallocate(fd, 0, off_t(bytes))) {
    close(fd);
    throw std::runtime_error("nccl emu: sizing " + name + ": " + std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("nccl emu: mmap " + name + ": " + std::strerror(errno));
  auto* c = new ncclComm;
  c->name = name;
  c->rank = rank;
  c->size = size;
  c->header = static_cast<Header*>(p);
  c->bytes = bytes;
  int32_t said = 0, unclaimed = 0;
  std::string bad;
  if (!c->header->nranks.compare_exchange_strong(said, size) && said != size)
    bad = "rank " + std::to_string(rank) + " was told of " + std::to_string(size) + " ranks, an earlier one of " +
          std::to_string(said) + ": every rank must be given the same world size";
  else if (!c->header->pid[rank].compare_exchange_strong(unclaimed, int32_t(getpid())))
    bad = "rank " + std::to_string(rank) + " is claimed twice (process " + std::to_string(unclaimed) + " has it, " +
          "process " + std::to_string(getpid()) + " asked for it): every rank needs its own RANK";
  if (!bad.empty()) {
    munmap(p, bytes);  // the name stays: the ranks that joined rightly still wait for their peers
    delete c;
    throw BadInit(bad);
  }
  try {
    c->barrier("init");
  } catch (...) {
    shm_unlink(name.c_str());
    munmap(p, bytes);
    delete c;
    throw;
  }
  // Every rank has it mapped: the name can go (each rank unlinks; all but the first find it gone).
  shm_unlink(name.c_str());
  return c;
}

// Segments left by a job whose init never completed (a rank never came, and the init's watchdog
// ended the process): the name holds the pid of the process that made the id.
void remove_stale_segments() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string(), prefix = "ulysses-nccl-";
    if (file.rfind(prefix, 0) != 0) continue;
    const pid_t pid = pid_t(std::atoll(file.c_str() + prefix.size()));
    if (pid > 0 && process_gone(pid)) shm_unlink(("/" + file).c_str());
  }
}

ncclResult_t failed(ncclResult_t r, const std::string& why) {
  std::fprintf(stderr, "nccl emu: %s\n", why.c_str());
  return r;
}

// A device that has faulted takes no new NCCL work, nor a new communicator (NCCL's init and split
// allocate device memory): the CUDA error, sticky as a GPU's.
ncclResult_t after_fault(const char* what) {
  return failed(ncclUnhandledCudaError, std::string(what) + ": a CUDA call failed: " +
                                            cudaGetErrorString(ul_emu::device_fault()));
}

void require_device(const void* p, size_t bytes, const char* which) {
  if (bytes == 0) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice)
    throw std::invalid_argument(std::string("the ") + which + " buffer is not device memory (cudaMalloc)");
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return an && bn && x < y + bn && y < x + an;
}

// The checks of a call's arguments, run at the call: a throw is its ncclInvalidArgument.
ncclResult_t check(ncclComm_t c, const char* what, const std::function<void()>& checks) {
  if (!c) return failed(ncclInvalidArgument, std::string(what) + ": no communicator");
  try {
    checks();
  } catch (const std::exception& e) {
    return failed(ncclInvalidArgument, std::string(what) + ": " + e.what());
  }
  return ncclSuccess;
}

// Runs `body` as work on `stream`: at issue, or later when the stream runs late (then beside the
// host thread once cudaStreamQuery polls it, so comm_nccl's deadline sees a peer that hangs). A
// peer's failure at issue is the call's ncclRemoteError. Beside the host, it is NCCL's: the async
// error, with the collective left running (cudaStreamQuery: not ready) until the caller aborts
// the communicator, so it is no kernel fault. Run by a call that waits for the stream (no one
// left to abort), it is the stream's failure. An abort ends the collective without an error, as
// NCCL's ends the work it left.
ncclResult_t enqueue(ncclComm_t c, cudaStream_t stream, std::function<void()> body) {
  if (c->aborted.load()) return failed(ncclInvalidUsage, "the communicator was aborted");
  if (ul_emu::device_fault() != cudaSuccess) return after_fault("a collective");
  const std::thread::id issuer = std::this_thread::get_id();
  try {
    ul_emu::on_stream_polled(stream, [c, issuer, body = std::move(body)] {
      std::lock_guard<std::mutex> one_at_a_time(c->running);
      if (c->aborted.load()) return;
      try {
        body();
      } catch (const PeerFailure& e) {
        if (c->aborted.load()) return;
        c->async_error.store(ncclRemoteError);
        const std::string why = std::string("nccl emu: ") + e.what();
        if (std::this_thread::get_id() != issuer) {
          std::fprintf(stderr, "%s\n", why.c_str());
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(int(kPeerWaitS));
          while (!c->aborted.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (c->aborted.load()) return;
        }
        throw PeerFailure(why);
      }
    });
  } catch (const Mismatch& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return ncclInvalidUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return ncclRemoteError;
  }
  return ncclSuccess;
}

}  // namespace

const char* ncclGetLastError(ncclComm_t) { return ""; }

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "a CUDA call failed";
    case ncclSystemError: return "a system call failed (the message before this one says which)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument (the message before this one says which)";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "a peer process exited or did not answer (the message before this one says which)";
    case ncclInProgress: return "operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return failed(ncclInvalidArgument, "ncclGetUniqueId: null id");
  remove_stale_segments();
  static std::atomic<uint64_t> made{0};
  std::random_device rd;
  const std::string name = "/ulysses-nccl-" + std::to_string(getpid()) + "-" + std::to_string(made++) + "-" +
                           std::to_string(rd()) + std::to_string(rd());
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, name.data(), std::min(name.size(), sizeof id->internal - 1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (ul_emu::device_fault() != cudaSuccess) return after_fault("ncclCommInitRank");
  if (!comm) return failed(ncclInvalidArgument, "ncclCommInitRank: null communicator");
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return failed(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + " (at most " + std::to_string(kMaxRanks) + " here)");
  id.internal[sizeof id.internal - 1] = 0;
  if (id.internal[0] != '/') return failed(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
  try {
    *comm = join(id.internal, nranks, rank);
  } catch (const BadInit& e) {
    return failed(ncclInvalidUsage, std::string("ncclCommInitRank: ") + e.what());
  } catch (const PeerFailure& e) {
    return failed(ncclRemoteError, std::string("ncclCommInitRank: ") + e.what());
  } catch (const std::exception& e) {
    return failed(ncclSystemError, e.what());
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  cudaDeviceSynchronize();  // as NCCL's waits for the communicator's work (queued work may use it)
  munmap(comm->header, comm->bytes);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // Waits for nothing. The object and its mapping stay (queued work may still point at it, and
  // finds it aborted): an abort ends the job.
  if (!comm) return ncclSuccess;
  comm->aborted.store(true);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (!comm || !count) return failed(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (!comm || !rank) return failed(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return failed(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  *async_error = comm->async_error.load();
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ul_emu::device_fault() != cudaSuccess) return after_fault("ncclCommSplit");
  if (!comm || !newcomm) return failed(ncclInvalidArgument, "ncclCommSplit: null argument");
  if (config) return failed(ncclInvalidArgument, "ncclCommSplit: the emulation takes no config");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return failed(ncclInvalidArgument, "ncclCommSplit: negative color");
  try {
    cudaDeviceSynchronize();  // collective on the host: the communicator's earlier work first
    comm->header->color[comm->rank] = color;
    comm->header->key[comm->rank] = key;
    comm->barrier("split");
    std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
    for (int r = 0; r < comm->size; r++)
      if (color != NCCL_SPLIT_NOCOLOR && comm->header->color[r] == color) members.emplace_back(comm->header->key[r], r);
    comm->barrier("split");  // all have read the exchange before the next split writes it
    const uint64_t split = comm->splits++;
    *newcomm = nullptr;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    std::sort(members.begin(), members.end());
    int rank = 0;
    while (members[rank].second != comm->rank) rank++;
    *newcomm = join(comm->name + "." + std::to_string(split) + "." + std::to_string(color), int(members.size()), rank);
  } catch (const PeerFailure& e) {
    return failed(ncclRemoteError, std::string("ncclCommSplit: ") + e.what());
  } catch (const std::exception& e) {
    return failed(ncclSystemError, e.what());
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  ul::DType d{};
  ul::ReduceOp o{};
  if (ncclResult_t r = check(comm, "all_reduce", [&] {
        d = dtype(t);
        o = reduce_op(op);
        require_device(send, count * ul::dtype_size(d), "send");
        require_device(recv, count * ul::dtype_size(d), "receive");
      }))
    return r;
  return enqueue(comm, stream, [=] {
    comm->agree("all_reduce", int(t), int(op), count, -1);
    const size_t e = ul::dtype_size(d), per = kSlotBytes / e;
    std::vector<const void*> srcs(comm->size);
    for (size_t off = 0; off < count; off += per) {
      const size_t n = std::min(per, count - off);
      std::memcpy(comm->slot(comm->rank), static_cast<const char*>(send) + off * e, n * e);
      comm->barrier("all_reduce");
      for (int r = 0; r < comm->size; r++) srcs[r] = comm->slot(r);
      ul::reduce_many(static_cast<char*>(recv) + off * e, srcs.data(), comm->size, n, d, o);
      comm->barrier("all_reduce");
    }
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  ul::DType d{};
  if (ncclResult_t r = check(comm, "all_gather", [&] {
        d = dtype(t);
        require_device(send, count * ul::dtype_size(d), "send");
        require_device(recv, comm->size * count * ul::dtype_size(d), "receive");
      }))
    return r;
  return enqueue(comm, stream, [=] {
    comm->agree("all_gather", int(t), -1, count, -1);
    const size_t e = ul::dtype_size(d), per = kSlotBytes / e;
    for (size_t off = 0; off < count; off += per) {
      const size_t n = std::min(per, count - off);
      std::memcpy(comm->slot(comm->rank), static_cast<const char*>(send) + off * e, n * e);
      comm->barrier("all_gather");
      for (int r = 0; r < comm->size; r++)
        std::memcpy(static_cast<char*>(recv) + (r * count + off) * e, comm->slot(r), n * e);
      comm->barrier("all_gather");
    }
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  ul::DType d{};
  if (ncclResult_t r = check(comm, "broadcast", [&] {
        d = dtype(t);
        if (root < 0 || root >= comm->size)
          throw std::invalid_argument("root " + std::to_string(root) + " of " + std::to_string(comm->size) + " ranks");
        if (comm->rank == root) require_device(send, count * ul::dtype_size(d), "send");
        require_device(recv, count * ul::dtype_size(d), "receive");
      }))
    return r;
  return enqueue(comm, stream, [=] {
    comm->agree("broadcast", int(t), -1, count, root);
    const size_t e = ul::dtype_size(d), per = kSlotBytes / e;
    for (size_t off = 0; off < count; off += per) {
      const size_t n = std::min(per, count - off);
      if (comm->rank == root) std::memcpy(comm->slot(root), static_cast<const char*>(send) + off * e, n * e);
      comm->barrier("broadcast");
      std::memmove(static_cast<char*>(recv) + off * e, comm->slot(root), n * e);
      comm->barrier("broadcast");
    }
  });
}

namespace {

// Reduce-scatter and all-to-all: each rank's send holds one block of `count` per rank; a round
// puts elements [off, off + n) of every block in the rank's slot, block j at j * n, and `take`
// reads the slots.
void by_blocks(ncclComm_t comm, const void* send, size_t count, ul::DType d, const char* what,
               const std::function<void(size_t off, size_t n)>& take) {
  const size_t e = ul::dtype_size(d), per = kSlotBytes / (e * comm->size);
  for (size_t off = 0; off < count; off += per) {
    const size_t n = std::min(per, count - off);
    for (int j = 0; j < comm->size; j++)
      std::memcpy(comm->slot(comm->rank) + j * n * e, static_cast<const char*>(send) + (j * count + off) * e, n * e);
    comm->barrier(what);
    take(off, n);
    comm->barrier(what);
  }
}

}  // namespace

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  ul::DType d{};
  ul::ReduceOp o{};
  if (ncclResult_t r = check(comm, "reduce_scatter", [&] {
        d = dtype(t);
        o = reduce_op(op);
        require_device(send, comm->size * count * ul::dtype_size(d), "send");
        require_device(recv, count * ul::dtype_size(d), "receive");
      }))
    return r;
  return enqueue(comm, stream, [=] {
    comm->agree("reduce_scatter", int(t), int(op), count, -1);
    const size_t e = ul::dtype_size(d);
    std::vector<const void*> srcs(comm->size);
    by_blocks(comm, send, count, d, "reduce_scatter", [&](size_t off, size_t n) {
      for (int r = 0; r < comm->size; r++) srcs[r] = comm->slot(r) + comm->rank * n * e;
      ul::reduce_many(static_cast<char*>(recv) + off * e, srcs.data(), comm->size, n, d, o);
    });
  });
}

ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream) {
  ul::DType d{};
  if (ncclResult_t r = check(comm, "all_to_all", [&] {
        d = dtype(t);
        const size_t bytes = comm->size * count * ul::dtype_size(d);
        require_device(send, bytes, "send");
        require_device(recv, bytes, "receive");
        if (overlap(send, bytes, recv, bytes)) throw std::invalid_argument("the send and receive buffers overlap");
      }))
    return r;
  return enqueue(comm, stream, [=] {
    comm->agree("all_to_all", int(t), -1, count, -1);
    const size_t e = ul::dtype_size(d);
    by_blocks(comm, send, count, d, "all_to_all", [&](size_t off, size_t n) {
      for (int i = 0; i < comm->size; i++)
        std::memcpy(static_cast<char*>(recv) + (i * count + off) * e, comm->slot(i) + comm->rank * n * e, n * e);
    });
  });
}

// ---- grouped send/recv ------------------------------------------------------------------------

namespace {

struct P2p {
  ncclComm_t comm;
  bool send;
  const void* buf;
  size_t count;
  ncclDataType_t type;
  int peer;
  cudaStream_t stream;
};
// The group the calling thread has open (NCCL's groups are per thread too).
thread_local int t_group_depth = 0;
thread_local std::vector<P2p> t_group;

// One entry of a group's table: what rank i sends to and receives from rank j (count -1: nothing).
struct Pair {
  int64_t send_count = -1, recv_count = -1;
  int32_t send_type = -1, recv_type = -1;
};

std::string said(int64_t count, int32_t type) {
  return count < 0 ? std::string("nothing")
                   : std::to_string(count) + (count == 1 ? " element" : " elements") + " (type " + std::to_string(type) + ")";
}

// One communicator's part of a group, as one collective: each rank's row of the table goes through
// its slot, and every rank checks the whole table (so all reach one verdict); then the data goes in
// rounds of kSlotBytes / size bytes per pair.
void run_pairs(ncclComm_t c, const std::vector<P2p>& ops, const std::vector<Pair>& row) {
  const int n = c->size;
  std::memcpy(c->slot(c->rank), row.data(), n * sizeof(Pair));
  c->barrier("send/recv");
  std::vector<Pair> table(size_t(n) * n);  // [i * n + j]: rank i's entry for rank j
  for (int i = 0; i < n; i++) std::memcpy(&table[size_t(i) * n], c->slot(i), n * sizeof(Pair));
  c->barrier("send/recv");
  const size_t per = kSlotBytes / n;
  size_t rounds = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      const Pair &out = table[size_t(i) * n + j], &in = table[size_t(j) * n + i];
      if (out.send_count != in.recv_count || (out.send_count >= 0 && out.send_type != in.recv_type))
        throw Mismatch("nccl emu: in send/recv group #" + std::to_string(c->calls - 1) + ", rank " + std::to_string(i) +
                       " sends " + said(out.send_count, out.send_type) + " to rank " + std::to_string(j) +
                       ", which receives " + said(in.recv_count, in.recv_type) +
                       " from it: every send needs its matching receive in the same group");
      if (out.send_count > 0) {
        const size_t bytes = size_t(out.send_count) * ul::dtype_size(dtype(ncclDataType_t(out.send_type)));
        rounds = std::max(rounds, (bytes + per - 1) / per);
      }
    }
  for (size_t r = 0; r < rounds; r++) {
    const size_t off = r * per;
    for (const P2p& op : ops) {
      const size_t bytes = op.count * ul::dtype_size(dtype(op.type));
      if (op.send && off < bytes)
        std::memcpy(c->slot(c->rank) + op.peer * per, static_cast<const char*>(op.buf) + off, std::min(per, bytes - off));
    }
    c->barrier("send/recv");
    for (const P2p& op : ops) {
      const size_t bytes = op.count * ul::dtype_size(dtype(op.type));
      if (!op.send && off < bytes)
        std::memcpy(static_cast<char*>(const_cast<void*>(op.buf)) + off, c->slot(op.peer) + c->rank * per,
                    std::min(per, bytes - off));
    }
    c->barrier("send/recv");
  }
}

// The calling thread's group, ended: each communicator's part is one collective on its stream.
ncclResult_t run_group() {
  std::vector<P2p> group;
  group.swap(t_group);
  std::vector<ncclComm_t> comms;
  for (const P2p& op : group)
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
  for (ncclComm_t c : comms) {
    std::vector<P2p> ops;
    std::vector<Pair> row(c->size);
    for (const P2p& op : group) {
      if (op.comm != c) continue;
      if (!ops.empty() && op.stream != ops[0].stream)
        return failed(ncclInvalidUsage, "send/recv: one communicator's sends and receives in a group on two streams "
                                        "(the emulation takes one)");
      ops.push_back(op);
      Pair& p = row[op.peer];
      (op.send ? p.send_count : p.recv_count) = int64_t(op.count);
      (op.send ? p.send_type : p.recv_type) = int32_t(op.type);
    }
    if (ncclResult_t r = enqueue(c, ops[0].stream, [c, ops, row] {
          c->agree("send/recv", -1, -1, 0, -1);
          run_pairs(c, ops, row);
        }))
      return r;
  }
  return ncclSuccess;
}

ncclResult_t p2p(const P2p& op) {
  const char* what = op.send ? "send" : "recv";
  if (ncclResult_t r = check(op.comm, what, [&] {
        const ul::DType d = dtype(op.type);
        if (op.peer < 0 || op.peer >= op.comm->size)
          throw std::invalid_argument("peer " + std::to_string(op.peer) + " of " + std::to_string(op.comm->size) +
                                      " ranks");
        require_device(op.buf, op.count * ul::dtype_size(d), op.send ? "send" : "receive");
      }))
    return r;
  for (const P2p& o : t_group)
    if (o.comm == op.comm && o.send == op.send && o.peer == op.peer)
      return failed(ncclInvalidUsage, std::string(what) + ": a second " + (op.send ? "send to" : "receive from") +
                                          " rank " + std::to_string(op.peer) + " in one group (the emulation takes one)");
  t_group.push_back(op);
  return t_group_depth > 0 ? ncclSuccess : run_group();
}

}  // namespace

ncclResult_t ncclGroupStart() {
  t_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return failed(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  return --t_group_depth > 0 ? ncclSuccess : run_group();
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  return p2p({comm, true, send, count, t, peer, stream});
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  return p2p({comm, false, recv, count, t, peer, stream});
}
