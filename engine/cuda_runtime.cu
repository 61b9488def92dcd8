// The CUDA backend's DeviceOps: device memory through the CUDA runtime, every call checked.
// Compiled by nvcc (ULYSSES_CUDA) or as C++ over the emulated runtime (ULYSSES_CUDA_EMULATION).
#include "engine/cuda_runtime.h"

#include <mutex>
#include <stdexcept>
#include <string>

#include "engine/cuda_launch.h"
#include "engine/device.h"
#include "engine/gpu_profile.h"

namespace ul {
namespace {

// Plain cudaMalloc, never managed memory: a stray host access to device memory must fail loudly.
void* cuda_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    throw std::runtime_error("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  return p;
}

void cuda_free(void* p) {
  const cudaError_t e = cudaFree(p);
  // Buffers freed by static destructors at exit may outlive the runtime; nothing is lost then.
  if (e == cudaErrorCudartUnloading) return;
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

}  // namespace

void init_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    // The usual causes: no GPU, no driver, or a driver older than this build's CUDA runtime.
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("--device cuda: no usable CUDA device (") + cudaGetErrorString(e) + ")");
    if (n == 0) throw std::runtime_error("--device cuda: no CUDA device is visible");
    register_device_ops(Device::cuda,
                        {cuda_alloc, cuda_free, cuda_set, cuda_to_host, cuda_from_host, cuda_within, cuda_sync});
  });
}

}  // namespace ul
