#include "parallel/ulysses.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/device.h"
#include "layers/op_util.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_launch.h"
#endif

namespace ul {
namespace cpu {

template <class T>
void heads_to_chunks(T* send, const T* src, const HeadSplit& hs, int B, int Tl, int D) {
  // src: (B, Tl, H, D), H = Hq + 2*Hkv;  send: (P, B, Tl, W, D)
  const int H = hs.Hq + 2 * hs.Hkv, W = hs.width();
#pragma omp parallel for collapse(2) schedule(static)
  for (int j = 0; j < hs.P; j++)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        for (int s = 0; s < W; s++) {
          const T* x = src + ((size_t(b) * Tl + t) * H + hs.source(j, s)) * D;
          T* y = send + (((size_t(j) * B + b) * Tl + t) * W + s) * D;
          for (int d = 0; d < D; d++) y[d] = x[d];
        }
}

template <class T>
void chunks_to_heads(T* dst, const T* recv, const HeadSplit& hs, int B, int Tl, int D, bool accumulate) {
  // recv: (P, B, Tl, W, D);  dst: (B, Tl, H, D). Replicated kv heads (several j, one source head)
  // are summed, so one thread owns each token and walks j in order.
  const int H = hs.Hq + 2 * hs.Hkv, W = hs.width();
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++)
      for (int j = 0; j < hs.P; j++)
        for (int s = 0; s < W; s++) {
          const T* x = recv + (((size_t(j) * B + b) * Tl + t) * W + s) * D;
          T* y = dst + ((size_t(b) * Tl + t) * H + hs.source(j, s)) * D;
          if (accumulate)
            for (int d = 0; d < D; d++) y[d] += x[d];
          else
            for (int d = 0; d < D; d++) y[d] = x[d];
        }
}

template <class T>
void chunks_to_sequence(T* dst, const T* recv, int P, int B, int Tl, int R, bool accumulate) {
  // recv: (P, B, Tl, R);  dst: (B, P*Tl, R)
#pragma omp parallel for collapse(2) schedule(static)
  for (int j = 0; j < P; j++)
    for (int b = 0; b < B; b++) {
      const T* x = recv + (size_t(j) * B + b) * Tl * size_t(R);
      T* y = dst + (size_t(b) * P * Tl + size_t(j) * Tl) * R;
      const size_t n = size_t(Tl) * R;
      if (accumulate)
        for (size_t i = 0; i < n; i++) y[i] += x[i];
      else
        for (size_t i = 0; i < n; i++) y[i] = x[i];
    }
}

template <class T>
void sequence_to_chunks(T* send, const T* src, int P, int B, int Tl, int R) {
  // src: (B, P*Tl, R);  send: (P, B, Tl, R)
#pragma omp parallel for collapse(2) schedule(static)
  for (int j = 0; j < P; j++)
    for (int b = 0; b < B; b++) {
      const T* x = src + (size_t(b) * P * Tl + size_t(j) * Tl) * R;
      T* y = send + (size_t(j) * B + b) * Tl * size_t(R);
      const size_t n = size_t(Tl) * R;
      for (size_t i = 0; i < n; i++) y[i] = x[i];
    }
}

#define UL_INSTANTIATE(T)                                                                             \
  template void heads_to_chunks<T>(T*, const T*, const HeadSplit&, int, int, int);                    \
  template void chunks_to_heads<T>(T*, const T*, const HeadSplit&, int, int, int, bool);              \
  template void chunks_to_sequence<T>(T*, const T*, int, int, int, int, bool);                        \
  template void sequence_to_chunks<T>(T*, const T*, int, int, int, int);
UL_INSTANTIATE(float)
UL_INSTANTIATE(double)
#undef UL_INSTANTIATE

}  // namespace cpu

