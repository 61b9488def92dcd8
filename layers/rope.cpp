#include "layers/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/file_io.h"
#include "layers/op_util.h"

namespace ul {

double yarn_attention_factor(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

RopeScaling parse_rope_scaling(const std::string& spec, const std::string& where) {
  const std::string named = where.empty() ? "--rope-scaling '" + spec + "'" : where + " '" + spec + "'";
  auto bad = [&](const std::string& why) {
    return std::runtime_error(named + ": " + why +
                              " (none, linear:factor=F, llama3:factor=F,low=1,high=4,orig=8192, or "
                              "yarn:factor=F,orig=N,beta_fast=32,beta_slow=1,attn=X,truncate=1)");
  };
  RopeScaling s;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  if (kind == "none") {
    if (colon != std::string::npos) throw bad("none takes no settings");
    return s;
  }
  if (kind == "linear") s.kind = RopeScaling::kLinear;
  else if (kind == "llama3") s.kind = RopeScaling::kLlama3;
  else if (kind == "yarn") s.kind = RopeScaling::kYarn;
  else throw bad("unknown kind '" + kind + "'");
  bool has_factor = false, has_attn = false, has_orig = false;
  const bool yarn = s.kind == RopeScaling::kYarn;
  std::vector<std::string> seen;  // a key given twice: which one counts is a guess
  for (size_t at = colon == std::string::npos ? spec.size() : colon + 1; at < spec.size();) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at), key = item.substr(0, item.find('='));
    at = comma + 1;
    if (item.find('=') == std::string::npos) throw bad("'" + item + "' is not key=value");
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) throw bad(key + " is given twice");
    seen.push_back(key);
    const std::string v = item.substr(key.size() + 1);
    // Decimal as written, as the flags' numbers are: no blank, no hex (strtod takes both).
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !std::isfinite(x) || v.find_first_not_of("0123456789.eE+-") != std::string::npos)
      throw bad(key + ": '" + v + "' is not a decimal number");
    // A float setting: one the float does not hold (inf, or 0 from a value that is not) is refused
    // as that, not as the range check's "must be > 0" below.
    if (key != "orig" && key != "truncate" && (!std::isfinite(float(x)) || (x != 0 && float(x) == 0)))
      throw bad(key + ": " + v + " is outside a float's range");
    if (key == "factor") s.factor = float(x), has_factor = true;
    else if (key == "low" && s.kind == RopeScaling::kLlama3) s.low_freq_factor = float(x);
    else if (key == "high" && s.kind == RopeScaling::kLlama3) s.high_freq_factor = float(x);
    else if (key == "orig" && (s.kind == RopeScaling::kLlama3 || yarn)) {
      // A count of positions: digits only, as config.json's reader takes it ([1, 2^31)).
      if (v.find_first_not_of("0123456789") != std::string::npos || x < 1 || x > 2147483647.0)
        throw bad("orig: '" + v + "' is not a whole number of positions in [1, 2^31)");
      s.original_max_pos = int32_t(x), has_orig = true;
    } else if (key == "beta_fast" && yarn) s.beta_fast = float(x);
    else if (key == "beta_slow" && yarn) s.beta_slow = float(x);
    else if (key == "attn" && yarn) s.attention_factor = float(x), has_attn = true;
    else if (key == "truncate" && yarn) {
      if (x != 0 && x != 1) throw bad("truncate must be 0 or 1");
      s.truncate = x == 1;
    } else throw bad("unknown key '" + key + "' for " + kind);
  }
  if (!has_factor) throw bad("factor=F is required");
  if (yarn && !has_orig) throw bad("yarn needs orig=N, the context the model was trained at");
  if (yarn && !has_attn) s.attention_factor = yarn_attention_factor(s.factor);
  check_rope_scaling(s, named);
  return s;
}

