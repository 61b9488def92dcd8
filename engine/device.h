// Raw memory on a device. The CPU path is here; the CUDA path (cudaMalloc, cudaMemcpy, ...) is
// compiled in when the CUDA backend is built (real or emulated) and registers itself at startup.
#pragma once
#include <cstddef>

#include "engine/tensor.h"

namespace ul {

// The four primitives every allocator and copy in the engine goes through.
struct DeviceOps {
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*set)(void* p, int byte, size_t bytes);  // memset
  // Copies between this device and the host, or within this device.
  void (*to_host)(void* dst, const void* src, size_t bytes);
  void (*from_host)(void* dst, const void* src, size_t bytes);
  void (*within)(void* dst, const void* src, size_t bytes);
  void (*sync)();
};

// Throws with a clear message if the device's backend was not built in.
const DeviceOps& device_ops(Device d);
void register_device_ops(Device d, const DeviceOps& ops);
bool device_available(Device d);

void* device_alloc(Device d, size_t bytes);
void device_free(Device d, void* p);
// Bytes on `d` from device_alloc not yet freed, in this process (every thread): what the memory
// planner's per-rank figures are checked against (parameters, gradients, AdamW state, arena).
size_t device_bytes_in_use(Device d);
void device_zero(Device d, void* p, size_t bytes);
void device_set(Device d, void* p, int byte, size_t bytes);
// Copy `bytes` from (src on sd) to (dst on dd); either side may be the host.
void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes);

// Host-side copy of a tensor (any device) — for tests, checkpoints and logging.
void copy_to_host(void* dst, const Tensor& t);
void copy_from_host(const Tensor& t, const void* src);

}  // namespace ul
