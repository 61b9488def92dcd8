#include "parallel/comm_mpi.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/device.h"
#include "parallel/comm_util.h"
#include "parallel/wait_notice.h"
#include "parallel/watchdog.h"

namespace ul {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw CommError("mpi: MPI_Init_thread failed");
  owns_ = true;
}

MpiRuntime::~MpiRuntime() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (owns_ && !fin) MPI_Finalize();
}

void abort_job_if_shared(int code) {
  int init = 0, fin = 0, size = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

std::pair<int, int> mpi_world_place() {
  int init = 0, fin = 0, rank = -1, size = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return {-1, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return {rank, size};
}

namespace {
size_t g_max_count = INT_MAX;

// The elements of `es` bytes one call carries: g_max_count, and at most 1 GiB (some MPI stacks
// mishandle messages past 2 GiB even when the count fits an int).
size_t max_piece(size_t es) { return std::min(g_max_count, std::max<size_t>(1, (size_t(1) << 30) / es)); }
}  // namespace

void set_mpi_max_count(size_t elements) {
  if (elements < 1 || elements > size_t(INT_MAX))
    throw CommError("mpi: the largest count a call carries must be in [1, INT_MAX], got " + std::to_string(elements));
  g_max_count = elements;
}

namespace {

// bf16 has no MPI type: it moves as 16-bit integers and is reduced in f32 (see reduce()).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return MPI_UINT16_T;
  }
  throw CommError("mpi: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

// `len` consecutive elements of `base` whose extent is `stride_bytes`: block j of a collective's
// buffer then starts at j * stride_bytes, so one call moves a piece [off, off + len) of every
// rank's block of `count` elements (stride = count * element size), in place, without packing.
class PieceType {
 public:
  PieceType(size_t len, MPI_Datatype base, size_t stride_bytes) {
    MPI_Datatype run = MPI_DATATYPE_NULL;
    const bool ok = MPI_Type_contiguous(int(len), base, &run) == MPI_SUCCESS &&
                    MPI_Type_create_resized(run, 0, MPI_Aint(stride_bytes), &type_) == MPI_SUCCESS &&
                    MPI_Type_commit(&type_) == MPI_SUCCESS;
    if (run != MPI_DATATYPE_NULL) MPI_Type_free(&run);
    if (!ok) {
      if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
      throw CommError("mpi: cannot build a datatype of " + std::to_string(len) + " elements");
    }
  }
  ~PieceType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  PieceType(const PieceType&) = delete;
  PieceType& operator=(const PieceType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

std::vector<float> widen(const void* bf16, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(static_cast<const uint16_t*>(bf16)[i]);
  return f;
}
void narrow(void* bf16, const float* f, size_t n) {
  for (size_t i = 0; i < n; i++) static_cast<uint16_t*>(bf16)[i] = f32_to_bf16(f[i]);
}

class MpiComm : public Comm {
 public:
  // guard: the deadline of every call that waits on the peers (null: none), shared with the
  // communicators split from this one (one thread makes every MPI call: MPI_THREAD_FUNNELED).
  MpiComm(MPI_Comm c, Device d, std::shared_ptr<RearmableWatchdog> guard)
      : Comm(d), comm_(c), guard_(std::move(guard)) {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiComm() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  // Element-wise, so counts above INT_MAX go in pieces.
  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    stats.all_reduce += comm_volume::all_reduce(count, t, size_);
    Staged s(device_, buf, count * dtype_size(t), true);
    if (t == DType::bf16) {
      std::vector<float> f = widen(s.host(), count);
      for (size_t off = 0; off < count; off += max_piece(4))
        call("MPI_Allreduce", [&] {
          return MPI_Allreduce(MPI_IN_PLACE, f.data() + off, piece(count - off, 4), MPI_FLOAT, mpi_op(op), comm_);
        });
      narrow(s.host(), f.data(), count);
    } else {
      char* p = static_cast<char*>(s.host());
      for (size_t off = 0; off < count; off += max_piece(dtype_size(t)))
        call("MPI_Allreduce", [&] {
          return MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), piece(count - off, dtype_size(t)), mpi_type(t),
                               mpi_op(op), comm_);
        });
    }
    s.copy_out();
  }

  // Above max_piece elements per rank: one call per piece [off, off + len) of every rank's
  // block, the blocks strided by a resized datatype (PieceType).
  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    stats.all_to_all += comm_volume::all_to_all(count, t, size_);
    const size_t es = dtype_size(t), bytes = size_t(size_) * count * es;
    Staged in(device_, send, bytes, true), out(device_, recv, bytes, false);
    const char* src = static_cast<const char*>(in.host());
    char* dst = static_cast<char*>(out.host());
    if (count <= max_piece(es)) {
      call("MPI_Alltoall",
           [&] { return MPI_Alltoall(src, int(count), mpi_type(t), dst, int(count), mpi_type(t), comm_); });
    } else {
      for (size_t off = 0; off < count; off += max_piece(es)) {
        const PieceType piece_t(piece(count - off, es), mpi_type(t), count * es);
        call("MPI_Alltoall",
             [&] { return MPI_Alltoall(src + off * es, 1, piece_t.get(), dst + off * es, 1, piece_t.get(), comm_); });
      }
    }
    out.copy_out();
  }

  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    stats.all_gather += comm_volume::all_gather(count, t, size_);
    const size_t es = dtype_size(t);
    Staged in(device_, send, count * es, true), out(device_, recv, size_t(size_) * count * es, false);
    const char* src = static_cast<const char*>(in.host());
    char* dst = static_cast<char*>(out.host());
    if (count <= max_piece(es)) {
      call("MPI_Allgather",
           [&] { return MPI_Allgather(src, int(count), mpi_type(t), dst, int(count), mpi_type(t), comm_); });
    } else {
      for (size_t off = 0; off < count; off += max_piece(es)) {
        const int len = piece(count - off, es);
        const PieceType piece_t(size_t(len), mpi_type(t), count * es);
        call("MPI_Allgather",
             [&] { return MPI_Allgather(src + off * es, len, mpi_type(t), dst + off * es, 1, piece_t.get(), comm_); });
      }
    }
    out.copy_out();
  }

  // Pieces are packed (each rank's part of a piece made contiguous) rather than strided: a
  // reduction over a derived datatype is left to MPI implementations' goodwill.
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    stats.reduce_scatter += comm_volume::reduce_scatter(count, t, size_);
    Staged in(device_, send, size_t(size_) * count * dtype_size(t), true), out(device_, recv, count * dtype_size(t), false);
    if (t == DType::bf16) {
      std::vector<float> f = widen(in.host(), size_t(size_) * count), r(count);
      reduce_scatter_host(f.data(), r.data(), count, MPI_FLOAT, sizeof(float), op);
      narrow(out.host(), r.data(), count);
    } else {
      reduce_scatter_host(in.host(), out.host(), count, mpi_type(t), dtype_size(t), op);
    }
    out.copy_out();
  }

  void broadcast(void* buf, size_t count, DType t, int root) override {
    if (root < 0 || root >= size_)
      throw CommError("mpi: broadcast root " + std::to_string(root) + " is not a rank of a communicator of size " +
                      std::to_string(size_));
    stats.broadcast += comm_volume::broadcast(count, t, size_, rank_ == root);
    Staged s(device_, buf, count * dtype_size(t), rank_ == root);
    char* p = static_cast<char*>(s.host());
    for (size_t off = 0; off < count; off += max_piece(dtype_size(t)))
      call("MPI_Bcast", [&] {
        return MPI_Bcast(p + off * dtype_size(t), piece(count - off, dtype_size(t)), mpi_type(t), root, comm_);
      });
    s.copy_out();
  }

  void barrier() override { call("MPI_Barrier", [&] { return MPI_Barrier(comm_); }); }

  // A negative color gets no communicator (nullptr), as MPI_UNDEFINED.
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm nc = MPI_COMM_NULL;
    call("MPI_Comm_split", [&] { return MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc); });
    if (nc == MPI_COMM_NULL) return nullptr;
    return std::unique_ptr<Comm>(new MpiComm(nc, device_, guard_));
  }

 private:
  static int piece(size_t left, size_t es) { return int(std::min(left, max_piece(es))); }

  // send: size_ blocks of `count` elements of `es` bytes; recv: this rank's reduced block.
  void reduce_scatter_host(const void* send, void* recv, size_t count, MPI_Datatype type, size_t es, ReduceOp op) {
    if (count <= max_piece(es)) {
      call("MPI_Reduce_scatter_block",
           [&] { return MPI_Reduce_scatter_block(send, recv, int(count), type, mpi_op(op), comm_); });
      return;
    }
    const char* src = static_cast<const char*>(send);
    char* dst = static_cast<char*>(recv);
    // Pieces of at most 2^24 elements per rank here: the packed copy is size_ of them, not size_ x 2^31.
    const size_t step = std::min(max_piece(es), size_t(1) << 24);
    std::vector<char> packed(size_t(size_) * step * es);
    for (size_t off = 0; off < count; off += step) {
      const size_t len = std::min(step, count - off);
      for (int j = 0; j < size_; j++)
        std::memcpy(packed.data() + size_t(j) * len * es, src + (size_t(j) * count + off) * es, len * es);
      call("MPI_Reduce_scatter_block",
           [&] { return MPI_Reduce_scatter_block(packed.data(), dst + off * es, int(len), type, mpi_op(op), comm_); });
    }
  }

  // An MPI call that waits on the peers, under the guard's deadline when there is one: MPI's
  // blocking collectives cannot be interrupted, so a peer that hangs (alive, never calling) would
  // hold this rank until the scheduler's limit. `what`: a string literal (the guard keeps it).
  template <class F>
  void call(const char* what, F&& mpi) {
    int err = MPI_SUCCESS;
    if (guard_) {
      RearmableWatchdog::ArmedScope armed(*guard_, what);
      err = mpi();
    } else {
      err = mpi();
    }
    check(err, what);
  }

  void check(int err, const char* what) const {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    throw CommError(std::string("mpi: ") + what + " failed on rank " + std::to_string(rank_) + ": " + std::string(msg, len));
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<RearmableWatchdog> guard_;
};

}  // namespace

