// Flash attention on CUDA (the math is in attention.h; the CPU flash loop it must match is in
// attention.cpp). T is float or __nv_bfloat16; softmax statistics and every sum are float.
//
// Both element types walk the same tiles as the CPU: 64 query rows per block against 64-key tiles
// (causal: key tile kt <= query tile qt), and the two-pass backward: dk/dv per (b, kv head, key
// tile) over the group's query heads and the later query tiles, then dq per (b, head, query tile).
// Every element of dqkv is owned by one thread of one block, so there are no atomics and the
// result does not depend on scheduling (deterministic).
//
// bf16: tensor cores (engine/mma.h, m16n8k16). A block is 4 warps; a warp owns 16 rows of the
//   tile. Its own operand (Q and dout in the forward and dq pass) stays in registers as A fragments
//   for the whole block; the other side streams through shared memory in two stages: cp.async
//   (engine/async_copy.h) copies the next tile in while the tensor cores work on this one. Tile
//   rows are padded by 8 elements so that ldmatrix (the fragment loads, .trans for the row-major B
//   operands) is free of bank conflicts. The dk/dv pass keeps K and V in shared memory too and
//   reads their fragments with ldmatrix per step (in registers they spill at D = 128). The score
//   accumulators are laid out exactly like the A fragment of the next product (P V, P^T dO, dS K,
//   ...), so probabilities go from registers to the tensor cores without shared memory. The
//   softmax row statistics are shared by the 4 lanes of a quad (shuffles). Only the diagonal tile
//   tests visibility element by element; with a document mask, tile pairs that share no document
//   are skipped and pairs inside one document need only the causal test (the CPU's tiles and rule).
// f32: the verification precision, plain FMA: one thread per query row (forward, dq) or key row
//   (dk/dv) with its rows in registers, the other side staged 32 rows at a time in shared memory.
//
// Not yet done for speed: 128-row tiles with 8 warps, skipping fully masked warps on the diagonal,
// warp-specialised producers (TMA, wgmma).
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/async_copy.h"
#include "engine/cuda_launch.h"
#include "engine/mma.h"
#include "layers/scratch_sizes.h"
#include "layers/attention.h"

