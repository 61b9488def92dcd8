// The pieces both halves of the CUDA flash attention share (attention_forward.cu and
// attention_backward.cu): tile geometry, the document-tile rule, the shared-memory staging and the
// tensor-core fragment helpers, and the host-side launch helpers.
//
// Flash attention on CUDA (the math is in attention.h; the CPU flash loop it must match is in
// attention.cpp). T is float or __nv_bfloat16; softmax statistics and every sum are float.
//
// The bf16 kernels walk the CPU's tiles, with its skipping rule: 64-row query tiles against 64-key
// tiles (causal: key tile kt <= query tile qt); the f32 kernels take 64 query rows per block but
// step over keys 32 at a time, skipping only what the window excludes. Both use the two-pass backward: dk/dv per (b, kv head, key
// tile) over the group's query heads and the later query tiles, then dq per (b, head, query block).
// A bf16 forward or dq block takes one query tile (4 warps, the default) or two (8 warps; see
// set_attention_query_rows): each row still meets the same key tiles in the same order, and a warp
// skips a key tile whose keys all come after its rows, so both give the same bits.
// Every element of dqkv is owned by one thread of one block, so there are no atomics and the
// result does not depend on scheduling (deterministic).
//
// bf16: tensor cores (engine/mma.h, m16n8k16). A dk/dv block is 4 warps, a forward or dq block 4
//   or 8 (set_attention_query_rows); a warp owns 16 rows of the tile. Its own operand (Q and dout in the forward and dq pass) stays in registers as A fragments
//   for the whole block; the other side streams through shared memory in two stages: cp.async
//   (engine/async_copy.h) copies the next tile in while the tensor cores work on this one. Tile
//   rows are padded by 8 elements so that ldmatrix (the fragment loads, .trans for the row-major B
//   operands) is free of bank conflicts. The dk/dv pass keeps K and V in shared memory too and
//   reads their fragments with ldmatrix per step (in registers they spill at D = 128). The score
//   accumulators are laid out exactly like the A fragment of the next product (P V, P^T dO, dS K,
//   ...), so probabilities go from registers to the tensor cores without shared memory. The
//   softmax row statistics are shared by the 4 lanes of a quad (shuffles). Visibility is tested
//   element by element only where a tile needs it (KeyTiles::masked): the diagonal, a tile at the
//   window's edge, a dk/dv tile whose queries run past T, a pair not inside one document; tile pairs
//   that share no document are skipped (the CPU's tiles and rule), and with rising ids never visited
//   (KeyTiles, first_tile);
//   with a sliding window, tiles wholly older than it are never visited (O(T W) work, not O(T^2)).
// f32: the verification precision, plain FMA: a query row (forward, dq) or key row (dk/dv) per
//   group of S consecutive lanes (FmaSplit), its rows in registers, split over the group's lanes
//   so that no head dim spills; the other side staged 32 rows at a time in shared memory.
//
// Not yet done for speed: 32 rows per warp (FlashAttention-2's layout: half the ldmatrix reads per
// tensor-core instruction), warp-specialised producers (TMA, wgmma).
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/async_copy.h"
#include "engine/cuda_launch.h"
#include "engine/mma.h"
#include "layers/attention.h"

