// Warp-level tensor-core multiply-add, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32:
//   D (16x8, f32) = A (16x16, bf16, row-major) * B (16x8, bf16, "col": stored as B^T rows) + C.
// All 32 lanes of a warp call it together (it is a warp collective), each with its fragments in
// the PTX ISA layout ("Matrix Fragments for mma.m16n8k16 with floating point type"), where
// g = lane / 4 and t = lane % 4, and a .b32 register holds two bf16, the lower index in the low half:
//   A  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B  b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]   (two rows of column g)
//   C  c[0..1] = C[g][2t, 2t+1]  c[2..3] = C[g+8][2t, 2t+1]
// Under nvcc it is the PTX instruction (sm_80 and later). Under the emulator it is a lane-exact
// reference: every lane deposits its fragments in per-warp slots, the warp meets at __syncwarp,
// each lane computes its four elements of C in float from the bf16 inputs (k in order), and the
// warp meets again before any lane may overwrite its slot with the next call's fragments.
//
// The loaders fill fragments from a bf16 tile in (shared) memory with plain loads, `ld` elements
// between rows; pairs are read as one 32-bit word, so `ld` and the column offset must be even.
// Blocks that use this header are 1-D (the lane is threadIdx.x % 32).
#pragma once
#include <cstdint>

#include "engine/cuda_launch.h"

#if defined(__CUDACC__) || ULYSSES_CUDA_EMULATED

namespace ul {
namespace cuda {

__device__ __forceinline__ int lane_id() { return int(threadIdx.x) & 31; }

__device__ __forceinline__ uint32_t bf16_bits(__nv_bfloat16 h) {
#if ULYSSES_CUDA_EMULATED
  return h.__x;
#else
  return __bfloat16_as_ushort(h);
#endif
}

// Two bf16 in one register: lo in bits 0..15, hi in bits 16..31.
__device__ __forceinline__ uint32_t pack_bf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return bf16_bits(lo) | (bf16_bits(hi) << 16);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return pack_bf16x2(__float2bfloat16(lo), __float2bfloat16(hi));
}
// p[0] and p[1] as one register; p must be 4-byte aligned.
__device__ __forceinline__ uint32_t load_bf16x2(const __nv_bfloat16* p) {
#if ULYSSES_CUDA_EMULATED
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}
__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float lo, float hi) {
  const uint32_t v = pack_bf16x2(lo, hi);
#if ULYSSES_CUDA_EMULATED
  std::memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

#if ULYSSES_CUDA_EMULATED
namespace emu_mma {
struct LaneFragments {
  uint32_t a[4], b[2];
};
// One slot per lane of each warp of the block in flight: __shared__-like storage (static
// thread_local is one copy per block in flight, see cuda_emu.h). 32 warps: the most a block has.
inline LaneFragments (&slots())[32][32] {
  static thread_local LaneFragments s[32][32];
  return s;
}
inline float lo_bf16(uint32_t v) { return __bfloat162float(__nv_bfloat16{static_cast<unsigned short>(v & 0xffffu)}); }
inline float hi_bf16(uint32_t v) { return __bfloat162float(__nv_bfloat16{static_cast<unsigned short>(v >> 16)}); }
// A[r][k] and B[k][n] read from the lane that holds them, per the layout above.
inline float a_elem(const LaneFragments* w, int r, int k) {
  const int lane = (r % 8) * 4 + (k % 8) / 2;
  const uint32_t v = w[lane].a[(r / 8) + 2 * (k / 8)];
  return (k & 1) ? hi_bf16(v) : lo_bf16(v);
}
inline float b_elem(const LaneFragments* w, int k, int n) {
  const int lane = n * 4 + (k % 8) / 2;
  const uint32_t v = w[lane].b[k / 8];
  return (k & 1) ? hi_bf16(v) : lo_bf16(v);
}
}  // namespace emu_mma
#endif

// c[0..3] += (A * B) elements of this lane; a[4], b[2] are this lane's fragments (layout above).
__device__ __forceinline__ void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if ULYSSES_CUDA_EMULATED
  const int lane = lane_id(), warp = int(threadIdx.x) / 32;
  emu_mma::LaneFragments* w = emu_mma::slots()[warp];
  for (int i = 0; i < 4; i++) w[lane].a[i] = a[i];
  for (int i = 0; i < 2; i++) w[lane].b[i] = b[i];
  __syncwarp();  // every lane's fragments are in place
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    const int r = g + (i / 2) * 8, n = 2 * t + (i & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; k++) acc += emu_mma::a_elem(w, r, k) * emu_mma::b_elem(w, k, n);
    c[i] += acc;
  }
  __syncwarp();  // every lane has read the slots before the next call overwrites them
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// A fragment of the 16x16 block whose element (r, k) is A[r * ld + k] (row-major A).
__device__ __forceinline__ void load_a_frag(uint32_t a[4], const __nv_bfloat16* A, int ld) {
  const int g = lane_id() / 4, t = lane_id() % 4;
  a[0] = load_bf16x2(A + g * ld + 2 * t);
  a[1] = load_bf16x2(A + (g + 8) * ld + 2 * t);
  a[2] = load_bf16x2(A + g * ld + 2 * t + 8);
  a[3] = load_bf16x2(A + (g + 8) * ld + 2 * t + 8);
}
// B fragment of the 16x8 block whose element (k, n) is Bt[n * ld + k] (B stored as its transpose,
// i.e. column-major B: the fast case, pairs are adjacent).
__device__ __forceinline__ void load_b_frag_col(uint32_t b[2], const __nv_bfloat16* Bt, int ld) {
  const int g = lane_id() / 4, t = lane_id() % 4;
  b[0] = load_bf16x2(Bt + g * ld + 2 * t);
  b[1] = load_bf16x2(Bt + g * ld + 2 * t + 8);
}
// B fragment of the 16x8 block whose element (k, n) is B[k * ld + n] (row-major B): each register
// gathers two elements one row apart.
__device__ __forceinline__ void load_b_frag_row(uint32_t b[2], const __nv_bfloat16* B, int ld) {
  const int g = lane_id() / 4, t = lane_id() % 4;
  b[0] = pack_bf16x2(B[(2 * t) * ld + g], B[(2 * t + 1) * ld + g]);
  b[1] = pack_bf16x2(B[(2 * t + 8) * ld + g], B[(2 * t + 9) * ld + g]);
}

}  // namespace cuda
}  // namespace ul

#endif  // __CUDACC__ || ULYSSES_CUDA_EMULATED
