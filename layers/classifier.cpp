#include "layers/classifier.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/device.h"
#include "layers/linear.h"
#include "layers/op_util.h"

namespace ul {
namespace {

// Throws on a target outside [-1, V); returns the number of valid (!= -1) targets.
int64_t check_targets(const int32_t* targets, int N, int V) {
  int64_t n_valid = 0;
  for (int n = 0; n < N; n++) {
    const int32_t t = targets[n];
    if (t < -1 || t >= V)
      throw std::runtime_error("classifier_cross_entropy: target " + std::to_string(t) + " at index " +
                               std::to_string(n) + " is outside [-1, V) with V = " + std::to_string(V));
    n_valid += t >= 0;
  }
  return n_valid;
}

// Scratch elements for chunks of up to R rows: the logits (R, V), plus the gathered x rows and
// their dx (R, C each) for chunks whose valid rows are not contiguous.
size_t scratch_elems(int R, int C, int V) { return size_t(R) * V + 2 * size_t(R) * C; }

// Softmax + cross-entropy over the rows of one chunk, in place: on entry L holds the logits
// (R, V); on exit, when `grad`, it holds dlogits = (p - onehot(target)) * grad_scale.
// tg: the R targets, all valid. Adds each row's loss and hit into the stats; row_loss and row_hit
// (R each, may be null) get each row's loss and hit.
template <class T>
void softmax_xent_rows(T* L, const int32_t* tg, int R, int V, T grad_scale, bool grad, CrossEntropyStats& st,
                       float* row_loss, uint8_t* row_hit) {
  // Per-row results, summed serially afterwards: the loss does not depend on the thread count.
  std::vector<double> loss(R);
  std::vector<char> hit(R);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < R; r++) {
    Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> row(L + size_t(r) * V, V);
    const int t = tg[r];
    const T mx = row.maxCoeff();
    // argmax: the first index holding mx. A scalar scan would cost twice the rest of this loop, so
    // find the first block of 256 whose (vectorised) max is mx, then scan only that block.
    int arg = 0;
    while (arg + 256 < V && row.segment(arg, 256).maxCoeff() != mx) arg += 256;
    while (arg < V - 1 && row[arg] != mx) arg++;
    const T lt = row[t];
    row = (row - mx).exp();
    // Sum the V exponentials (each in (0, 1]) in blocks: vectorised sums of 4096 terms, combined
    // in double, so a 50k vocabulary loses no precision in the normaliser.
    double sum = 0;
    for (int j = 0; j < V; j += 4096) sum += double(row.segment(j, std::min(4096, V - j)).sum());
    loss[r] = std::log(sum) - double(lt - mx);
    hit[r] = arg == t;
    if (grad) {
      row *= T(double(grad_scale) / sum);
      row[t] -= grad_scale;
    }
  }
  for (int r = 0; r < R; r++) {
    st.loss_sum += loss[r];
    st.n_correct += hit[r];
    if (row_loss) row_loss[r] = float(loss[r]);
    if (row_hit) row_hit[r] = uint8_t(hit[r]);
  }
}

// The chunked algorithm behind both the CPU function and the op. Ignored rows are left out of
// every GEMM: the rows with a valid target are taken chunk_rows at a time; a chunk whose rows are
// contiguous in x is used in place, another one is gathered into scratch (and its dx scattered back).
// scratch: scratch_elems(chunk_rows, C, V) elements. dx (N, C), dw (>= V, C), row_loss and row_hit
// (N each, host) may be null.
template <class T>
CrossEntropyStats classifier_chunks(T* scratch, T* dx, T* dw, const T* x, const T* w, const int32_t* targets, int N,
                                    int C, int V, T grad_scale, int chunk_rows, float* row_loss,
                                    uint8_t* row_hit) {
  CrossEntropyStats st;
  if (row_loss) std::fill_n(row_loss, N, 0.f);  // ignored rows: no loss, no hit
  if (row_hit) std::fill_n(row_hit, N, uint8_t(0));
  std::vector<float> chunk_loss(row_loss ? std::min(chunk_rows, N) : 0);
  std::vector<uint8_t> chunk_hit(row_hit ? std::min(chunk_rows, N) : 0);
  std::vector<int> rows_v;  // indices of the valid rows
  std::vector<int32_t> tg;  // their targets
  rows_v.reserve(N);
  for (int n = 0; n < N; n++)
    if (targets[n] >= 0) rows_v.push_back(n), tg.push_back(targets[n]);
  const int NV = int(rows_v.size());
  st.n_valid = NV;
  const bool grad = dx || dw;
  chunk_rows = std::max(1, chunk_rows);
  T* logits = scratch;
  T* xg = scratch + size_t(chunk_rows) * V;
  T* dxg = xg + size_t(chunk_rows) * C;

  for (int64_t k0 = 0; k0 < NV; k0 += chunk_rows) {  // 64-bit: k0 + chunk_rows may pass int's end
    const int R = int(std::min<int64_t>(chunk_rows, NV - k0));
    const int first = rows_v[k0];
    const bool contiguous = rows_v[k0 + R - 1] - first == R - 1;
    const T* xc = x + size_t(first) * C;
    if (!contiguous) {
      for (int i = 0; i < R; i++) std::copy_n(x + size_t(rows_v[k0 + i]) * C, C, xg + size_t(i) * C);
      xc = xg;
    }
    // The GEMMs are those of a linear layer without bias: x (R, C) -> logits (R, V) with weight w[0:V].
    cpu::linear_forward<T>(logits, xc, w, nullptr, R, C, V);  // (R, C)(C, V)
    softmax_xent_rows(logits, tg.data() + k0, R, V, grad_scale, grad, st, row_loss ? chunk_loss.data() : nullptr,
                      row_hit ? chunk_hit.data() : nullptr);
    for (int i = 0; i < R && row_loss; i++) row_loss[rows_v[k0 + i]] = chunk_loss[i];
    for (int i = 0; i < R && row_hit; i++) row_hit[rows_v[k0 + i]] = chunk_hit[i];
    if (!grad) continue;
    // dx (R, C) += dlogits w[0:V], straight into dx when the rows are contiguous; dw[0:V] += dlogits^T x.
    T* dxc = !dx ? nullptr : contiguous ? dx + size_t(first) * C : dxg;
    if (dx && !contiguous) std::fill_n(dxg, size_t(R) * C, T(0));
    cpu::linear_backward<T>(dxc, dw, nullptr, logits, xc, w, R, C, V);
    if (dx && !contiguous)
      for (int i = 0; i < R; i++) {
        T* dst = dx + size_t(rows_v[k0 + i]) * C;
        const T* src = dxg + size_t(i) * C;
        for (int c = 0; c < C; c++) dst[c] += src[c];
      }
  }
  return st;
}

}  // namespace

