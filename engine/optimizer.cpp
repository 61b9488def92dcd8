#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

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

// In chunks fixed by n, added in order: the same bits whatever the threads (an OpenMP reduction
// combines the threads' sums in the order they finish, and the norm fed the clip factor). Within a
// chunk, 8 running sums over every 8th element, added in a fixed order at its end: one sum was a
// chain of dependent double adds (~4 cycles an element, 6% of a GPT-2 124M CPU step); 8
// independent ones vectorize and the loop waits on memory instead.
double sum_squares(const float* x, size_t n) {
  const size_t chunk = size_t(1) << 16, K = (n + chunk - 1) / chunk;
  std::vector<double> part(K, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < int64_t(K); k++) {
    constexpr size_t kLanes = 8;
    double acc[kLanes] = {};
    const size_t begin = size_t(k) * chunk, end = std::min(n, begin + chunk);
    size_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (size_t l = 0; l < kLanes; l++) acc[l] += double(x[i + l]) * x[i + l];
    for (; i < end; i++) acc[(i - begin) % kLanes] += double(x[i]) * x[i];  // the tail, lane by position
    part[size_t(k)] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace cpu

AdamW::AdamW(Params& params, AdamWConfig cfg, size_t lo, size_t hi) : params_(params), cfg_(cfg) {
  lo_ = std::min(lo, params.numel());
  hi_ = std::max(lo_, std::min(hi, params.numel()));
  if (lo_ < params.master_lo() || hi_ > params.master_hi())  // a bf16 update needs the masters
    throw std::runtime_error("AdamW: elements [" + std::to_string(lo_) + ", " + std::to_string(hi_) +
                             ") reach past the master weights kept here [" + std::to_string(params.master_lo()) + ", " +
                             std::to_string(params.master_hi()) + ")");
  size_t bytes = (hi_ - lo_) * sizeof(float);
  m_ = static_cast<float*>(device_alloc(params.device(), bytes));
  v_ = static_cast<float*>(device_alloc(params.device(), bytes));
  device_zero(params.device(), m_, bytes);
  device_zero(params.device(), v_, bytes);
  // [lo, hi) as runs of parameters with one decay rule, ends relative to lo (a shard boundary may
  // cut a parameter): the CPU updates run by run, and on CUDA a step is one launch that reads the
  // runs from a device copy.
  for (const ParamSpec& s : params.specs()) {
    const size_t a = std::max(s.offset, lo_), b = std::min(s.offset + size_t(s.shape.numel()), hi_);
    if (a >= b) continue;
    if (!decay_.empty() && decay_.back() == uint8_t(s.decay)) {
      ends_.back() = b - lo_;
    } else {
      ends_.push_back(b - lo_);
      decay_.push_back(uint8_t(s.decay));
    }
  }
  if (params.device() == Device::cpu || ends_.empty()) return;
  seg_ends_ = static_cast<uint64_t*>(device_alloc(params.device(), ends_.size() * sizeof(uint64_t)));
  seg_decay_ = static_cast<uint8_t*>(device_alloc(params.device(), decay_.size()));
  device_copy(seg_ends_, params.device(), ends_.data(), Device::cpu, ends_.size() * sizeof(uint64_t));
  device_copy(seg_decay_, params.device(), decay_.data(), Device::cpu, decay_.size());
}

AdamW::~AdamW() {
  device_free(params_.device(), m_);
  device_free(params_.device(), v_);
  if (seg_ends_) device_free(params_.device(), seg_ends_);
  if (seg_decay_) device_free(params_.device(), seg_decay_);
}

void AdamW::step(float lr, float grad_scale) {
  t_++;
  if (params_.device() == Device::cpu) {
    for (size_t k = 0, a = 0; k < ends_.size(); a = ends_[k], k++)  // [a, ends_[k]) relative to lo
      cpu::adamw_update(params_.data() + lo_ + a, params_.grad() + lo_ + a, m_ + a, v_ + a, ends_[k] - a, lr,
                        cfg_.beta1, cfg_.beta2, cfg_.eps, decay_[k] ? cfg_.weight_decay : 0.0f, grad_scale, t_);
    return;
  }
#if ULYSSES_HAVE_CUDA
  // Every parameter of [lo, hi) in one launch, the decay rule by segment; the rounding's random
  // bits follow each element's index in the whole buffer.
  const size_t n = hi_ - lo_;
  if (n == 0) return;
  const cuda::DecaySegments segs{seg_ends_, seg_decay_, int(ends_.size())};
  if (params_.dtype() == DType::bf16)
    cuda::adamw_update(static_cast<__nv_bfloat16*>(params_.raw()) + lo_, params_.master_at(lo_), params_.grad() + lo_,
                       m_, v_, n, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, grad_scale, t_, cfg_.seed,
                       nullptr, lo_, segs);
  else
    cuda::adamw_update(params_.data() + lo_, static_cast<float*>(nullptr), params_.grad() + lo_, m_, v_, n, lr,
                       cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, grad_scale, t_, cfg_.seed, nullptr, lo_,
                       segs);
#else
  throw std::runtime_error(std::string("AdamW: parameters on ") + device_name(params_.device()) +
                           " but this build has no CUDA backend");
#endif
}

void AdamW::round_params(size_t lo, size_t hi) const {
  if (params_.dtype() != DType::bf16 || t_ == 0) return;  // t 0: the nearest rounding of the init stands
#if ULYSSES_HAVE_CUDA
  hi = std::min(hi, params_.numel());
  if (lo >= hi) return;
  if (lo < params_.master_lo() || hi > params_.master_hi())
    throw std::runtime_error("AdamW::round_params: elements [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             ") reach past the master weights kept here");
  // The bits step() drew: they depend on the element's index only (and the seed and step).
  cuda::round_master(static_cast<__nv_bfloat16*>(params_.raw()) + lo, params_.master_at(lo), hi - lo, t_, cfg_.seed,
                     nullptr, lo);
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

float lr_at(int step, const LrSchedule& s) {
  if (step < s.warmup) return s.lr * float(step + 1) / float(s.warmup);
  if (s.kind == "constant") return s.lr;
  if (s.kind == "wsd") {
    // The decay's steps: the last round(decay_frac * steps), after the warmup; step `first` is the
    // first to go down, the last step lands on lr * final_frac. The product nudged up by 1e-12 of
    // itself: a decimal fraction is a hair off in binary (0.0012 x 1250 gives 1.4999999999999998,
    // not 1.5), and a half meant as written rounds up, as round(0.7 x 5) = 4 says.
    const double decay = s.decay_frac * s.steps * (1 + 1e-12);
    const int n = std::min(std::max(1, int(std::lround(decay))), std::max(1, s.steps - s.warmup));
    const int first = s.steps - n;
    if (step < first) return s.lr;
    const double progress = std::min(1.0, double(step - first + 1) / double(n));
    return float(s.lr * (1.0 - (1.0 - s.final_frac) * progress));
  }
  int decay_steps = s.steps - s.warmup;
  // One step after the warmup is the last: it lands on the floor, as wsd's does (it once stayed at lr).
  if (decay_steps <= 1) return s.lr * s.final_frac;
  double progress = double(step - s.warmup) / double(decay_steps - 1);
  if (progress > 1) progress = 1;
  double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return float(s.lr * (s.final_frac + (1.0 - s.final_frac) * cosine));
}

}  // namespace ul
