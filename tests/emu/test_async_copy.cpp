// cp.async under the emulator (engine/async_copy.h): a destination is poisoned when its copy is
// issued and the data lands only when a wait retires the copy's group, zero-filled past src-size;
// misuse is reported; a double-buffered tile loop gets the right
// answer with its waits and a wrong one without; and more than 48 KiB of dynamic shared memory
// needs cudaFuncSetAttribute, as on the GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "engine/async_copy.h"
#include "engine/cuda_launch.h"
#include "stream_order.h"

namespace {

using ul::cuda::cp_async;
using ul::cuda::cp_async_commit;
using ul::cuda::cp_async_wait;

// One warp. Thread i copies words 4i..4i+3 of src into slot 0 (group 0) and into slot 1 (group 1,
// only its first 6 bytes read), then snapshots both slots before any wait, after wait<1>, and after
// wait<0>: out = 3 snapshots x 2 slots x 128 words.
__global__ void groups_kernel(uint32_t* out, const uint32_t* src) {
  UL_DYNAMIC_SMEM(uint32_t, smem);  // (2, 128), 16-byte aligned
  uint32_t(*slot)[128] = reinterpret_cast<uint32_t(*)[128]>(smem);
  const int i = threadIdx.x;
  for (int k = 0; k < 4; k++) slot[0][4 * i + k] = slot[1][4 * i + k] = 0xdeadbeefu;
  __syncthreads();
  cp_async<16>(&slot[0][4 * i], src + 4 * i, 16);
  cp_async_commit();
  cp_async<16>(&slot[1][4 * i], src + 4 * i, 6);
  cp_async_commit();
  auto snapshot = [&](int n) {
    __syncthreads();
    for (int s = 0; s < 2; s++)
      for (int k = 0; k < 4; k++) out[(n * 2 + s) * 128 + 4 * i + k] = slot[s][4 * i + k];
  };
  snapshot(0);
  cp_async_wait<1>();
  snapshot(1);
  cp_async_wait<0>();
  snapshot(2);
}

// Sums `tiles` tiles of 256 floats, double-buffered as async_copy.h describes; thread i keeps the
// sums of 4 elements copied by another thread. The mistakes: skipping the waits, or the barrier
// that keeps a buffer from being refilled while another thread still reads it.
enum class Pipeline { right, no_waits, no_trailing_barrier };
__global__ void pipeline_kernel(float* out, const float* src, int tiles, Pipeline how) {
  const bool waits = how != Pipeline::no_waits;
  UL_DYNAMIC_SMEM(float, smem);  // (2, 256)
  float(*buf)[256] = reinterpret_cast<float(*)[256]>(smem);
  const int i = threadIdx.x;  // 64 threads, 16 bytes each per tile
  auto fetch = [&](int t) {
    cp_async<16>(&buf[t & 1][4 * i], src + t * 256 + 4 * i, 16);
    cp_async_commit();
  };
  for (int k = 0; k < 4; k++) buf[0][4 * i + k] = buf[1][4 * i + k] = 0.f;
  __syncthreads();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  fetch(0);
  for (int t = 0; t < tiles; t++) {
    if (t + 1 < tiles) {
      fetch(t + 1);
      if (waits) cp_async_wait<1>();
    } else if (waits) {
      cp_async_wait<0>();
    }
    __syncthreads();
    for (int k = 0; k < 4; k++) acc[k] += buf[t & 1][(4 * i + 64 + k) % 256];  // another thread's copy
    if (how != Pipeline::no_trailing_barrier) __syncthreads();
  }
  cp_async_wait<0>();
  for (int k = 0; k < 4; k++) out[4 * i + k] = acc[k];
}

__global__ void misaligned_kernel(const float* src) {
  UL_DYNAMIC_SMEM(float, buf);
  cp_async<16>(&buf[1], src, 16);
}

// cp.async whose destination is global memory, or whose source is host memory: a GPU faults.
__global__ void to_global_kernel(float* dst, const float* src) { cp_async<16>(dst, src, 16); }
struct Source {  // (a pointer inside a struct: the launch's check of pointer arguments does not see it)
  const float* p;
};
__global__ void from_host_kernel(Source src) {
  UL_DYNAMIC_SMEM(float, buf);
  cp_async<16>(buf, src.p, 16);
}
// Into a static shared array (UL_STATIC_SMEM), which is shared memory too.
__global__ void to_static_kernel(float* out, const float* src) {
  UL_STATIC_SMEM(float, tile, [4]);
  cp_async<16>(tile, src, 16);
  cp_async_commit();
  cp_async_wait<0>();
  out[0] = tile[3];
}

__global__ void big_smem_kernel(int* out) {
  UL_DYNAMIC_SMEM(int, smem);
  smem[threadIdx.x] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = smem[(threadIdx.x + 1) % blockDim.x];
}

template <class T>
T* device_copy(const std::vector<T>& h) {
  T* p;
  UL_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  UL_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> h(n);
  UL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

TEST_CASE("emulated cp.async lands at the wait that retires its group, zero-filling past src-size",
          "[emu][async_copy]") {
  std::vector<uint32_t> src(128);
  for (uint32_t k = 0; k < 128; k++) src[k] = 0x01020304u * (k + 1);
  uint32_t* d_src = device_copy(src);
  uint32_t* d_out = device_copy(std::vector<uint32_t>(3 * 2 * 128, 0u));
  ul::launch("groups", groups_kernel, dim3(1), dim3(32), 2 * 128 * 4, nullptr, d_out, d_src);
  const std::vector<uint32_t> out = host_copy(d_out, 3 * 2 * 128);
  auto at = [&](int snap, int slot, int word) { return out[(snap * 2 + slot) * 128 + word]; };
  int bad = 0;
  for (int w = 0; w < 128; w++) {
    const uint32_t poison = 0xffffffffu;  // undefined until the wait: the emulator's NaN bytes
    // group 1 read 6 bytes per thread: word 0 whole, the low half of word 1, then zeros
    const uint32_t partial = w % 4 == 0 ? src[w] : (w % 4 == 1 ? (src[w] & 0xffffu) : 0u);
    bad += at(0, 0, w) != poison || at(0, 1, w) != poison;      // nothing waited for: nothing landed
    bad += at(1, 0, w) != src[w] || at(1, 1, w) != poison;      // wait<1>: the older group only
    bad += at(2, 0, w) != src[w] || at(2, 1, w) != partial;     // wait<0>: both
  }
  CHECK(bad == 0);
  cudaFree(d_src);
  cudaFree(d_out);
}

TEST_CASE("a double-buffered cp.async loop is right with its waits and barriers, wrong without",
          "[emu][async_copy]") {
  const int tiles = 5;
  std::vector<float> src(tiles * 256);
  for (size_t k = 0; k < src.size(); k++) src[k] = float(k % 97) + 0.5f;
  std::vector<float> want(256, 0.f);
  for (int t = 0; t < tiles; t++)
    for (int e = 0; e < 256; e++) want[e] += src[t * 256 + (e + 64) % 256];
  float* d_src = device_copy(src);
  float* d_out = device_copy(std::vector<float>(256, 0.f));
  ul::launch("pipeline", pipeline_kernel, dim3(1), dim3(64), 2 * 256 * 4, nullptr, d_out, d_src, tiles,
             Pipeline::right);
  CHECK(host_copy(d_out, 256) == want);
  for (Pipeline wrong : {Pipeline::no_waits, Pipeline::no_trailing_barrier}) {
    ul::launch("pipeline", pipeline_kernel, dim3(1), dim3(64), 2 * 256 * 4, nullptr, d_out, d_src, tiles, wrong);
    CHECK(host_copy(d_out, 256) != want);  // tiles read before they landed, or after their refill began
  }
  cudaFree(d_src);
  cudaFree(d_out);
}

TEST_CASE("emulated cp.async refuses misaligned addresses", "[emu][async_copy]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  float* d_src = device_copy(std::vector<float>(64, 1.f));
  CHECK_THROWS_WITH(ul::launch("misaligned", misaligned_kernel, dim3(1), dim3(1), 256, nullptr, d_src),
                    Catch::Contains("not aligned to 16"));
  CHECK(ul_emu::device_fault() == cudaErrorLaunchFailure);  // a fault, sticky as a GPU's
  ul_emu::clear_device_fault();
  cudaFree(d_src);
}

TEST_CASE("emulated cp.async copies device memory into shared memory only", "[emu][async_copy]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  float* d_src = device_copy(std::vector<float>{1.f, 2.f, 3.f, 4.f});
  float* d_out = device_copy(std::vector<float>(4, 0.f));
  ul::launch("to_static", to_static_kernel, dim3(1), dim3(1), 0, nullptr, d_out, d_src);
  float got = 0;
  UL_CUDA_CHECK(cudaMemcpy(&got, d_out, sizeof got, cudaMemcpyDeviceToHost));
  CHECK(got == 4.f);
  CHECK_THROWS_WITH(ul::launch("to_global", to_global_kernel, dim3(1), dim3(1), 0, nullptr, d_out, d_src),
                    Catch::Contains("to_global") && Catch::Contains("outside this block's shared memory"));
  ul_emu::clear_device_fault();
  alignas(16) static float host[4] = {1.f, 2.f, 3.f, 4.f};
  CHECK_THROWS_WITH(ul::launch("from_host", from_host_kernel, dim3(1), dim3(1), 64, nullptr, Source{host}),
                    Catch::Contains("cp.async from host memory"));
  ul_emu::clear_device_fault();
  cudaFree(d_src);
  cudaFree(d_out);
}

TEST_CASE("over 48 KiB of dynamic shared memory needs cudaFuncSetAttribute first", "[emu][async_copy]") {
  int* d_out = device_copy(std::vector<int>(256, -1));
  const size_t bytes = 64 << 10;
  CHECK_THROWS_WITH(ul::launch("big_smem", big_smem_kernel, dim3(1), dim3(256), bytes, nullptr, d_out),
                    Catch::Contains("big_smem") && Catch::Contains("cudaFuncSetAttribute"));
  UL_CUDA_CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  ul::launch("big_smem", big_smem_kernel, dim3(1), dim3(256), bytes, nullptr, d_out);
  const std::vector<int> out = host_copy(d_out, 256);
  for (int i = 0; i < 256; i++) CHECK(out[i] == (i + 1) % 256);
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 << 10) ==
        cudaErrorInvalidValue);
  cudaFree(d_out);
}