std::unique_ptr<Comm> mpi_world(Device device, double timeout_s, double notice_s) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) throw CommError("mpi_world: MPI is not initialised (make an MpiRuntime first)");
  if (!(timeout_s >= 0)) throw CommError("mpi_world: timeout_s must be >= 0 (0: none)");
  MPI_Comm c;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c) != MPI_SUCCESS) throw CommError("mpi_world: MPI_Comm_dup failed");
  std::shared_ptr<RearmableWatchdog> guard;
  if (timeout_s > 0) {
    int rank = 0, size = 1;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    // Nothing returns from inside a blocking MPI call, and MPI_Abort may only be called by the
    // thread that makes the MPI calls (this one is the watchdog's): the process says which call
    // ran out and exits, and mpirun, seeing a rank end without MPI_Finalize, ends the others.
    guard = std::make_shared<RearmableWatchdog>(timeout_s, [rank, size, timeout_s](const char* what) {
      std::fprintf(stderr, "train: error: mpi: rank %d of %d waited %g s (--comm-timeout) inside %s: a peer hangs "
                   "or died, or works alone for longer (a large save: raise --comm-timeout); exiting\n", rank, size,
                   timeout_s, what);
      std::fflush(stderr);
      std::_Exit(1);
    }, notice_s, [timeout_s](const char* what, double lasted) {
      if (wait_notice() > 0) print_wait_notice(what, lasted, "the other ranks", timeout_s);
    });
  }
  return std::unique_ptr<Comm>(new MpiComm(c, device, std::move(guard)));
}

}  // namespace ul