void check_rope_scaling(const RopeScaling& s, const std::string& where) {
  auto bad = [&](const std::string& why) { return std::runtime_error(where + ": " + why); };
  if (s.kind != RopeScaling::kNone && s.kind != RopeScaling::kLinear && s.kind != RopeScaling::kLlama3 &&
      s.kind != RopeScaling::kYarn)
    throw bad("unknown rope scaling kind " + std::to_string(s.kind));
  if (s.kind == RopeScaling::kNone) return;
  if (!(s.factor > 0) || !std::isfinite(s.factor)) throw bad("the rope scaling factor must be > 0");
  if (s.kind == RopeScaling::kLinear) return;
  if (s.kind == RopeScaling::kYarn) {
    if (s.original_max_pos < 1) throw bad("yarn rope scaling needs original_max_position_embeddings >= 1");
    if (!(s.beta_slow > 0) || !(s.beta_fast > s.beta_slow) || !std::isfinite(s.beta_fast))
      throw bad("yarn rope scaling needs 0 < beta_slow < beta_fast");
    if (!(s.attention_factor > 0) || !std::isfinite(s.attention_factor))
      throw bad("yarn rope scaling needs attention_factor > 0");
    return;
  }
  if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor))
    throw bad("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
  if (s.original_max_pos < 1) throw bad("llama3 rope scaling needs original_max_position_embeddings >= 1");
}

std::string rope_scaling_str(const RopeScaling& s) {
  const std::string factor = "factor=" + float_text(s.factor);
  const std::string orig = ",orig=" + std::to_string(s.original_max_pos);
  switch (s.kind) {
    case RopeScaling::kNone: return "none";
    case RopeScaling::kLinear: return "linear:" + factor;
    case RopeScaling::kLlama3:
      return "llama3:" + factor + ",low=" + float_text(s.low_freq_factor) + ",high=" + float_text(s.high_freq_factor) + orig;
    case RopeScaling::kYarn:
      return "yarn:" + factor + orig + ",beta_fast=" + float_text(s.beta_fast) + ",beta_slow=" + float_text(s.beta_slow) +
             ",attn=" + float_text(s.attention_factor) + ",truncate=" + (s.truncate ? "1" : "0");
    default: return "kind " + std::to_string(s.kind);  // refused by parse_rope_scaling
  }
}

namespace cpu {

namespace {
// freq_i (rope.h), i < D/2, kept in double: the angle pos * freq_i then keeps double precision
// even at positions in the millions, and is rounded to T only as its cos and sin.
std::vector<double> rope_freqs(int D, const Rope& rope) {
  std::vector<double> f(D / 2);
  for (int i = 0; i < D / 2; i++) f[i] = rope_freq(i, D, rope);
  return f;
}

// Rotates the Hq + Hkv query/key heads of one token by angle sign * pos * freq_i (times magnitude) and copies (or,
// when accumulating, adds) the Hkv value heads. src, dst: (Hq + 2*Hkv, D). cs: scratch for the
// D/2 cosines then the D/2 sines of this token.
template <class T>
void rotate_token(T* dst, const T* src, int pos, int Hq, int Hkv, int D, const double* freq, double magnitude,
                  double sign, bool accumulate, std::vector<T>& cs) {
  const int half = D / 2;
  for (int i = 0; i < half; i++) {
    const double a = sign * double(pos) * freq[i];
    cs[i] = T(magnitude * std::cos(a));
    cs[half + i] = T(magnitude * std::sin(a));
  }
  for (int h = 0; h < Hq + Hkv; h++) {
    const T* x = src + size_t(h) * D;
    T* y = dst + size_t(h) * D;
    for (int i = 0; i < half; i++) {
      const T x1 = x[i], x2 = x[i + half], c = cs[i], s = cs[half + i];
      const T y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
      if (accumulate) {
        y[i] += y1;
        y[i + half] += y2;
      } else {
        y[i] = y1;
        y[i + half] = y2;
      }
    }
  }
  const size_t v0 = size_t(Hq + Hkv) * D, nv = size_t(Hkv) * D;
  for (size_t j = v0; j < v0 + nv; j++) dst[j] = accumulate ? dst[j] + src[j] : src[j];
}

// Every token of src (N, Hq + 2*Hkv, D) rotated by sign * its angles into dst (added when
// accumulate); dst may alias src (each pair is read before it is written).
template <class T>
void rotate_tokens(T* dst, const T* src, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope, double sign,
                   bool accumulate) {
  const size_t row = size_t(Hq + 2 * Hkv) * D;
  const std::vector<double> freq = rope_freqs(D, rope);
#pragma omp parallel
  {
    std::vector<T> cs(D);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++)
      rotate_token(dst + n * row, src + n * row, pos[n], Hq, Hkv, D, freq.data(), rope_magnitude(rope), sign,
                   accumulate, cs);
  }
}
}  // namespace

