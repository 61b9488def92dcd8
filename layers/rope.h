// Rotary position embedding on packed q/k/v heads, "rotate half" convention (as in Hugging Face
// Llama): for head dim D and i < D/2, with angle a = pos * freq_i (rope_freq below):
//   y[i]       = x[i] cos a - x[i + D/2] sin a
//   y[i + D/2] = x[i + D/2] cos a + x[i] sin a
// applied to the Hq query heads and Hkv key heads; the Hkv value heads pass through unchanged.
// (yarn also scales y by a constant, rope_magnitude.) Backward is the transpose: the inverse
// rotation (angle -a) of dy, times the same constant. Positions are explicit (global positions
// under sequence parallelism; restarted per document when packing).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

#ifdef __CUDACC__
#define UL_ROPE_HD __host__ __device__
#else
#define UL_ROPE_HD
#endif

namespace ul {

// Hugging Face's rope_scaling, the frequency rules that stretch a model's context:
//   none    freq_i = theta^(-2i/D)
//   linear  freq_i / factor (position interpolation: position p turns as p / factor did)
//   llama3  Llama 3.1's rule by wavelength w_i = 2 pi / freq_i against the original context L:
//           w_i < L / high_freq_factor: kept (the fast pairs that resolve nearby tokens);
//           w_i > L / low_freq_factor: freq_i / factor (the slow pairs, stretched over the new
//           context); between: (1 - s) freq_i / factor + s freq_i, s = (L / w_i - low) / (high - low)
//   yarn    YaRN (Qwen 2.5's, DeepSeek's long-context rule), by pair index against the original
//           context L: pair i turns r_i = L freq_i / (2 pi) times over L. Pairs that turn more
//           than beta_fast times are kept, pairs that turn fewer than beta_slow times get
//           freq_i / factor, and a linear ramp in i joins the two (its ends, the pair indices
//           where r_i = beta_fast and beta_slow, rounded outward when truncate). Both q and k are
//           also multiplied by attention_factor (0.1 ln(factor) + 1 unless given), which sharpens
//           the softmax by attention_factor^2 as the context grows (rope_magnitude below).
struct RopeScaling {
  enum Kind : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2, kYarn = 3 };
  int32_t kind = kNone;
  float factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int32_t original_max_pos = 8192;  // L
  float beta_fast = 32, beta_slow = 1, attention_factor = 1;  // yarn
  bool truncate = true;                                       // yarn: ramp ends rounded to whole pairs
};

struct Rope {
  float theta = 10000;
  RopeScaling scaling;
  Rope() = default;
  Rope(float t) : theta(t) {}  // NOLINT: a bare theta is the unscaled RoPE
};

// "none", "linear:factor=4", "llama3:factor=32,low=1,high=4,orig=8192",
// "yarn:factor=4,orig=32768,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1": the
// --rope-scaling syntax, parsed and printed (printed in full; parse fills what is left out with
// the defaults above, yarn's attn with 0.1 ln(factor) + 1). parse throws naming the flag (or
// `where`, for a spec read from a file) and the problem (an unknown kind or key, a number not
// written in decimal or past a float's range, a factor <= 0, low >= high, orig outside [1, 2^31),
// beta_fast <= beta_slow).
RopeScaling parse_rope_scaling(const std::string& spec, const std::string& where = "");
std::string rope_scaling_str(const RopeScaling& s);
// YaRN's default attention factor for a context stretched by `factor`: 0.1 ln(factor) + 1 (1 for
// factor <= 1), as the paper and Hugging Face; with mscale, 0.1 mscale ln(factor) + 1 (DeepSeek's
// configs give the ratio of two such).
double yarn_attention_factor(double factor, double mscale = 1);
// Throws "where: problem" for settings no rule can use (what parse also refuses), e.g. read from a file.
void check_rope_scaling(const RopeScaling& s, const std::string& where);

// freq_i for pair i < D/2, in double (an angle at position 10^6 keeps its precision), on the host
// and in the CUDA kernels alike.
UL_ROPE_HD inline double rope_freq(int i, int D, const Rope& r) {
  const double f = pow(double(r.theta), -2.0 * i / D);
  const RopeScaling& s = r.scaling;
  if (s.kind == RopeScaling::kLinear) return f / s.factor;
  if (s.kind == RopeScaling::kYarn) {
    // The pair index at which r_i = rotations: L theta^(-2i/D) = 2 pi rotations, solved for i.
    auto pair_at = [&](double rotations) {
      return D * log(s.original_max_pos / (rotations * 2 * 3.14159265358979323846)) / (2 * log(double(r.theta)));
    };
    double lo = pair_at(s.beta_fast), hi = pair_at(s.beta_slow);
    if (s.truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0 ? lo : 0, hi = hi < D - 1 ? hi : D - 1;
    if (lo == hi) hi += 0.001;  // as Hugging Face: a step, not a division by zero
    double ramp = (i - lo) / (hi - lo);  // 0 (kept) .. 1 (divided by factor)
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    return ramp * f / s.factor + (1 - ramp) * f;
  }
  if (s.kind != RopeScaling::kLlama3) return f;
  const double wavelen = 2 * 3.14159265358979323846 / f, L = s.original_max_pos;
  if (wavelen < L / s.high_freq_factor) return f;
  if (wavelen > L / s.low_freq_factor) return f / s.factor;
  const double smooth = (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

// What cos and sin are multiplied by: yarn's attention_factor, else 1. The rotation then scales q
// and k by it (and the backward dq and dk: the op is attention_factor times a rotation).
UL_ROPE_HD inline double rope_magnitude(const Rope& r) {
  return r.scaling.kind == RopeScaling::kYarn ? double(r.scaling.attention_factor) : 1.0;
}

namespace cpu {
// qkv, y: (N, Hq + 2*Hkv, D); pos: (N)
template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope);
template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16; pointers are device memory. Angles are computed in double (exact
// enough at positions in the millions), their cos and sin rounded to float, the rotation in float.
// Forward writes y (which may alias qkv); backward adds into dqkv.
template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope,
                  cudaStream_t s);
template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope,
                   cudaStream_t s);
}  // namespace cuda
#endif

// qkv: (B, T, Hq + 2*Hkv, D), pos: i32 (B, T) -> same shape as qkv
Tensor rope(const Tensor& qkv, const Tensor& pos, int Hq, int Hkv, const Rope& rope);

}  // namespace ul
