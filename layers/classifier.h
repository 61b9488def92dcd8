// Fused classifier + softmax + cross-entropy (+ its gradient), over chunks of rows, so that the
// (N, V) logits never exist at once: each chunk of rows gets its logits, loss, and — when the tape
// records — its gradient, immediately:
//   logits = x w^T (N, V),  p = softmax(logits),  loss_n = -log p[n, target_n]
//   dlogits = (p - onehot(target)) * grad_scale,  dx += dlogits w,  dw += dlogits^T x
// Targets of -1 are ignored (no loss, no gradient). Rows of w at index >= V (vocab padding) are
// never scored. grad_scale is 1 / (valid targets of the whole optimizer step, over all ranks):
// the normalisation of DESIGN.md "Loss and gradients across ranks".
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ul {

struct CrossEntropyStats {
  double loss_sum = 0;    // sum over valid targets of -log p (not scaled)
  int64_t n_valid = 0;    // targets != -1
  int64_t n_correct = 0;  // valid targets where argmax(logits) == target
};

namespace cpu {
// Rows [0, N); dx/dw may be null (no gradient wanted). Returns the stats of these rows.
template <class T>
CrossEntropyStats classifier_forward_backward(T* dx, T* dw, const T* x, const T* w, const int32_t* targets,
                                              int N, int C, int V, T grad_scale, int chunk_rows);
}  // namespace cpu

// x: (..., C), w: (Vp, C) with Vp >= V, targets: i32 (...) with values in [-1, V).
// When the tape records and x or w needs a gradient, dx and dw are added now (scaled by
// grad_scale): the loss is a terminal node, so nothing waits for a later backward.
CrossEntropyStats classifier_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int V,
                                           float grad_scale);

}  // namespace ul
