// The emulated CUDA runtime: "device" memory is host memory; every call is synchronous except
// the copies of a non-blocking stream, which are deferred (see CUstream_st).
#include "engine/cuda_emu/runtime.h"

#include "engine/cuda_emu/gpu_models.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

// A stream made with cudaStreamNonBlocking defers its copies: they wait in its queue and run only
// when the program makes them observable (an event on that stream synchronized or waited on, the
// stream synchronized, the device synchronized, memory freed). So a missing wait shows up here as
// stale data, the way it would on a GPU, instead of being hidden by synchronous execution. Other
// streams (and the legacy default stream, nullptr) run everything at once. A stream belongs to the
// thread that made it (each rank of the local communicator is a thread with its own streams).
struct CUstream_st {
  bool deferred = false;
  std::deque<std::function<void()>> queue;
  uint64_t issued = 0, done = 0;
  std::thread::id owner = std::this_thread::get_id();

  void run_until(uint64_t n) {
    while (done < n && !queue.empty()) {
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      op();
      done++;
    }
  }
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
  bool recorded = false;
  cudaStream_t stream = nullptr;  // where it was recorded, and how much of that stream it covers
  uint64_t upto = 0;
};

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

// Like the real runtime: a failing call returns its error and also leaves it for cudaGetLastError.
cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

// The deferred streams, to drain on cudaDeviceSynchronize and before a free: the calling thread's.
std::mutex g_streams_mu;
std::set<cudaStream_t> g_streams;

void drain_this_thread() {
  std::vector<cudaStream_t> mine;
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    for (cudaStream_t s : g_streams)
      if (s->owner == std::this_thread::get_id()) mine.push_back(s);
  }
  for (cudaStream_t s : mine) s->run_until(s->issued);
}

bool valid_kind(cudaMemcpyKind k) { return k >= cudaMemcpyHostToHost && k <= cudaMemcpyDefault; }