namespace ul {
namespace cuda {
namespace {

using bf16 = __nv_bfloat16;

// Loops over per-thread arrays (fragments, accumulators, rows) are unrolled so that the arrays can
// live in registers; the emulator runs them as written.
#if defined(__CUDACC__)
#define UL_UNROLL _Pragma("unroll")
#else
#define UL_UNROLL
#endif

constexpr int kTile = 64;     // query rows per block and keys per tile (the CPU's tile too)
constexpr int kWarps = 4;     // bf16 kernels: 4 warps x 16 rows = one tile
constexpr int kFmaRows = 32;  // f32 kernels: rows of the other side staged per step

// Index arithmetic for the packed layouts (as in attention.cpp).
struct Geometry {
  int B, Tn, Hq, Hkv, D, group, nt;
  __host__ __device__ int64_t qkv_stride() const { return int64_t(Hq + 2 * Hkv) * D; }
  __host__ __device__ int64_t out_stride() const { return int64_t(Hq) * D; }
  // token t of packed head `head` (q: h, k: Hq + g, v: Hq + Hkv + g) in qkv
  __host__ __device__ int64_t qkv(int b, int t, int head) const {
    return (int64_t(b) * Tn + t) * qkv_stride() + int64_t(head) * D;
  }
  __host__ __device__ int64_t out(int b, int t, int h) const {
    return (int64_t(b) * Tn + t) * out_stride() + int64_t(h) * D;
  }
  __host__ __device__ int64_t lse(int b, int h, int t) const { return (int64_t(b) * Hq + h) * Tn + t; }
};

// Query q attends to key k: causal, inside the sequence, and in the same document.
__device__ __forceinline__ bool visible(int q, int k, int Tn, const int32_t* docb) {
  return k <= q && q < Tn && (!docb || docb[k] == docb[q]);
}

// ---- document tiles ------------------------------------------------------------------------------
// With a document mask, a pair of tiles whose id ranges do not meet has nothing visible and is
// skipped, and a pair inside one document needs no mask beyond the causal one: the CPU's rule
// (attention.cpp, tile_mask). Ranges are reduced by whole warps, so every warp of a block reaches
// the same decisions without a barrier.
struct DocRange {
  int lo, hi;
};

// The ids of tile `tile`'s rows below T. All 32 lanes of the warp call it together.
__device__ __forceinline__ DocRange doc_range(const int32_t* docb, int tile, int Tn) {
  int lo = INT_MAX, hi = INT_MIN;
  for (int r = tile * kTile + lane_id(); r < min((tile + 1) * kTile, Tn); r += 32) {
    lo = min(lo, docb[r]);
    hi = max(hi, docb[r]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  return {lo, hi};
}
__device__ __forceinline__ bool ranges_meet(DocRange a, DocRange b) { return a.lo <= b.hi && b.lo <= a.hi; }
__device__ __forceinline__ bool one_document(DocRange a, DocRange b) {
  return a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
}

// The key tiles query tile qt walks (forward, dq pass): 0..qt, or with documents only those that
// share one with it (qt itself always does: a query sees itself).
struct KeyTiles {
  const int32_t* docb;
  int qt, Tn;
  DocRange q;
  __device__ KeyTiles(const int32_t* d, int qt_, int Tn_)
      : docb(d), qt(qt_), Tn(Tn_), q(d ? doc_range(d, qt_, Tn_) : DocRange{0, 0}) {}
  // The first tile from kt on to walk; qt + 1 past the last.
  __device__ int next(int kt) const {
    while (docb && kt < qt && !ranges_meet(q, doc_range(docb, kt, Tn))) kt++;
    return kt;
  }
  // Tile kt tests visibility element by element: the diagonal (which also holds any keys past T),
  // and any pair not inside one document.
  __device__ bool masked(int kt) const { return kt == qt || (docb && !one_document(q, doc_range(docb, kt, Tn))); }
};

// ---- bf16 helpers --------------------------------------------------------------------------------

__host__ __device__ constexpr int kLd(int D) { return D + 8; }  // shared tile row, padded so ldmatrix is conflict-free
__host__ __device__ constexpr int kTileElems(int D) { return kTile * kLd(D); }

// Issues the copy of 64 x D elements from global (row r at src + r * stride) into shared memory (row
// r at dst + r * (D + 8)), 16 bytes a cp.async; rows from `valid` on are zero-filled, so that they
// add nothing to a product (a NaN from uninitialised memory would survive a zero probability).
template <int D>
__device__ __forceinline__ void fetch_rows(bf16* dst, const bf16* src, int64_t stride, int valid) {
  constexpr int kVecs = D / 8;
  for (int i = threadIdx.x; i < kTile * kVecs; i += blockDim.x) {
    const int r = i / kVecs, c = (i % kVecs) * 8;
    const bool in = r < valid;
    cp_async<16>(dst + r * kLd(D) + c, in ? src + r * stride + c : src, in ? 16 : 0);
  }
}

// Key tile kt of kv head kvh (K and V, 64 rows each) into stage `stage` of a two-stage buffer
// (stage s: K at smem + 2 s kTileElems, V right after), as one commit group.
template <int D>
__device__ __forceinline__ void fetch_kv_tile(bf16* smem, int stage, const bf16* qkv, const Geometry& G, int b,
                                              int kvh, int kt) {
  bf16* Ks = smem + stage * 2 * kTileElems(D);
  const int k0 = kt * kTile;
  fetch_rows<D>(Ks, qkv + G.qkv(b, k0, G.Hq + kvh), G.qkv_stride(), G.Tn - k0);
  fetch_rows<D>(Ks + kTileElems(D), qkv + G.qkv(b, k0, G.Hq + G.Hkv + kvh), G.qkv_stride(), G.Tn - k0);
  cp_async_commit();
}

// A fragment of rows r0..r0+15, columns col..col+15 of a row-major matrix in global memory (row r
// at base + r * stride); rows from `rows` on read as zero. Plain loads: each warp reads its own
// operand once per block, so staging it through shared memory would buy nothing.
__device__ __forceinline__ void load_a_rows(uint32_t a[4], const bf16* base, int64_t stride, int r0, int rows,
                                            int col) {
  const int g = lane_id() / 4, t = lane_id() % 4;
  const int ra = r0 + g, rb = ra + 8;
  a[0] = ra < rows ? load_bf16x2(base + ra * stride + col + 2 * t) : 0u;
  a[1] = rb < rows ? load_bf16x2(base + rb * stride + col + 2 * t) : 0u;
  a[2] = ra < rows ? load_bf16x2(base + ra * stride + col + 2 * t + 8) : 0u;
  a[3] = rb < rows ? load_bf16x2(base + rb * stride + col + 2 * t + 8) : 0u;
}

// s[j] += A * (B block j) for the 8 key (or query) blocks j of a 16 x 64 score tile, where B's
// element (k, n) is Bt[(8 j + n) * ld + k]: the 64 rows of the staged tile, columns 16 kk.. of D.
__device__ __forceinline__ void mma_row_tile(float (*s)[4], const uint32_t a[4], const bf16* Bt, int ld) {
  UL_UNROLL for (int j = 0; j < 8; j += 2) {
    uint32_t b[4];
    ldsm_b_col_x2(b, Bt + j * 8 * ld, ld);
    mma_m16n8k16_bf16(s[j], a, b);
    mma_m16n8k16_bf16(s[j + 1], a, b + 2);
  }
}

// acc[n] += A * (B block n) for the D / 8 column blocks of a (16, D) accumulator, where B is 16 rows
// of a row-major staged tile (element (k, n) at B[k * ld + n]).
template <int D>
__device__ __forceinline__ void mma_col_tile(float (*acc)[4], const uint32_t a[4], const bf16* B, int ld) {
  UL_UNROLL for (int n = 0; n < D / 8; n += 2) {
    uint32_t b[4];
    ldsm_b_row_x2(b, B + n * 8, ld);
    mma_m16n8k16_bf16(acc[n], a, b);
    mma_m16n8k16_bf16(acc[n + 1], a, b + 2);
  }
}

// The accumulators of key (or query) columns 16 kk .. 16 kk + 15 of a 16 x 64 score tile, as the A
// fragment of a product over those columns: n-tiles 2 kk and 2 kk + 1 hold exactly the elements
// the A layout gives this lane (rows g, g + 8; columns 2t, 2t + 1 and 2t + 8, 2t + 9).
__device__ __forceinline__ void scores_as_a(uint32_t a[4], float (*s)[4], int kk) {
  a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// p[0..1] += (lo, hi), rounded once to bf16.
__device__ __forceinline__ void add_bf16x2(bf16* p, float lo, float hi) {
  store_bf16x2(p, to_float(p[0]) + lo, to_float(p[1]) + hi);
}

// ---- forward ---------------------------------------------------------------------------------------

// grid (nt, Hq, B), block 128; smem: two stages of (K tile, V tile), 4 x 64 x (D + 8) bf16, so the
// next key tile is copied in (cp.async) while the tensor cores work on this one.
// out: (B, T, Hq, D), lse: (B, Hq, T), qkv: (B, T, Hq + 2 Hkv, D)
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_mma_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                                 const int32_t* __restrict__ doc, Geometry G, float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D);
  UL_DYNAMIC_SMEM(bf16, smem);  // stage s: K tile at smem + 2 s kElems, its V tile right after
  const int qt = G.nt - 1 - int(blockIdx.x);  // later query tiles walk more keys: start them first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int q0 = qt * kTile;
  const int rows[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};  // this lane's query rows
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const float ninf = -INFINITY;

  const KeyTiles tiles(docb, qt, G.Tn);
  int kt = tiles.next(0);
  fetch_kv_tile<D>(smem, 0, qkv, G, b, kvh, kt);

  uint32_t qf[D / 16][4];  // Q rows of the warp, (16, D) as D / 16 A fragments
  UL_UNROLL for (int kk = 0; kk < D / 16; kk++)
    load_a_rows(qf[kk], qkv + G.qkv(b, 0, h), G.qkv_stride(), q0 + warp * 16, G.Tn, kk * 16);

  float o[D / 8][4] = {};  // unnormalised output rows, (16, D) as D / 8 accumulator tiles
  float m[2] = {ninf, ninf}, l[2] = {0.f, 0.f};  // running max; this lane's share of the running sum
  for (int step = 0; kt <= qt; step++) {
    const int next = tiles.next(kt + 1);
    if (next <= qt) {
      fetch_kv_tile<D>(smem, (step + 1) & 1, qkv, G, b, kvh, next);
      cp_async_wait<1>();  // all but the newest group: tile kt has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // ... from every thread's copies
    const bf16* Ks = smem + (step & 1) * 2 * kElems;
    const bf16* Vs = Ks + kElems;
    const int k0 = kt * kTile;

    float s[8][4] = {};  // S = Q K^T, (16, 64)
    UL_UNROLL for (int kk = 0; kk < D / 16; kk++) mma_row_tile(s, qf[kk], Ks + kk * 16, LD);
    const bool masked = tiles.masked(kt);
    float mx[2] = {ninf, ninf};
    UL_UNROLL for (int j = 0; j < 8; j++)
      UL_UNROLL for (int e = 0; e < 4; e++) {
        const int k = k0 + j * 8 + 2 * t + (e & 1);
        s[j][e] = !masked || visible(rows[e / 2], k, G.Tn, docb) ? s[j][e] * scale : ninf;
        mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
      }
    float alpha[2], sum[2] = {0.f, 0.f};
    UL_UNROLL for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));  // the quad holds the row
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = m_new == ninf ? 1.f : __expf(m[r] - m_new);  // nothing visible yet: nothing to rescale
      m[r] = m_new;
    }
    UL_UNROLL for (int j = 0; j < 8; j++)
      UL_UNROLL for (int e = 0; e < 4; e++) {
        const int r = e / 2;
        s[j][e] = m[r] == ninf ? 0.f : __expf(s[j][e] - m[r]);  // masked: exp(-inf) = 0
        sum[r] += s[j][e];
      }
    UL_UNROLL for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
    UL_UNROLL for (int n = 0; n < D / 8; n++)
      UL_UNROLL for (int e = 0; e < 4; e++) o[n][e] *= alpha[e / 2];

    UL_UNROLL for (int kk = 0; kk < kTile / 16; kk++) {  // O += P V: P (16, 64) in registers, V (64, D) staged
      uint32_t ap[4];
      scores_as_a(ap, s, kk);
      mma_col_tile<D>(o, ap, Vs + kk * 16 * LD, LD);
    }
    __syncthreads();  // every warp is done with this stage before the step after next refills it
    kt = next;
  }

