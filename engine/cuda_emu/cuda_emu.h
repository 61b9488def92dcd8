// SIMT emulation, the kernel side: with ULYSSES_CUDA_EMULATION=ON every .cu file is compiled as
// C++ with this header force-included, and its kernels run on the CPU (engine/cuda_emu/executor.cpp).
//
// The model, in short:
//   - each CUDA thread of a block is a fiber; the block's fibers run on ONE OS thread, switching
//     only at a barrier or a warp collective: one warp runs as far as it gets (to a barrier or its
//     end) before the next starts, first to last warp in even blocks and last to first in odd
//     ones, and the lanes of a warp likewise (lane 0 first, or lane 31 first), so that a missing
//     barrier or __syncwarp shows; blocks are spread over OpenMP threads;
//   - threadIdx/blockIdx/blockDim/gridDim are thread_local variables that the scheduler sets before
//     resuming a fiber, so they always describe the fiber that runs;
//   - static shared memory, declared UL_STATIC_SMEM(T, name, [N]...) (engine/cuda_launch.h), is a
//     `static thread_local` array: one copy per OS thread, which is one copy per block in flight,
//     since an OS thread runs one block at a time from its first fiber to its last. The first
//     thread of each block to reach the declaration fills it with 0xff bytes (NaN), as the GPU
//     leaves it undefined at a block's start: a read before any write shows instead of reading
//     the previous block's values. A plain __shared__ declaration does not compile here;
//   - __syncthreads() parks the fiber until every thread of the block has arrived; a barrier that
//     only part of the block can reach, or threads that meet at two different barriers (source
//     lines), are reported as errors, not a hang or a barrier that opens too early;
//   - warp collectives (shuffles, __syncwarp, votes) park each lane until all lanes named in the
//     mask (that still run) have arrived, then compute every lane's result at once, as the hardware
//     exchanges registers in one step; a shuffle from a lane that takes no part (undefined on the
//     GPU) yields all-one bits, NaN as a float. mma.sync and ldmatrix (Collective::aligned) also
//     need all 32 lanes present: a warp with exited or absent lanes is an error there;
//   - a limit of the model: lanes meet at every collective, so what a lane wrote to shared memory
//     before a shuffle, mma or ldmatrix is visible to the others after it, where the GPU promises
//     that only for __syncwarp and barriers; a kernel that leans on a shuffle for it passes here;
//   - other limits: __launch_bounds__ is dropped (a launch of more threads than a kernel's bound,
//     which a GPU refuses, runs here: every launch in the tree passes the bound's own expression);
//     a barrier is told from another by its source line, so one __syncthreads in a helper called
//     from both sides of a branch that splits a warp counts as one barrier (undefined on a GPU;
//     the tree's barriers are in kernel bodies, or in a helper every thread of the block calls
//     at one place: optimizer.cu's block_sum); atomics are exact, and a non-atomic
//     read-modify-write that races across blocks shows only by chance (blocks on OpenMP threads);
//     the host threads flush subnormal floats to zero (engine/float_env.h: train and the tests set
//     it), where a GPU build without -ftz keeps them, so a kernel's results below 1.2e-38 differ.
// Only what the project's kernels use is here; nvcc compiles the same files for the real GPU.
#pragma once
#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/cuda_emu/runtime.h"

// ---- qualifiers ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Kernels declare static shared memory with UL_STATIC_SMEM, which poisons it per block.
#define __shared__ static_assert(false, "declare static shared memory with UL_STATIC_SMEM(T, name, [N])");
#define UL_STATIC_SMEM(T, name, dims) \
  static thread_local T name dims;     \
  ::ul_emu::static_smem(&name, sizeof(name))
// Dynamic shared memory, spelled the same on both paths (see engine/cuda_launch.h for nvcc's).
#define UL_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::ul_emu::dynamic_smem())

constexpr int warpSize = 32;

