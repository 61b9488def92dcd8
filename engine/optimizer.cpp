#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

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
    if (params_.device() == Device::cpu) {
      cpu::adamw_update(params_.data() + a, params_.grad() + a, m_ + (a - lo_), v_ + (a - lo_), b - a, lr, cfg_.beta1,
                        cfg_.beta2, cfg_.eps, wd, grad_scale, t_);
      continue;
    }
#if ULYSSES_HAVE_CUDA
    // Each slice its own rounding stream: the run seed plus the slice's offset in the buffer.
    const uint64_t seed = cfg_.seed + a;
    if (params_.dtype() == DType::bf16)
      cuda::adamw_update(static_cast<__nv_bfloat16*>(params_.raw()) + a, params_.master() + a, params_.grad() + a,
                         m_ + (a - lo_), v_ + (a - lo_), b - a, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale,
                         t_, seed, nullptr);
    else
      cuda::adamw_update(params_.data() + a, static_cast<float*>(nullptr), params_.grad() + a, m_ + (a - lo_),
                         v_ + (a - lo_), b - a, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale, t_, seed,
                         nullptr);
#else
    throw std::runtime_error(std::string("AdamW: parameters on ") + device_name(params_.device()) +
                             " but this build has no CUDA backend");
#endif
  }
}

void AdamW::round_params(size_t lo, size_t hi) const {
  if (params_.dtype() != DType::bf16 || t_ == 0) return;  // t 0: the nearest rounding of the init stands
#if ULYSSES_HAVE_CUDA
  for (const ParamSpec& s : params_.specs()) {
    // The slices of step(): the same [a, b) and seed give the same random bits.
    size_t a = std::max(s.offset, lo), b = std::min(s.offset + size_t(s.shape.numel()), hi);
    if (a >= b) continue;
    cuda::round_master(static_cast<__nv_bfloat16*>(params_.raw()) + a, params_.master() + a, b - a, t_, cfg_.seed + a,
                       nullptr);
  }
#else
  (void)lo, (void)hi;
#endif
}

double sum_squares_on(Device d, const float* x, size_t n) {
  if (d == Device::cpu) return cpu::sum_squares(x, n);
#if ULYSSES_HAVE_CUDA
  return cuda::sum_squares(x, n, nullptr);  // the legacy default stream, as the ops (layers/op_util.h)
#else
  throw std::runtime_error(std::string("sum_squares: buffer on ") + device_name(d) + " but this build has no CUDA backend");
#endif
}

double grad_global_norm(const Params& params) {
  return std::sqrt(sum_squares_on(params.device(), params.grad(), params.numel()));
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
