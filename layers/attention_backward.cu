// Flash attention backward on CUDA: Di = rowsum(dout * out), then the dk/dv pass and the dq pass
// (tensor-core kernels for bf16, FMA kernels for f32), and their launch. The design, and what the
// kernels share, is in attention_tiles.cuh.
#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "engine/cuda_runtime.h"
#include "layers/attention_tiles.cuh"
#include "layers/elementwise.cuh"
#include "layers/scratch_sizes.h"

namespace ul {
namespace cuda {
namespace {

using namespace attn;

// Di[b, h, t] = sum_c dout * out over the row (b, t, h). A group of g lanes per row, each taking
// one 16-byte pack of V elements (g = D / V, so one load per lane covers the row; the launch
// below requires the alignment), the group's sums added with shuffles; 32 / g rows per warp, 256 threads per block.
template <class T, int V>
__global__ void attention_rowdot_kernel(float* __restrict__ Di, const T* __restrict__ dout, const T* __restrict__ out,
                                        Geometry G, int g) {
  const int64_t rows = int64_t(G.B) * G.Tn * G.Hq;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / g;  // (b, t, h) in out's order
  const int part = int(threadIdx.x % g);
  float s = 0.f;
  if (row < rows)
    for (int c = part * V; c < G.D; c += g * V) {
      float a[V], o[V];
      load_floats<V>(dout + row * G.D + c, a);
      load_floats<V>(out + row * G.D + c, o);
      for (int k = 0; k < V; k++) s += a[k] * o[k];
    }
  // Every lane takes part (no early exit), so the full mask holds; a group is g aligned lanes.
  for (int offset = g / 2; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (part == 0 && row < rows) {
    const int h = int(row % G.Hq), t = int(row / G.Hq % G.Tn), b = int(row / G.Hq / G.Tn);
    Di[G.lse(b, h, t)] = s;
  }
}

// Pass 1, bf16. grid (nt, Hkv, B), block 128; warp w owns keys k0 + 16 w .. + 15 of the tile.
// smem: the block's K and V tiles (2 x 64 x (D + 8) bf16, read as A fragments by ldmatrix); S
// stages of (Q tile, dout tile) (2 S x 64 x (D + 8) bf16), then S stages of the tile's queries' lse
// and Di (2 S x 64 f32). The block walks (query head of the group, query tile from kt on) in order;
// with S = 2 it fetches step i + 1 while it multiplies step i, with S = 1 (a GPU whose blocks may
// not hold two stages at D = 128: mma_dkv_smem) after it. The same arithmetic either way.
template <int D, int S, bool kAcc>
__global__ void __launch_bounds__(kWarps * 32)
    attention_backward_dkv_mma_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                      const float* __restrict__ lse, const float* __restrict__ Di,
                                      const bf16* __restrict__ qkv, const int32_t* __restrict__ doc,
                                      const int* __restrict__ falls, Geometry G, float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D);
  UL_DYNAMIC_SMEM(bf16, smem);
  const bf16* Ks = smem;          // (64, LD)
  const bf16* Vs = smem + kElems;  // (64, LD)
  // stage s: Q at smem + (2 + 2 s) kElems, dout after it; lse at stats + 2 s 64, Di after it
  static_assert(S == 1 || S == 2, "one or two stages");
  float* stats = reinterpret_cast<float*>(smem + (2 + 2 * S) * kElems);
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int k0 = kt * kTile;
  const int keys[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};  // this lane's key rows
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const DocRange kr = docb ? doc_range(docb, kt, G.Tn) : DocRange{0, 0};
  // Earlier query tiles see none of these keys, nor (with a window) those past the last key's
  // window, nor (with rising ids) those after the tile where the keys' last document ends.
  int nqt = G.last_query(min(k0 + kTile, G.Tn) - 1) / kTile - kt + 1;
  if (docb && !falls[b]) nqt = first_tile(kt + 1, kt + nqt, [&](int j) { return docb[j * kTile] > kr.hi; }) - kt;
  const int steps = G.group * nqt;
  // Step i is query head kvh * group + i / nqt, query tile kt + i % nqt. With documents, the steps
  // whose query tile shares none with the key tile are skipped (the diagonal always shares one).
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

