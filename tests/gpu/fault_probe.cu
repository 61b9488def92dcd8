// A program whose kernel faults on purpose (a store through a null pointer), for
// tests/gpu/test_fault_gpu.cpp: a fault leaves its process's CUDA context unusable, so it runs as
// a process of its own. `fault_probe later` finds the fault at a later call (a launch's check or a
// synchronize), with CUDA_LAUNCH_BLOCKING unset; `fault_probe blocking` sets it to 1 first.
// Either way it prints the first error as train would ("caught: ...") while a device buffer is
// freed as the stack unwinds, and exits 0; 2 when nothing failed.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#include "engine/device.h"

namespace {

__global__ void store_kernel(float* p) { p[threadIdx.x] = 1.f; }  // p: nullptr for the fault

struct DeviceBuffer {
  void* p = ul::device_alloc(ul::Device::cuda, 1024);
  ~DeviceBuffer() { ul::device_free(ul::Device::cuda, p); }  // fails after the fault: must not throw
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "later" && mode != "blocking") {
    std::fprintf(stderr, "usage: fault_probe later|blocking\n");
    return 1;
  }
  // Before the first CUDA call; `later` clears it (bench/gpu_check.sh runs the gpu tests with it set).
  if (mode == "blocking") setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  else unsetenv("CUDA_LAUNCH_BLOCKING");
  try {
    ul::init_cuda_backend();
    DeviceBuffer buffer;
    ul::launch("fault", store_kernel, dim3(1), dim3(32), 0, nullptr, static_cast<float*>(nullptr));
    ul::launch("after_the_fault", store_kernel, dim3(1), dim3(32), 0, nullptr, static_cast<float*>(buffer.p));
    UL_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("caught: %s\n", e.what());
    return 0;
  }
  std::printf("no error\n");
  return 2;
}