namespace ul {
namespace cuda {
namespace attn {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;     // keys per tile, and the query rows of each step of the dk/dv pass (the CPU's tile too)
constexpr int kWarps = 4;     // bf16 dk/dv pass: 4 warps x 16 keys = one tile
constexpr int kFmaRows = 32;  // f32 kernels: rows of the other side staged per step

// Index arithmetic for the packed layouts (as in attention.cpp), and the sliding window.
struct Geometry {
  int B, Tn, Hq, Hkv, D, group, nt;
  int window;  // 0: none; W: query q sees keys q - W < k <= q
  // The earliest key query q sees (without documents), and the last query that sees key k.
  __host__ __device__ int first_key(int q) const { return window ? max(0, q - window + 1) : 0; }
  __host__ __device__ int last_query(int k) const { return window ? min(Tn - 1, k + window - 1) : Tn - 1; }
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

// The larger of a and b, or NaN when either is NaN, and NaN from then on: fmaxf drops a NaN, and a
// NaN score alone in a row's tile (a document starting at the tile's last key) once read as
// "nothing visible", a finite wrong output where the CPU's shows NaN.
__device__ __forceinline__ float max_keep_nan(float a, float b) { return (b > a || b != b) ? b : a; }

// Query q attends to key k: causal, inside the sequence, in the same document and the window.
__device__ __forceinline__ bool visible(int q, int k, const Geometry& G, const int32_t* docb) {
  return k <= q && q < G.Tn && (!docb || docb[k] == docb[q]) && (!G.window || q - k < G.window);
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

// Rising ids (each document one run of positions, as packing makes them): falls[b], set by
// doc_falls_kernel, is 0 for such a sequence. Then a tile's documents lie in a run of tiles found
// by bisection, where testing every earlier tile's ids cost more than the work at long T (T = 64K
// of 2K-token documents: hundreds of tiles walked, a few dozen multiplied).
// pairs: the B (T - 1) neighbours (t, t + 1) inside a sequence; falls zeroed before. (static: each
// .cu that includes this has its own.)
static __global__ void doc_falls_kernel(int* __restrict__ falls, const int32_t* __restrict__ doc, int Tn,
                                        int64_t pairs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (Tn - 1), t = b * Tn + i % (Tn - 1);
    if (doc[t + 1] < doc[t]) atomicExch(falls + b, 1);
  }
}

// The first tile j in [lo, hi) for which reached(j) holds (hi if none), where reached holds for
// every tile after one it holds for. 32 probes a round, one a lane: a range of n tiles takes
// log32(n) rounds (3 at T = 1M). All 32 lanes of the warp call it together.
template <class F>
__device__ __forceinline__ int first_tile(int lo, int hi, F reached) {
  while (lo < hi) {
    const int step = (hi - lo + 31) / 32, p = lo + lane_id() * step;
    const unsigned probed = __ballot_sync(0xffffffffu, p < hi);
    const unsigned hit = __ballot_sync(0xffffffffu, p < hi && reached(p));
    const int misses = __popc(probed & ~hit), probes = __popc(probed);  // misses: the probes before a hit
    if (misses < probes) hi = lo + misses * step;   // the first probe that hit
    if (misses > 0) lo += (misses - 1) * step + 1;  // past the last probe that missed
  }
  return lo;
}

// The key tiles a block of query rows q0 .. q0 + rows - 1 walks (forward, dq pass; q0 a multiple
// of the tile, rows one or two tiles): from the tile of the first row's earliest key (0 without a
// window) to last, the tile of its last row below T, with documents only those that share one
// with its rows (with rising ids, walked from the tile where the rows' first document begins).
// The tiles from first = q0 / 64 on are always walked: each holds keys that its own rows see (a
// query sees itself).
struct KeyTiles {
  const int32_t* docb;
  int begin, first, last, Tn;
  int window_end;  // tiles below it hold keys that leave the last row's window (masked); 0: none do
  DocRange q;  // the ids of the block's rows
  __device__ KeyTiles(const int32_t* d, bool rising, int q0, int rows, const Geometry& G)
      : docb(d), begin(G.first_key(q0) / kTile), first(q0 / kTile), last((min(q0 + rows, G.Tn) - 1) / kTile),
        Tn(G.Tn), window_end(G.window ? (G.first_key(q0 + rows - 1) + kTile - 1) / kTile : 0), q{0, 0} {
    if (!d) return;
    q = doc_range(d, first, Tn);
    for (int t = first + 1; t <= last; t++) {
      const DocRange r = doc_range(d, t, Tn);
      q = {min(q.lo, r.lo), max(q.hi, r.hi)};
    }
    // Tiles before `first` are whole; the first whose last id reaches the rows' lowest one.
    if (rising) begin = first_tile(begin, first, [&](int j) { return d[j * kTile + kTile - 1] >= q.lo; });
  }
  // The first tile from kt on to walk; last + 1 past the end.
  __device__ int next(int kt) const {
    kt = max(kt, begin);
    while (docb && kt < first && !ranges_meet(q, doc_range(docb, kt, Tn))) kt++;
    return kt;
  }
  // Tile kt tests visibility element by element: the diagonal ones (which also hold any keys past
  // T), those whose keys leave the last row's window, and any pair not inside one document.
  __device__ bool masked(int kt) const {
    return kt >= first || kt < window_end || (docb && !one_document(q, doc_range(docb, kt, Tn)));
  }
};

// A warp's 16 query rows from r0 on have nothing to do against key tile kt when every key of it
// comes after every row (causal: only in blocks of more than one tile), when every key is older
// than its first row's window, or when the rows lie past T. (A tile nothing of which is visible
// would add exact zeros: skipping it changes no bits.)
__device__ __forceinline__ bool warp_idle(int r0, int kt, const Geometry& G) {
  return kt * kTile > r0 + 15 || (G.window && r0 - (kt * kTile + kTile - 1) >= G.window) || r0 >= G.Tn;
}

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

// The tensor-core kernels keep the softmax in base 2: a score s becomes exp2(s * scale * log2(e) -
// m2) with m2 the row's max (or its lse) times log2(e) -- one FFMA and one MUFU.EX2 per score
// where exp(s * scale - m) costs an FMUL, an FADD and another FMUL inside __expf. The lse they
// store stays natural (m2 ln 2 + ln l), as the CPU's.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x, the hardware approximation (relative error about 2^-22; subnormal results flush to zero,
// which only ever multiply a sum that a larger term dominates). The emulator computes it exactly,
// or within that error with ULYSSES_EMU_APPROX_MATH=1.
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#elif ULYSSES_CUDA_EMULATED
  return ul_emu::fast_exp2(x);  // exact, or within ex2.approx's error (ULYSSES_EMU_APPROX_MATH)
#else
  return exp2f(x);
#endif
}

// p[0..1] += (lo, hi), rounded once to bf16; without accumulate p is not read, and the sums are
// those of adding into zeros (0 + -0 is +0, as a zeroed buffer would give).
__device__ __forceinline__ void add_bf16x2(bf16* p, float lo, float hi, bool accumulate) {
  store_bf16x2(p, (accumulate ? to_float(p[0]) : 0.f) + lo, (accumulate ? to_float(p[1]) : 0.f) + hi);
}

// ---- f32 helpers ---------------------------------------------------------------------------------

// Keys k0 .. k0 + 31 of kv head kvh, K into Ks and V into Vs, (32, D) each; rows past T are zero.
template <int D>
__device__ __forceinline__ void stage_kv_rows_f32(float* Ks, float* Vs, const float* qkv, const Geometry& G, int b,
                                                  int kvh, int k0) {
  for (int i = threadIdx.x; i < kFmaRows * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    const bool in = k0 + r < G.Tn;
    Ks[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + kvh) + c] : 0.f;
    Vs[i] = in ? qkv[G.qkv(b, k0 + r, G.Hq + G.Hkv + kvh) + c] : 0.f;
  }
}

// A row of D elements split over S = D / kCols consecutive lanes, lane `part` of the group holding
// columns part, part + S, part + 2S, ... (interleaved: the group's lanes read S different banks of
// a shared row and neighbouring global addresses). W bounds the columns a thread holds: one thread
// per row would hold 2-4 x D floats, which at D = 128 spills kilobytes of registers to local memory.
template <int D, int W>
struct FmaSplit {
  static constexpr int kCols = D < W ? D : W;  // columns per lane
  static constexpr int kLanes = D / kCols;     // lanes per row: 1 to 8, a divisor of 32
  static constexpr int kThreads = kTile * kLanes;
};

// The sum of v over the S lanes of a group. Every lane of the warp calls it (full mask).
template <int S>
__device__ __forceinline__ float group_sum(float v) {
  UL_UNROLL for (int o = S / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- host side -----------------------------------------------------------------------------------

inline Geometry geometry(int B, int Tn, int Hq, int Hkv, int D, int window) {
  if (B < 0 || Tn < 0 || Hq <= 0 || Hkv <= 0)
    throw std::invalid_argument("attention (CUDA): bad shape B=" + std::to_string(B) + " T=" + std::to_string(Tn) +
                                " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv));
  if (Hq % Hkv != 0)
    throw std::invalid_argument("attention (CUDA): Hq (" + std::to_string(Hq) + ") must be a multiple of Hkv (" +
                                std::to_string(Hkv) + ")");
  if (!attention_cuda_head_dim(D))
    throw std::invalid_argument("attention (CUDA): head dim D = " + std::to_string(D) +
                                " is not supported; the CUDA kernels are built for D = 16, 32, 64 or 128");
  if (window < 0)
    throw std::invalid_argument("attention (CUDA): the sliding window must be >= 0, got " + std::to_string(window));
  // The kernels' grids are (tiles, heads, sequences): y and z stop at 65535 on every GPU.
  if (B > 65535 || Hq > 65535)
    throw std::invalid_argument("attention (CUDA): " +
                                (B > 65535 ? "batch " + std::to_string(B) + " sequences" : std::to_string(Hq) + " heads") +
                                " per call, more than the 65535 a grid dimension holds" +
                                (B > 65535 ? " (fewer per micro-batch: --grad-accum)" : ""));
  // A window of T or more hides nothing (q - k < T always): no window at all, which also keeps
  // k + window - 1 in last_query() from overflowing an int for windows near INT_MAX.
  if (window >= Tn) window = 0;
  return Geometry{B, Tn, Hq, Hkv, D, Hq / Hkv, int(ceil_div(Tn, kTile)), window};
}

// falls[b] = 1 where sequence b's document ids fall somewhere, else 0 (B ints of device memory).
static inline void mark_falling(int* falls, const int32_t* doc, int B, int Tn, cudaStream_t s) {
  if (!falls)
    throw std::invalid_argument("attention (CUDA): documents need the scratch of attention_forward_scratch_bytes");
  UL_CUDA_CHECK(cudaMemsetAsync(falls, 0, size_t(B) * sizeof(int), s));
  const int64_t pairs = int64_t(B) * (Tn - 1);
  if (pairs > 0)
    launch("attention_doc_falls", doc_falls_kernel, dim3(capped_blocks(pairs, 256, 4096)),
           dim3(256), 0, s, falls, doc, Tn, pairs);
}

// f(std::integral_constant<int, D>) for the supported head dims.
template <class F>
void with_head_dim(int D, F&& f) {
  switch (D) {
    case 16: f(std::integral_constant<int, 16>{}); return;
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    default: break;
  }
  throw std::invalid_argument("attention (CUDA): head dim D = " + std::to_string(D) + " is not supported");
}

// Two stages of two tiles (forward, dq); the dk/dv pass has its K and V tiles and `stages` stages of
// (Q tile, dout tile, lse and Di rows): 2 x 64 x 136 x 2 + 2 x (2 x 64 x 136 x 2 + 2 x 64 x 4) =
// 105472 bytes at D = 128 with two stages, over the 101376 of sm_86, sm_89 and sm_120; one: 70144.
constexpr size_t mma_stages_smem(int D) { return size_t(4) * kTileElems(D) * sizeof(bf16); }
constexpr size_t mma_dkv_smem(int D, int stages) {
  return size_t(2 + 2 * stages) * kTileElems(D) * sizeof(bf16) + size_t(2 * stages) * kTile * sizeof(float);
}
constexpr size_t fma_rows_smem(int D) { return size_t(2) * kFmaRows * D * sizeof(float); }

// A launch with over 48 KiB of dynamic shared memory must raise the kernel's limit first.
template <class K>
void allow_smem(K* kernel, size_t bytes) {
  if (bytes > (48u << 10))
    UL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Scaled as the CPU scales: 1 / sqrt(D) in float.
inline float softmax_scale(int D) { return 1.0f / sqrtf(float(D)); }

}  // namespace attn
}  // namespace cuda
}  // namespace ul
