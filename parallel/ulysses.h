// Ulysses sequence parallelism: the two all-to-alls around attention, as autograd ops.
// Rank r of an sp group of size P holds tokens [r*Tl, (r+1)*Tl) of every sequence (T = Tl*P).
//   scatter_heads: (B, Tl, Hq + 2*Hkv, D)  my tokens, all heads
//               -> (B, T, Hq/P + 2*KVl, D)   all tokens, my heads (sequence in global order)
//   gather_heads:  (B, T, Hq/P, D)          attention output for my heads
//               -> (B, Tl, Hq, D)            my tokens, all heads
// Rank j gets query heads [j*Hq/P, (j+1)*Hq/P). KV heads: if Hkv >= P, KVl = Hkv/P and rank j gets
// kv heads [j*KVl, (j+1)*KVl); if Hkv < P (P % Hkv == 0), KVl = 1 and rank j gets kv head
// (j*Hq/P) / (Hq/Hkv), the one its query heads read, so each kv head is replicated on P/Hkv ranks
// and the backward sums the replicas' gradients. Per token the received heads are packed as
// [local q heads | local k heads | local v heads], the layout attention() takes.
// Each op: pack into P chunks, one all_to_all, unpack; its backward is the inverse all_to_all on
// the gradients, added (+=) into the input gradient. Every rank of the sp group runs the same ops
// in the same order (forward and backward), so the collectives match up.
#pragma once
#include "engine/tensor.h"
#include "parallel/communicator.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

// Which of the input heads each rank receives. For gather_heads (no kv heads) Hkv = 0.
struct HeadSplit {
  int Hq, Hkv, P;
  int q_local() const { return Hq / P; }
  int kv_local() const { return Hkv == 0 ? 0 : (Hkv >= P ? Hkv / P : 1); }
  int width() const { return q_local() + 2 * kv_local(); }  // heads per token on the receiving side
  int first_kv(int j) const { return Hkv >= P ? j * kv_local() : (j * q_local()) / (Hq / Hkv); }
  // The input head (of Hq + 2*Hkv) that is local head s on rank j.
  int source(int j, int s) const {
    const int ql = q_local(), kl = kv_local();
    if (s < ql) return j * ql + s;
    if (s < ql + kl) return Hq + first_kv(j) + (s - ql);
    return Hq + Hkv + first_kv(j) + (s - ql - kl);
  }
};

namespace cpu {
// src: (B, Tl, Hq + 2*Hkv, D) -> send: (P, B, Tl, W, D), W = hs.width(); send[j][b][t][s] = src[b][t][hs.source(j, s)]
template <class T>
void heads_to_chunks(T* send, const T* src, const HeadSplit& hs, int B, int Tl, int D);
// The inverse (accumulate: +=, so replicated heads sum): dst[b][t][hs.source(j, s)] (+)= recv[j][b][t][s]
template <class T>
void chunks_to_heads(T* dst, const T* recv, const HeadSplit& hs, int B, int Tl, int D, bool accumulate);
// recv: (P, B, Tl, R) -> dst: (B, P*Tl, R); chunk j holds tokens [j*Tl, (j+1)*Tl). R: elements per token.
template <class T>
void chunks_to_sequence(T* dst, const T* recv, int P, int B, int Tl, int R, bool accumulate);
// The inverse: src: (B, P*Tl, R) -> send: (P, B, Tl, R)
template <class T>
void sequence_to_chunks(T* send, const T* src, int P, int B, int Tl, int R);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// The same four permutes on device buffers, T = float or __nv_bfloat16, same shapes and semantics
// as cpu:: above. One thread per output pack (16 bytes, or one element when packs do not fit), so nothing races: chunks_to_heads sums a
// replicated kv head's P/Hkv copies in rank order (in fp32, rounded once), as the CPU loop does.
template <class T>
void heads_to_chunks(T* send, const T* src, const HeadSplit& hs, int B, int Tl, int D, cudaStream_t s);
template <class T>
void chunks_to_heads(T* dst, const T* recv, const HeadSplit& hs, int B, int Tl, int D, bool accumulate,
                     cudaStream_t s);
template <class T>
void chunks_to_sequence(T* dst, const T* recv, int P, int B, int Tl, int R, bool accumulate, cudaStream_t s);
template <class T>
void sequence_to_chunks(T* send, const T* src, int P, int B, int Tl, int R, cudaStream_t s);
}  // namespace cuda
#endif

// Refuses (std::runtime_error, before any work) heads % sp, kv_heads % sp when kv_heads >= sp,
// sp % kv_heads when kv_heads < sp, seq % sp (the message lists the sp values that would work:
// with world >= 1, only those that also divide it, which the grid requires), any value below 1,
// and query heads that are not a multiple of the kv heads.
void check_ulysses_config(int heads, int kv_heads, int seq, int sp, int world = 0);

// On the cpu the tensors are f32; on cuda f32 or bf16 (the comm gets device buffers, so it must be
// made for Device::cuda).
// qkv: (B, Tl, Hq + 2*Hkv, D) -> (B, Tl*P, Hq/P + 2*KVl, D). `out`, when given, is that output,
// allocated by the caller (so qkv can live in a scratch scope that ends before out is used).
Tensor ulysses_scatter_heads(const Tensor& qkv, int Hq, int Hkv, Comm& sp, const Tensor* out = nullptr);
// y: (B, Tl*P, Hq/P, D) -> (B, Tl, Hq, D)
Tensor ulysses_gather_heads(const Tensor& y, int Hq, Comm& sp);

}  // namespace ul
