#include "layers/embedding.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/device.h"
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

// The error for v[n] = value outside [0, limit): it names the value, its index and the range.
[[noreturn]] void range_error(int32_t value, int n, int64_t limit, const char* kind, const char* table) {
  throw std::runtime_error("embedding: " + std::string(kind) + " " + std::to_string(value) + " at index " +
                           std::to_string(n) + " is outside the " + table + " [0, " + std::to_string(limit) + ")");
}

// Every v[n] must lie in [0, limit).
void check_range(const int32_t* v, int N, int64_t limit, const char* kind, const char* table) {
  for (int n = 0; n < N; n++)
    if (v[n] < 0 || v[n] >= limit) range_error(v[n], n, limit, kind, table);
}

// The shapes both backends check; dtypes and devices are each backend's business.
struct Dims {
  int64_t B, T, V;
  int C, N;
  bool has_wpe;
};
Dims check_dims(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe) {
  if (idx.ndim() != 2) throw std::runtime_error("embedding: token ids must be (B, T), got " + idx.shape.str());
  if (wte.ndim() != 2) throw std::runtime_error("embedding: wte must be (V, C), got " + wte.shape.str());
  Dims d{idx.size(0), idx.size(1), wte.size(0), int(wte.size(1)), row_count(idx.size(0) * idx.size(1), "embedding"), wpe.defined()};
  if (d.has_wpe) {
    if (wpe.ndim() != 2 || wpe.size(1) != d.C)
      throw std::runtime_error("embedding: wpe must be (maxT, " + std::to_string(d.C) + "), got " + wpe.shape.str());
    if (!pos.defined()) throw std::runtime_error("embedding: wpe is given but positions are not");
  }
  if (pos.defined()) check_shape(pos, idx.shape, "embedding positions");
  return d;
}
}  // namespace

#if ULYSSES_HAVE_CUDA
namespace {
void require_cuda_i32(const Tensor& t, const char* what) {
  if (t.device != Device::cuda || t.dtype != DType::i32)
    throw std::runtime_error(std::string(what) + ": expected i32 on cuda, got " + t.str());
}

// The CPU's range check, on device: a kernel finds the first value out of range, and the host
// reads that one value back to name it in the same message as the CPU op.
void check_range_cuda(const int32_t* v, int N, int64_t limit, const char* kind, const char* table) {
  int first = 0;
  {
    ArenaScope scope(ctx().arena);
    int* scratch = static_cast<int*>(ctx().arena.alloc(sizeof(int)));
    first = cuda::embedding_first_out_of_range(v, N, limit, scratch, op_stream());
  }
  if (first < 0) return;
  int32_t value = 0;
  device_copy(&value, Device::cpu, v + first, Device::cuda, sizeof(value));
  range_error(value, first, limit, kind, table);
}
}  // namespace

// The same op on the CUDA backend, for f32 and bf16 tables; table gradients are f32 either way.
static Tensor embedding_cuda(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe) {
  const Dims d = check_dims(idx, pos, wte, wpe);
  require_cuda_i32(idx, "embedding token ids");
  if (pos.defined()) require_cuda_i32(pos, "embedding positions");
  const bool has_wpe = d.has_wpe;
  const int N = d.N, C = d.C;
  Tensor y;
  dispatch_cuda(wte, {has_wpe ? &wpe : &wte}, "embedding", [&](auto tag) {
    using T = decltype(tag);
    check_range_cuda(idx.as<int32_t>(), N, d.V, "token id", "vocabulary");
    if (has_wpe) check_range_cuda(pos.as<int32_t>(), N, wpe.size(0), "position", "position table");
    Context& c = ctx();
    y = c.empty({d.B, d.T, C}, wte.dtype);
    const int32_t* pos_p = has_wpe ? pos.as<int32_t>() : nullptr;
    const T* wpe_p = has_wpe ? wpe.as<T>() : nullptr;
    cuda::embedding_forward(y.as<T>(), idx.as<int32_t>(), pos_p, wte.as<T>(), wpe_p, N, C, op_stream());
    if (!needs_grad({&wte, &wpe})) return;  // idx and pos are integers: no gradient flows to them
    y = c.tape.track(y);
    c.tape.push("embedding", [=] {
      const T* dy = static_cast<const T*>(ctx().tape.grad_if_any(y));
      if (!dy) return;
      // Gradient buffers first: one allocated lazily inside the scratch scope would be released with it.
      float* dwte = weight_grad_or_scratch(wte);  // parameter gradients are f32 whatever T is
      float* dwpe = has_wpe ? weight_grad_or_scratch(wpe) : nullptr;
      ArenaScope scope(ctx().arena);
      void* scratch = ctx().arena.alloc(cuda::embedding_backward_scratch_bytes(N));
      cuda::embedding_backward(dwte, dwpe, dy, idx.as<int32_t>(), pos_p, scratch, N, C, op_stream());
    });
  });
  return y;
}
#endif

Tensor embedding(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe) {
#if ULYSSES_HAVE_CUDA
  if (wte.device == Device::cuda) return embedding_cuda(idx, pos, wte, wpe);
#endif
  require_cpu_i32(idx, "embedding token ids");
  require_cpu_f32(wte, "embedding wte");
  if (wpe.defined()) require_cpu_f32(wpe, "embedding wpe");
  if (pos.defined()) require_cpu_i32(pos, "embedding positions");
  const Dims d = check_dims(idx, pos, wte, wpe);
  const bool has_wpe = d.has_wpe;
  const int C = d.C, N = d.N;
  check_range(idx.i32(), N, d.V, "token id", "vocabulary");
  if (has_wpe) check_range(pos.i32(), N, wpe.size(0), "position", "position table");

  Context& c = ctx();
  Tensor y = c.empty({d.B, d.T, C});
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
