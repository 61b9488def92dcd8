// The CUDA backend's DeviceOps: device memory through the CUDA runtime, every call checked.
// Compiled by nvcc (ULYSSES_CUDA) or as C++ over the emulated runtime (ULYSSES_CUDA_EMULATION).
#include "engine/cuda_runtime.h"

#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "engine/cuda_launch.h"
#include "engine/device.h"
#include "engine/gpu_profile.h"
#if ULYSSES_CUDA_EMULATED
#include "engine/cuda_emu/gpu_models.h"
#endif

namespace ul {
namespace {

// Plain cudaMalloc, never managed memory: a stray host access to device memory must fail loudly.
void* cuda_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    throw std::runtime_error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cuda_error_text(e));
  return p;
}

void cuda_free(void* p) {
  const cudaError_t e = cudaFree(p);
  // Buffers freed by static destructors at exit may outlive the runtime; nothing is lost then.
  if (e == cudaErrorCudartUnloading) return;
  // Freed by a destructor while an error unwinds the stack: that error is the one to say. A GPU's
  // fault is sticky, so every free after it fails too, and a throw from a destructor would end the
  // program (std::terminate) before the first error reached the user.
  if (e != cudaSuccess && std::uncaught_exceptions() > 0) return;
  UL_CUDA_CHECK(e);
}

void cuda_set(void* p, int byte, size_t bytes) {
  if (!bytes) return;
  gpu_profile::Span span;
  if (gpu_profile::enabled()) span.begin("cudaMemset", nullptr);
  UL_CUDA_CHECK(cudaMemset(p, byte, bytes));
}

// cudaMemcpy on the legacy default stream: ordered after every kernel launched before it, which is
// what the engine's synchronous copies (tests, checkpoints, logging) rely on.
void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* name) {
  if (!bytes) return;
  gpu_profile::Span span;
  if (gpu_profile::enabled()) span.begin(name, nullptr);
  UL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}
// cudaMemcpyDefault: the direction from the pointers (unified addressing). A collective of a GPU run
// under MPI stages its buffers through the host with these copies, and some of those buffers are
// host memory (a stop flag, a step number): a fixed direction that does not match the pointers is
// undefined behaviour; Default copies either.
void cuda_to_host(void* dst, const void* src, size_t bytes) {
  copy(dst, src, bytes, cudaMemcpyDefault, "cudaMemcpy device to host");
}
void cuda_from_host(void* dst, const void* src, size_t bytes) {
  copy(dst, src, bytes, cudaMemcpyDefault, "cudaMemcpy host to device");
}
void cuda_within(void* dst, const void* src, size_t bytes) {
  copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "cudaMemcpy device to device");
}
void cuda_sync() { UL_CUDA_CHECK(cudaDeviceSynchronize()); }

// A kernel of this build, asked for its attributes: the runtime answers "no kernel image" when the
// build has none for the device, which otherwise surfaces at the first launch of some op.
__global__ void device_probe_kernel() {}

// The devices init_cuda_backend has checked, with their memory then.
std::mutex g_checked_mu;
std::map<int, GpuInfo> g_checked;

// The CUDA runtime this build links, "13.0".
std::string runtime_version() {
#ifdef CUDART_VERSION
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#else
  return "(emulated)";
#endif
}

// The GPUs this build has kernels for, as CMake was told.
std::string built_archs() {
#if ULYSSES_CUDA_EMULATED
  const std::string a = ul_emu::kernel_archs();
  return a.empty() ? "every GPU (emulated)" : a;
#else
  return ULYSSES_CUDA_ARCHS;
#endif
}

// cuda_device_problem for device d, whose properties are p.
std::string device_problem(int d, const cudaDeviceProp& p) {
  const std::string gpu = "GPU " + std::to_string(d) + " (" + p.name + ", compute capability " +
                          std::to_string(p.major) + "." + std::to_string(p.minor) + ")";
  if (p.major < 8)
    return "--device cuda: " + gpu + " is too old: ulysses' kernels need compute capability 8.0 or newer "
           "(bf16 tensor cores and cp.async: A100, RTX 30xx, L40S, H100 and later)";
  cudaFuncAttributes a;
  const cudaError_t e = cudaFuncGetAttributes(&a, device_probe_kernel);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not sticky, but leave nothing for the next check to find
  const std::string sm = std::to_string(p.major) + std::to_string(p.minor);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
    return "--device cuda: this build has no kernels for " + gpu + ": it was built for " + built_archs() +
           " (CMAKE_CUDA_ARCHITECTURES); rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + sm +
           " (or native: the GPUs of the machine that builds; README \"CUDA backend\")";
  return "--device cuda: " + gpu + ": cannot query this build's kernels (" + cudaGetErrorString(e) + ")";
}

}  // namespace

