// The fused classifier + cross-entropy on CUDA (the algorithm is in classifier.h; the CPU code it
// must match is classifier.cpp). T is float or __nv_bfloat16 (x, w, dx, dlogits); the logits, the
// losses and dw are fp32.
//
// per chunk of rows   logits (R, V) = x w[0:V]^T by GEMM (fp32 output; rows round_up(V, 64) apart);
//                     softmax_cross_entropy: one block per row, two passes over the row —
//                       (1) an online max / sum of exp / first argmax, each thread over a strided
//                           slice, combined across the block in a fixed order;
//                       (2) dlogits = (exp(l - max) / sum - onehot) * grad_scale;
//                       with a gradient to write, the row is copied into shared memory first
//                       where a block can hold it (V <= ~58K on sm_90), so it is read from global
//                       memory once, not twice;
//                     dx += dlogits w[0:V] and dw[0:V] += dlogits^T x by GEMM.
// The losses go to a per-row buffer, summed on the host in row order (no atomics: deterministic).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/async_copy.h"
#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#include "engine/gemm.h"
#include "layers/scratch_sizes.h"
#include "layers/classifier.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kUnroll = 4;  // loads in flight per thread in softmax_cross_entropy

// Softmax statistics of a set of logits: the max m, sum of exp(l - m), and the first index of m.
struct RowStats {
  float m, s;
  int arg;
};

// Symmetric to the bit: the operands are ordered by (max, index) before any arithmetic.
__device__ __forceinline__ RowStats combine(RowStats a, RowStats b) {
  if (b.m > a.m || (b.m == a.m && b.arg < a.arg)) {
    RowStats t = a;
    a = b;
    b = t;
  }
  // a holds the larger max (or the same max at the smaller index). A -inf max means an empty set,
  // or a set of NaN logits only (a NaN is never the max but makes the sum NaN): that NaN is kept,
  // or a thread whose every logit is NaN would drop it from the row's loss.
  if (b.m == -INFINITY) return isnan(b.s) ? RowStats{a.m, b.s, a.arg} : a;
  return {a.m, a.s + b.s * expf(b.m - a.m), a.arg};
}

__device__ __forceinline__ RowStats warp_combine(RowStats v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    RowStats o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset),
               __shfl_xor_sync(0xffffffffu, v.arg, offset)};
    v = combine(v, o);  // combine is symmetric (bitwise), so every lane ends with the same bits
  }
  return v;
}

// Grid (R), block (a multiple of 32, <= 1024). logits: (R, V) fp32; dlogits: (R, V) T or null;
// both with rows ld elements apart.
// kStaged: the row is first copied into dynamic shared memory (round_up(V, 4) floats), 16 bytes a
// copy where the rows are 16-byte aligned, else 4, and both passes read it there: a 50K-class row
// (201 KB) outgrows L2 between the passes when every SM streams rows, so reading it twice from
// global memory costs a second trip to HBM. The passes visit the same elements in the same order
// either way, so both settings give the same bits.
// No __restrict__ on logits / dlogits: they may be one buffer (T = float).
// Launch bounds: the blocks reach kMaxThreads, so nvcc must keep the registers to what that many
// threads may hold (or the launch fails with "too many resources"), which the emulator cannot see.
template <class T, bool kStaged>
__global__ void __launch_bounds__(kMaxThreads) softmax_cross_entropy_kernel(T* dlogits, float* __restrict__ loss, int32_t* __restrict__ hit,
                                             const float* logits, const int32_t* __restrict__ targets, int V,
                                             int ld, float grad_scale, bool wide_copies) {
  UL_STATIC_SMEM(RowStats, s_warp, [kMaxThreads / 32]);
  UL_DYNAMIC_SMEM(float, s_row);  // kStaged: the row, round_up(V, 4) floats
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int t = targets[row];
  const float* lg = logits + size_t(row) * ld;
  T* dr = dlogits ? dlogits + size_t(row) * ld : nullptr;
  if (t < 0) {  // ignored: the whole block leaves together, before any barrier
    if (dr)
      for (int i = tid; i < V; i += blockDim.x) dr[i] = from_float<T>(0.f);
    if (tid == 0) loss[row] = 0.f, hit[row] = 0;
    return;
  }
  const float lt = lg[t];  // read before the barriers below, so before anything overwrites it
  if (kStaged) {
    // Every copy of the row in flight at once (12 or so 16-byte copies a thread at V = 50K): the
    // block waits for one round trip, not one per pass.
    if (wide_copies) {
      for (int c = tid; 4 * c < V; c += blockDim.x)
        cp_async<16>(s_row + 4 * c, lg + 4 * c, 4 * min(4, V - 4 * c));  // the tail's missing floats are zero-filled
    } else {
      for (int i = tid; i < V; i += blockDim.x) cp_async<4>(s_row + i, lg + i, 4);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  const float* lr = kStaged ? s_row : lg;

  // Each thread's elements are i = tid + k * blockDim.x, taken kUnroll at a time: their loads are
  // issued together, so a thread has several in flight (the kernel is bound by memory latency,
  // not arithmetic), and each is still visited in the order k = 0, 1, 2, ...
  const int stride = blockDim.x;
  RowStats st{-INFINITY, 0.f, V};
  for (int i0 = tid; i0 < V; i0 += kUnroll * stride) {
    float v[kUnroll];
    UL_UNROLL for (int u = 0; u < kUnroll; u++) v[u] = i0 + u * stride < V ? lr[i0 + u * stride] : -INFINITY;
    UL_UNROLL for (int u = 0; u < kUnroll; u++) {
      if (v[u] > st.m) {
        st.s = st.s * expf(st.m - v[u]) + 1.f;  // exp(-inf) = 0 for the first element
        st.m = v[u];
        st.arg = i0 + u * stride;
      } else if (v[u] != -INFINITY) {  // exp(-inf) adds nothing (and -inf - -inf would be NaN)
        st.s += expf(v[u] - st.m);
      }
    }
  }
  st = warp_combine(st);
  if (lane == 0) s_warp[warp] = st;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    st = lane < warps ? s_warp[lane] : RowStats{-INFINITY, 0.f, V};
    st = warp_combine(st);
    if (lane == 0) s_warp[0] = st;
  }
  __syncthreads();
  st = s_warp[0];

  if (tid == 0) {
    loss[row] = logf(st.s) - (lt - st.m);
    hit[row] = st.arg == t;
  }
  if (dr) {
    const float scale = grad_scale / st.s;
    for (int i0 = tid; i0 < V; i0 += kUnroll * stride) {
      float v[kUnroll];
      UL_UNROLL for (int u = 0; u < kUnroll; u++) v[u] = i0 + u * stride < V ? lr[i0 + u * stride] : 0.f;
      UL_UNROLL for (int u = 0; u < kUnroll; u++) {
        const int i = i0 + u * stride;
        if (i >= V) break;
        const float p = expf(v[u] - st.m) * scale;
        dr[i] = from_float<T>(i == t ? p - grad_scale : p);
      }
    }
  }
}

std::atomic<int> g_row_staging{0};

// The dynamic shared memory a staged row of V logits takes, and the static the kernel declares
// (the per-warp statistics), which comes out of the same limit.
size_t staged_row_bytes(int V) { return size_t(ceil_div(V, 4)) * 4 * sizeof(float); }
constexpr size_t kStatsBytes = sizeof(RowStats) * (kMaxThreads / 32);

}  // namespace

