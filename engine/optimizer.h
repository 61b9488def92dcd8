// AdamW with bias correction and decoupled weight decay (as torch.optim.AdamW), gradient
// global-norm clipping, and the warmup + cosine learning-rate schedule.
//   g' = g * clip,  m = b1 m + (1 - b1) g',  v = b2 v + (1 - b2) g'^2
//   p -= lr * wd * p                         (only parameters whose spec says decay: 2-D weights)
//   p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
#pragma once
#include <cstddef>
#include <vector>

#include "engine/params.h"

namespace ul {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

namespace cpu {
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t);
double sum_squares(const float* x, size_t n);
}  // namespace cpu

class AdamW {
 public:
  AdamW(Params& params, AdamWConfig cfg);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update of every parameter from params.grad(); grad_scale multiplies the gradients first
  // (the clipping factor). Increments the step count t used for bias correction.
  void step(float lr, float grad_scale);
  int t() const { return t_; }
  void set_t(int t) { t_ = t; }
  float* m() const { return m_; }
  float* v() const { return v_; }

 private:
  Params& params_;
  AdamWConfig cfg_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  int t_ = 0;
};

// L2 norm of the whole gradient buffer.
double grad_global_norm(const Params& params);
// min(1, max_norm / norm): the factor that clips the gradient to max_norm (max_norm <= 0: no clip).
float clip_factor(double norm, float max_norm);
// Linear warmup over `warmup` steps to lr, then cosine decay to lr * final_frac at the last step.
float lr_at(int step, int steps, int warmup, float lr, float final_frac);

}  // namespace ul
