// Rotary position embedding on packed q/k/v heads, "rotate half" convention (as in Hugging Face
// Llama): for head dim D and i < D/2, with angle a = pos * freq_i (rope_freq below):
//   y[i]       = x[i] cos a - x[i + D/2] sin a
//   y[i + D/2] = x[i + D/2] cos a + x[i] sin a
// applied to the Hq query heads and Hkv key heads; the Hkv value heads pass through unchanged.
// Backward is the inverse rotation (angle -a) of dy. Positions are explicit (global positions
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
struct RopeScaling {
  enum Kind : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2 };
  int32_t kind = kNone;
  float factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int32_t original_max_pos = 8192;  // L
};

struct Rope {
  float theta = 10000;
  RopeScaling scaling;
  Rope() = default;
  Rope(float t) : theta(t) {}  // NOLINT: a bare theta is the unscaled RoPE
};

// "none", "linear:factor=4", "llama3:factor=32,low=1,high=4,orig=8192": the --rope-scaling syntax,
// parsed and printed. parse throws naming the flag and the problem (an unknown kind or key, a
// factor <= 0, low >= high, orig <= 0).
RopeScaling parse_rope_scaling(const std::string& spec);
std::string rope_scaling_str(const RopeScaling& s);
// Throws "where: problem" for settings no rule can use (what parse also refuses), e.g. read from a file.
void check_rope_scaling(const RopeScaling& s, const std::string& where);

// freq_i for pair i < D/2, in double (an angle at position 10^6 keeps its precision), on the host
// and in the CUDA kernels alike.
UL_ROPE_HD inline double rope_freq(int i, int D, const Rope& r) {
  const double f = pow(double(r.theta), -2.0 * i / D);
  const RopeScaling& s = r.scaling;
  if (s.kind == RopeScaling::kLinear) return f / s.factor;
  if (s.kind != RopeScaling::kLlama3) return f;
  const double wavelen = 2 * 3.14159265358979323846 / f, L = s.original_max_pos;
  if (wavelen < L / s.high_freq_factor) return f;
  if (wavelen > L / s.low_freq_factor) return f / s.factor;
  const double smooth = (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
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