  const float scale2 = scale * kLog2e;  // scores to the base-2 exponent
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};  // (16, D) each
  for (int i = 0, step = 0; i < steps; step++) {
    const int next = next_step(i + 1), stage = S == 2 ? step & 1 : 0;
    if (S == 2 && next < steps) {
      fetch(next, (step + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    const int qt = kt + i % nqt, q0 = qt * kTile;
    const bf16* Qs = smem + (2 + 2 * stage) * kElems;
    const bf16* dOs = Qs + kElems;
    float* lse_s = stats + stage * 2 * kTile;
    const float* Di_s = lse_s + kTile;
    // lse to base 2, each element by the thread whose copy brought it (landed at its own wait; the
    // barrier after this publishes it).
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) lse_s[r] *= kLog2e;
    __syncthreads();

    float pt[8][4] = {}, dst[8][4] = {};  // S^T = K Q^T and dP^T = V dout^T, (16 keys, 64 queries)
    UL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
      uint32_t ak[4], av[4];
      ldsm_a(ak, Ks + warp * 16 * LD + kk * 16, LD);
      ldsm_a(av, Vs + warp * 16 * LD + kk * 16, LD);
      mma_row_tile(pt, ak, Qs + kk * 16, LD);
      mma_row_tile(dst, av, dOs + kk * 16, LD);
    }
    // The diagonal tile, a tile with queries past T, one whose last query's window ends inside the
    // key tile, and pairs not inside one document mask.
    const bool masked = qt == kt || q0 + kTile > G.Tn || (G.window && q0 + kTile - 1 - k0 >= G.window) ||
                        (docb && !one_document(doc_range(docb, qt, G.Tn), kr));
    UL_UNROLL for (int j = 0; j < 8; j++)
      UL_UNROLL for (int e = 0; e < 4; e++) {
        const int qi = j * 8 + 2 * t + (e & 1);
        const bool see = !masked || visible(q0 + qi, keys[e / 2], G, docb);
        const float p = see ? fast_exp2(fmaf(pt[j][e], scale2, -lse_s[qi])) : 0.f;
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
    __syncthreads();  // this stage is free for the step after next (S = 2), or for the next (S = 1)
    if (S == 1 && next < steps) fetch(next, 0);
    i = next;
  }

  UL_UNROLL for (int r = 0; r < 2; r++) {
    if (keys[r] >= G.Tn) continue;
    bf16* dkrow = dqkv + G.qkv(b, keys[r], G.Hq + kvh);
    bf16* dvrow = dqkv + G.qkv(b, keys[r], G.Hq + G.Hkv + kvh);
    UL_UNROLL for (int n = 0; n < D / 8; n++) {
      add_bf16x2(dkrow + n * 8 + 2 * t, dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale, kAcc);
      add_bf16x2(dvrow + n * 8 + 2 * t, dv[n][2 * r], dv[n][2 * r + 1], kAcc);
    }
  }
}

// Pass 2, bf16. grid (ceil(T / (16 W)), Hq, B), block 32 W: W warps of 16 query rows, as in the
// forward; warp w owns query rows q0 + 16 w .. + 15. smem: two stages of (K tile, V tile),
// 4 x 64 x (D + 8) bf16, double-buffered as in the forward.
template <int D, int W, bool kAcc>
__global__ void __launch_bounds__(W * 32)
    attention_backward_dq_mma_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ Di,
                                     const bf16* __restrict__ qkv, const int32_t* __restrict__ doc,
                                     const int* __restrict__ falls, Geometry G, float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D), kRows = 16 * W;
  UL_DYNAMIC_SMEM(bf16, smem);  // stage s: K tile at smem + 2 s kElems, its V tile right after
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;  // later query blocks first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int r0 = q0 + warp * 16;
  const int rows[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  const KeyTiles tiles(docb, docb && !falls[b], q0, kRows, G);
  int kt = tiles.next(0);
  fetch_kv_tile<D>(smem, 0, qkv, G, b, kvh, kt);

  uint32_t qf[D / 16][4], of[D / 16][4];  // Q and dout rows of the warp, (16, D) each
  UL_UNROLL for (int kk = 0; kk < D / 16; kk++) {
    load_a_rows(qf[kk], qkv + G.qkv(b, 0, h), G.qkv_stride(), r0, G.Tn, kk * 16);
    load_a_rows(of[kk], dout + G.out(b, 0, h), G.out_stride(), r0, G.Tn, kk * 16);
  }
  float lse_r[2], Di_r[2];
  UL_UNROLL for (int r = 0; r < 2; r++) {
    lse_r[r] = rows[r] < G.Tn ? lse[G.lse(b, h, rows[r])] * kLog2e : 0.f;  // base 2
    Di_r[r] = rows[r] < G.Tn ? Di[G.lse(b, h, rows[r])] : 0.f;
  }
  const float scale2 = scale * kLog2e;
  float dq[D / 8][4] = {};  // (16, D)
  for (int step = 0; kt <= tiles.last; step++) {
    const int next = tiles.next(kt + 1);
    if (next <= tiles.last) {
      fetch_kv_tile<D>(smem, (step + 1) & 1, qkv, G, b, kvh, next);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // A warp whose rows see nothing in this tile skips the work, not the barriers: every thread
    // meets the same two __syncthreads (bar.sync is .aligned: warps at different barrier
    // instructions are undefined behaviour on a GPU, which the emulator's arrival count cannot see).
    if (!warp_idle(r0, kt, G)) {
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
          const bool see = !masked || visible(rows[r], k, G, docb);
          const float p = see ? fast_exp2(fmaf(s[j][e], scale2, -lse_r[r])) : 0.f;
          s[j][e] = p * (dp[j][e] - Di_r[r]);  // dS
        }
      UL_UNROLL for (int kk = 0; kk < kTile / 16; kk++) {  // dQ += dS K (over keys)
        uint32_t ads[4];
        scores_as_a(ads, s, kk);
        mma_col_tile<D>(dq, ads, Ks + kk * 16 * LD, LD);
      }
    }
    __syncthreads();
    kt = next;
  }
  UL_UNROLL for (int r = 0; r < 2; r++) {
    if (rows[r] >= G.Tn) continue;
    bf16* dqrow = dqkv + G.qkv(b, rows[r], h);
    UL_UNROLL for (int n = 0; n < D / 8; n++)
      add_bf16x2(dqrow + n * 8 + 2 * t, dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale, kAcc);
  }
}

// Pass 1, f32. grid (nt, Hkv, B), block 64 x S (S lanes per key row, FmaSplit<D, 16>: a lane holds
// four rows' worth, its K, V, dK and dV columns); smem: Q and dout rows (2 x 32 x D), then their
// lse and Di (2 x 32).
template <int D>
__global__ void __launch_bounds__(FmaSplit<D, 16>::kThreads)
    attention_backward_dkv_fma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                      const float* __restrict__ lse, const float* __restrict__ Di,
                                      const float* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                      float scale, bool accumulate) {
  constexpr int S = FmaSplit<D, 16>::kLanes, W = FmaSplit<D, 16>::kCols;
  UL_DYNAMIC_SMEM(float, smem);
  float* Qs = smem;                    // (32, D)
  float* dOs = smem + kFmaRows * D;    // (32, D)
  float* lse_s = dOs + kFmaRows * D;   // (32)
  float* Di_s = lse_s + kFmaRows;      // (32)
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int part = int(threadIdx.x) % S, key = kt * kTile + int(threadIdx.x) / S;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  float kr[W], vr[W], dk[W], dv[W];  // columns part + S i of the row
  UL_UNROLL for (int i = 0; i < W; i++) {
    kr[i] = key < G.Tn ? qkv[G.qkv(b, key, G.Hq + kvh) + i * S + part] : 0.f;
    vr[i] = key < G.Tn ? qkv[G.qkv(b, key, G.Hq + G.Hkv + kvh) + i * S + part] : 0.f;
    dk[i] = dv[i] = 0.f;
  }
  // Earlier queries see none of these keys, nor (with a window) those past the last key's window.
  const int qend = G.last_query(min(kt * kTile + kTile, G.Tn) - 1) + 1;
  for (int h = kvh * G.group; h < (kvh + 1) * G.group; h++)
    for (int q0 = kt * kTile; q0 < qend; q0 += kFmaRows) {
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
      // The step's 32 query rows summed apart, then added once (as the forward's keys: one row at a
      // time, a long key column's small terms were rounded away).
      float sdk[W], sdv[W];
      UL_UNROLL for (int i = 0; i < W; i++) sdk[i] = sdv[i] = 0.f;
      for (int r = 0; r < kFmaRows; r++) {
        const float* qi = Qs + r * D + part;
        const float* oi = dOs + r * D + part;
        float s = 0.f, dp = 0.f;
        UL_UNROLL for (int i = 0; i < W; i++) {
          s += kr[i] * qi[i * S];
          dp += vr[i] * oi[i * S];
        }
        s = group_sum<S>(s);  // every lane, visible or not: the shuffle needs the whole warp
        dp = group_sum<S>(dp);
        if (visible(q0 + r, key, G, docb)) {
          const float p = expf(s * scale - lse_s[r]);
          const float ds = p * (dp - Di_s[r]);
          UL_UNROLL for (int i = 0; i < W; i++) {
            sdv[i] += p * oi[i * S];
            sdk[i] += ds * qi[i * S];
          }
        }
      }
      UL_UNROLL for (int i = 0; i < W; i++) {
        dv[i] += sdv[i];
        dk[i] += sdk[i];
      }
    }
  if (key >= G.Tn) return;
  float* dkrow = dqkv + G.qkv(b, key, G.Hq + kvh) + part;
  float* dvrow = dqkv + G.qkv(b, key, G.Hq + G.Hkv + kvh) + part;
  UL_UNROLL for (int i = 0; i < W; i++) {
    dkrow[i * S] = (accumulate ? dkrow[i * S] : 0.f) + dk[i] * scale;
    dvrow[i * S] = (accumulate ? dvrow[i * S] : 0.f) + dv[i];
  }
}

// Pass 2, f32. grid (nt, Hq, B), block 64 x S (S lanes per query row, FmaSplit<D, 32>); smem: K
// and V rows, 2 x 32 x D.
template <int D>
__global__ void __launch_bounds__(FmaSplit<D, 32>::kThreads)
    attention_backward_dq_fma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                     const float* __restrict__ lse, const float* __restrict__ Di,
                                     const float* __restrict__ qkv, const int32_t* __restrict__ doc, Geometry G,
                                     float scale, bool accumulate) {
  constexpr int S = FmaSplit<D, 32>::kLanes, W = FmaSplit<D, 32>::kCols;
  UL_DYNAMIC_SMEM(float, smem);
  float* Ks = smem;                 // (32, D)
  float* Vs = smem + kFmaRows * D;  // (32, D)
  const int qt = G.nt - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int part = int(threadIdx.x) % S, q0 = qt * kTile, q = q0 + int(threadIdx.x) / S;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;

  float qr[W], orow[W], dq[W];  // columns part + S i of the row
  UL_UNROLL for (int i = 0; i < W; i++) {
    qr[i] = q < G.Tn ? qkv[G.qkv(b, q, h) + i * S + part] : 0.f;
    orow[i] = q < G.Tn ? dout[G.out(b, q, h) + i * S + part] : 0.f;
    dq[i] = 0.f;
  }
  const float lse_q = q < G.Tn ? lse[G.lse(b, h, q)] : 0.f, Di_q = q < G.Tn ? Di[G.lse(b, h, q)] : 0.f;
  const int kend = min(q0 + kTile, G.Tn);  // keys this block can see, from its first row's earliest on
  for (int k0 = G.first_key(q0) / kFmaRows * kFmaRows; k0 < kend; k0 += kFmaRows) {
    __syncthreads();
    stage_kv_rows_f32<D>(Ks, Vs, qkv, G, b, kvh, k0);
    __syncthreads();
    float sdq[W];  // the step's 32 keys summed apart, then added once (as dk and dv)
    UL_UNROLL for (int i = 0; i < W; i++) sdq[i] = 0.f;
    for (int j = 0; j < kFmaRows; j++) {
      const float* kj = Ks + j * D + part;
      const float* vj = Vs + j * D + part;
      float s = 0.f, dp = 0.f;
      UL_UNROLL for (int i = 0; i < W; i++) {
        s += qr[i] * kj[i * S];
        dp += orow[i] * vj[i * S];
      }
      s = group_sum<S>(s);  // every lane, visible or not: the shuffle needs the whole warp
      dp = group_sum<S>(dp);
      if (visible(q, k0 + j, G, docb)) {
        const float ds = expf(s * scale - lse_q) * (dp - Di_q);
        UL_UNROLL for (int i = 0; i < W; i++) sdq[i] += ds * kj[i * S];
      }
    }
    UL_UNROLL for (int i = 0; i < W; i++) dq[i] += sdq[i];
  }
  if (q >= G.Tn) return;
  float* dqrow = dqkv + G.qkv(b, q, h) + part;
  UL_UNROLL for (int i = 0; i < W; i++) dqrow[i * S] = (accumulate ? dqrow[i * S] : 0.f) + dq[i] * scale;
}

}  // namespace

