#include "layers/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "layers/op_util.h"

namespace ul {
namespace cpu {

// y: (N, C), idx, pos: (N), wte: (V, C), wpe: (maxT, C) or nullptr (then pos is not read)
template <class T>
void embedding_forward(T* y, const int32_t* idx, const int32_t* pos, const T* wte, const T* wpe, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    T* yr = y + size_t(n) * C;
    const T* te = wte + size_t(idx[n]) * C;
    if (wpe) {
      const T* pe = wpe + size_t(pos[n]) * C;
      for (int c = 0; c < C; c++) yr[c] = te[c] + pe[c];
    } else {
      for (int c = 0; c < C; c++) yr[c] = te[c];
    }
  }
}

// Rows of dy scatter into the tables, and two rows n may hit the same table row. To stay
// deterministic without atomics, threads split the channels: each owns a channel range and adds
// rows n = 0, 1, ... in order, so every sum is taken in the same order whatever the thread count.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dy, const int32_t* idx, const int32_t* pos, int N, int C) {
  constexpr int kChunk = 64;  // channels per task: whole cache lines, enough tasks for the threads
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < n_chunks; k++) {
    const int c0 = k * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int n = 0; n < N; n++) {
      const T* dyr = dy + size_t(n) * C;
      T* te = dwte + size_t(idx[n]) * C;
      for (int c = c0; c < c1; c++) te[c] += dyr[c];
      if (dwpe) {
        T* pe = dwpe + size_t(pos[n]) * C;
        for (int c = c0; c < c1; c++) pe[c] += dyr[c];
      }
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const int32_t*, const float*, const float*, int, int);
template void embedding_forward<double>(double*, const int32_t*, const int32_t*, const double*, const double*, int,
                                        int);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, const int32_t*, int, int);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, const int32_t*, int, int);
}  // namespace cpu

namespace {
void require_cpu_i32(const Tensor& t, const char* what) {
  if (t.device != Device::cpu)
    throw std::runtime_error(std::string(what) + ": the " + device_name(t.device) + " backend is not built in");
  if (t.dtype != DType::i32)
    throw std::runtime_error(std::string(what) + ": expected i32, got " + dtype_name(t.dtype));
}

// Every v[n] must lie in [0, limit); the error names the value, its index and the range.
void check_range(const int32_t* v, int N, int64_t limit, const char* kind, const char* table) {
  for (int n = 0; n < N; n++)
    if (v[n] < 0 || v[n] >= limit)
      throw std::runtime_error("embedding: " + std::string(kind) + " " + std::to_string(v[n]) + " at index " +
                               std::to_string(n) + " is outside the " + table + " [0, " + std::to_string(limit) +
                               ")");
}
}  // namespace

Tensor embedding(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe) {
  require_cpu_i32(idx, "embedding token ids");
  require_cpu_f32(wte, "embedding wte");
  if (idx.ndim() != 2) throw std::runtime_error("embedding: token ids must be (B, T), got " + idx.shape.str());
  if (wte.ndim() != 2) throw std::runtime_error("embedding: wte must be (V, C), got " + wte.shape.str());
  const int64_t B = idx.size(0), T = idx.size(1), V = wte.size(0);
  const int C = int(wte.size(1)), N = int(B * T);
  const bool has_wpe = wpe.defined();
  if (has_wpe) {
    require_cpu_f32(wpe, "embedding wpe");
    if (wpe.ndim() != 2 || wpe.size(1) != C)
      throw std::runtime_error("embedding: wpe must be (maxT, " + std::to_string(C) + "), got " + wpe.shape.str());
    if (!pos.defined()) throw std::runtime_error("embedding: wpe is given but positions are not");
  }
  if (pos.defined()) {
    require_cpu_i32(pos, "embedding positions");
    check_shape(pos, idx.shape, "embedding positions");
  }
  check_range(idx.i32(), N, V, "token id", "vocabulary");
  if (has_wpe) check_range(pos.i32(), N, wpe.size(0), "position", "position table");

  Context& c = ctx();
  Tensor y = c.empty({B, T, C});
  const int32_t* pos_p = has_wpe ? pos.i32() : nullptr;
  cpu::embedding_forward(y.f32(), idx.i32(), pos_p, wte.f32(), has_wpe ? wpe.f32() : nullptr, N, C);
  if (needs_grad({&wte, &wpe})) {  // idx and pos are integers: no gradient flows to them
    y = c.tape.track(y);
    c.tape.push("embedding", [=] {
      const float* dy = static_cast<const float*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      cpu::embedding_backward(grad_or_scratch(wte), has_wpe ? grad_or_scratch(wpe) : nullptr, dy, idx.i32(), pos_p,
                              N, C);
    });
  }
  return y;
}

}  // namespace ul