std::string cuda_device_problem() {
#if ULYSSES_CUDA_EMULATED
  ul_emu::stream_order();  // reads ULYSSES_EMU_STREAMS: a bad value is refused here, before any work
#endif
  int d = 0;
  UL_CUDA_CHECK(cudaGetDevice(&d));
  cudaDeviceProp p;
  UL_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return device_problem(d, p);
}

size_t cuda_smem_optin() {
  int d = 0, bytes = 0;
  UL_CUDA_CHECK(cudaGetDevice(&d));
  UL_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, d));
  return size_t(bytes);
}

int visible_cuda_devices(const std::string& flag) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  // The usual causes: no GPU, no driver, or a driver older than this build's CUDA runtime.
  if (e == cudaErrorInsufficientDriver)
    throw std::runtime_error(flag + ": " + cudaGetErrorString(e) + ": update the NVIDIA driver to one that runs CUDA " +
                             runtime_version() +
                             " (this build's; CUDA 12.x needs the 525 series or newer, CUDA 13 the 580 series): "
                             "nvidia-smi shows the driver and the newest CUDA it runs");
  if (e != cudaSuccess) throw std::runtime_error(flag + ": no usable CUDA device (" + cudaGetErrorString(e) + ")");
  if (n == 0) throw std::runtime_error(flag + ": no CUDA device is visible");
  return n;
}

void init_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    visible_cuda_devices("--device cuda");
    register_device_ops(Device::cuda,
                        {cuda_alloc, cuda_free, cuda_set, cuda_to_host, cuda_from_host, cuda_within, cuda_sync});
  });
  // Each device this process uses, once (a process drives one GPU; tests may switch), and its
  // memory then, before this process allocates any: what a run's plan must fit.
  int d = 0;
  UL_CUDA_CHECK(cudaGetDevice(&d));
  std::lock_guard<std::mutex> lock(g_checked_mu);
  if (g_checked.count(d)) return;
  cudaDeviceProp p;
  UL_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  const std::string problem = device_problem(d, p);
  if (!problem.empty()) throw std::runtime_error(problem);
  GpuInfo m;
  m.device = d;
  m.name = p.name;
  uint32_t h = 2166136261u;  // FNV-1a over the UUID's 16 bytes
  for (char c : p.uuid.bytes) h = (h ^ uint8_t(c)) * 16777619u;
  m.id = h ? h : 1;
  m.major = p.major;
  m.minor = p.minor;
  UL_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  g_checked[d] = m;
}

std::string GpuInfo::describe() const {
  char mem[64];
  std::snprintf(mem, sizeof mem, "%.1f of %.1f GiB free", double(free) / (1 << 30), double(total) / (1 << 30));
  return "GPU " + std::to_string(device) + " (" + name + ", compute capability " + std::to_string(major) + "." +
         std::to_string(minor) + ", " + mem + ")";
}

// The current device's record; the caller holds g_checked_mu.
static GpuInfo& checked_device(const char* who) {
  int d = 0;
  UL_CUDA_CHECK(cudaGetDevice(&d));
  const auto it = g_checked.find(d);
  if (it == g_checked.end()) throw std::logic_error(std::string(who) + ": init_cuda_backend has not seen this device");
  return it->second;
}

GpuInfo cuda_gpu_at_start() {
  std::lock_guard<std::mutex> lock(g_checked_mu);
  return checked_device("cuda_gpu_at_start");
}

void cuda_remeasure_free_memory() {
  std::lock_guard<std::mutex> lock(g_checked_mu);
  GpuInfo& g = checked_device("cuda_remeasure_free_memory");
  size_t total = 0;
  UL_CUDA_CHECK(cudaMemGetInfo(&g.free, &total));
}

}  // namespace ul