  UL_UNROLL for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int q = rows[r];
    if (q >= G.Tn) continue;
    // Every query sees at least itself, so l > 0.
    bf16* orow = out + G.out(b, q, h);
    UL_UNROLL for (int n = 0; n < D / 8; n++)
      store_bf16x2(orow + n * 8 + 2 * t, o[n][2 * r] / l[r], o[n][2 * r + 1] / l[r]);
    if (t == 0) lse[G.lse(b, h, q)] = m[r] + logf(l[r]);
  }
}

// grid (nt, Hq, B), block 64 (thread = query row); smem: K and V rows, 2 x 32 x D floats.
template <int D>
__global__ void __launch_bounds__(kTile)
    attention_forward_fma_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ qkv,
                                 const int32_t* __restrict__ doc, Geometry G, float scale) {
  UL_DYNAMIC_SMEM(float, smem);
  float* Ks = smem;                  // (32, D)
  float* Vs = smem + kFmaRows * D;   // (32, D)
  const int qt = G.nt - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int q0 = qt * kTile, q = q0 + threadIdx.x;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const float ninf = -INFINITY;

  float qr[D], acc[D];
  UL_UNROLL for (int c = 0; c < D; c++) {
    qr[c] = q < G.Tn ? qkv[G.qkv(b, q, h) + c] : 0.f;
    acc[c] = 0.f;
  }
  float m = ninf, l = 0.f;
  const int kend = min(q0 + kTile, G.Tn);  // keys this block can see
  for (int k0 = 0; k0 < kend; k0 += kFmaRows) {
    __syncthreads();
    for (int i = threadIdx.x; i < kFmaRows * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      const bool in = k0 + r < G.Tn;
      Ks[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + kvh) + c] : 0.f;
      Vs[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + G.Hkv + kvh) + c] : 0.f;
    }
    __syncthreads();
    float s[kFmaRows], mx = ninf;
    UL_UNROLL for (int j = 0; j < kFmaRows; j++) {
      s[j] = ninf;
      if (!visible(q, k0 + j, G.Tn, docb)) continue;
      float dot = 0.f;
      UL_UNROLL for (int c = 0; c < D; c++) dot += qr[c] * Ks[j * D + c];
      s[j] = dot * scale;
      mx = fmaxf(mx, s[j]);
    }
    const float m_new = fmaxf(m, mx);
    if (m_new == ninf) continue;  // nothing visible yet
    const float alpha = expf(m - m_new);
    m = m_new;
    l *= alpha;
    UL_UNROLL for (int c = 0; c < D; c++) acc[c] *= alpha;
    UL_UNROLL for (int j = 0; j < kFmaRows; j++) {
      if (s[j] == ninf) continue;
      const float p = expf(s[j] - m);
      l += p;
      UL_UNROLL for (int c = 0; c < D; c++) acc[c] += p * Vs[j * D + c];
    }
  }
  if (q >= G.Tn) return;
  UL_UNROLL for (int c = 0; c < D; c++) out[G.out(b, q, h) + c] = acc[c] / l;
  lse[G.lse(b, h, q)] = m + logf(l);
}

