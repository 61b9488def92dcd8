#include "parallel/comm_mpi.h"

#include <mpi.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "engine/device.h"
#include "parallel/comm_util.h"

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
  MpiComm(MPI_Comm c, Device d) : Comm(d), comm_(c) {
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
      for (size_t off = 0; off < count; off += INT_MAX)
        check(MPI_Allreduce(MPI_IN_PLACE, f.data() + off, piece(count - off), MPI_FLOAT, mpi_op(op), comm_), "MPI_Allreduce");
      narrow(s.host(), f.data(), count);
    } else {
      char* p = static_cast<char*>(s.host());
      for (size_t off = 0; off < count; off += INT_MAX)
        check(MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), piece(count - off), mpi_type(t), mpi_op(op), comm_),
              "MPI_Allreduce");
    }
    s.copy_out();
  }

  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    refuse_large(count, "all_to_all");
    stats.all_to_all += comm_volume::all_to_all(count, t, size_);
    const size_t bytes = size_t(size_) * count * dtype_size(t);
    Staged in(device_, send, bytes, true), out(device_, recv, bytes, false);
    check(MPI_Alltoall(in.host(), int(count), mpi_type(t), out.host(), int(count), mpi_type(t), comm_), "MPI_Alltoall");
    out.copy_out();
  }

  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    refuse_large(count, "all_gather");
    stats.all_gather += comm_volume::all_gather(count, t, size_);
    Staged in(device_, send, count * dtype_size(t), true), out(device_, recv, size_t(size_) * count * dtype_size(t), false);
    check(MPI_Allgather(in.host(), int(count), mpi_type(t), out.host(), int(count), mpi_type(t), comm_), "MPI_Allgather");
    out.copy_out();
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    refuse_large(count, "reduce_scatter");
    stats.reduce_scatter += comm_volume::reduce_scatter(count, t, size_);
    Staged in(device_, send, size_t(size_) * count * dtype_size(t), true), out(device_, recv, count * dtype_size(t), false);
    if (t == DType::bf16) {
      std::vector<float> f = widen(in.host(), size_t(size_) * count), r(count);
      check(MPI_Reduce_scatter_block(f.data(), r.data(), int(count), MPI_FLOAT, mpi_op(op), comm_), "MPI_Reduce_scatter_block");
      narrow(out.host(), r.data(), count);
    } else {
      check(MPI_Reduce_scatter_block(in.host(), out.host(), int(count), mpi_type(t), mpi_op(op), comm_),
            "MPI_Reduce_scatter_block");
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
    for (size_t off = 0; off < count; off += INT_MAX)
      check(MPI_Bcast(p + off * dtype_size(t), piece(count - off), mpi_type(t), root, comm_), "MPI_Bcast");
    s.copy_out();
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  // A negative color gets no communicator (nullptr), as MPI_UNDEFINED.
  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm nc = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &nc), "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) return nullptr;
    return std::unique_ptr<Comm>(new MpiComm(nc, device_));
  }

 private:
  static int piece(size_t left) { return int(left < size_t(INT_MAX) ? left : size_t(INT_MAX)); }

  void refuse_large(size_t count, const char* what) const {
    if (count > size_t(INT_MAX))
      throw CommError(std::string("mpi: ") + what + " of " + std::to_string(count) + " elements per rank exceeds " +
                      "MPI's int count (" + std::to_string(INT_MAX) + "); split it into smaller calls");
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
};

}  // namespace

std::unique_ptr<Comm> mpi_world(Device device) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) throw CommError("mpi_world: MPI is not initialised (make an MpiRuntime first)");
  MPI_Comm c;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c) != MPI_SUCCESS) throw CommError("mpi_world: MPI_Comm_dup failed");
  return std::unique_ptr<Comm>(new MpiComm(c, device));
}

}  // namespace ul
