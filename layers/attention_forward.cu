// Flash attention forward on CUDA: the tensor-core kernel (bf16) and the FMA kernel (f32), and
// their launch. The design, and what the kernels share, is in attention_tiles.cuh.
#include <atomic>

#include "layers/attention_tiles.cuh"
#include "layers/elementwise.cuh"
#include "layers/scratch_sizes.h"

namespace ul {
namespace cuda {

namespace {
std::atomic<int> g_query_rows{64};
}  // namespace

int attention_query_rows() { return g_query_rows.load(std::memory_order_relaxed); }

int set_attention_query_rows(int rows) {
  if (rows != 64 && rows != 128)
    throw std::invalid_argument("attention: query rows per block must be 64 or 128, got " + std::to_string(rows));
  return g_query_rows.exchange(rows);
}

namespace {

using namespace attn;

// grid (ceil(T / (16 W)), Hq, B), block 32 W: W warps of 16 query rows (W = 4: one tile; 8: two
// tiles, so each K/V tile fetched serves twice the rows); smem: two stages of (K tile, V tile),
// 4 x 64 x (D + 8) bf16, so the next key tile is copied in (cp.async) while the tensor cores work
// on this one. out: (B, T, Hq, D), lse: (B, Hq, T), qkv: (B, T, Hq + 2 Hkv, D)
template <int D, int W>
__global__ void __launch_bounds__(W * 32)
    attention_forward_mma_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                                 const int32_t* __restrict__ doc, const int* __restrict__ falls, Geometry G,
                                 float scale) {
  constexpr int LD = kLd(D), kElems = kTileElems(D), kRows = 16 * W;
  UL_DYNAMIC_SMEM(bf16, smem);  // stage s: K tile at smem + 2 s kElems, its V tile right after
  // Later query blocks walk more keys: start them first.
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int lane = lane_id(), warp = threadIdx.x / 32, t = lane % 4;
  const int r0 = q0 + warp * 16;                          // the warp's first query row
  const int rows[2] = {r0 + lane / 4, r0 + lane / 4 + 8};  // this lane's query rows
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const float ninf = -INFINITY;

  const KeyTiles tiles(docb, docb && !falls[b], q0, kRows, G);
  int kt = tiles.next(0);
  fetch_kv_tile<D>(smem, 0, qkv, G, b, kvh, kt);

  uint32_t qf[D / 16][4];  // Q rows of the warp, (16, D) as D / 16 A fragments
  UL_UNROLL for (int kk = 0; kk < D / 16; kk++)
    load_a_rows(qf[kk], qkv + G.qkv(b, 0, h), G.qkv_stride(), r0, G.Tn, kk * 16);

  const float scale2 = scale * kLog2e;  // scores to the base-2 exponent
  float o[D / 8][4] = {};  // unnormalised output rows, (16, D) as D / 8 accumulator tiles
  // Running max of the scaled scores in base 2 (max s * scale2); this lane's share of the running sum.
  float m[2] = {ninf, ninf}, l[2] = {0.f, 0.f};
  for (int step = 0; kt <= tiles.last; step++) {
    const int next = tiles.next(kt + 1);
    if (next <= tiles.last) {
      fetch_kv_tile<D>(smem, (step + 1) & 1, qkv, G, b, kvh, next);
      cp_async_wait<1>();  // all but the newest group: tile kt has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // ... from every thread's copies
    // A warp whose rows see nothing in this tile skips the work, not the barriers: every thread
    // meets the same two __syncthreads (bar.sync is .aligned: warps at different barrier
    // instructions are undefined behaviour on a GPU, which the emulator's arrival count cannot see).
    if (!warp_idle(r0, kt, G)) {
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
          if (masked && !visible(rows[e / 2], k, G, docb)) s[j][e] = ninf;
          mx[e / 2] = max_keep_nan(mx[e / 2], s[j][e]);  // raw scores: scale > 0 keeps the order
        }
      float alpha[2], sum[2] = {0.f, 0.f};
      UL_UNROLL for (int r = 0; r < 2; r++) {
        mx[r] = max_keep_nan(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));  // the quad holds the row
        mx[r] = max_keep_nan(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = max_keep_nan(m[r], mx[r] * scale2);
        // Nothing visible yet, or no new maximum: nothing to rescale. The second test keeps an
        // all-masked tile from multiplying by ex2.approx(0), whose exactness PTX does not promise:
        // tiles a 128-row block walks and a 64-row one skips must change no bits.
        alpha[r] = (m_new == ninf || m_new == m[r]) ? 1.f : fast_exp2(m[r] - m_new);
        m[r] = m_new;
      }
      UL_UNROLL for (int j = 0; j < 8; j++)
        UL_UNROLL for (int e = 0; e < 4; e++) {
          const int r = e / 2;
          s[j][e] = m[r] == ninf ? 0.f : fast_exp2(fmaf(s[j][e], scale2, -m[r]));  // masked: 2^-inf = 0
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
    if (t == 0) lse[G.lse(b, h, q)] = m[r] * kLn2 + logf(l[r]);
  }
}

// grid (nt, Hq, B), block 64 x S (S lanes per query row, FmaSplit<D, 32>); smem: K and V rows,
// 2 x 32 x D floats.
template <int D>
__global__ void __launch_bounds__(FmaSplit<D, 32>::kThreads)
    attention_forward_fma_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ qkv,
                                 const int32_t* __restrict__ doc, Geometry G, float scale) {
  constexpr int S = FmaSplit<D, 32>::kLanes, W = FmaSplit<D, 32>::kCols;
  UL_DYNAMIC_SMEM(float, smem);
  float* Ks = smem;                  // (32, D)
  float* Vs = smem + kFmaRows * D;   // (32, D)
  const int qt = G.nt - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / G.group;
  const int part = int(threadIdx.x) % S, q0 = qt * kTile, q = q0 + int(threadIdx.x) / S;
  const int32_t* docb = doc ? doc + int64_t(b) * G.Tn : nullptr;
  const float ninf = -INFINITY;

  float qr[W], acc[W];  // columns part + S i of the row
  UL_UNROLL for (int i = 0; i < W; i++) {
    qr[i] = q < G.Tn ? qkv[G.qkv(b, q, h) + i * S + part] : 0.f;
    acc[i] = 0.f;
  }
  float m = ninf, l = 0.f;
  const int kend = min(q0 + kTile, G.Tn);  // keys this block can see, from its first row's earliest on
  for (int k0 = G.first_key(q0) / kFmaRows * kFmaRows; k0 < kend; k0 += kFmaRows) {
    __syncthreads();
    stage_kv_rows_f32<D>(Ks, Vs, qkv, G, b, kvh, k0);
    __syncthreads();
    float s[kFmaRows], mx = ninf;
    UL_UNROLL for (int j = 0; j < kFmaRows; j++) {
      float dot = 0.f;
      UL_UNROLL for (int i = 0; i < W; i++) dot += qr[i] * Ks[j * D + i * S + part];
      dot = group_sum<S>(dot);  // every lane, visible or not: the shuffle needs the whole warp
      s[j] = visible(q, k0 + j, G, docb) ? dot * scale : ninf;
      mx = max_keep_nan(mx, s[j]);
    }
    const float m_new = max_keep_nan(m, mx);
    if (m_new == ninf) continue;  // nothing visible yet
    const float alpha = expf(m - m_new);
    m = m_new;
    // The step's 32 terms summed apart, then added to the row's sums once: added one key at a time,
    // a long row's small terms were rounded away (lse 1e-3 low at T = 1e6, 1e-2 at 1e7); the CPU
    // and the bf16 kernels sum a tile first too.
    float ls = 0.f, as[W];
    UL_UNROLL for (int i = 0; i < W; i++) as[i] = 0.f;
    UL_UNROLL for (int j = 0; j < kFmaRows; j++) {
      if (s[j] == ninf) continue;
      const float p = expf(s[j] - m);
      ls += p;
      UL_UNROLL for (int i = 0; i < W; i++) as[i] += p * Vs[j * D + i * S + part];
    }
    l = l * alpha + ls;
    UL_UNROLL for (int i = 0; i < W; i++) acc[i] = acc[i] * alpha + as[i];
  }
  if (q >= G.Tn) return;
  UL_UNROLL for (int i = 0; i < W; i++) out[G.out(b, q, h) + i * S + part] = acc[i] / l;
  if (part == 0) lse[G.lse(b, h, q)] = m + logf(l);
}

}  // namespace

size_t attention_forward_scratch_bytes(int B, bool doc) { return scratch::attention_forward(B, doc); }

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const int32_t* doc, int window, void* scratch, int B, int Tn,
                       int Hq, int Hkv, int D, cudaStream_t s) {
  const Geometry G = geometry(B, Tn, Hq, Hkv, D, window);
  if (B == 0 || Tn == 0) return;  // a grid of no blocks is an invalid launch
  int* falls = doc ? static_cast<int*>(scratch) : nullptr;  // (no scratch without documents)
  if (doc && std::is_same<T, bf16>::value) mark_falling(falls, doc, B, Tn, s);
  // cp.async and ldmatrix move 16-byte rows: a view at an odd offset would fault on the GPU.
  if (!pack_aligned({qkv, out})) throw std::runtime_error("attention_forward: qkv and out must be 16-byte aligned");
  const float scale = softmax_scale(D);
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if constexpr (std::is_same<T, float>::value) {
      launch("attention_forward_fma", attention_forward_fma_kernel<kD>, dim3(G.nt, Hq, B),
             dim3(FmaSplit<kD, 32>::kThreads), fma_rows_smem(kD), s, out, lse, qkv, doc, G, scale);
    } else {
      auto go = [&](auto w) {
        constexpr int kW = decltype(w)::value;
        auto* kernel = attention_forward_mma_kernel<kD, kW>;
        allow_smem(kernel, mma_stages_smem(kD));
        launch("attention_forward_mma", kernel, dim3(ceil_div(Tn, 16 * kW), Hq, B), dim3(kW * 32),
               mma_stages_smem(kD), s, out, lse, qkv, doc, falls, G, scale);
      };
      if (attention_query_rows() == 128) go(std::integral_constant<int, 8>{});
      else go(std::integral_constant<int, 4>{});
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, void*, int, int, int, int,
                                       int, cudaStream_t);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const int32_t*, int, void*,
                                               int, int, int, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