void check_ulysses_config(int heads, int kv_heads, int seq, int sp, int world) {
  auto fits = [&](int p) {
    return heads % p == 0 && seq % p == 0 && (kv_heads >= p ? kv_heads % p == 0 : p % kv_heads == 0) &&
           (world < 1 || world % p == 0);
  };
  const std::string cfg = "ulysses: " + std::to_string(heads) + " query heads, " + std::to_string(kv_heads) +
                          " kv heads, sequence " + std::to_string(seq) + ", sp " + std::to_string(sp) + ": ";
  if (heads < 1 || kv_heads < 1 || seq < 1 || sp < 1)
    throw std::runtime_error(cfg + "heads, kv heads, sequence length and sp must all be positive");
  if (heads % kv_heads != 0)
    throw std::runtime_error(cfg + "the query heads must be a multiple of the kv heads (grouped-query attention)");
  std::string problem;
  if (heads % sp != 0)
    problem = "the query heads are not divisible by sp";
  else if (kv_heads >= sp && kv_heads % sp != 0)
    problem = "the kv heads are not divisible by sp";
  else if (kv_heads < sp && sp % kv_heads != 0)
    problem = "sp is not a multiple of the kv heads (each kv head must go to a whole number of ranks)";
  else if (seq % sp != 0)
    problem = "the sequence length is not divisible by sp (use a multiple of " + std::to_string(sp) + ")";
  if (problem.empty()) return;
  std::string valid;
  for (int p = 1; p <= heads; p++)
    if (fits(p)) valid += (valid.empty() ? "" : ", ") + std::to_string(p);
  throw std::runtime_error(cfg + problem + "; sp values that work for this model and sequence" +
                           (world >= 1 ? " and divide the world size " + std::to_string(world) : std::string()) +
                           ": " + valid);
}

namespace {

void check_comm(const Tensor& x, const Comm& comm, const char* op) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) {
    if (x.dtype != DType::f32 && x.dtype != DType::bf16)
      throw std::runtime_error(std::string(op) + ": CUDA backend expects f32 or bf16, got " + dtype_name(x.dtype));
    if (ctx().device != Device::cuda)
      throw std::runtime_error(std::string(op) + ": input on cuda but the context is on " + device_name(ctx().device));
  } else {
    require_cpu_f32(x, op);
  }
#else
  require_cpu_f32(x, op);
#endif
  if (x.ndim() != 4) throw std::runtime_error(std::string(op) + ": expected a 4-d tensor, got " + x.str());
  if (comm.device() != x.device)
    throw std::runtime_error(std::string(op) + ": the communicator is for " + device_name(comm.device()) +
                             " buffers, the tensor is on " + device_name(x.device));
}

// The permutes of the tensors' backend, element type T: cpu:: on f32 host buffers, cuda:: on f32
// or bf16 device buffers (launched on op_stream()).
template <class T>
struct Permutes {
  Device dev;
  void heads_to_chunks(T* send, const T* src, const HeadSplit& hs, int B, int Tl, int D) const {
#if ULYSSES_HAVE_CUDA
    if (dev == Device::cuda) return cuda::heads_to_chunks(send, src, hs, B, Tl, D, op_stream());
#endif
    if constexpr (std::is_same<T, float>::value) cpu::heads_to_chunks(send, src, hs, B, Tl, D);
  }
  void chunks_to_heads(T* dst, const T* recv, const HeadSplit& hs, int B, int Tl, int D, bool acc) const {
#if ULYSSES_HAVE_CUDA
    if (dev == Device::cuda) return cuda::chunks_to_heads(dst, recv, hs, B, Tl, D, acc, op_stream());
#endif
    if constexpr (std::is_same<T, float>::value) cpu::chunks_to_heads(dst, recv, hs, B, Tl, D, acc);
  }
  void chunks_to_sequence(T* dst, const T* recv, int P, int B, int Tl, int R, bool acc) const {
#if ULYSSES_HAVE_CUDA
    if (dev == Device::cuda) return cuda::chunks_to_sequence(dst, recv, P, B, Tl, R, acc, op_stream());
#endif
    if constexpr (std::is_same<T, float>::value) cpu::chunks_to_sequence(dst, recv, P, B, Tl, R, acc);
  }
  void sequence_to_chunks(T* send, const T* src, int P, int B, int Tl, int R) const {
#if ULYSSES_HAVE_CUDA
    if (dev == Device::cuda) return cuda::sequence_to_chunks(send, src, P, B, Tl, R, op_stream());
#endif
    if constexpr (std::is_same<T, float>::value) cpu::sequence_to_chunks(send, src, P, B, Tl, R);
  }
};

