// Warp-level tensor-core multiply-add, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32:
//   D (16x8, f32) = A (16x16, bf16, row-major) * B (16x8, bf16, "col": stored as B^T rows) + C.
// All 32 lanes of a warp call it together (it is a warp collective), each with its fragments in
// the PTX ISA layout ("Matrix Fragments for mma.m16n8k16 with floating point type"), where
// g = lane / 4 and t = lane % 4, and a .b32 register holds two bf16, the lower index in the low half:
//   A  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B  b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]   (two rows of column g)
//   C  c[0..1] = C[g][2t, 2t+1]  c[2..3] = C[g+8][2t, 2t+1]
// Under nvcc it is the PTX instruction (sm_80 and later). Under the emulator it is a lane-exact
// reference: every lane deposits its fragments in per-warp slots, the warp meets (all 32 lanes),
// each lane computes its four elements of C in float from the bf16 inputs (k in order), and the
// warp meets again before any lane may overwrite its slot with the next call's fragments.
//
// The loaders (ldsm_*) fill fragments from bf16 tiles in shared memory with ldmatrix (below).
// Blocks that use this header are 1-D (the lane is threadIdx.x % 32).
#pragma once
#include <cstdint>
#include <stdexcept>

#include "engine/cuda_launch.h"

// Device code for an older GPU would fail in ptxas with "Feature ... requires sm_80": say it plainly.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "ulysses' kernels need sm_80 or newer (bf16 mma.sync, cp.async): set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

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
#if ULYSSES_CUDA_EMULATED
// A GPU faults on a misaligned 4-byte access; the emulator, where any address would do, throws.
inline void check_bf16x2_alignment(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 4)
    throw std::runtime_error("misaligned 4-byte access to a bf16 pair (an odd element offset)");
}
#endif
// p[0] and p[1] as one register; p must be 4-byte aligned.
__device__ __forceinline__ uint32_t load_bf16x2(const __nv_bfloat16* p) {
#if ULYSSES_CUDA_EMULATED
  check_bf16x2_alignment(p);
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
  check_bf16x2_alignment(p);
  std::memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

#if ULYSSES_CUDA_EMULATED
namespace emu_mma {
// The warp meets as the .aligned instruction does: all 32 lanes, or the emulator reports the warp.
inline void meet_aligned() { ul_emu::warp_collective(ul_emu::Collective::aligned, 0xffffffffu, 0, 0, 32); }

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
  emu_mma::meet_aligned();  // every lane's fragments are in place
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    const int r = g + (i / 2) * 8, n = 2 * t + (i & 1);
    float acc = 0.f;
    for (int k = 0; k < 16; k++) acc += emu_mma::a_elem(w, r, k) * emu_mma::b_elem(w, k, n);
    c[i] += acc;
  }
  emu_mma::meet_aligned();  // every lane has read the slots before the next call overwrites them
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// ---- fragments from shared memory: ldmatrix ------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 loads four 8x8 bf16 matrices in one warp-wide
// instruction: lane 8 i + j names row j of matrix i (16 bytes at a 16-byte aligned shared address),
// and lane l receives in r[i] row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i, exactly
// an A/B fragment register; with .trans it receives column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1
// instead (a row-major tile read as its transpose, which is the B fragment of a row-major B).
// Rows `ld` elements apart with ld / 8 odd (D + 8 for D a multiple of 16) put the 8 row addresses
// of a matrix in 8 different 16-byte groups of banks: no bank conflicts.
#if ULYSSES_CUDA_EMULATED
namespace emu_ldsm {
// Per warp of the block in flight, each lane's row address (thread_local: see emu_mma::slots).
inline const __nv_bfloat16* (&slots())[32][32] {
  static thread_local const __nv_bfloat16* s[32][32];
  return s;
}
}  // namespace emu_ldsm
#endif

template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16* row) {
#if ULYSSES_CUDA_EMULATED
  if (reinterpret_cast<uintptr_t>(row) % 16)
    throw std::runtime_error("ldmatrix: a row address that is not 16-byte aligned");
  if (!::ul_emu::is_shared(row, 16))
    throw std::runtime_error("ldmatrix: a row address outside this block's shared memory (it reads shared memory)");
  const int lane = lane_id(), warp = int(threadIdx.x) / 32;
  const __nv_bfloat16** w = emu_ldsm::slots()[warp];
  w[lane] = row;
  emu_mma::meet_aligned();  // every lane's address is in place
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    const __nv_bfloat16* const* m = w + 8 * i;  // the row addresses of matrix i
    r[i] = kTrans ? pack_bf16x2(m[2 * t][g], m[2 * t + 1][g]) : load_bf16x2(m[g] + 2 * t);
  }
  emu_mma::meet_aligned();  // every lane has read the addresses before the next call overwrites them
#elif defined(__CUDA_ARCH__)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// The A fragment of the 16x16 block whose element (r, k) is A[r * ld + k] (row-major, shared):
// matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a[0..3].
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const __nv_bfloat16* A, int ld) {
  const int l = lane_id();
  ldmatrix_x4<false>(a, A + (l % 16) * ld + (l / 16) * 8);
}
// The B fragments of two adjacent 16x8 blocks (columns n = 0-7 in b[0..1], n = 8-15 in b[2..3]) of
// the 16x16 B whose element (k, n) is Bt[n * ld + k]: B stored as its transpose, like K in Q K^T.
__device__ __forceinline__ void ldsm_b_col_x2(uint32_t b[4], const __nv_bfloat16* Bt, int ld) {
  const int l = lane_id();
  ldmatrix_x4<false>(b, Bt + (l % 8 + 8 * (l / 16)) * ld + 8 * (l / 8 % 2));
}
// The same for a row-major B, element (k, n) at B[k * ld + n], like V in P V: read transposed.
__device__ __forceinline__ void ldsm_b_row_x2(uint32_t b[4], const __nv_bfloat16* B, int ld) {
  const int l = lane_id();
  ldmatrix_x4<true>(b, B + (l % 16) * ld + (l / 16) * 8);
}

}  // namespace cuda
}  // namespace ul

#endif  // __CUDACC__ || ULYSSES_CUDA_EMULATED
