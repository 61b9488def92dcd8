// Causal self-attention with grouped-query heads, flash style: O(T) memory, no T x T buffer.
// qkv: (B, T, Hq + 2*Hkv, D) packed as [q heads | k heads | v heads] per token;
// query head h reads key/value head h / (Hq / Hkv).
//   S = q k^T / sqrt(D) (causal: key t' <= query t; when doc is given, doc[t'] == doc[t]; with a
//   sliding window W, t - W < t')
//   out = softmax(S) v,  lse[t] = log sum_t' exp(S[t, t'])   (kept for the backward)
// Forward walks key tiles with an online softmax (running max and sum); backward recomputes the
// probabilities tile by tile from q, k and lse:
//   P = exp(S - lse),  dv += P^T dout,  dP = dout v^T,  dS = P (dP - rowsum(dout * out)),
//   dq += dS k / sqrt(D),  dk += dS^T q / sqrt(D)
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
// out: (B, T, Hq, D); lse: (B, Hq, T); doc: (B, T) document ids or nullptr (no document mask);
// window: 0 or W > 0, the sliding window (query t sees keys t - W < t' <= t). lse in T: the
// float64 instantiation (the gradient checks') keeps it in double, or P = exp(S - lse) would
// carry float's 1e-7 relative error of lse into every gradient.
template <class T>
void attention_forward(T* out, T* lse, const T* qkv, const int32_t* doc, int window, int B, int Tn, int Hq, int Hkv,
                       int D);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const T* lse, const T* qkv, const int32_t* doc,
                        int window, int B, int Tn, int Hq, int Hkv, int D);
// The backward's walk: 1, one pass (each score tile computed once: one task per sequence and kv
// head, dq gathered in its own scratch of group x T x D); 2, two passes (dk/dv, then dq, each tile
// computed twice, the tasks per tile: for fewer sequences x kv heads than threads, or a scratch
// past 32 MiB); 0 (the default), as those rules pick. The same bits either way. Returns the old
// setting (tests and bench_attention).
int set_attention_backward_passes(int passes);
}  // namespace cpu

// The head dims the CUDA kernels are built for (the CPU kernels take any).
inline bool attention_cuda_head_dim(int D) { return D == 16 || D == 32 || D == 64 || D == 128; }

#if ULYSSES_HAVE_CUDA
namespace cuda {
// The same contract as the CPU kernels, on device memory; T is float or __nv_bfloat16, lse and all
// accumulation are float. D must be one of 16, 32, 64, 128 (attention_cuda_head_dim); other head
// dims throw std::invalid_argument naming D. doc: device (B, T) ids or nullptr. scratch:
// attention_forward_scratch_bytes(B, doc) bytes of device memory (none without documents): where a
// sequence's ids rise (each document one run of positions, as packing makes them), the bf16
// kernels find the tiles of a tile's documents by bisection instead of testing every earlier one.
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const int32_t* doc, int window, void* scratch, int B, int Tn,
                       int Hq, int Hkv, int D, cudaStream_t s);
size_t attention_forward_scratch_bytes(int B, bool doc);
// Adds into dqkv (every row of it: q rows get dq, k rows dk, v rows dv), or with accumulate = false
// stores what adding into zeros would give, without reading dqkv (the gradient's first writer:
// Tape::grad_to_overwrite). scratch: attention_backward_scratch_bytes(B, Tn, Hq, doc) bytes of
// device memory (rowsum(dout * out), and the forward's scratch). Deterministic: every element of
// dqkv is written by one thread, summing in a fixed order.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, const int32_t* doc,
                        int window, float* scratch, int B, int Tn, int Hq, int Hkv, int D, cudaStream_t s,
                        bool accumulate = true);
size_t attention_backward_scratch_bytes(int B, int Tn, int Hq, bool doc);

// Query rows per block of the bf16 forward and dq pass: 64 (4 warps of 16 rows, the default) or
// 128 (8 warps: each K/V tile a block fetches then serves twice the rows, for half the traffic
// from L2, at one block of 256 threads per SM instead of three of 128). The same results either
// way, to the bit. Process-wide, for benchmarks and tests: returns the previous value; anything
// but 64 or 128 throws std::invalid_argument.
int set_attention_query_rows(int rows);
int attention_query_rows();

// Stages of (Q, dout) tiles the bf16 dk/dv pass keeps in shared memory: 2 (fetch the next while
// multiplying this one) or 1 (fetch, then multiply). 0, the default: 2 where the device lets a
// block hold them (at D = 128 that is 105472 bytes: sm_80, sm_90, sm_100), else 1 (sm_86, sm_89,
// sm_120 allow 101376). The same results either way, to the bit. Process-wide, for benchmarks and
// tests: returns the previous value; anything but 0, 1 or 2 throws std::invalid_argument.
int set_attention_dkv_stages(int stages);
int attention_dkv_stages();
}  // namespace cuda
#endif

// qkv: (B, T, Hq + 2*Hkv, D), doc: i32 (B, T) or undefined -> (B, T, Hq, D)
// window: 0 (none) or W > 0, a sliding window: query t sees keys t - W < t' <= t (W keys with itself)
Tensor attention(const Tensor& qkv, int Hq, int Hkv, const Tensor& doc, int window = 0);

}  // namespace ul