template <class T> constexpr DType dtype_of() { return DType::f32; }
#if ULYSSES_HAVE_CUDA
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::bf16; }
#endif

// One all_to_all of P chunks of `chunk` elements of T. `src`: the send buffer itself when the data
// already lies as (P, chunk), else pack(send) fills arena scratch; `dst`: where the chunks land when
// that is their final layout, else unpack(recv) reads them from arena scratch. With batch 1, the
// long-context case, the sequence <-> chunks permutes are the identity, so half the scratch goes.
template <class T, class Pack, class Unpack>
void exchange(Comm& comm, size_t chunk, const T* src, T* dst, Pack pack, Unpack unpack) {
  Arena& arena = ctx().arena;
  ArenaScope scratch(arena);
  const size_t bytes = size_t(comm.size()) * chunk * sizeof(T);
  T* send = src ? nullptr : static_cast<T*>(arena.alloc(bytes));
  T* recv = dst ? dst : static_cast<T*>(arena.alloc(bytes));
  if (send) pack(send);
#if ULYSSES_HAVE_CUDA
  // The communicator reads send from its own thread (local, MPI) or stream: the kernel that wrote
  // it must have finished (the pack, or with batch 1 the op that produced the tensor itself). (NCCL on op_stream() would be ordered already; one sync per all-to-all is cheap.)
  if (comm.device() == Device::cuda) UL_CUDA_CHECK(cudaStreamSynchronize(op_stream()));
#endif
  comm.all_to_all(send ? send : src, recv, chunk, dtype_of<T>());
  if (!dst) unpack(recv);
}

template <class T>
Tensor scatter_heads(const Tensor& qkv, const HeadSplit& hs, Comm& comm, const Tensor* given) {
  const int P = comm.size(), B = int(qkv.size(0)), Tl = int(qkv.size(1)), D = int(qkv.size(3));
  const int W = hs.width();
  const size_t chunk = size_t(B) * Tl * W * D;
  const Permutes<T> k{qkv.device};
  Context& c = ctx();
  const Shape shape{B, int64_t(Tl) * P, W, D};
  if (given && (given->shape != shape || given->dtype != qkv.dtype || given->device != qkv.device || given->gid >= 0))
    throw std::runtime_error("ulysses_scatter_heads: the given output " + given->str() + " is not a fresh " +
                             Tensor{nullptr, shape, qkv.dtype, qkv.device}.str());
  Tensor out = given ? *given : c.empty(shape, qkv.dtype);
  exchange<T>(comm, chunk, nullptr, B == 1 ? out.as<T>() : nullptr,
              [&](T* send) { k.heads_to_chunks(send, qkv.as<T>(), hs, B, Tl, D); },
              [&](const T* recv) { k.chunks_to_sequence(out.as<T>(), recv, P, B, Tl, W * D, false); });
  if (needs_grad({&qkv})) {
    out = c.tape.track(out);
    Comm* cm = &comm;  // must outlive backward
    c.tape.push("ulysses_scatter_heads", [=] {
      // Every rank runs the all_to_all, gradient or not, so the collectives stay matched.
      Tape& tape = ctx().tape;
      T* dout = static_cast<T*>(tape.grad_if_any(out));
      // Batch 1, the long-context case: dout is sent as it lies and is dead once sent, so the
      // local qkv's gradient (first written here; never larger than dout) is put in its memory,
      // rather than in a third buffer of that size next to dout and the received chunks. Only
      // when nothing has written qkv's gradient yet: adopting dout's memory would discard it.
      const bool reuse = B == 1 && dout && qkv.requires_grad() && !tape.grad_if_any(qkv);
      if (reuse) {
        exchange<T>(*cm, chunk, dout, nullptr, [](T*) {}, [&](const T* recv) {
          tape.adopt_grad(qkv, dout, out.nbytes());
          device_zero(k.dev, dout, qkv.nbytes());
          k.chunks_to_heads(dout, recv, hs, B, Tl, D, true);
        });
        return;
      }
      T* dqkv = grad_or_scratch_as<T>(qkv);
      exchange<T>(*cm, chunk, B == 1 ? dout : nullptr, nullptr,
                  [&](T* send) {
                    if (dout) k.sequence_to_chunks(send, dout, P, B, Tl, W * D);
                    else device_zero(k.dev, send, P * chunk * sizeof(T));
                  },
                  [&](const T* recv) { k.chunks_to_heads(dqkv, recv, hs, B, Tl, D, true); });
    });
  }
  return out;
}