// On the CPU a chunk's logits take about 32 MiB of f32 (8M elements): large enough that the
// (V, R)(R, C) weight-gradient GEMM has a deep inner dimension, small enough that the arena never
// holds more than one chunk (64 MiB chunks measured no faster for GPT-2 124M at B*T = 256); a
// multiple of 16. On CUDA the rows are the M of three GEMMs that a GPU runs in 128-row tiles: 160
// rows (GPT-2's vocabulary at 8M) would leave a tile 3/4 empty and launch a chunk's kernels 200
// times per 32K tokens, so a chunk is 64M elements (256 MiB of f32 logits, 1280 rows for GPT-2),
// a multiple of 128.
int classifier_chunk_rows(int V, int64_t n_valid, Device device) {
  const bool cuda = device == Device::cuda;
  const int64_t elems = int64_t(cuda ? 64 : 8) << 20, align = cuda ? 128 : 16;
  int64_t r = std::max<int64_t>(1, elems / V);
  if (r > align) r -= r % align;
  return int(std::max<int64_t>(1, std::min<int64_t>(r, n_valid)));
}

namespace cpu {

template <class T>
CrossEntropyStats classifier_forward_backward(T* dx, T* dw, const T* x, const T* w, const int32_t* targets, int N,
                                              int C, int V, T grad_scale, int chunk_rows, T* scratch) {
  check_targets(targets, N, V);
  std::vector<T> own;
  if (!scratch) {
    chunk_rows = std::max(1, std::min(chunk_rows, N));
    own.resize(scratch_elems(chunk_rows, C, V));
    scratch = own.data();
  }
  return classifier_chunks(scratch, dx, dw, x, w, targets, N, C, V, grad_scale, chunk_rows, nullptr, nullptr);
}

size_t classifier_scratch_elems(int chunk_rows, int C, int V) { return scratch_elems(chunk_rows, C, V); }

template CrossEntropyStats classifier_forward_backward<float>(float*, float*, const float*, const float*,
                                                              const int32_t*, int, int, int, float, int, float*);
template CrossEntropyStats classifier_forward_backward<double>(double*, double*, const double*, const double*,
                                                               const int32_t*, int, int, int, double, int, double*);
}  // namespace cpu