int set_softmax_row_staging(int mode) {
  if (mode < 0 || mode > 2)
    throw std::invalid_argument("softmax_cross_entropy: row staging must be 0 (where a block can hold the row), "
                                "1 (never) or 2 (always), got " + std::to_string(mode));
  return g_row_staging.exchange(mode);
}

bool softmax_row_staged(int V) {
  const int mode = g_row_staging.load(std::memory_order_relaxed);
  if (mode == 1) return false;
  const size_t need = staged_row_bytes(V) + kStatsBytes, optin = cuda_smem_optin();
  if (need <= optin) return true;
  if (mode == 2)
    throw std::runtime_error("softmax_cross_entropy: a row of " + std::to_string(V) + " logits takes " +
                             std::to_string(need) + " bytes of shared memory; this GPU allows " +
                             std::to_string(optin) + " a block (row staging 2 asks for it always)");
  return false;
}

template <class T>
void softmax_cross_entropy(T* dlogits, float* loss, int32_t* hit, const float* logits, const int32_t* targets, int R,
                           int V, float grad_scale, cudaStream_t s, int ld) {
  if (R == 0) return;
  if (V < 1) throw std::runtime_error("softmax_cross_entropy: V = " + std::to_string(V) + " (need at least 1)");
  if (ld == 0) ld = V;
  if (ld < V) throw std::runtime_error("softmax_cross_entropy: row stride " + std::to_string(ld) + " < V = " + std::to_string(V));
  // ~16 elements per thread, in whole warps: small vocabularies do not park idle threads at the barriers.
  const int threads = int(std::min<long long>(kMaxThreads, std::max<long long>(32, ceil_div(V, 16 * 32) * 32)));
  // Without a gradient there is no second pass, so nothing to stage.
  if (dlogits && softmax_row_staged(V)) {
    const size_t smem = staged_row_bytes(V);
    const bool wide = ld % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
    auto* kernel = softmax_cross_entropy_kernel<T, true>;
    // Past 48 KiB of shared memory in all (static and dynamic) a kernel must opt in. Always to the
    // most it may take, one value for every launch: ranks that are threads of one process, with
    // rows of different lengths, cannot lower it under each other's launches.
    UL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(cuda_smem_optin() - kStatsBytes)));
    launch("softmax_cross_entropy", kernel, dim3(R), dim3(threads), smem, s, dlogits, loss, hit, logits, targets, V,
           ld, grad_scale, wide);
  } else {
    launch("softmax_cross_entropy", softmax_cross_entropy_kernel<T, false>, dim3(R), dim3(threads), 0, s, dlogits,
           loss, hit, logits, targets, V, ld, grad_scale, false);
  }
}

size_t classifier_scratch_bytes(int N, int V, int chunk_rows, DType dtype) {
  return scratch::classifier(N, V, chunk_rows, dtype_size(dtype));
}