template <class T>
Tensor gather_heads(const Tensor& y, const HeadSplit& hs, Comm& comm) {
  const int P = comm.size(), B = int(y.size(0)), T_ = int(y.size(1)), Hl = int(y.size(2)), D = int(y.size(3));
  const int Tl = T_ / P;
  const size_t chunk = size_t(B) * Tl * Hl * D;
  const Permutes<T> k{y.device};
  Context& c = ctx();
  Tensor out = c.empty({B, Tl, hs.Hq, D}, y.dtype);
  exchange<T>(comm, chunk, B == 1 ? y.as<T>() : nullptr, nullptr,
              [&](T* send) { k.sequence_to_chunks(send, y.as<T>(), P, B, Tl, Hl * D); },
              [&](const T* recv) { k.chunks_to_heads(out.as<T>(), recv, hs, B, Tl, D, false); });
  if (needs_grad({&y})) {
    out = c.tape.track(out);
    Comm* cm = &comm;
    c.tape.push("ulysses_gather_heads", [=] {
      const T* dout = static_cast<const T*>(ctx().tape.grad_if_any(out));
      T* dy = grad_or_scratch_as<T>(y);
      // Never received in place, even at batch 1: dy is added to (+=, other ops may have written
      // it), so the chunks land in scratch and chunks_to_sequence accumulates them.
      exchange<T>(*cm, chunk, nullptr, nullptr,
                  [&](T* send) {
                    if (dout) k.heads_to_chunks(send, dout, hs, B, Tl, D);
                    else device_zero(k.dev, send, P * chunk * sizeof(T));
                  },
                  [&](const T* recv) { k.chunks_to_sequence(dy, recv, P, B, Tl, Hl * D, true); });
    });
  }
  return out;
}

}  // namespace

Tensor ulysses_scatter_heads(const Tensor& qkv, int Hq, int Hkv, Comm& comm, const Tensor* out) {
  check_comm(qkv, comm, "ulysses_scatter_heads");
  const int P = comm.size(), Tl = int(qkv.size(1));
  if (qkv.size(2) != Hq + 2 * Hkv)
    throw std::runtime_error("ulysses_scatter_heads: qkv " + qkv.str() + " does not hold " + std::to_string(Hq) +
                             " + 2*" + std::to_string(Hkv) + " heads");
  check_ulysses_config(Hq, Hkv, Tl * P, P);
  const HeadSplit hs{Hq, Hkv, P};
#if ULYSSES_HAVE_CUDA
  if (qkv.dtype == DType::bf16) return scatter_heads<__nv_bfloat16>(qkv, hs, comm, out);
#endif
  return scatter_heads<float>(qkv, hs, comm, out);
}

Tensor ulysses_gather_heads(const Tensor& y, int Hq, Comm& comm) {
  check_comm(y, comm, "ulysses_gather_heads");
  const int P = comm.size(), T = int(y.size(1)), Hl = int(y.size(2));
  check_ulysses_config(Hq, Hq, T, P);
  if (Hl * P != Hq)
    throw std::runtime_error("ulysses_gather_heads: y " + y.str() + " should hold " + std::to_string(Hq) + " / " +
                             std::to_string(P) + " heads per rank");
  const HeadSplit hs{Hq, 0, P};
#if ULYSSES_HAVE_CUDA
  if (y.dtype == DType::bf16) return gather_heads<__nv_bfloat16>(y, hs, comm);
#endif
  return gather_heads<float>(y, hs, comm);
}

}  // namespace ul