// ---- backward ----------------------------------------------------------------------------------

// Di[b, h, t] = sum_c dout * out over the row (b, t, h). One warp per row, 8 rows per block.
template <class T>
__global__ void attention_rowdot_kernel(float* __restrict__ Di, const T* __restrict__ dout, const T* __restrict__ out,
                                        Geometry G) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;  // (b, t, h) in out's order
  if (row >= int64_t(G.B) * G.Tn * G.Hq) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  float s = 0.f;
  for (int c = lane; c < G.D; c += 32) s += to_float(dout[row * G.D + c]) * to_float(out[row * G.D + c]);
  s = warp_sum(s);
  const int h = int(row % G.Hq), t = int(row / G.Hq % G.Tn), b = int(row / G.Hq / G.Tn);
  if (lane == 0) Di[G.lse(b, h, t)] = s;
}

// Pass 1, bf16. grid (nt, Hkv, B), block 128; warp w owns keys k0 + 16 w .. + 15 of the tile.
// smem: the block's K and V tiles (2 x 64 x (D + 8) bf16, read as A fragments by ldmatrix); two
// stages of (Q tile, dout tile) (4 x 64 x (D + 8) bf16), then two stages of the tile's queries' lse
// and Di (4 x 64 f32). The block walks (query head of the group, query tile from kt on) in order,
// fetching step i + 1 while it multiplies step i.
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    attention_backward_dkv_mma_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                      const float* __restrict__ lse, const float* __restrict__ Di,
                                      const bf16* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                      float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D);
  UL_DYNAMIC_SMEM(bf16, smem);
  const bf16* Ks = smem;          // (64, LD)
  const bf16* Vs = smem + kElems;  // (64, LD)
  // stage s: Q at smem + (2 + 2 s) kElems, dout after it; lse at stats + 2 s 64, Di after it
  float* stats = reinterpret_cast<float*>(smem + 6 * kElems);
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int k0 = kt * kTile;
  const int keys[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};  // this lane's key rows
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const int nqt = G.nt - kt, steps = G.group * nqt;  // earlier query tiles see none of these keys
  // Step i is query head kvh * group + i / nqt, query tile kt + i % nqt. With documents, the steps
  // whose query tile shares none with the key tile are skipped (the diagonal always shares one).
  const DocRange kr = docb ? doc_range(docb, kt, G.Tn) : DocRange{0, 0};
  auto next_step = [&](int i) {
    while (docb && i < steps && i % nqt != 0 && !ranges_meet(doc_range(docb, kt + i % nqt, G.Tn), kr)) i++;
    return i;
  };

  fetch_rows<D>(smem, qkv + G.qkv(b, k0, G.Hq + kvh), G.qkv_stride(), G.Tn - k0);
  fetch_rows<D>(smem + kElems, qkv + G.qkv(b, k0, G.Hq + G.Hkv + kvh), G.qkv_stride(), G.Tn - k0);
  auto fetch = [&](int i, int stage) {  // step i as one commit group (the first also has K and V)
    const int h = kvh * G.group + i / nqt, q0 = (kt + i % nqt) * kTile, nq = min(kTile, G.Tn - q0);
    bf16* Qs = smem + (2 + 2 * stage) * kElems;
    fetch_rows<D>(Qs, qkv + G.qkv(b, q0, h), G.qkv_stride(), nq);
    fetch_rows<D>(Qs + kElems, dout + G.out(b, q0, h), G.out_stride(), nq);
    float* st = stats + stage * 2 * kTile;
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
      const int64_t at = G.lse(b, h, q0 + (r < nq ? r : 0));
      cp_async<4>(st + r, lse + at, r < nq ? 4 : 0);  // queries past T: zero
      cp_async<4>(st + kTile + r, Di + at, r < nq ? 4 : 0);
    }
    cp_async_commit();
  };
  fetch(0, 0);  // step 0 is a diagonal one

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};  // (16, D) each
  for (int i = 0, step = 0; i < steps; step++) {
    const int next = next_step(i + 1);
    if (next < steps) {
      fetch(next, (step + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int qt = kt + i % nqt, q0 = qt * kTile;
    const bf16* Qs = smem + (2 + 2 * (step & 1)) * kElems;
    const bf16* dOs = Qs + kElems;
    const float* lse_s = stats + (step & 1) * 2 * kTile;
    const float* Di_s = lse_s + kTile;

    float pt[8][4] = {}, dst[8][4] = {};  // S^T = K Q^T and dP^T = V dout^T, (16 keys, 64 queries)
    UL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
      uint32_t ak[4], av[4];
      ldsm_a(ak, Ks + warp * 16 * LD + kk * 16, LD);
      ldsm_a(av, Vs + warp * 16 * LD + kk * 16, LD);
      mma_row_tile(pt, ak, Qs + kk * 16, LD);
      mma_row_tile(dst, av, dOs + kk * 16, LD);
    }
    // The diagonal tile, a tile with queries past T, and pairs not inside one document mask.
    const bool masked =
        qt == kt || q0 + kTile > G.Tn || (docb && !one_document(doc_range(docb, qt, G.Tn), kr));
    UL_UNROLL for (int j = 0; j < 8; j++)
      UL_UNROLL for (int e = 0; e < 4; e++) {
        const int qi = j * 8 + 2 * t + (e & 1);
        const bool see = !masked || visible(q0 + qi, keys[e / 2], G.Tn, docb);
        const float p = see ? __expf(pt[j][e] * scale - lse_s[qi]) : 0.f;
        pt[j][e] = p;                             // P^T
        dst[j][e] = p * (dst[j][e] - Di_s[qi]);   // dS^T
      }
    UL_UNROLL for (int kk = 0; kk < kTile / 16; kk++) {  // dV += P^T dout, dK += dS^T Q (over queries)
      uint32_t ap[4], ads[4];
      scores_as_a(ap, pt, kk);
      scores_as_a(ads, dst, kk);
      mma_col_tile<D>(dv, ap, dOs + kk * 16 * LD, LD);
      mma_col_tile<D>(dk, ads, Qs + kk * 16 * LD, LD);
    }
    __syncthreads();  // this stage is free for the step after next
    i = next;
  }

  UL_UNROLL for (int r = 0; r < 2; r++) {
    if (keys[r] >= G.Tn) continue;
    bf16* dkrow = dqkv + G.qkv(b, keys[r], G.Hq + kvh);
    bf16* dvrow = dqkv + G.qkv(b, keys[r], G.Hq + G.Hkv + kvh);
    UL_UNROLL for (int n = 0; n < D / 8; n++) {
      add_bf16x2(dkrow + n * 8 + 2 * t, dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
      add_bf16x2(dvrow + n * 8 + 2 * t, dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

// Pass 2, bf16. grid (nt, Hq, B), block 128; warp w owns query rows q0 + 16 w .. + 15.
// smem: two stages of (K tile, V tile), 4 x 64 x (D + 8) bf16, double-buffered as in the forward.
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    attention_backward_dq_mma_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ Di,
                                     const bf16* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                     float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D);
  UL_DYNAMIC_SMEM(bf16, smem);  // stage s: K tile at smem + 2 s kElems, its V tile right after
  const int qt = G.nt - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int q0 = qt * kTile;
  const int rows[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  const KeyTiles tiles(docb, qt, G.Tn);
  int kt = tiles.next(0);
  fetch_kv_tile<D>(smem, 0, qkv, G, b, kvh, kt);

  uint32_t qf[D / 16][4], of[D / 16][4];  // Q and dout rows of the warp, (16, D) each
  UL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
    load_a_rows(qf[kk], qkv + G.qkv(b, 0, h), G.qkv_stride(), q0 + warp * 16, G.Tn, kk * 16);
    load_a_rows(of[kk], dout + G.out(b, 0, h), G.out_stride(), q0 + warp * 16, G.Tn, kk * 16);
  }
  float lse_r[2], Di_r[2];
  UL_UNROLL for (int r = 0; r < 2; r++) {
    lse_r[r] = rows[r] < G.Tn ? lse[G.lse(b, h, rows[r])] : 0.f;
    Di_r[r] = rows[r] < G.Tn ? Di[G.lse(b, h, rows[r])] : 0.f;
  }
  float dq[D / 8][4] = {};  // (16, D)
  for (int step = 0; kt <= qt; step++) {
    const int next = tiles.next(kt + 1);
    if (next <= qt) {
      fetch_kv_tile<D>(smem, (step + 1) & 1, qkv, G, b, kvh, next);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* Ks = smem + (step & 1) * 2 * kElems;
    const bf16* Vs = Ks + kElems;
    const int k0 = kt * kTile;

    float s[8][4] = {}, dp[8][4] = {};  // S = Q K^T, dP = dout V^T, (16, 64)
    UL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
      mma_row_tile(s, qf[kk], Ks + kk * 16, LD);
      mma_row_tile(dp, of[kk], Vs + kk * 16, LD);
    }
    const bool masked = tiles.masked(kt);
    UL_UNROLL for (int j = 0; j < 8; j++)
      UL_UNROLL for (int e = 0; e < 4; e++) {
        const int r = e / 2, k = k0 + j * 8 + 2 * t + (e & 1);
        const bool see = !masked || visible(rows[r], k, G.Tn, docb);
        const float p = see ? __expf(s[j][e] * scale - lse_r[r]) : 0.f;
        s[j][e] = p * (dp[j][e] - Di_r[r]);  // dS
      }
    UL_UNROLL for (int kk = 0; kk < kTile / 16; kk++) {  // dQ += dS K (over keys)
      uint32_t ads[4];
      scores_as_a(ads, s, kk);
      mma_col_tile<D>(dq, ads, Ks + kk * 16 * LD, LD);
    }
    __syncthreads();
    kt = next;
  }
  UL_UNROLL for (int r = 0; r < 2; r++) {
    if (rows[r] >= G.Tn) continue;
    bf16* dqrow = dqkv + G.qkv(b, rows[r], h);
    UL_UNROLL for (int n = 0; n < D / 8; n++)
      add_bf16x2(dqrow + n * 8 + 2 * t, dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale);
  }
}

// Pass 1, f32. grid (nt, Hkv, B), block 64 (thread = key row); smem: Q and dout rows
// (2 x 32 x D), then their lse and Di (2 x 32).
template <int D>
__global__ void __launch_bounds__(kTile)
    attention_backward_dkv_fma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                      const float* __restrict__ lse, const float* __restrict__ Di,
                                      const float* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                      float scale) {
  UL_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;                    // (32, D)
  float* dOs = smem + kFmaRows * D;    // (32, D)
  float* lse_s = dOs + kFmaRows * D;   // (32)
  float* Di_s = lse_s + kFmaRows;      // (32)
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int key = kt * kTile + threadIdx.x;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  float kr[D], vr[D], dk[D], dv[D];
  UL_UNROLL for (int c = 0; c < D; c++) {
    kr[c] = key < G.Tn ? qkv[G.qkv(b, key, G.Hq + kvh) + c] : 0.f;
    vr[c] = key < G.Tn ? qkv[G.qkv(b, key, G.Hq + G.Hkv + kvh) + c] : 0.f;
    dk[c] = dv[c] = 0.f;
  }
  for (int h = kvh * G.group; h < (kvh + 1) * G.group; h++)
    for (int q0 = kt * kTile; q0 < G.Tn; q0 += kFmaRows) {  // earlier queries see none of these keys
      __syncthreads();
      for (int i = threadIdx.x; i < kFmaRows * D; i += blockDim.x) {
        const int r = i / D, c = i % D;
        const bool in = q0 + r < G.Tn;
        Qs[i] = in ? qkv[G.qkv(b, q0 + r, h) + c] : 0.f;
        dOs[i] = in ? dout[G.out(b, q0 + r, h) + c] : 0.f;
      }
      for (int i = threadIdx.x; i < kFmaRows; i += blockDim.x) {
        lse_s[i] = q0 + i < G.Tn ? lse[G.lse(b, h, q0 + i)] : 0.f;
        Di_s[i] = q0 + i < G.Tn ? Di[G.lse(b, h, q0 + i)] : 0.f;
      }
      __syncthreads();
      for (int i = 0; i < kFmaRows; i++) {
        if (!visible(q0 + i, key, G.Tn, docb)) continue;
        const float* qi = Qs + i * D;
        const float* oi = dOs + i * D;
        float s = 0.f, dp = 0.f;
        UL_UNROLL for (int c = 0; c < D; c++) {
          s += kr[c] * qi[c];
          dp += vr[c] * oi[c];
        }
        const float p = expf(s * scale - lse_s[i]);
        const float ds = p * (dp - Di_s[i]);
        UL_UNROLL for (int c = 0; c < D; c++) {
          dv[c] += p * oi[c];
          dk[c] += ds * qi[c];
        }
      }
    }
  if (key >= G.Tn) return;
  float* dkrow = dqkv + G.qkv(b, key, G.Hq + kvh);
  float* dvrow = dqkv + G.qkv(b, key, G.Hq + G.Hkv + kvh);
  UL_UNROLL for (int c = 0; c < D; c++) {
    dkrow[c] += dk[c] * scale;
    dvrow[c] += dv[c];
  }
}

// Pass 2, f32. grid (nt, Hq, B), block 64 (thread = query row); smem: K and V rows, 2 x 32 x D.
template <int D>
__global__ void __launch_bounds__(kTile)
    attention_backward_dq_fma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ Di,
                                     const float* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                     float scale) {
  UL_DYNAMIC_SMEM(float, smem);
  float* Ks = smem;                 // (32, D)
  float* Vs = smem + kFmaRows * D;  // (32, D)
  const int qt = G.nt - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int q0 = qt * kTile, q = q0 + threadIdx.x;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  float qr[D], orow[D], dq[D];
  UL_UNROLL for (int c = 0; c < D; c++) {
    qr[c] = q < G.Tn ? qkv[G.qkv(b, q, h) + c] : 0.f;
    orow[c] = q < G.Tn ? dout[G.out(b, q, h) + c] : 0.f;
    dq[c] = 0.f;
  }
  const float lse_q = q < G.Tn ? lse[G.lse(b, h, q)] : 0.f, Di_q = q < G.Tn ? Di[G.lse(b, h, q)] : 0.f;
  const int kend = min(q0 + kTile, G.Tn);
  for (int k0 = 0; k0 < kend; k0 += kFmaRows) {
    __syncthreads();
    for (int i = threadIdx.x; i < kFmaRows * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      const bool in = k0 + r < G.Tn;
      Ks[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + kvh) + c] : 0.f;
      Vs[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + G.Hkv + kvh) + c] : 0.f;
    }
    __syncthreads();
    for (int j = 0; j < kFmaRows; j++) {
      if (!visible(q, k0 + j, G.Tn, docb)) continue;
      const float* kj = Ks + j * D;
      const float* vj = Vs + j * D;
      float s = 0.f, dp = 0.f;
      UL_UNROLL for (int c = 0; c < D; c++) {
        s += qr[c] * kj[c];
        dp += orow[c] * vj[c];
      }
      const float ds = expf(s * scale - lse_q) * (dp - Di_q);
      UL_UNROLL for (int c = 0; c < D; c++) dq[c] += ds * kj[c];
    }
  }
  if (q >= G.Tn) return;
  float* dqrow = dqkv + G.qkv(b, q, h);
  UL_UNROLL for (int c = 0; c < D; c++) dqrow[c] += dq[c] * scale;
}