template <class T>
CrossEntropyStats classifier_forward_backward(T* dx, float* dw, const T* x, const T* w, const int32_t* targets,
                                              const int32_t* targets_host, int N, int C, int V, float grad_scale,
                                              int chunk_rows, void* scratch, cudaStream_t s, float* row_loss,
                                              uint8_t* row_hit) {
  CrossEntropyStats st;
  if (N == 0) return st;
  const bool bf = !std::is_same<T, float>::value;
  chunk_rows = std::max(1, std::min(chunk_rows, N));
  // Scratch: logits (chunk_rows, L) fp32 | dlogits (chunk_rows, L) T, bf16 only (f32 reuses the
  // logits) | loss (N) fp32 | hit (N) i32; each region's offset rounded to 256 bytes. A row holds V values in a
  // stride of L = round_up(V, 64): the GEMMs that write and read them keep to aligned rows.
  const int L = int(scratch::classifier_row_stride(V));
  char* p = static_cast<char*>(scratch);
  float* logits = reinterpret_cast<float*>(p);
  p += scratch::align256(size_t(chunk_rows) * L * sizeof(float));
  T* dlogits = reinterpret_cast<T*>(logits);
  if (bf) {
    dlogits = reinterpret_cast<T*>(p);
    p += scratch::align256(size_t(chunk_rows) * L * sizeof(T));
  }
  float* loss = reinterpret_cast<float*>(p);
  int32_t* hit = reinterpret_cast<int32_t*>(p + scratch::align256(size_t(N) * 4));
  // Rows never scored (whole chunks of ignored targets) read as zero loss and no hit.
  UL_CUDA_CHECK(cudaMemsetAsync(loss, 0, size_t(N) * 4, s));
  UL_CUDA_CHECK(cudaMemsetAsync(hit, 0, size_t(N) * 4, s));
  const bool grad = dx || dw;

  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {  // 64-bit: r0 + chunk_rows may pass int's end
    // Trim the chunk to its first and last valid target: a run of ignored rows costs no GEMM.
    int a = int(r0), b = int(std::min<int64_t>(N, r0 + chunk_rows));
    while (a < b && targets_host[a] < 0) a++;
    while (b > a && targets_host[b - 1] < 0) b--;
    if (a == b) continue;
    const int R = b - a;
    const T* xc = x + size_t(a) * C;
    // logits (R, V) = x (R, C) · w[0:V]^T (C, V): the padded rows of w are never read.
    gemm<T, float>(logits, xc, w, nullptr, R, V, C, false, true, false, "classifier logits", s, {0, 0, L});
    softmax_cross_entropy<T>(grad ? dlogits : nullptr, loss + a, hit + a, logits, targets + a, R, V, grad_scale, s, L);
    if (!grad) continue;
    // dx (R, C) += dlogits (R, V) · w[0:V] (V, C)
    if (dx) gemm<T, T>(dx + size_t(a) * C, dlogits, w, nullptr, R, C, V, false, false, true, "classifier dx", s, {L, 0, 0});
    // dw[0:V] (V, C) += dlogits^T (V, R) · x (R, C), in fp32 (A stored (R, V) in rows of L)
    if (dw) gemm<T, float>(dw, dlogits, xc, nullptr, V, C, R, true, false, true, "classifier dw", s, {L, 0, 0});
  }

  std::vector<float> loss_h(N);
  std::vector<int32_t> hit_h(N);
  UL_CUDA_CHECK(cudaMemcpyAsync(loss_h.data(), loss, size_t(N) * 4, cudaMemcpyDeviceToHost, s));
  UL_CUDA_CHECK(cudaMemcpyAsync(hit_h.data(), hit, size_t(N) * 4, cudaMemcpyDeviceToHost, s));
  UL_CUDA_CHECK(cudaStreamSynchronize(s));
  for (int n = 0; n < N; n++) {
    st.loss_sum += loss_h[n];
    st.n_correct += hit_h[n];
    st.n_valid += targets_host[n] >= 0;
  }
  if (row_loss) std::copy(loss_h.begin(), loss_h.end(), row_loss);
  if (row_hit)
    for (int n = 0; n < N; n++) row_hit[n] = uint8_t(hit_h[n] != 0);
  return st;
}

template void softmax_cross_entropy<float>(float*, float*, int32_t*, const float*, const int32_t*, int, int, float,
                                           cudaStream_t, int);
template void softmax_cross_entropy<__nv_bfloat16>(__nv_bfloat16*, float*, int32_t*, const float*, const int32_t*,
                                                   int, int, float, cudaStream_t, int);
template CrossEntropyStats classifier_forward_backward<float>(float*, float*, const float*, const float*,
                                                              const int32_t*, const int32_t*, int, int, int, float,
                                                              int, void*, cudaStream_t, float*, uint8_t*);
template CrossEntropyStats classifier_forward_backward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                                                      const __nv_bfloat16*, const int32_t*,
                                                                      const int32_t*, int, int, int, float, int,
                                                                      void*, cudaStream_t, float*, uint8_t*);

}  // namespace cuda
}  // namespace ul