// Both backends: w (Vp >= V, C) for x (..., C), one i32 target per row of x.
static void check_classifier_inputs(const Tensor& x, const Tensor& w, const Tensor& targets, int V) {
  if (targets.dtype != DType::i32)
    throw std::runtime_error("classifier_cross_entropy: targets must be i32, got " +
                             std::string(dtype_name(targets.dtype)));
  const int C = last_dim(x), N = rows(x);
  if (w.ndim() != 2 || w.size(1) != C || V < 1 || w.size(0) < V)
    throw std::runtime_error("classifier_cross_entropy: weight must be (Vp >= V = " + std::to_string(V) + ", " +
                             std::to_string(C) + "), got " + w.shape.str());
  if (targets.numel() != N)
    throw std::runtime_error("classifier_cross_entropy: " + std::to_string(targets.numel()) + " targets for " +
                             std::to_string(N) + " rows of " + x.shape.str());
}

#if ULYSSES_HAVE_CUDA
// The same op on the CUDA backend, for f32 and bf16 x and w; dw is f32 either way. targets: i32 on
// the cuda device (or on the cpu: then uploaded). The targets are read on the host too: they are
// checked there, and they decide which rows the chunks cover.
static CrossEntropyStats classifier_cross_entropy_cuda(const Tensor& x, const Tensor& w, const Tensor& targets, int V,
                                                       float grad_scale, float* row_loss, uint8_t* row_hit) {
  const int C = last_dim(x), N = rows(x);
  check_classifier_inputs(x, w, targets, V);
  std::vector<int32_t> tg(N);
  copy_to_host(tg.data(), targets);
  check_targets(tg.data(), N, V);
  CrossEntropyStats st;
  dispatch_cuda(x, {&w}, "classifier_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    Context& c = ctx();
    const bool grad = c.tape.recording && (x.requires_grad() || w.requires_grad());
    // The gradient slots first: allocated on first use from the arena, they must outlive the scope.
    T* dx = grad && x.requires_grad() ? grad_or_scratch_as<T>(x) : nullptr;
    float* dw = grad && w.requires_grad() ? weight_grad_or_scratch(w) : nullptr;
    // The chunks run over all rows (trimmed to valid targets), so the row count caps their size.
    const int R = classifier_chunk_rows(V, N, Device::cuda);
    ArenaScope scope(c.arena);  // one chunk of scratch, released on return
    const int32_t* tg_dev = targets.device == Device::cuda ? targets.i32() : nullptr;
    if (!tg_dev) {
      int32_t* up = static_cast<int32_t*>(c.arena.alloc(size_t(N) * sizeof(int32_t)));
      device_copy(up, Device::cuda, tg.data(), Device::cpu, size_t(N) * sizeof(int32_t));
      tg_dev = up;
    }
    void* scratch = c.arena.alloc(cuda::classifier_scratch_bytes(N, V, R, x.dtype));
    st = cuda::classifier_forward_backward<T>(dx, dw, x.as<T>(), w.as<T>(), tg_dev, tg.data(), N, C, V, grad_scale,
                                              R, scratch, op_stream(), row_loss, row_hit);
  });
  return st;
}
#endif

CrossEntropyStats classifier_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int V,
                                           float grad_scale, float* row_loss, uint8_t* row_hit) {
#if ULYSSES_HAVE_CUDA
  if (x.device == Device::cuda) return classifier_cross_entropy_cuda(x, w, targets, V, grad_scale, row_loss, row_hit);
#endif
  require_cpu_f32(x, "classifier_cross_entropy");
  require_cpu_f32(w, "classifier_cross_entropy weight");
  if (targets.device != Device::cpu)
    throw std::runtime_error(std::string("classifier_cross_entropy: targets must be on the cpu, got ") +
                             device_name(targets.device));
  const int C = last_dim(x), N = rows(x);
  check_classifier_inputs(x, w, targets, V);
  const int64_t n_valid = check_targets(targets.i32(), N, V);

  Context& c = ctx();
  const bool grad = c.tape.recording && (x.requires_grad() || w.requires_grad());
  // The gradient slots first: allocated on first use from the arena, they must outlive the scope.
  float* dx = grad && x.requires_grad() ? c.tape.gradf(x) : nullptr;
  float* dw = grad && w.requires_grad() ? c.tape.gradf(w) : nullptr;
  // Sized by the valid rows (the CUDA twin sizes them by all rows), so with ignored targets the
  // CPU's arena peak is below the planner's, which plans every target valid: a smaller scratch,
  // not a planner error.
  const int R = classifier_chunk_rows(V, n_valid, Device::cpu);
  ArenaScope scope(c.arena);  // one chunk of scratch, released on return
  float* scratch = static_cast<float*>(c.arena.alloc(scratch_elems(R, C, V) * sizeof(float)));
  return classifier_chunks(scratch, dx, dw, x.f32(), w.f32(), targets.i32(), N, C, V, grad_scale, R, row_loss, row_hit);
}

}  // namespace ul