// Device allocations: each is its own mapping and ends right before a PROT_NONE page, so a kernel
// that reads or writes past the end of a buffer (by more than the buffer's rounding up to 256
// bytes) faults at that access, where on a GPU it would read or corrupt a neighbouring buffer
// without a word. Keyed by the pointer cudaMalloc returned.
struct Mapping {
  char* base;
  size_t len;
  size_t bytes, rounded;  // asked for; with the rounding up to 256 (poisoned, checked at the free)
};
struct Mappings {
  std::mutex mu;
  std::unordered_map<void*, Mapping> by_ptr;
  size_t held = 0;  // bytes cudaMalloc was asked for and not yet freed
};
// Never destroyed: static destructors elsewhere may still free device memory at exit.
Mappings& mappings() {
  static Mappings* m = new Mappings;
  return *m;
}

}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + 255) / 256 * 256;  // 256-byte alignment, as cudaMalloc guarantees
  const size_t data = (rounded + page - 1) / page * page;
  void* m = mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  char* base = static_cast<char*>(m);
  mprotect(base + data, page, PROT_NONE);  // the guard page
  char* q = base + data - rounded;
  // Fresh device memory reads as NaN (all bits set) in f32 and bf16, so a kernel that reads what
  // nothing wrote poisons its result instead of silently reading zeros. The rounding's slack past
  // the end too: a read just past a buffer reads NaN (on a GPU, a neighbour's data), and a write
  // there is caught when the buffer is freed.
  std::memset(q, 0xff, rounded);
  {
    Mappings& ms = mappings();
    std::lock_guard<std::mutex> lock(ms.mu);
    ms.by_ptr[q] = {base, data + page, bytes, rounded};
    ms.held += bytes;
  }
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  drain_this_thread();  // cudaFree synchronizes the device
  if (!p) return cudaSuccess;
  Mapping m;
  {
    Mappings& ms = mappings();
    std::lock_guard<std::mutex> lock(ms.mu);
    const auto it = ms.by_ptr.find(p);
    if (it == ms.by_ptr.end()) return fail(cudaErrorInvalidValue);  // not from cudaMalloc, or freed twice
    m = it->second;
    ms.by_ptr.erase(it);
    ms.held -= m.bytes;
  }
  const unsigned char* tail = static_cast<const unsigned char*>(p) + m.bytes;
  for (size_t i = 0; i < m.rounded - m.bytes; i++)
    if (tail[i] != 0xff) {  // on a GPU: a neighbouring buffer corrupted without a word
      std::fprintf(stderr, "cuda_emu: something wrote %zu byte(s) past the end of a %zu-byte cudaMalloc buffer\n",
                   i + 1, m.bytes);
      std::abort();
    }
  munmap(m.base, m.len);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* p) {
  drain_this_thread();
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (!valid_kind(kind)) return fail(cudaErrorInvalidValue);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!s || !s->deferred) return cudaMemcpy(dst, src, bytes, kind);
  if (!valid_kind(kind)) return fail(cudaErrorInvalidValue);
  if (bytes && (!dst || !src)) return fail(cudaErrorInvalidValue);
  s->queue.push_back([=] { std::memmove(dst, src, bytes); });  // reads src when it runs, as a GPU would
  s->issued++;
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!p) return fail(cudaErrorInvalidValue);
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (!s) return fail(cudaErrorInvalidValue);
  *s = new CUstream_st;
  (*s)->deferred = (flags & cudaStreamNonBlocking) != 0;
  if ((*s)->deferred) {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    g_streams.insert(*s);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  s->run_until(s->issued);  // the real call lets queued work finish too
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    g_streams.erase(s);
  }
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s) s->run_until(s->issued);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  // Whatever waits, the work the event covers must be done before the waiter's next operation;
  // everything but deferred streams runs at once, so running it now is exactly that.
  if (e->stream) e->stream->run_until(e->upto);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  if (!e) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  e->t = std::chrono::steady_clock::now();
  e->recorded = true;
  e->stream = s && s->deferred ? s : nullptr;
  e->upto = e->stream ? s->issued : 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (e->stream) e->stream->run_until(e->upto);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  drain_this_thread();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return fail(cudaErrorInvalidValue);
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  t_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
  if (!d) return fail(cudaErrorInvalidValue);
  *d = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (d != 0) return fail(cudaErrorInvalidDevice);
  const ul_emu::GpuModel& m = ul_emu::emulated_gpu();
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "%s", m.name);
  const pid_t pid = getpid();
  std::memcpy(p->uuid.bytes, &pid, sizeof pid);
  p->totalGlobalMem = m.memory;
  p->sharedMemPerBlockOptin = m.smem_optin;
  p->major = m.major;
  p->minor = m.minor;
  p->multiProcessorCount = m.sms;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int d) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (d != 0) return fail(cudaErrorInvalidDevice);
  const ul_emu::GpuModel& m = ul_emu::emulated_gpu();
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = m.sms; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = m.major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = m.minor; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(m.smem_optin); return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  *total = ul_emu::emulated_gpu().memory;
  Mappings& ms = mappings();
  std::lock_guard<std::mutex> lock(ms.mu);
  *free = ms.held < *total ? *total - ms.held : 0;
  return cudaSuccess;
}

namespace ul_emu {
bool set_max_dynamic_smem(const void* kernel, size_t bytes);  // executor.cpp: checked at launch
size_t kernel_smem_limit(const void* kernel);                 // executor.cpp
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void* func) {
  if (!a || !func) return fail(cudaErrorInvalidValue);
  const ul_emu::GpuModel& m = ul_emu::emulated_gpu();
  if (!ul_emu::has_kernel_image(ul_emu::kernel_archs(), m.major, m.minor))
    return fail(cudaErrorNoKernelImageForDevice);
  *a = cudaFuncAttributes{};
  a->maxThreadsPerBlock = 1024;
  a->maxDynamicSharedSizeBytes = int(ul_emu::kernel_smem_limit(func));
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      !ul_emu::set_max_dynamic_smem(func, size_t(value)))
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