// ---- the running fiber's coordinates (set by the scheduler) --------------------------------------
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace ul_emu {

// aligned: mma.sync and ldmatrix (engine/mma.h), which all 32 lanes of the warp must execute.
enum class Collective : int { none, sync, ballot, shfl_idx, shfl_up, shfl_down, shfl_xor, aligned };

// The call's source line: threads that meet at two different barriers are an error (below).
void syncthreads(const char* file, int line);
// Parks the calling lane until every running lane of `mask` has arrived with the same op, mask
// and width; returns this lane's result bits (the shuffled value, or the ballot in the low 32 bits
// with the participating lanes in the high 32).
uint64_t warp_collective(Collective op, unsigned mask, uint64_t value, int arg, int width);
void* dynamic_smem();  // this block's dynamic shared memory (nullptr when the launch asked for none)
// A static shared array's declaration, run by every thread: the block's first fills it with 0xff
// bytes; past 48 KiB of static shared memory in a block (the GPU's limit), or the emulated GPU's
// opt-in limit with the dynamic (227 KiB on an H100: gpu_models.h), the launch fails.
void static_smem(void* array, size_t bytes);
// Whether [p, p + bytes) lies in this block's dynamic shared memory or one of its static shared
// arrays: what ldmatrix's row addresses and cp.async's destination must be (a GPU faults otherwise).
bool is_shared(const void* p, size_t bytes);

// cp.async (engine/async_copy.h): `bytes` (4, 8 or 16) from src to dst, of which the first
// src_bytes are read and the rest zero-filled. The destination turns to NaN bytes when the copy is
// issued and gets its data only when a cp_async_wait retires the copy's commit group: on the GPU it
// is undefined in between, so a tile read before its wait (or before the barrier after it, by
// another thread), or refilled while another warp still reads it, shows as NaN.
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);  // retires all but the `pending` newest committed groups

// Runs body once per thread of every block; throws std::runtime_error naming the kernel, the block
// and the misuse (bad configuration, partial barrier, deadlock, or the kernel's own exception).
// More than 48 KiB of dynamic shared memory needs set_max_dynamic_smem(kernel, ...) first, as
// cudaFuncSetAttribute on the GPU.
void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
              const std::function<void()>& body);
bool set_max_dynamic_smem(const void* kernel, size_t bytes);  // false past the emulated GPU's opt-in limit
// The launch's configuration alone (what run_grid checks first): a queued launch is checked at
// issue, as the GPU refuses a bad configuration at the launch, not when the grid would run.
void check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes);

// A kernel's pointer argument must be one the GPU can follow (device_reachable) or null: the
// emulator shares the host's address space and would follow any, where a GPU faults (an illegal
// address, sticky). A pointer inside a struct argument is not seen.
std::string host_pointer_arg(const char* kernel, size_t index, const void* p);  // the message
template <class P>
void check_pointer_arg(const char* kernel, size_t index, const P& p) {
  if constexpr (std::is_pointer<P>::value && !std::is_function<std::remove_pointer_t<P>>::value) {
    if (p != nullptr && !device_reachable(p)) {
      note_device_fault(cudaErrorIllegalAddress);
      throw std::runtime_error(host_pointer_arg(kernel, index, p));
    }
  }
}

// Runs the grid at once, or queues it when the stream runs late (runtime.h: StreamOrder); `name`
// must outlive a queued launch (the engine passes string literals).
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  // Converted once, as a <<<>>> call would; every fiber then gets its own copies (by-value params).
  const auto params = std::tuple<P...>(std::forward<A>(args)...);
  const void* entry = reinterpret_cast<const void*>(kernel);
  check_launch(name, entry, grid, block, smem_bytes);
  std::apply([name](const auto&... a) {
    size_t i = 0;
    (check_pointer_arg(name, i++, a), ...);
  }, params);
  on_stream(stream, [=] { run_grid(name, entry, grid, block, smem_bytes, [&] { std::apply(kernel, params); }); });
}

template <class T>
T shuffle(Collective op, unsigned mask, T var, int arg, int width) {
  static_assert(std::is_arithmetic<T>::value || std::is_same<T, __nv_bfloat16>::value,
                "CUDA shuffles take arithmetic types and __nv_bfloat16");
  static_assert(sizeof(T) <= 8, "at most 64 bits per shuffle");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_collective(op, mask, bits, arg, width);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

}  // namespace ul_emu