// qkv, y: (N, Hq + 2*Hkv, D); pos: (N). y may alias qkv.
template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope) {
  rotate_tokens(y, qkv, pos, N, Hq, Hkv, D, rope, 1.0, false);
}

// A rotation is orthogonal, so its transpose (the backward) is the rotation by -a.
template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope) {
  rotate_tokens(dqkv, dy, pos, N, Hq, Hkv, D, rope, -1.0, true);
}

template void rope_forward<float>(float*, const float*, const int32_t*, int, int, int, int, const Rope&);
template void rope_forward<double>(double*, const double*, const int32_t*, int, int, int, int, const Rope&);
template void rope_backward<float>(float*, const float*, const int32_t*, int, int, int, int, const Rope&);
template void rope_backward<double>(double*, const double*, const int32_t*, int, int, int, int, const Rope&);
}  // namespace cpu

namespace {
// The checks both backends make on qkv (B, T, Hq + 2*Hkv, D), the head counts and theta; returns D.
int check_rope(const Tensor& qkv, int Hq, int Hkv, const Rope& rope) {
  const float theta = rope.theta;
  if (qkv.ndim() != 4) throw std::runtime_error("rope: qkv must be (B, T, Hq + 2*Hkv, D), got " + qkv.shape.str());
  const int D = int(qkv.size(3));
  if (Hq <= 0 || Hkv <= 0 || qkv.size(2) != Hq + 2 * Hkv)
    throw std::runtime_error("rope: qkv " + qkv.shape.str() + " does not hold Hq + 2*Hkv heads for Hq = " +
                             std::to_string(Hq) + ", Hkv = " + std::to_string(Hkv));
  if (D % 2 != 0) throw std::runtime_error("rope: head dim must be even, got " + std::to_string(D));
  if (!(theta > 0)) throw std::runtime_error("rope: theta must be positive, got " + std::to_string(theta));
  check_rope_scaling(rope.scaling, "rope");
  return D;
}
}  // namespace

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 tensors; positions are i32 on the device.
static Tensor rope_cuda(const Tensor& qkv, const Tensor& pos, int Hq, int Hkv, const Rope& rope) {
  const int D = check_rope(qkv, Hq, Hkv, rope);
  if (pos.device != Device::cuda || pos.dtype != DType::i32)
    throw std::runtime_error("rope: positions must be i32 on cuda, got " + pos.str());
  check_shape(pos, {qkv.size(0), qkv.size(1)}, "rope positions");
  const int N = row_count(qkv.size(0) * qkv.size(1), "rope");
  Tensor y;
  dispatch_cuda(qkv, {}, "rope", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    y = c.empty(qkv.shape, qkv.dtype);
    cuda::rope_forward(y.as<T>(), qkv.as<T>(), pos.as<int32_t>(), N, Hq, Hkv, D, rope, op_stream());
    if (!needs_grad({&qkv})) return;
    y = c.tape.track(y);
    c.tape.push("rope", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cuda::rope_backward(grad_or_scratch_as<T>(qkv), dy, pos.as<int32_t>(), N, Hq, Hkv, D, rope, op_stream());
    });
  });
  return y;
}
#endif

Tensor rope(const Tensor& qkv, const Tensor& pos, int Hq, int Hkv, const Rope& rope) {
#if ULYSSES_HAVE_CUDA
  if (qkv.device == Device::cuda) return rope_cuda(qkv, pos, Hq, Hkv, rope);
#endif
  require_cpu_f32(qkv, "rope");
  const int D = check_rope(qkv, Hq, Hkv, rope);
  const int64_t B = qkv.size(0), T = qkv.size(1);
  if (pos.device != Device::cpu || pos.dtype != DType::i32)
    throw std::runtime_error("rope: positions must be i32 on the cpu, got " + pos.str());
  check_shape(pos, {B, T}, "rope positions");
  const int N = row_count(B * T, "rope");

  Context& c = ctx();
  Tensor y = c.empty(qkv.shape);
  cpu::rope_forward(y.f32(), qkv.f32(), pos.i32(), N, Hq, Hkv, D, rope);
  if (needs_grad({&qkv})) {
    y = c.tape.track(y);
    c.tape.push("rope", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::rope_backward(grad_or_scratch(qkv), dy, pos.i32(), N, Hq, Hkv, D, rope);
    });
  }
  return y;
}

}  // namespace ul
