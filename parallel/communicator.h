// The communicator every collective in ulysses goes through. Buffers live on the device the
// communicator was made for (host memory for `local` and `mpi` on the CPU backend).
// Backends: local (ranks are threads of this process), mpi (ranks are processes), nccl (GPUs).
// Every call is blocking and collective: all ranks of the communicator must make it, in order.
// A failure on any rank (a dead peer, a timeout) throws CommError on every other rank instead of
// hanging.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "engine/tensor.h"

namespace ul {

// An error that every rank of the world throws together, having agreed on it through a collective
// (a checkpoint a rank could not write): an MPI job then ends on each rank (status 1, MPI finalized)
// rather than by MPI_Abort from whichever rank gets there first, which may kill rank 0 before its
// log records the cause.
struct JobError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { sum, max };

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bytes this rank sent to other ranks, by collective (the step log and the scaling tests read it).
// Every backend counts the volume of the standard algorithm, whatever it really does internally,
// so numbers compare across backends. With P = size(), e = dtype_size(t), per call:
//   all_to_all(count)      count * (P - 1) * e        (P - 1 of my P chunks leave)
//   all_gather(count)      count * (P - 1) * e        (ring: my chunk, then P - 2 forwarded ones)
//   reduce_scatter(count)  count * (P - 1) * e        (ring)
//   all_reduce(count)      2 * count * (P - 1) / P * e  (ring: reduce-scatter + all-gather)
//   broadcast(count)       count * e on the root, 0 elsewhere (and 0 when P = 1)
// (integer arithmetic, the division last; parallel/comm_util.h has them as functions.)
struct CommStats {
  uint64_t all_reduce = 0, all_to_all = 0, all_gather = 0, reduce_scatter = 0, broadcast = 0;
  uint64_t total() const { return all_reduce + all_to_all + all_gather + reduce_scatter + broadcast; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  Device device() const { return device_; }

  // In place: buf (count elements) becomes the reduction over ranks.
  virtual void all_reduce(void* buf, size_t count, DType t, ReduceOp op) = 0;
  // send: size() chunks of `count` elements; chunk j goes to rank j. recv: chunk j came from rank j.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType t) = 0;
  // send: `count` elements; recv: size() chunks, chunk j from rank j.
  virtual void all_gather(const void* send, void* recv, size_t count, DType t) = 0;
  // send: size() chunks of `count`; recv (count): the reduction over ranks of chunk rank().
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new communicator, ordered by key (then by old rank).
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  CommStats stats;

 protected:
  explicit Comm(Device d) : device_(d) {}
  Device device_;
};

}  // namespace ul
