// RoPE on CUDA (the math is in rope.h; the CPU loop it must match is in rope.cpp).
// T is float or __nv_bfloat16; the rotation is computed in float and rounded to T once.
//
// forward, backward   one thread per (token n, frequency i < D/2): it computes the angle
//              pos[n] * freq_i (rope_freq, rope.h) in double, its cos and sin in double rounded to float (as
//              the CPU does: in float the angle of position 10^6 would be off by up to 0.03 rad),
//              then rotates pair (i, i + D/2) of each of the Hq + Hkv query/key heads and copies
//              (forward) or adds (backward) elements i and i + D/2 of the Hkv value heads.
//              Consecutive threads take consecutive i of one token: loads are coalesced runs of D/2.
//              The backward is the rotation by -angle, added into dqkv. Both scale cos and sin by
//              rope_magnitude (yarn's attention factor; 1 otherwise).
// The forward reads each pair before writing it, from the same thread, so y may alias qkv.
#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "layers/rope.h"

namespace ul {
namespace cuda {
namespace {

// dst, src: (N, Hq + 2*Hkv, D); pos: (N). Forward: dst = R(angle) src on q/k heads, dst = src on
// v heads. Backward: dst += R(-angle) src on q/k heads, dst += src on v heads.
template <class T, bool kBackward>
__global__ void rope_kernel(T* dst, const T* src, const int32_t* __restrict__ pos, int N, int Hq, int Hkv, int D,
                            Rope rope) {
  const int half = D / 2;
  const int64_t pairs = int64_t(N) * half;
  for (int64_t t = grid_first(); t < pairs; t += grid_stride()) {
    const int64_t n = t / half;
    const int i = int(t % half);
    // Double throughout, as the CPU: freq by the same function (rope.h), then the angle.
    const double freq = rope_freq(i, D, rope);
    const double a = (kBackward ? -1.0 : 1.0) * double(pos[n]) * freq;
    const double m = rope_magnitude(rope);  // 1, or yarn's attention factor
    const float c = float(m * cos(a)), s = float(m * sin(a));
    const size_t row = size_t(n) * (Hq + 2 * Hkv) * D;
    for (int h = 0; h < Hq + Hkv; h++) {
      const size_t j = row + size_t(h) * D + i;
      const float x1 = to_float(src[j]), x2 = to_float(src[j + half]);
      const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
      if (kBackward) {
        dst[j] = from_float<T>(to_float(dst[j]) + y1);
        dst[j + half] = from_float<T>(to_float(dst[j + half]) + y2);
      } else {
        dst[j] = from_float<T>(y1);
        dst[j + half] = from_float<T>(y2);
      }
    }
    for (int h = Hq + Hkv; h < Hq + 2 * Hkv; h++) {
      const size_t j = row + size_t(h) * D + i;
      if (kBackward) {
        dst[j] = from_float<T>(to_float(dst[j]) + to_float(src[j]));
        dst[j + half] = from_float<T>(to_float(dst[j + half]) + to_float(src[j + half]));
      } else {
        dst[j] = src[j];
        dst[j + half] = src[j + half];
      }
    }
  }
}

template <class T, bool kBackward>
void launch_rope(const char* name, T* dst, const T* src, const int32_t* pos, int N, int Hq, int Hkv, int D,
                 const Rope& rope, cudaStream_t s) {
  const int64_t pairs = int64_t(N) * (D / 2);
  if (pairs == 0) return;  // a grid of no blocks is an invalid launch
  launch(name, rope_kernel<T, kBackward>, dim3(elementwise_blocks(pairs)), dim3(kElementwiseThreads), 0, s, dst, src,
         pos, N, Hq, Hkv, D, rope);
}

}  // namespace

template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope,
                  cudaStream_t s) {
  launch_rope<T, false>("rope_forward", y, qkv, pos, N, Hq, Hkv, D, rope, s);
}

template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, const Rope& rope,
                   cudaStream_t s) {
  launch_rope<T, true>("rope_backward", dqkv, dy, pos, N, Hq, Hkv, D, rope, s);
}

template void rope_forward<float>(float*, const float*, const int32_t*, int, int, int, int, const Rope&,
                                  cudaStream_t);
template void rope_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int, int, int, int,
                                          const Rope&, cudaStream_t);
template void rope_backward<float>(float*, const float*, const int32_t*, int, int, int, int, const Rope&,
                                   cudaStream_t);
template void rope_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int, int, int, int,
                                           const Rope&, cudaStream_t);

}  // namespace cuda
}  // namespace ul