// ---- host side -----------------------------------------------------------------------------------

Geometry geometry(int B, int Tn, int Hq, int Hkv, int D) {
  if (B < 0 || Tn < 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    throw std::invalid_argument("attention (CUDA): bad shape B=" + std::to_string(B) + " T=" + std::to_string(Tn) +
                                " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv));
  if (!attention_supports_head_dim(D))
    throw std::invalid_argument("attention (CUDA): head dim D = " + std::to_string(D) +
                                " is not supported; the CUDA kernels are built for D = 32, 64 or 128");
  return Geometry{B, Tn, Hq, Hkv, D, Hq / Hkv, int(ceil_div(Tn, kTile))};
}

// f(std::integral_constant<int, D>) for the supported head dims.
template <class F>
void with_head_dim(int D, F&& f) {
  switch (D) {
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default: break;
  }
  throw std::invalid_argument("attention (CUDA): head dim D = " + std::to_string(D) + " is not supported");
}

// Two stages of two tiles (forward, dq); the dk/dv pass adds its K and V tiles and the statistics.
constexpr size_t mma_stages_smem(int D) { return size_t(4) * kTileElems(D) * sizeof(bf16); }
constexpr size_t mma_dkv_smem(int D) { return size_t(6) * kTileElems(D) * sizeof(bf16) + 4 * kTile * sizeof(float); }
constexpr size_t fma_rows_smem(int D) { return size_t(2) * kFmaRows * D * sizeof(float); }

// A launch with over 48 KiB of dynamic shared memory must raise the kernel's limit first.
template <class K>
void allow_smem(K* kernel, size_t bytes) {
  if (bytes > (48u << 10))
    UL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Scaled as the CPU scales: 1 / sqrt(D) in float.
float softmax_scale(int D) { return 1.0f / sqrtf(float(D)); }

}  // namespace

bool attention_supports_head_dim(int D) { return D == 32 || D == 64 || D == 128; }

size_t attention_backward_scratch_bytes(int B, int Tn, int Hq) { return scratch::attention_backward(B, Tn, Hq); }

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const int32_t* doc, int B, int Tn, int Hq, int Hkv, int D,
                       cudaStream_t s) {
  const Geometry G = geometry(B, Tn, Hq, Hkv, D);
  if (B == 0 || Tn == 0) return;  // a grid of no blocks is an invalid launch
  const dim3 grid(G.nt, Hq, B);
  const float scale = softmax_scale(D);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if constexpr (std::is_same<T, float>::value)
      launch("attention_forward_fma", attention_forward_fma_kernel<kD>, grid, dim3(kTile), fma_rows_smem(kD), s, out,
             lse, qkv, doc, G, scale);
    else {
      allow_smem(attention_forward_mma_kernel<kD>, mma_stages_smem(kD));
      launch("attention_forward_mma", attention_forward_mma_kernel<kD>, grid, dim3(kWarps * 32), mma_stages_smem(kD),
             s, out, lse, qkv, doc, G, scale);
    }
  });
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, const int32_t* doc,
                        float* scratch, int B, int Tn, int Hq, int Hkv, int D, cudaStream_t s) {
  const Geometry G = geometry(B, Tn, Hq, Hkv, D);
  if (B == 0 || Tn == 0) return;
  float* Di = scratch;  // (B, Hq, T)
  launch("attention_rowdot", attention_rowdot_kernel<T>, dim3(ceil_div(int64_t(B) * Tn * Hq, 8)), dim3(256), 0, s, Di,
         dout, out, G);
  const float scale = softmax_scale(D);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if constexpr (std::is_same<T, float>::value) {
      launch("attention_backward_dkv_fma", attention_backward_dkv_fma_kernel<kD>, dim3(G.nt, Hkv, B), dim3(kTile),
             fma_rows_smem(kD) + 2 * kFmaRows * sizeof(float), s, dqkv, dout, lse, Di, qkv, doc, G, scale);
      launch("attention_backward_dq_fma", attention_backward_dq_fma_kernel<kD>, dim3(G.nt, Hq, B), dim3(kTile),
             fma_rows_smem(kD), s, dqkv, dout, lse, Di, qkv, doc, G, scale);
    } else {
      allow_smem(attention_backward_dkv_mma_kernel<kD>, mma_dkv_smem(kD));
      launch("attention_backward_dkv_mma", attention_backward_dkv_mma_kernel<kD>, dim3(G.nt, Hkv, B),
             dim3(kWarps * 32), mma_dkv_smem(kD), s, dqkv, dout, lse, Di, qkv, doc, G, scale);
      allow_smem(attention_backward_dq_mma_kernel<kD>, mma_stages_smem(kD));
      launch("attention_backward_dq_mma", attention_backward_dq_mma_kernel<kD>, dim3(G.nt, Hq, B), dim3(kWarps * 32),
             mma_stages_smem(kD), s, dqkv, dout, lse, Di, qkv, doc, G, scale);
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int, int, int,
                                       cudaStream_t);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const int32_t*, int, int,
                                               int, int, int, cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*,
                                        const int32_t*, float*, int, int, int, int, int, cudaStream_t);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                const float*, const __nv_bfloat16*, const int32_t*, float*, int, int,
                                                int, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
