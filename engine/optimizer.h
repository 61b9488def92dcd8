// AdamW with bias correction and decoupled weight decay (as torch.optim.AdamW), gradient
// global-norm clipping, and the learning-rate schedules (warmup, then cosine, wsd or constant).
//   g' = g * clip,  m = b1 m + (1 - b1) g',  v = b2 v + (1 - b2) g'^2
//   p -= lr * wd * p                         (only parameters whose spec says decay: 2-D weights)
//   p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
#pragma once
#include <string>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/params.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  uint64_t seed = 0;  // bf16 on cuda: the stochastic rounding's random bits derive from it (the run seed)
};

namespace cpu {
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t);
double sum_squares(const float* x, size_t n);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// Which of a launch's elements decay: segment k covers [ends[k - 1], ends[k]) (from 0; the last
// end is n) and decays by weight_decay iff decay[k]. Both arrays live in device memory. count 0:
// every element decays.
struct DecaySegments {
  const uint64_t* ends = nullptr;
  const uint8_t* decay = nullptr;
  int count = 0;
};

// The update of cpu::adamw_update on n device elements, fp32 math on the master weights, which are
// `master` (fp32) when Tp is __nv_bfloat16, or `params` themselves when Tp is float (master must
// then be null). For bf16, params = master rounded STOCHASTICALLY: away from zero with probability
// (distance to the bf16 nearer zero) / (bf16 spacing), so the rounding is unbiased and updates
// smaller than a bf16 ulp are not lost on average. The random bits are a hash of (seed, t, g), g =
// index_base + i the element's index in the whole parameter buffer: the same seed and step give an
// element the same bits however the buffer is cut into launches (ZeRO shards, one launch or
// many), so a rerun is bitwise identical. One launch covers every parameter: `segments` says which
// decay.
template <class Tp>
void adamw_update(Tp* params, float* master, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int t, uint64_t seed, cudaStream_t s,
                  size_t index_base = 0, DecaySegments segments = {});

// params = master rounded stochastically with exactly the random bits adamw_update<bf16> used at
// step t with this seed and index_base (so, after a checkpoint restores the masters, the bf16
// weights are the ones the run had).
void round_master(__nv_bfloat16* params, const float* master, size_t n, int t, uint64_t seed, cudaStream_t s,
                  size_t index_base = 0);

// sum_i x[i]^2 (the squared global gradient norm), in double, in two fixed-order stages
// (deterministic): per-block partial sums into scratch, then one block adds them in order and
// writes *out (a device double; sum_squares_scratch_bytes(n) bytes of scratch hold the partials).
void sum_squares(double* out, const float* x, size_t n, double* scratch, cudaStream_t s);
size_t sum_squares_scratch_bytes(size_t n);
// The same, returned to the host (waits for the result; its scratch is cached per host thread).
double sum_squares(const float* x, size_t n, cudaStream_t s);
}  // namespace cuda
#endif

class AdamW {
 public:
  // The state covers elements [lo, hi) of the parameter buffer (ZeRO-1: this rank's shard; by
  // default all of it); step() updates only those, with each parameter's decay rule. A bf16
  // model's masters must cover them (Params::master_lo/hi).
  AdamW(Params& params, AdamWConfig cfg, size_t lo = 0, size_t hi = SIZE_MAX);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update of every parameter from params.grad(); grad_scale multiplies the gradients first
  // (the clipping factor). Increments the step count t used for bias correction. On cuda the
  // update is cuda::adamw_update on the device buffers (m and v live on the params' device); a bf16
  // model is updated in its f32 master copy (Params::master) and rounded stochastically.
  void step(float lr, float grad_scale);
  int t() const { return t_; }
  void set_t(int t) { t_ = t; }
  // A bf16 model (t() > 0): re-rounds the bf16 weights of elements [lo, hi) from their masters
  // with the random bits step() drew for them at step t() (they depend on the element's index, not
  // on the shard); after a checkpoint load the weights are then bitwise the run's. No-op for f32.
  void round_params(size_t lo, size_t hi) const;
  float* m() const { return m_; }  // hi() - lo() elements: m[i] is element lo() + i's
  float* v() const { return v_; }
  size_t lo() const { return lo_; }
  size_t hi() const { return hi_; }

 private:
  Params& params_;
  AdamWConfig cfg_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  size_t lo_ = 0, hi_ = 0;
  int t_ = 0;
  // [lo, hi) as runs of parameters with the same decay rule: run k ends at ends_[k] (relative to
  // lo) and decays iff decay_[k]; on cuda also on the device (cuda::DecaySegments), so that a step
  // is one launch.
  std::vector<uint64_t> ends_;
  std::vector<uint8_t> decay_;
  uint64_t* seg_ends_ = nullptr;
  uint8_t* seg_decay_ = nullptr;
};

// sum of x[i]^2 over n f32 elements on device d (cpu::sum_squares, or the CUDA reduction).
double sum_squares_on(Device d, const float* x, size_t n);
// L2 norm of the whole gradient buffer.
double grad_global_norm(const Params& params);
// min(1, max_norm / norm): the factor that clips the gradient to max_norm (max_norm <= 0: no clip).
float clip_factor(double norm, float max_norm);
// The learning rate of step `step` (0-based) of `steps`: linear warmup over `warmup` steps to lr,
// then by `schedule` (Options::schedule):
//   cosine    decay to lr * final_frac at the last step;
//   wsd       lr until the last round(decay_frac * steps) steps (at least one, none in the warmup),
//             which decay linearly to lr * final_frac at the last step (the warmup-stable-decay
//             schedule: a run lengthened before its decay sees the same rates, so --steps may grow
//             on a resume without a jump);
//   constant  lr.
struct LrSchedule {
  std::string kind = "cosine";
  int steps = 1, warmup = 0;
  float lr = 0, final_frac = 0.1f;
  double decay_frac = 0.2;
};
float lr_at(int step, const LrSchedule& s);

}  // namespace ul
