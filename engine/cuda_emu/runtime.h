// The host side of the CUDA emulation: the runtime API subset the engine calls (memory, copies,
// streams, events, errors, devices) on host memory, and the __nv_bfloat16 type. Plain C++: any
// file may include it (engine/cuda_runtime.h does, under ULYSSES_CUDA_EMULATED). The kernel side
// (threadIdx, __shared__, barriers, shuffles, launch) is in cuda_emu.h.
//
// One of two streams runs late, so that a missing wait between them shows up as stale data instead
// of passing by luck (ULYSSES_EMU_STREAMS, below). By default the legacy stream runs everything at
// issue (a kernel has finished when its launch returns) and a stream made with
// cudaStreamNonBlocking queues its work until an event, a stream or device synchronization, or a
// free makes it observable. Names and values follow the real API so that code written against it
// compiles unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

// ---- errors -----------------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorCudartUnloading = 4,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  // A kernel's fault (the emulator reports its own as cudaErrorLaunchFailure; the rest are named
  // so that ul::kernel_fault knows them on both paths).
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

// ---- launch geometry (shared with the kernel side) ---------------------------------------------
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

// ---- streams and events -------------------------------------------------------------------------
struct CUstream_st;  // opaque: streams only carry identity here
struct CUevent_st;   // the host time at which the work before its last record had run
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;

// ---- which stream runs late (emulation only) -------------------------------------------------------
namespace ul_emu {
// late_side (the default; ULYSSES_EMU_STREAMS=late-side): the legacy stream (nullptr) and blocking
// streams run their work at issue; non-blocking streams queue theirs (kernels, GEMMs, copies,
// memsets). A copy the legacy stream must wait for before reusing a buffer is seen not to have
// happened without that wait.
// late_main (ULYSSES_EMU_STREAMS=late-main): the other way round. The legacy stream queues its
// kernels, GEMMs, async copies and memsets (blocking streams share its queue, as they synchronize
// with it), and non-blocking streams run theirs at issue: a side-stream copy that does not wait
// for the kernels before it reads their output before they have run, or overwrites their input.
// Both orders are ones a GPU may take; a correct program gives the same bits in each. Queued work
// that fails is reported by the call that runs it: the fault's code (below), the message on stderr.
enum class StreamOrder { late_side, late_main };
StreamOrder stream_order();
// Finishes this thread's queued work first: cudaErrorLaunchFailure when some of it failed.
cudaError_t set_stream_order(StreamOrder order);
// Runs op now, or queues it on s (nullptr: the calling thread's legacy stream) when s runs late.
void on_stream(cudaStream_t s, std::function<void()> op);
// The same, for work that may wait on other processes (an emulated NCCL collective). Queued, the
// first cudaStreamQuery that reaches it starts it on a thread of its own, and answers
// cudaErrorNotReady until it has ended, so a caller polling with a deadline sees a peer that hangs
// (as on a GPU); every other call that runs the stream waits for it. op touches no CUDA call.
void on_stream_polled(cudaStream_t s, std::function<void()> op);
// The host guard (ULYSSES_EMU_HOST_GUARD=1 sets it at start): device memory is PROT_NONE except
// while device work runs (an op above, a copy), so host code that dereferences a device pointer
// faults here, with a note on stderr, as it would on a GPU. Process-wide.
void set_host_guard(bool on);
bool host_guard_on();
// A kernel's fault is sticky, as a GPU's is: once an emulated kernel has failed (a misuse the
// emulator catches, or a fault injected below), every later runtime call that touches the device
// returns the fault (cudaErrorLaunchFailure, or cudaErrorIllegalAddress for an injected one),
// cudaGetLastError keeps returning it, launches and GEMMs throw, and NCCL calls fail with
// ncclUnhandledCudaError. Per host thread, as each rank of the local communicator has a device of
// its own here. device_fault(): the calling thread's fault, or cudaSuccess.
cudaError_t device_fault();
void note_device_fault(cudaError_t e);
// Whether a kernel may follow p: device memory (cudaMalloc's) or pinned host memory
// (cudaMallocHost's, which the GPU maps); any other host address is an illegal one on a GPU.
bool device_reachable(const void* p);
// Tests only: the calling thread's device as a fresh process would find it (a GPU's fault lasts
// until the process ends).
void clear_device_fault();
// Fault injection (ULYSSES_EMU_FAULT=KERNEL[:N] sets it at start): the N-th launch (1 = the first)
// in this process of the kernel launched under the name KERNEL does not run and faults as an
// illegal address would, so that a test can see what the program does with a GPU's fault.
// Process-wide; an empty name turns it off.
void inject_fault(const char* kernel, long nth);
}  // namespace ul_emu

// ---- the runtime calls (engine/cuda_emu/runtime.cpp) ---------------------------------------------
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
};
// Device for cudaMalloc'd memory, host for cudaMallocHost's, unregistered for any other address.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);

enum : unsigned int { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum : unsigned int { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags = 0);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
// Runs what the stream has queued (work here is done once it has run), up to work that would wait
// on other processes (ul_emu::on_stream_polled): cudaErrorNotReady, left for cudaGetLastError too.
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();   // returns and clears the calling thread's last error
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* n);  // one emulated device
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int* d);

// The device's properties: those of the GPU model ULYSSES_EMU_GPU names (engine/cuda_emu/gpu_models.h;
// an H100 by default). Only the fields and attributes the engine reads.
struct CUuuid_st {
  char bytes[16];
};
typedef CUuuid_st cudaUUID_t;
struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;  // one emulated GPU per process: from the process id
  size_t totalGlobalMem;
  size_t sharedMemPerBlockOptin;
  int major, minor;
  int multiProcessorCount;
};
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d);
// total: the model's memory; free: that less what cudaMalloc holds (never below 0).
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);

// Kernel attributes: only the one the engine sets (over 48 KiB of dynamic shared memory).
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
// A kernel's attributes; cudaErrorNoKernelImageForDevice when the "binary" has no image for the
// emulated GPU (ULYSSES_EMU_KERNEL_ARCHS), as the real call says for a build for another GPU.
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  int maxThreadsPerBlock;
  int maxDynamicSharedSizeBytes;
};
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* func);
template <class T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, T* entry) {
  return cudaFuncGetAttributes(a, reinterpret_cast<const void*>(entry));
}

// Typed overloads, as the real cuda_runtime.h has them: cudaMalloc(&float_ptr, bytes).
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
template <class T>
inline cudaError_t cudaMallocHost(T** p, size_t bytes) { return cudaMallocHost(reinterpret_cast<void**>(p), bytes); }

// ---- bfloat16 -----------------------------------------------------------------------------------
// Only the raw bits and the explicit conversions: no implicit float <-> bf16 conversions or
// arithmetic, so kernel code that compiles here uses nothing the real header might lack.
struct __nv_bfloat16 {
  unsigned short __x;
};
static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is two bytes");

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.__x = static_cast<unsigned short>((u >> 16) | 0x40u);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.__x = static_cast<unsigned short>(u >> 16);
  return r;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
// Round toward zero: drop the low 16 bits.
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  r.__x = static_cast<unsigned short>(u >> 16);
  if ((u & 0x7fffffffu) > 0x7f800000u) r.__x |= 0x40u;  // keep a NaN whose payload was only low bits
  return r;
}
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = uint32_t(h.__x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