size_t attention_backward_scratch_bytes(int B, int Tn, int Hq, bool doc) {
  return scratch::attention_backward(B, Tn, Hq, doc);
}

namespace {
std::atomic<int> g_dkv_stages{0};

// The stages the dk/dv pass runs with at head dim D on the current device: as set, or (0) two
// where a block may hold them, else one. A setting the device cannot hold is refused by name.
int dkv_stages(int D) {
  const size_t optin = cuda_smem_optin();
  int stages = g_dkv_stages.load(std::memory_order_relaxed);
  if (stages == 0) stages = mma_dkv_smem(D, 2) <= optin ? 2 : 1;
  if (mma_dkv_smem(D, stages) > optin)
    throw std::runtime_error("attention backward: the dk/dv pass at head dim " + std::to_string(D) + " with " +
                             std::to_string(stages) + " stage(s) needs " + std::to_string(mma_dkv_smem(D, stages)) +
                             " bytes of shared memory a block; this GPU allows " + std::to_string(optin));
  return stages;
}
}  // namespace

int attention_dkv_stages() { return g_dkv_stages.load(std::memory_order_relaxed); }

int set_attention_dkv_stages(int stages) {
  if (stages < 0 || stages > 2)
    throw std::invalid_argument("attention: dk/dv stages must be 0 (as the GPU allows), 1 or 2, got " +
                                std::to_string(stages));
  return g_dkv_stages.exchange(stages);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* out, const float* lse, const T* qkv, const int32_t* doc,
                        int window, float* scratch, int B, int Tn, int Hq, int Hkv, int D, cudaStream_t s,
                        bool accumulate) {
  const Geometry G = geometry(B, Tn, Hq, Hkv, D, window);
  if (B == 0 || Tn == 0) return;
  float* Di = scratch;  // (B, Hq, T), then the forward's scratch
  // The flags again (the forward's scratch went back to the arena; B T reads, against the T^2 pass).
  // (Without documents the scratch ends before them: null, not a pointer past its end, which the
  // kernels never read then but a launch's check of its arguments sees outside any buffer.)
  int* falls = doc ? reinterpret_cast<int*>(scratch + int64_t(B) * Hq * Tn) : nullptr;
  if (doc && std::is_same<T, bf16>::value) mark_falling(falls, doc, B, Tn, s);
  // Every head dim the kernels take (16 to 128) is a power-of-two number of packs, and the tensors
  // come from the arena (64-byte aligned); the tensor-core kernels need 16 bytes too.
  constexpr int kV = kPackElems<T>;
  if (!pack_aligned({dout, out, qkv, dqkv}))
    throw std::runtime_error("attention_backward: dout, out, qkv and dqkv must be 16-byte aligned");
  const int64_t rows = int64_t(B) * Tn * Hq;
  const int g = std::min(32, D / kV);  // lanes per row
  launch("attention_rowdot", attention_rowdot_kernel<T, kV>, dim3(ceil_div(rows * g, 256)), dim3(256), 0, s, Di, dout,
         out, G, g);
  const float scale = softmax_scale(D);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if constexpr (std::is_same<T, float>::value) {
      launch("attention_backward_dkv_fma", attention_backward_dkv_fma_kernel<kD>, dim3(G.nt, Hkv, B),
             dim3(FmaSplit<kD, 16>::kThreads), fma_rows_smem(kD) + 2 * kFmaRows * sizeof(float), s, dqkv, dout, lse,
             Di, qkv, doc, G, scale, accumulate);
      launch("attention_backward_dq_fma", attention_backward_dq_fma_kernel<kD>, dim3(G.nt, Hq, B),
             dim3(FmaSplit<kD, 32>::kThreads), fma_rows_smem(kD), s, dqkv, dout, lse, Di, qkv, doc, G, scale,
             accumulate);
    } else {
      auto dkv = [&](auto stages, auto acc) {
        constexpr int kS = decltype(stages)::value;
        auto* kernel = attention_backward_dkv_mma_kernel<kD, kS, decltype(acc)::value>;
        allow_smem(kernel, mma_dkv_smem(kD, kS));
        // Named apart, so a profile (and a test) tells which ran.
        launch(kS == 2 ? "attention_backward_dkv_mma" : "attention_backward_dkv_mma_1stage", kernel, dim3(G.nt, Hkv, B),
               dim3(kWarps * 32), mma_dkv_smem(kD, kS), s, dqkv, dout, lse, Di, qkv, doc, falls, G, scale);
      };
      auto dq = [&](auto w, auto acc) {
        constexpr int kW = decltype(w)::value;
        auto* kernel = attention_backward_dq_mma_kernel<kD, kW, decltype(acc)::value>;
        allow_smem(kernel, mma_stages_smem(kD));
        launch("attention_backward_dq_mma", kernel, dim3(ceil_div(Tn, 16 * kW), Hq, B), dim3(kW * 32),
               mma_stages_smem(kD), s, dqkv, dout, lse, Di, qkv, doc, falls, G, scale);
      };
      // The flag as a template argument: a run-time one cost the D = 64 dq pass spilled registers.
      auto both = [&](auto acc) {
        if (dkv_stages(kD) == 2) dkv(std::integral_constant<int, 2>{}, acc);
        else dkv(std::integral_constant<int, 1>{}, acc);
        if (attention_query_rows() == 128) dq(std::integral_constant<int, 8>{}, acc);
        else dq(std::integral_constant<int, 4>{}, acc);
      };
      if (accumulate) both(std::true_type{});
      else both(std::false_type{});
    }
  });
}

template void attention_backward<float>(float*, const float*, const float*, const float*, const float*,
                                        const int32_t*, int, float*, int, int, int, int, int, cudaStream_t, bool);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                const float*, const __nv_bfloat16*, const int32_t*, int, float*, int,
                                                int, int, int, int, cudaStream_t, bool);

}  // namespace cuda
}  // namespace ul