// ---- barriers and warp collectives ---------------------------------------------------------------
// A macro, so that the barrier is known by its call's source line (the compiler may inline or
// duplicate the call; the line stays): bar.sync is .aligned, every thread must reach the same one.
#define __syncthreads() ::ul_emu::syncthreads(__FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) { ul_emu::warp_collective(ul_emu::Collective::sync, mask, 0, 0, 32); }

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return ul_emu::shuffle(ul_emu::Collective::shfl_idx, mask, var, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ul_emu::shuffle(ul_emu::Collective::shfl_up, mask, var, int(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ul_emu::shuffle(ul_emu::Collective::shfl_down, mask, var, int(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return ul_emu::shuffle(ul_emu::Collective::shfl_xor, mask, var, lane_mask, width);
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  return unsigned(ul_emu::warp_collective(ul_emu::Collective::ballot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
  uint64_t r = ul_emu::warp_collective(ul_emu::Collective::ballot, mask, pred != 0, 0, 32);
  return uint32_t(r) == uint32_t(r >> 32);
}

// ---- integer intrinsics ---------------------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// Blocks of a grid run concurrently on OpenMP threads; fences order their memory like on a GPU.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- atomics: real ones, since blocks run on several OS threads ----------------------------------
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
namespace ul_emu {
template <class T, class F>
T atomic_update(T* a, F f) {  // compare-and-swap loop; returns the old value like CUDA's atomics
  T old;
  __atomic_load(a, &old, __ATOMIC_RELAXED);
  T next = f(old);
  while (!__atomic_compare_exchange(a, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) next = f(old);
  return old;
}
}  // namespace ul_emu
inline float atomicAdd(float* a, float v) { return ul_emu::atomic_update(a, [v](float o) { return o + v; }); }
inline double atomicAdd(double* a, double v) { return ul_emu::atomic_update(a, [v](double o) { return o + v; }); }
inline int atomicMax(int* a, int v) { return ul_emu::atomic_update(a, [v](int o) { return o > v ? o : v; }); }
inline int atomicMin(int* a, int v) { return ul_emu::atomic_update(a, [v](int o) { return o < v ? o : v; }); }
inline unsigned atomicMax(unsigned* a, unsigned v) {
  return ul_emu::atomic_update(a, [v](unsigned o) { return o > v ? o : v; });
}
inline int atomicExch(int* a, int v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
inline float atomicExch(float* a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
  return old;
}
inline int atomicCAS(int* a, int expected, int desired) {
  __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;  // the old value, whether or not the swap happened
}

// ---- math: libm where CUDA's name exists there, the fast intrinsics as their exact versions ------
// With ULYSSES_EMU_APPROX_MATH=1 the fast ones the kernels use land anywhere within the GPU's
// documented error instead (CUDA C++ Programming Guide, intrinsic functions: rsqrtf 2 ulp, __expf
// 2 + floor(|1.16 x|) ulp; PTX ex2.approx.ftz: 2 ulp here, subnormal results flushed to zero), by a
// pseudo-random amount fixed by the input: a test whose tolerance only the exact values meet then
// fails here, not first on a GPU. Equal inputs still give equal outputs (the bitwise claims hold).
// Not perturbed: the standard functions (expf 2 ulp on a GPU, logf 1, and the double pow, log,
// sin, cos 1-2), which run as glibc's correctly rounded or near results; a tolerance met only by
// those exact values still passes here (the kernels' tests allow 1e-5 relative or more).
namespace ul_emu {
bool approx_math();             // runtime.cpp: the variable, read once
void set_approx_math(bool on);  // tests
inline float approx(float exact, float x, int max_ulp, bool ftz) {
  if (!approx_math() || !std::isfinite(exact) || exact == 0.f) return exact;
  uint32_t h;
  std::memcpy(&h, &x, 4);
  h ^= h >> 16, h *= 0x7feb352dU, h ^= h >> 15, h *= 0x846ca68bU, h ^= h >> 16;  // a hash of the input
  const int k = int(h % uint32_t(2 * max_ulp + 1)) - max_ulp;
  int32_t bits;
  std::memcpy(&bits, &exact, 4);
  bits += k;  // k ulp from the exact result (toward or away from zero, by its sign)
  float y;
  std::memcpy(&y, &bits, 4);
  if (!std::isfinite(y) || std::signbit(y) != std::signbit(exact)) y = exact;  // past the largest or the smallest
  if (ftz && std::fabs(y) < 1.17549435e-38f) y = std::copysign(0.f, y);
  return y;
}
inline float fast_exp2(float x) { return approx(exp2f(x), x, 2, true); }
}  // namespace ul_emu
inline float rsqrtf(float x) { return ul_emu::approx(1.0f / sqrtf(x), x, 2, false); }
inline float __expf(float x) {
  return ul_emu::approx(expf(x), x, 2 + int(std::min(1e6f, std::fabs(1.16f * x))), false);
}
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
template <class T>
inline T __ldg(const T* p) { return *p; }

// CUDA declares integer and float min/max at global scope for device code.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
