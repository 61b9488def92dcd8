// Fused classifier + softmax + cross-entropy (+ its gradient), over chunks of rows, so that the
// (N, V) logits never exist at once: each chunk of rows gets its logits, loss, and — when the tape
// records — its gradient, immediately:
//   logits = x w^T (N, V),  p = softmax(logits),  loss_n = -log p[n, target_n]
//   dlogits = (p - onehot(target)) * grad_scale,  dx += dlogits w,  dw += dlogits^T x
// Targets of -1 are ignored (no loss, no gradient). Rows of w at index >= V (vocab padding) are
// never scored. grad_scale is 1 / (valid targets of the whole optimizer step, over all ranks):
// the normalisation of the README's "Sequence and data parallelism" (the mean over every valid target of the step).
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

struct CrossEntropyStats {
  double loss_sum = 0;    // sum over valid targets of -log p (not scaled)
  int64_t n_valid = 0;    // targets != -1
  int64_t n_correct = 0;  // valid targets where argmax(logits) == target
};

namespace cpu {
// Rows [0, N); dx/dw may be null (no gradient wanted). Returns the stats of these rows. scratch:
// classifier_scratch_elems(chunk_rows, C, V) elements the caller keeps (the op's arena), or null:
// a vector made for the call.
template <class T>
CrossEntropyStats classifier_forward_backward(T* dx, T* dw, const T* x, const T* w, const int32_t* targets,
                                              int N, int C, int V, T grad_scale, int chunk_rows, T* scratch = nullptr);
size_t classifier_scratch_elems(int chunk_rows, int C, int V);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// One block per row of logits (R, V) (fp32, the GEMM's output), target t = targets[r]:
//   loss[r] = logsumexp(logits[r]) - logits[r][t],  hit[r] = (first argmax == t),
//   dlogits[r] = (softmax(logits[r]) - onehot(t)) * grad_scale    (when dlogits is not null)
// A row with t = -1 gets loss 0, hit 0 and a zero dlogits row. dlogits may be the logits buffer
// itself when T is float (each element is read before the same thread overwrites it). ld: the
// rows' stride in elements, of both (0: V, packed); the elements past V in a row are not touched.
template <class T>
void softmax_cross_entropy(T* dlogits, float* loss, int32_t* hit, const float* logits, const int32_t* targets, int R,
                           int V, float grad_scale, cudaStream_t s, int ld = 0);

// Where softmax_cross_entropy keeps a row between its two passes (when it has two: with dlogits),
// process-wide: 0 (the default) in shared memory where a block can hold it (V up to ~58K on
// sm_90), else read again from global memory; 1 always read twice from global memory; 2 always in
// shared memory (a launch whose row does not fit is refused). The results are the same bits either
// way; tests and bench_kernels compare the two. Returns the previous setting.
int set_softmax_row_staging(int mode);
// Whether a launch for rows of V logits stages them, under the setting above (2: throws if not).
bool softmax_row_staged(int V);

// The chunked classifier of cpu::classifier_forward_backward on device buffers: for each chunk of
// up to chunk_rows rows (trimmed to its first and last valid target, skipped when it has none), the
// fp32 logits by GEMM, softmax_cross_entropy, then dx (N, C) += dlogits w[0:V] and
// dw (>= V, C) (fp32) += dlogits^T x by GEMM. dx and/or dw may be null (no gradient wanted).
// targets: device copy (N); targets_host: the same values on the host, already checked to be in
// [-1, V) (it decides the chunks and n_valid). scratch: classifier_scratch_bytes(...) bytes.
// The per-row losses and hits are summed on the host in row order: deterministic. row_loss (host,
// N, may be null) gets each row's loss (0 for an ignored target), row_hit (host, N, may be null)
// 1 where the row's argmax is its target (0 for an ignored target).
template <class T>
CrossEntropyStats classifier_forward_backward(T* dx, float* dw, const T* x, const T* w, const int32_t* targets,
                                              const int32_t* targets_host, int N, int C, int V, float grad_scale,
                                              int chunk_rows, void* scratch, cudaStream_t s,
                                              float* row_loss = nullptr, uint8_t* row_hit = nullptr);
// dtype: f32 or bf16 (the T above).
size_t classifier_scratch_bytes(int N, int V, int chunk_rows, DType dtype);
}  // namespace cuda
#endif

// Rows per chunk the op uses on `device` for V classes and n_valid scored rows (the planner
// mirrors it).
int classifier_chunk_rows(int V, int64_t n_valid, Device device);

// x: (..., C), w: (Vp, C) with Vp >= V, targets: i32 (...) with values in [-1, V).
// When the tape records and x or w needs a gradient, dx and dw are added now (scaled by
// grad_scale): the loss is a terminal node, so nothing waits for a later backward.
// row_loss: null, or host memory for one float per row of x: each row's loss (0 where ignored);
// row_hit: null, or host memory for one byte per row: 1 where its argmax is its target, else 0.
CrossEntropyStats classifier_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int V,
                                           float grad_scale, float* row_loss = nullptr, uint8_t* row_hit = nullptr);

}  // namespace ul
