#include "engine/device.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace ul {
namespace {

void* cpu_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment: one cache line, one AVX-512 register.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p)
    throw std::runtime_error("out of host memory allocating " + std::to_string(bytes) + " bytes (beyond what the "
                             "start-up checks count: a process limit such as `ulimit -v` or a scheduler's h_vmem?)");
  return p;
}
void cpu_free(void* p) { std::free(p); }
void cpu_set(void* p, int byte, size_t bytes) { if (bytes) std::memset(p, byte, bytes); }
void cpu_copy(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
void cpu_sync() {}

struct Registry {
  DeviceOps ops[2];
  bool have[2] = {true, false};
  Registry() { ops[0] = {cpu_alloc, cpu_free, cpu_set, cpu_copy, cpu_copy, cpu_copy, cpu_sync}; }
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_device_ops(Device d, const DeviceOps& ops) {
  registry().ops[int(d)] = ops;
  registry().have[int(d)] = true;
}

bool device_available(Device d) { return registry().have[int(d)]; }

const DeviceOps& device_ops(Device d) {
  if (!device_available(d))
    throw std::runtime_error(std::string("device '") + device_name(d) +
                             "' is not available: this build has no CUDA backend "
                             "(configure with -DULYSSES_CUDA=ON or -DULYSSES_CUDA_EMULATION=ON)");
  return registry().ops[int(d)];
}

namespace {
// The live allocations of each device, for device_bytes_in_use. Few and long-lived (parameter
// buffers, AdamW state, the arena's blocks), so a lock per call costs nothing that shows.
struct Usage {
  std::mutex mu;
  std::unordered_map<void*, size_t> live[2];
  size_t bytes[2] = {0, 0};
};
Usage& usage() {
  static Usage u;
  return u;
}
}  // namespace

void* device_alloc(Device d, size_t bytes) {
  void* p = device_ops(d).alloc(bytes);
  if (p) {
    Usage& u = usage();
    std::lock_guard<std::mutex> lock(u.mu);
    u.live[int(d)][p] = bytes;
    u.bytes[int(d)] += bytes;
  }
  return p;
}

void device_free(Device d, void* p) {
  if (!p) return;
  {
    Usage& u = usage();
    std::lock_guard<std::mutex> lock(u.mu);
    auto it = u.live[int(d)].find(p);
    if (it != u.live[int(d)].end()) {
      u.bytes[int(d)] -= it->second;
      u.live[int(d)].erase(it);
    }
  }
  device_ops(d).free(p);
}

size_t device_bytes_in_use(Device d) {
  Usage& u = usage();
  std::lock_guard<std::mutex> lock(u.mu);
  return u.bytes[int(d)];
}
void device_zero(Device d, void* p, size_t bytes) { device_ops(d).set(p, 0, bytes); }
void device_set(Device d, void* p, int byte, size_t bytes) { device_ops(d).set(p, byte, bytes); }

void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  if (bytes == 0) return;
  if (dd == Device::cpu && sd == Device::cpu) cpu_copy(dst, src, bytes);
  else if (dd == Device::cpu) device_ops(sd).to_host(dst, src, bytes);
  else if (sd == Device::cpu) device_ops(dd).from_host(dst, src, bytes);
  else device_ops(dd).within(dst, src, bytes);
}

void copy_to_host(void* dst, const Tensor& t) { device_copy(dst, Device::cpu, t.ptr, t.device, t.nbytes()); }
void copy_from_host(const Tensor& t, const void* src) { device_copy(t.ptr, t.device, src, Device::cpu, t.nbytes()); }

}  // namespace ul
