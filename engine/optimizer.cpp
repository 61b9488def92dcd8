#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>

#include "engine/device.h"

namespace ul {
namespace cpu {

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t) {
  const float bc1 = 1.0f - std::pow(beta1, float(t));
  const float bc2 = 1.0f - std::pow(beta2, float(t));
  const float step_size = lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] - lr * weight_decay * p[i];
    p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

double sum_squares(const float* x, size_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (size_t i = 0; i < n; i++) s += double(x[i]) * x[i];
  return s;
}

}  // namespace cpu

AdamW::AdamW(Params& params, AdamWConfig cfg, size_t lo, size_t hi) : params_(params), cfg_(cfg) {
  lo_ = std::min(lo, params.numel());
  hi_ = std::max(lo_, std::min(hi, params.numel()));
  size_t bytes = (hi_ - lo_) * sizeof(float);
  m_ = static_cast<float*>(device_alloc(params.device(), bytes));
  v_ = static_cast<float*>(device_alloc(params.device(), bytes));
  device_zero(params.device(), m_, bytes);
  device_zero(params.device(), v_, bytes);
}

AdamW::~AdamW() {
  device_free(params_.device(), m_);
  device_free(params_.device(), v_);
}

void AdamW::step(float lr, float grad_scale) {
  t_++;
  for (const ParamSpec& s : params_.specs()) {
    // This parameter's elements that lie in [lo, hi): a shard boundary may cut a parameter.
    size_t a = std::max(s.offset, lo_), b = std::min(s.offset + size_t(s.shape.numel()), hi_);
    if (a >= b) continue;
    float wd = s.decay ? cfg_.weight_decay : 0.0f;
    cpu::adamw_update(params_.data() + a, params_.grad() + a, m_ + (a - lo_), v_ + (a - lo_), b - a, lr, cfg_.beta1,
                      cfg_.beta2, cfg_.eps, wd, grad_scale, t_);
  }
}

double grad_global_norm(const Params& params) {
  return std::sqrt(cpu::sum_squares(params.grad(), params.numel()));
}

float clip_factor(double norm, float max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return float(max_norm / norm);
}

float lr_at(int step, int steps, int warmup, float lr, float final_frac) {
  if (step < warmup) return lr * float(step + 1) / float(warmup);
  int decay_steps = steps - warmup;
  if (decay_steps <= 1) return lr;
  double progress = double(step - warmup) / double(decay_steps - 1);
  if (progress > 1) progress = 1;
  double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return float(lr * (final_frac + (1.0 - final_frac) * cosine));
}

}  // namespace ul
