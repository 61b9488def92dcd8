#include "parallel/ulysses.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "layers/op_util.h"

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

void check_ulysses_config(int heads, int kv_heads, int seq, int sp) {
  auto fits = [&](int p) {
    return heads % p == 0 && seq % p == 0 && (kv_heads >= p ? kv_heads % p == 0 : p % kv_heads == 0);
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
  throw std::runtime_error(cfg + problem + "; sp values that work for this model and sequence: " + valid);
}

namespace {

void check_comm(const Tensor& x, const Comm& comm, const char* op) {
  require_cpu_f32(x, op);
  if (x.ndim() != 4) throw std::runtime_error(std::string(op) + ": expected a 4-d tensor, got " + x.str());
  if (comm.device() != x.device)
    throw std::runtime_error(std::string(op) + ": the communicator is for " + device_name(comm.device()) +
                             " buffers, the tensor is on " + device_name(x.device));
}

// One all_to_all of P chunks of `chunk` floats, through scratch from the arena.
// pack(send) fills the send buffer; unpack(recv) reads the received one.
template <class Pack, class Unpack>
void exchange(Comm& comm, size_t chunk, Pack pack, Unpack unpack) {
  Arena& arena = ctx().arena;
  ArenaScope scratch(arena);
  const size_t bytes = size_t(comm.size()) * chunk * sizeof(float);
  float* send = static_cast<float*>(arena.alloc(bytes));
  float* recv = static_cast<float*>(arena.alloc(bytes));
  pack(send);
  comm.all_to_all(send, recv, chunk, DType::f32);
  unpack(recv);
}

}  // namespace

Tensor ulysses_scatter_heads(const Tensor& qkv, int Hq, int Hkv, Comm& comm) {
  check_comm(qkv, comm, "ulysses_scatter_heads");
  const int P = comm.size(), B = int(qkv.size(0)), Tl = int(qkv.size(1)), D = int(qkv.size(3));
  if (qkv.size(2) != Hq + 2 * Hkv)
    throw std::runtime_error("ulysses_scatter_heads: qkv " + qkv.str() + " does not hold " + std::to_string(Hq) +
                             " + 2*" + std::to_string(Hkv) + " heads");
  check_ulysses_config(Hq, Hkv, Tl * P, P);
  const HeadSplit hs{Hq, Hkv, P};
  const int W = hs.width();
  const size_t chunk = size_t(B) * Tl * W * D;
  Context& c = ctx();
  Tensor out = c.empty({B, int64_t(Tl) * P, W, D});
  exchange(comm, chunk, [&](float* send) { cpu::heads_to_chunks(send, qkv.f32(), hs, B, Tl, D); },
           [&](const float* recv) { cpu::chunks_to_sequence(out.f32(), recv, P, B, Tl, W * D, false); });
  if (needs_grad({&qkv})) {
    out = c.tape.track(out);
    Comm* cm = &comm;  // must outlive backward
    c.tape.push("ulysses_scatter_heads", [=] {
      // Every rank runs the all_to_all, gradient or not, so the collectives stay matched.
      const float* dout = static_cast<const float*>(ctx().tape.grad_if_any(out));
      float* dqkv = grad_or_scratch(qkv);
      exchange(*cm, chunk,
               [&](float* send) {
                 if (dout) cpu::sequence_to_chunks(send, dout, P, B, Tl, W * D);
                 else std::fill(send, send + P * chunk, 0.f);
               },
               [&](const float* recv) { cpu::chunks_to_heads(dqkv, recv, hs, B, Tl, D, true); });
    });
  }
  return out;
}

Tensor ulysses_gather_heads(const Tensor& y, int Hq, Comm& comm) {
  check_comm(y, comm, "ulysses_gather_heads");
  const int P = comm.size(), B = int(y.size(0)), T = int(y.size(1)), Hl = int(y.size(2)), D = int(y.size(3));
  check_ulysses_config(Hq, Hq, T, P);
  if (Hl * P != Hq)
    throw std::runtime_error("ulysses_gather_heads: y " + y.str() + " should hold " + std::to_string(Hq) + " / " +
                             std::to_string(P) + " heads per rank");
  const int Tl = T / P;
  const HeadSplit hs{Hq, 0, P};
  const size_t chunk = size_t(B) * Tl * Hl * D;
  Context& c = ctx();
  Tensor out = c.empty({B, Tl, Hq, D});
  exchange(comm, chunk, [&](float* send) { cpu::sequence_to_chunks(send, y.f32(), P, B, Tl, Hl * D); },
           [&](const float* recv) { cpu::chunks_to_heads(out.f32(), recv, hs, B, Tl, D, false); });
  if (needs_grad({&y})) {
    out = c.tape.track(out);
    Comm* cm = &comm;
    c.tape.push("ulysses_gather_heads", [=] {
      const float* dout = static_cast<const float*>(ctx().tape.grad_if_any(out));
      float* dy = grad_or_scratch(y);
      exchange(*cm, chunk,
               [&](float* send) {
                 if (dout) cpu::heads_to_chunks(send, dout, hs, B, Tl, D);
                 else std::fill(send, send + P * chunk, 0.f);
               },
               [&](const float* recv) { cpu::chunks_to_sequence(dy, recv, P, B, Tl, Hl * D, true); });
    });
  }
  return out;
}

}  // namespace ul
