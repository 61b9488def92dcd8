// The SIMT emulator against CUDA's documented semantics: indices, shared memory and barriers,
// dynamic shared memory, every shuffle variant, votes, atomics across blocks, the runtime calls,
// and the misuse that must be reported rather than hang. The kernels are written as in a .cu file.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "stream_order.h"

namespace {

// ---- helpers ------------------------------------------------------------------------------------
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count, int fill_byte = 0xff) : n(count) {
    UL_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    UL_CUDA_CHECK(cudaMemset(p, fill_byte, n * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    UL_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void set(const std::vector<T>& h) { UL_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
};

// ---- kernels --------------------------------------------------------------------------------------
// One record of 8 ints per thread, at its global linear index.
__global__ void indices_kernel(int* out) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int per_block = blockDim.x * blockDim.y * blockDim.z;
  int* r = out + 8 * (bid * per_block + tid);
  r[0] = threadIdx.x, r[1] = threadIdx.y, r[2] = threadIdx.z;
  r[3] = blockIdx.x, r[4] = blockIdx.y, r[5] = blockIdx.z;
  r[6] = blockDim.x * 100 + blockDim.y * 10 + blockDim.z;
  r[7] = gridDim.x * 100 + gridDim.y * 10 + gridDim.z;
}

// Tree reduction of 256 values per block in static shared memory.
__global__ void block_sum_kernel(int* out, const int* in) {
  UL_STATIC_SMEM(int, s, [256]);
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * 256 + t];
  __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Reverses each block's slice `rounds` times through shared memory (an even count restores it),
// and checks the shared slot that thread 0 fills with the block index: a block that saw another
// block's shared memory would fail one or the other.
__global__ void reverse_kernel(int* data, int* owner_ok, int rounds) {
  UL_STATIC_SMEM(int, s, [128]);
  UL_STATIC_SMEM(int, owner, );
  const int t = threadIdx.x, n = blockDim.x;
  int* d = data + blockIdx.x * n;
  if (t == 0) owner = blockIdx.x;
  for (int r = 0; r < rounds; r++) {
    s[t] = d[t];
    __syncthreads();
    d[t] = s[n - 1 - t];
    __syncthreads();
  }
  owner_ok[blockIdx.x * n + t] = owner == int(blockIdx.x);
}

// Inclusive prefix sum of each block's slice (Hillis-Steele), double-buffered in dynamic shared memory.
__global__ void scan_kernel(float* out, const float* in) {
  UL_DYNAMIC_SMEM(float, buf);
  const int t = threadIdx.x, n = blockDim.x;
  float* a = buf;
  float* b = buf + n;
  a[t] = in[blockIdx.x * n + t];
  __syncthreads();
  for (int offset = 1; offset < n; offset <<= 1) {
    b[t] = a[t] + (t >= offset ? a[t - offset] : 0.f);
    __syncthreads();
    float* tmp = a;
    a = b;
    b = tmp;
  }
  out[blockIdx.x * n + t] = a[t];
}

enum ShflOp { kIdx, kUp, kDown, kXor };

// Two warps per block; lane l of warp w holds 1000 * w + l. Each lane shuffles with its argument.
__global__ void shuffle_kernel(int* out, int op, int arg, int width, int per_lane_src) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int v = 1000 * warp + lane;
  int r = 0;
  if (op == kIdx) r = __shfl_sync(0xffffffffu, v, per_lane_src ? (lane + arg) % 32 : arg, width);
  if (op == kUp) r = __shfl_up_sync(0xffffffffu, v, arg, width);
  if (op == kDown) r = __shfl_down_sync(0xffffffffu, v, arg, width);
  if (op == kXor) r = __shfl_xor_sync(0xffffffffu, v, arg, width);
  out[threadIdx.x] = r;
}

// Other element types and a partial mask: lanes 0-15 shuffle among themselves while 16-31 leave.
__global__ void shuffle_types_kernel(double* d_out, float* b_out, int* half_out) {
  const int lane = threadIdx.x;
  d_out[lane] = __shfl_down_sync(0xffffffffu, 1e10 + lane, 1);
  const __nv_bfloat16 h = __float2bfloat16(float(lane) * 0.5f);
  b_out[lane] = __bfloat162float(__shfl_xor_sync(0xffffffffu, h, 1));
  if (lane >= 16) return;
  half_out[lane] = __shfl_sync(0x0000ffffu, lane * 3, 15 - lane, 16);
}

__global__ void vote_kernel(unsigned* ballot, int* any, int* all) {
  const int lane = threadIdx.x;
  ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  any[lane] = __any_sync(0xffffffffu, lane == 7) + 2 * __any_sync(0xffffffffu, 0);
  all[lane] = __all_sync(0xffffffffu, lane < 32) + 2 * __all_sync(0xffffffffu, lane != 5);
  __syncwarp();
}

__global__ void warp_sum_kernel(float* out) {
  out[threadIdx.x] = ul::cuda::warp_sum(float(threadIdx.x % 32) + 0.25f);
}

__global__ void atomics_kernel(int* count, float* fsum, unsigned long long* big, int* maxv) {
  const int gid = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(count, 1);
  atomicAdd(fsum, 0.5f);
  atomicAdd(big, 1ull << 33);
  atomicMax(maxv, gid);
}

// Misuse.
__global__ void early_exit_barrier_kernel(int* out) {
  if (threadIdx.x < 16) return;  // these never reach the barrier below
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void lone_barrier_kernel(int* out) {
  if (threadIdx.x == 0) __syncthreads();  // the others exit while thread 0 waits
  out[threadIdx.x] = 1;
}
// Warp 0 and warp 1 meet at two different barriers: every thread arrives at one, so a count of
// arrivals lets the block through, but bar.sync is .aligned (undefined on the GPU).
__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x < 32) __syncthreads();
  else __syncthreads();
  out[threadIdx.x] = 1;
}
// 40 KiB of dynamic shared memory (under the 48 KiB default) beside 16 KiB of static.
__global__ void static_and_dynamic_kernel(int* out) {
  UL_STATIC_SMEM(char, fixed, [16 * 1024]);
  UL_DYNAMIC_SMEM(char, dyn);
  fixed[threadIdx.x] = 1;
  dyn[threadIdx.x] = 2;
  out[0] = fixed[0] + dyn[0];
}
__global__ void split_warp_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
  else __syncthreads();
}
// Thread 0 of each block reads a static shared word before anything writes it (undefined on the
// GPU: the emulator's NaN bytes), then leaves the block's index there for the next block to find.
__global__ void unwritten_smem_kernel(unsigned* out) {
  UL_STATIC_SMEM(unsigned, word, [2]);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = word[1];
    word[1] = blockIdx.x;
  }
}
__global__ void too_much_static_smem_kernel(int* out) {
  UL_STATIC_SMEM(char, big, [48 * 1024 + 16]);
  big[threadIdx.x] = 1;
  out[0] = big[0];
}
// Lane 0 of each warp reads a shared word and then writes its warp number + 1 there, with no
// barrier between the warps: what each reads tells which warp ran first. out: (block, warp).
__global__ void warp_order_kernel(int* out) {
  UL_STATIC_SMEM(int, word, );
  if (threadIdx.x == 0) word = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    out[blockIdx.x * 2 + warp] = word;
    word = warp + 1;
  }
}
// Lanes 0 and 31 of one warp the same way, with no __syncwarp between them. out: (block, 2).
__global__ void lane_order_kernel(int* out) {
  UL_STATIC_SMEM(int, word, );
  if (threadIdx.x == 0) word = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  if (lane == 0 || lane == 31) {
    out[blockIdx.x * 2 + lane / 31] = word;
    word = lane + 1;
  }
}
// Lanes 0-15 shuffle with a mask that names them only, reading lane (l + 8) % 32: lanes 8-15 read
// lanes 16-23, which take no part. out: (32) as float.
__global__ void absent_lane_kernel(float* out) {
  const int lane = threadIdx.x % 32;
  if (lane < 16) out[lane] = __shfl_sync(0x0000ffffu, float(lane), (lane + 8) % 32);
  else out[lane] = -1.f;
}

// One 16-byte pack of floats from in + offset to out (a 16-byte aligned pointer plus offset floats).
__global__ void pack_copy_kernel(float* out, const float* in, int offset) {
  ul::cuda::store_pack<4>(out, ul::cuda::load_pack<4>(in + offset));
}
__global__ void bad_mask_kernel(int* out) { out[threadIdx.x] = __shfl_sync(0x1u, 1, 0); }
__global__ void big_block_kernel(int* barrier_passes) {
  __syncthreads();
  atomicAdd(barrier_passes, 1);
  __syncthreads();
}

}  // namespace

TEST_CASE("emu: thread and block indices over a multi-block 2-D grid", "[emu]") {
  const dim3 grid(3, 2), block(8, 4, 2);
  const int per_block = 64, blocks = 6;
  DeviceBuffer<int> out(8 * per_block * blocks);
  ul::launch("indices", indices_kernel, grid, block, 0, nullptr, out.p);
  const std::vector<int> h = out.get();
  int bad = 0;
  for (int bz = 0; bz < 1; bz++)
    for (int by = 0; by < 2; by++)
      for (int bx = 0; bx < 3; bx++)
        for (int tz = 0; tz < 2; tz++)
          for (int ty = 0; ty < 4; ty++)
            for (int tx = 0; tx < 8; tx++) {
              const int bid = bx + 3 * by, tid = tx + 8 * (ty + 4 * tz);
              const int* r = &h[8 * (bid * per_block + tid)];
              const int want[8] = {tx, ty, tz, bx, by, bz, 842, 321};
              for (int k = 0; k < 8; k++) bad += r[k] != want[k];
            }
  CHECK(bad == 0);
}

TEST_CASE("emu: shared memory and __syncthreads give a block reduction", "[emu]") {
  const int blocks = 37;
  std::vector<int> in(blocks * 256);
  std::iota(in.begin(), in.end(), -1000);
  DeviceBuffer<int> d_in(in.size()), d_out(blocks);
  d_in.set(in);
  ul::launch("block_sum", block_sum_kernel, dim3(blocks), dim3(256), 0, nullptr, d_out.p, d_in.p);
  const std::vector<int> out = d_out.get();
  for (int b = 0; b < blocks; b++) {
    const int want = std::accumulate(in.begin() + b * 256, in.begin() + (b + 1) * 256, 0);
    CHECK(out[b] == want);
  }
}

TEST_CASE("emu: static shared memory is private to each block, also with blocks on several OS threads", "[emu]") {
  const int blocks = 96, n = 128;
  std::vector<int> in(blocks * n);
  std::iota(in.begin(), in.end(), 0);
  DeviceBuffer<int> d(in.size()), ok(in.size());
  d.set(in);
  ul::launch("reverse", reverse_kernel, dim3(blocks), dim3(n), 0, nullptr, d.p, ok.p, 1);
  std::vector<int> once = d.get();
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < n; t++) REQUIRE(once[b * n + t] == in[b * n + n - 1 - t]);
  ul::launch("reverse", reverse_kernel, dim3(blocks), dim3(n), 0, nullptr, d.p, ok.p, 9);  // odd: back to in
  CHECK(d.get() == in);
  const std::vector<int> owner_ok = ok.get();
  CHECK(std::count(owner_ok.begin(), owner_ok.end(), 1) == blocks * n);
}

TEST_CASE("emu: static shared memory starts as NaN bytes in every block and past 48 KiB is refused", "[emu]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  const int blocks = 40;
  DeviceBuffer<unsigned> out(blocks);
  ul::launch("unwritten", unwritten_smem_kernel, dim3(blocks), dim3(64), 0, nullptr, out.p);
  // Not the previous block's index, which a block on the same OS thread once found there.
  for (unsigned v : out.get()) CHECK(v == 0xffffffffu);
  DeviceBuffer<int> one(1);
  CHECK_THROWS_WITH(ul::launch("big", too_much_static_smem_kernel, dim3(1), dim3(32), 0, nullptr, one.p),
                    Catch::Contains("49168 bytes of static shared memory (the GPU allows 48 KiB"));
  // Static and dynamic together past 48 KiB need the opt-in, as on the GPU; with it they run.
  CHECK_THROWS_WITH(
      ul::launch("both", static_and_dynamic_kernel, dim3(1), dim3(32), 40 * 1024, nullptr, one.p),
      Catch::Contains("16384 bytes of static and 40960 of dynamic") && Catch::Contains("cudaFuncSetAttribute"));
  CHECK(ul_emu::device_fault() == cudaSuccess);  // refused as a launch's configuration, which is not sticky
  UL_CUDA_CHECK(cudaFuncSetAttribute(static_and_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 40 * 1024));
  ul::launch("both", static_and_dynamic_kernel, dim3(1), dim3(32), 40 * 1024, nullptr, one.p);
  CHECK(one.get()[0] == 3);
}

TEST_CASE("emu: dynamic shared memory", "[emu]") {
  const int blocks = 5, n = 64;
  std::vector<float> in(blocks * n);
  for (size_t i = 0; i < in.size(); i++) in[i] = float(i % 7) - 2.f;
  DeviceBuffer<float> d_in(in.size()), d_out(in.size());
  d_in.set(in);
  ul::launch("scan", scan_kernel, dim3(blocks), dim3(n), 2 * n * sizeof(float), nullptr, d_out.p, d_in.p);
  const std::vector<float> out = d_out.get();
  for (int b = 0; b < blocks; b++) {
    float run = 0.f;
    for (int t = 0; t < n; t++) {
      run += in[b * n + t];
      REQUIRE(out[b * n + t] == run);  // small integers: exact in any order
    }
  }
}

TEST_CASE("emu: warp shuffles follow the CUDA semantics", "[emu]") {
  // Expected values straight from the CUDA C++ Programming Guide, per lane l of a warp holding
  // value(l), with groups of `width` lanes:
  //   __shfl_sync:      value(group start + src % width)
  //   __shfl_up_sync:   value(l - d) if l % width >= d, else value(l)
  //   __shfl_down_sync: value(l + d) if l % width + d < width, else value(l)
  //   __shfl_xor_sync:  value(l ^ m) unless l ^ m lies in a later group, then value(l)
  struct Case { int op, arg, width, per_lane_src; };
  const Case cases[] = {{kIdx, 3, 32, 0},  {kIdx, 37, 32, 0}, {kIdx, 5, 8, 0},    {kIdx, 1, 32, 1},
                        {kIdx, 13, 16, 0}, {kUp, 1, 32, 0},   {kUp, 3, 8, 0},     {kUp, 16, 16, 0},
                        {kDown, 1, 32, 0}, {kDown, 5, 8, 0},  {kDown, 31, 32, 0}, {kXor, 1, 32, 0},
                        {kXor, 16, 32, 0}, {kXor, 5, 8, 0},   {kXor, 16, 8, 0},   {kXor, 3, 4, 0}};
  DeviceBuffer<int> out(64);
  for (const Case& c : cases) {
    ul::launch("shuffle", shuffle_kernel, dim3(1), dim3(64), 0, nullptr, out.p, c.op, c.arg, c.width, c.per_lane_src);
    const std::vector<int> h = out.get();
    for (int t = 0; t < 64; t++) {
      const int warp = t / 32, l = t % 32, start = l / c.width * c.width;
      int src = l;
      if (c.op == kIdx) src = start + (c.per_lane_src ? (l + c.arg) % 32 : c.arg) % c.width;
      if (c.op == kUp && l % c.width >= c.arg) src = l - c.arg;
      if (c.op == kDown && l % c.width + c.arg < c.width) src = l + c.arg;
      if (c.op == kXor && (l ^ c.arg) / c.width <= l / c.width) src = l ^ c.arg;
      INFO("op " << c.op << " arg " << c.arg << " width " << c.width << " thread " << t);
      REQUIRE(h[t] == 1000 * warp + src);
    }
  }
}

TEST_CASE("emu: shuffles of double and bf16, and a partial mask", "[emu]") {
  DeviceBuffer<double> d(32);
  DeviceBuffer<float> b(32);
  DeviceBuffer<int> half(16);
  ul::launch("shuffle_types", shuffle_types_kernel, dim3(1), dim3(32), 0, nullptr, d.p, b.p, half.p);
  const auto hd = d.get();
  const auto hb = b.get();
  const auto hh = half.get();
  for (int l = 0; l < 32; l++) {
    CHECK(hd[l] == 1e10 + (l < 31 ? l + 1 : l));
    CHECK(hb[l] == float(l ^ 1) * 0.5f);
  }
  for (int l = 0; l < 16; l++) CHECK(hh[l] == (15 - l) * 3);
}

TEST_CASE("emu: votes and warp_sum", "[emu]") {
  DeviceBuffer<unsigned> ballot(32);
  DeviceBuffer<int> any(32), all(32);
  ul::launch("vote", vote_kernel, dim3(1), dim3(32), 0, nullptr, ballot.p, any.p, all.p);
  unsigned want = 0;
  for (int l = 0; l < 32; l += 3) want |= 1u << l;
  for (unsigned v : ballot.get()) CHECK(v == want);
  for (int v : any.get()) CHECK(v == 1);
  for (int v : all.get()) CHECK(v == 1);

  DeviceBuffer<float> sums(96);
  ul::launch("warp_sum", warp_sum_kernel, dim3(1), dim3(96), 0, nullptr, sums.p);
  for (float v : sums.get()) CHECK(v == 31.f * 32.f / 2.f + 8.f);
}

TEST_CASE("emu: atomics add up across blocks", "[emu]") {
  const int blocks = 100, threads = 128, total = blocks * threads;
  DeviceBuffer<int> count(1, 0), maxv(1, 0);
  DeviceBuffer<float> fsum(1, 0);
  DeviceBuffer<unsigned long long> big(1, 0);
  ul::launch("atomics", atomics_kernel, dim3(blocks), dim3(threads), 0, nullptr, count.p, fsum.p, big.p, maxv.p);
  CHECK(count.get()[0] == total);
  CHECK(fsum.get()[0] == 0.5f * total);  // exact: multiples of 0.5 below 2^23
  CHECK(big.get()[0] == (unsigned long long)total << 33);
  CHECK(maxv.get()[0] == total - 1);
}

// out: (block, 2) from a kernel where the first and the last warp (or lane) of each block read a
// shared word and then write their number + 1 there, with no barrier between them. The first
// writes `first`, the last `last`. Blocks alternate: in every other block the first runs first (it
// reads the initial 0, the last reads `first`), in the others the last does. Which blocks go
// forward also alternates by launch, so block 0 sets the parity for this one.
void check_turns(const std::vector<int>& h, int blocks, int first, int last) {
  const int flip = h[0] == 0 ? 0 : 1;
  for (int b = 0; b < blocks; b++) {
    INFO("block " << b << ", block 0 went " << (flip ? "backward" : "forward"));
    const int r = (b + flip) % 2;
    CHECK(h[b * 2 + r] == 0);
    CHECK(h[b * 2 + 1 - r] == (r == 0 ? first : last));
  }
}

TEST_CASE("emu: one warp runs to its next barrier before the next warp starts, in both orders", "[emu]") {
  DeviceBuffer<int> out(4 * 2);
  ul::launch("warp_order", warp_order_kernel, dim3(4), dim3(64), 0, nullptr, out.p);
  check_turns(out.get(), 4, 1, 2);
}

TEST_CASE("emu: the lanes of a warp take turns in both orders, so a missing __syncwarp shows", "[emu]") {
  DeviceBuffer<int> out(4 * 2);
  ul::launch("lane_order", lane_order_kernel, dim3(4), dim3(32), 0, nullptr, out.p);
  check_turns(out.get(), 4, 1, 32);
}

TEST_CASE("emu: a one-block grid is walked forward and backward on alternate launches", "[emu]") {
  // A single block once always went forward, so a race inside it could never show. Two launches
  // in a row: lane 0 sees the word first in one of them, lane 31 in the other.
  DeviceBuffer<int> a(2), b(2);
  ul::launch("lane_order", lane_order_kernel, dim3(1), dim3(32), 0, nullptr, a.p);
  ul::launch("lane_order", lane_order_kernel, dim3(1), dim3(32), 0, nullptr, b.p);
  const std::vector<int> ha = a.get(), hb = b.get();
  CHECK(((ha[0] == 0 && ha[1] == 1 && hb[1] == 0 && hb[0] == 32) ||
         (ha[1] == 0 && ha[0] == 32 && hb[0] == 0 && hb[1] == 1)));
}

__global__ void block_ticket_kernel(int* out, int* next);

TEST_CASE("emu: a kernel alternates its own order with another kernel launched between", "[emu]") {
  // The order once alternated by the thread's launches of any kernel: in a fixed pair (a partial
  // sum, then its one-block final; every training step's sequence) each kernel kept one order.
  DeviceBuffer<int> a(2), b(2), between(1);
  ul::launch("lane_order", lane_order_kernel, dim3(1), dim3(32), 0, nullptr, a.p);
  ul::launch("block_ticket", block_ticket_kernel, dim3(1), dim3(1), 0, nullptr, between.p, between.p);
  ul::launch("lane_order", lane_order_kernel, dim3(1), dim3(32), 0, nullptr, b.p);
  const std::vector<int> ha = a.get(), hb = b.get();
  CHECK(((ha[0] == 0 && ha[1] == 1 && hb[1] == 0 && hb[0] == 32) ||
         (ha[1] == 0 && ha[0] == 32 && hb[0] == 0 && hb[1] == 1)));
}

TEST_CASE("emu: the bytes past a cudaMalloc buffer, up to its 256-byte rounding, and before it read NaN", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  // On a GPU they are a neighbour's (an off-by-one read gets its data); here they are poisoned, and
  // a write there is caught when the buffer is freed. Before its start too (a negative index): the
  // rest of the page below the buffer, which once read zeros.
  float* p = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), 100 * sizeof(float)) == cudaSuccess);
  for (int i = 100; i < 128; i++) CHECK(std::isnan(p[i]));  // device memory is host memory here
  for (int i = 1; i <= 64; i++) CHECK(std::isnan(p[-i]));
  CHECK(cudaFree(p) == cudaSuccess);
}

// out[blockIdx.x]: the order the block ran in, from a ticket.
__global__ void block_ticket_kernel(int* out, int* next) { out[blockIdx.x] = atomicAdd(next, 1); }

TEST_CASE("emu: a grid's blocks run in one order and in the other on alternate launches", "[emu]") {
  // A GPU orders no block before another: a block reading what a lower-numbered one wrote in the
  // same launch must not always find it. (Several OS threads take blocks as they come; on one,
  // the whole order flips.)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<std::vector<int>> order;
  for (int launch = 0; launch < 2; launch++) {
    DeviceBuffer<int> out(8), next(1, 0);
    ul::launch("block_ticket", block_ticket_kernel, dim3(8), dim3(1), 0, nullptr, out.p, next.p);
    order.push_back(out.get());
  }
  omp_set_num_threads(threads);
  const std::vector<int> up = {0, 1, 2, 3, 4, 5, 6, 7}, down = {7, 6, 5, 4, 3, 2, 1, 0};
  CHECK(((order[0] == up && order[1] == down) || (order[0] == down && order[1] == up)));
}

// Reads the byte before dynamic shared memory into out[0], then (write) writes it.
__global__ void smem_below_kernel(int* out, int write) {
  UL_DYNAMIC_SMEM(unsigned char, smem);
  out[0] = smem[-1];
  if (write) smem[-4] = 0;
}

TEST_CASE("emu: the bytes before dynamic shared memory read NaN, and a write there is caught", "[emu]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch
  DeviceBuffer<int> out(1);
  ul::launch("smem_below", smem_below_kernel, dim3(1), dim3(1), 256, nullptr, out.p, 0);
  CHECK(out.get()[0] == 0xff);
  CHECK_THROWS_WITH(ul::launch("smem_below", smem_below_kernel, dim3(1), dim3(1), 256, nullptr, out.p, 1),
                    Catch::Contains("4 byte(s) before the start of its dynamic shared memory"));
  CHECK(ul_emu::device_fault() == cudaErrorLaunchFailure);
  ul_emu::clear_device_fault();
}

TEST_CASE("emu: the fast math intrinsics, exact or (ULYSSES_EMU_APPROX_MATH) within the GPU's error", "[emu]") {
  const bool was = ul_emu::approx_math();
  auto ulps = [](float a, float b) {
    int32_t x, y;
    std::memcpy(&x, &a, 4), std::memcpy(&y, &b, 4);
    return std::abs(int64_t(x) - int64_t(y));
  };
  for (bool approx : {false, true}) {
    CAPTURE(approx);
    ul_emu::set_approx_math(approx);
    int64_t worst_rsqrt = 0, worst_exp = 0, worst_exp2 = 0, moved = 0;
    for (int i = 1; i <= 20000; i++) {
      const float x = float(i) * 0.37f, e = float(i % 400) * 0.05f - 10.f;
      worst_rsqrt = std::max(worst_rsqrt, ulps(rsqrtf(x), 1.f / std::sqrt(x)));
      worst_exp = std::max(worst_exp, ulps(__expf(e), std::exp(e)) - int64_t(std::fabs(1.16f * e)));
      worst_exp2 = std::max(worst_exp2, ulps(ul_emu::fast_exp2(e), std::exp2(e)));
      moved += rsqrtf(x) != 1.f / std::sqrt(x);
    }
    CHECK(worst_rsqrt <= (approx ? 2 : 0));
    CHECK(worst_exp <= (approx ? 2 : 0));
    CHECK(worst_exp2 <= (approx ? 2 : 0));
    CHECK((moved > 0) == approx);
    CHECK(rsqrtf(2.f) == rsqrtf(2.f));  // the same input, the same output
    CHECK(ul_emu::fast_exp2(-130.f) == (approx ? 0.f : std::exp2(-130.f)));  // ex2.approx.ftz flushes subnormals
  }
  ul_emu::set_approx_math(was);
}

TEST_CASE("emu: a shuffle from a lane outside the mask reads NaN (undefined on the GPU)", "[emu]") {
  DeviceBuffer<float> out(32);
  ul::launch("absent_lane", absent_lane_kernel, dim3(1), dim3(32), 0, nullptr, out.p);
  const std::vector<float> h = out.get();
  for (int l = 0; l < 8; l++) CHECK(h[l] == float(l + 8));
  for (int l = 8; l < 16; l++) CHECK(std::isnan(h[l]));
}

TEST_CASE("emu: a grid's block count past 2^31 - 1 is an error, not cut to 32 bits", "[emu]") {
  CHECK(ul::ceil_div(513, 256) == 3u);
  CHECK(ul::ceil_div(0x7fffffffLL * 256, 256) == 0x7fffffffu);
  CHECK_THROWS_WITH(ul::ceil_div(0x7fffffffLL * 256 + 1, 256), Catch::Contains("2147483648 blocks") &&
                                                                     Catch::Contains("more than a grid's 2^31 - 1"));
}

TEST_CASE("emu: misuse is reported, not hung", "[emu]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // faults throw at the launch, not a later sync
  DeviceBuffer<int> out(64);
  // A misuse inside a kernel is its fault, sticky as a GPU's: seen, then cleared (as a fresh
  // process would find the device) for the next. A bad configuration is the launch's error only.
  auto faulted = [] {
    const bool sticky = ul_emu::device_fault() == cudaErrorLaunchFailure;
    ul_emu::clear_device_fault();
    return sticky;
  };
  CHECK_THROWS_WITH(ul::launch("early_exit", early_exit_barrier_kernel, dim3(2), dim3(64), 0, nullptr, out.p),
                    Catch::Contains("early_exit") && Catch::Contains("__syncthreads") &&
                        Catch::Contains("every thread of the block"));
  CHECK(faulted());
  // Which side is seen first (the barrier's thread, or the ones that exit) follows the launch's
  // walking order, which alternates from launch to launch: both say what is wrong.
  for (int twice = 0; twice < 2; twice++) {
    CHECK_THROWS_WITH(ul::launch("lone_barrier", lone_barrier_kernel, dim3(1), dim3(64), 0, nullptr, out.p),
                      Catch::Contains("__syncthreads") &&
                          (Catch::Contains("exited while") || Catch::Contains("a barrier must be reached by every thread")));
    CHECK(faulted());
  }
  CHECK_THROWS_WITH(ul::launch("two_barriers", two_barriers_kernel, dim3(1), dim3(64), 0, nullptr, out.p),
                    Catch::Contains("while 32 threads wait at the one at") && Catch::Contains("the same barrier"));
  CHECK(faulted());
  CHECK_THROWS_WITH(ul::launch("split_warp", split_warp_kernel, dim3(1), dim3(32), 0, nullptr, out.p),
                    Catch::Contains("deadlock") && Catch::Contains("__shfl_sync"));
  CHECK(faulted());
  CHECK_THROWS_WITH(ul::launch("bad_mask", bad_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.p),
                    Catch::Contains("leaves it out"));
  CHECK(faulted());
  CHECK_THROWS_WITH(ul::launch("too_big", big_block_kernel, dim3(1), dim3(2048), 0, nullptr, out.p),
                    Catch::Contains("invalid configuration"));
  CHECK_THROWS_WITH(ul::launch("no_blocks", big_block_kernel, dim3(0), dim3(32), 0, nullptr, out.p),
                    Catch::Contains("invalid configuration"));
  CHECK_FALSE(faulted());
  CHECK_THROWS_WITH(__syncthreads(), Catch::Contains("outside a kernel"));
  CHECK_FALSE(faulted());
  // A vector access must be aligned to its size, as on a GPU (which faults: "misaligned address").
  DeviceBuffer<float> in(8), vec(4);
  in.set({1, 2, 3, 4, 5, 6, 7, 8});
  ul::launch("aligned_pack", pack_copy_kernel, dim3(1), dim3(1), 0, nullptr, vec.p, in.p, 4);
  CHECK(vec.get() == std::vector<float>{5, 6, 7, 8});
  CHECK_THROWS_WITH(ul::launch("misaligned_pack", pack_copy_kernel, dim3(1), dim3(1), 0, nullptr, vec.p, in.p, 1),
                    Catch::Contains("misaligned_pack") && Catch::Contains("misaligned 16-byte"));
  CHECK(faulted());

  // A pointer argument in plain host memory: a GPU faults on it (the emulator would follow it).
  std::vector<int> host_out(1, 0);
  CHECK_THROWS_WITH(ul::launch("host_out", big_block_kernel, dim3(1), dim3(32), 0, nullptr, host_out.data()),
                    Catch::Contains("'host_out': argument 1") && Catch::Contains("is host memory"));
  CHECK(host_out[0] == 0);  // it did not run
  CHECK(ul_emu::device_fault() == cudaErrorIllegalAddress);  // sticky, as the GPU's fault
  ul_emu::clear_device_fault();

  // The executor recovers: a full 1024-thread block with barriers runs after the failures.
  DeviceBuffer<int> passes(1, 0);
  ul::launch("big_block", big_block_kernel, dim3(3), dim3(1024), 0, nullptr, passes.p);
  CHECK(passes.get()[0] == 3 * 1024);
}

// Whether the process may read byte p: write(2) checks the buffer and fails with EFAULT rather
// than letting the caller fault. 1: readable, 0: EFAULT, -1: something else went wrong.
int readable(const void* p) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  const bool ok = write(fd[1], p, 1) == 1;
  const int err = errno;
  close(fd[0]);
  close(fd[1]);
  return ok ? 1 : err == EFAULT ? 0 : -1;
}

// out[0], out[1]: whether the last byte of the launch's dynamic shared memory and the byte after it
// can be read.
__global__ void smem_edge_kernel(int* out, int bytes) {
  UL_DYNAMIC_SMEM(unsigned char, smem);
  out[0] = readable(smem + bytes - 1);
  out[1] = readable(smem + bytes);
}

TEST_CASE("emu: dynamic shared memory ends before a guard page", "[emu]") {
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // the kernel writes `out`, on the host
  int* out = nullptr;  // pinned: host memory a kernel may write
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&out), 2 * sizeof(int)) == cudaSuccess);
  for (int bytes : {128, 1000, 48 << 10}) {
    INFO(bytes << " bytes");
    out[0] = out[1] = -2;
    ul::launch("smem_edge", smem_edge_kernel, dim3(1), dim3(1), size_t(bytes), nullptr, out, bytes);
    CHECK(out[0] == 1);
    CHECK(out[1] == (bytes % 128 == 0 ? 0 : 1));  // past the 128-byte rounding: the guard
  }
  CHECK(cudaFreeHost(out) == cudaSuccess);
}

TEST_CASE("emu: device buffers end before a guard page, so a kernel running off one faults", "[emu]") {
  ul_test::HostGuardScope open(false);  // it looks into device memory from the host
  for (size_t bytes : {size_t(1), size_t(256), size_t(1000), size_t(4096), size_t(100000)}) {
    INFO(bytes << " bytes");
    char* p = nullptr;
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    const size_t rounded = (bytes + 255) / 256 * 256;
    CHECK(readable(p) == 1);
    CHECK(readable(p + rounded - 1) == 1);
    CHECK(readable(p + rounded) == 0);  // the first byte past the allocation's 256-byte rounding
    CHECK(cudaFree(p) == cudaSuccess);
  }
  int host = 0;
  CHECK(cudaFree(&host) == cudaErrorInvalidValue);  // not device memory
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFree(nullptr) == cudaSuccess);
}

// out[0]: whether p is readable while the kernel runs (the host guard opens device memory then).
__global__ void guard_probe_kernel(int* out, char* p) {
  out[0] = readable(p);
  p[0] = 7;
}

TEST_CASE("emu: the host guard closes device memory to host code, and opens it to device work", "[emu]") {
  ul_test::HostGuardScope restored(false);  // (a CI pass runs every emu test with the guard on)
  ul_test::StreamOrderScope at_launch(ul_emu::StreamOrder::late_side);  // the kernel runs at issue
  char* p = nullptr;
  REQUIRE(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(readable(p) == 1);
  ul_emu::set_host_guard(true);
  CHECK(readable(p) == 0);  // an existing buffer is closed...
  char* q = nullptr;
  REQUIRE(cudaMalloc(&q, 100) == cudaSuccess);
  CHECK(readable(q) == 0);  // ... and so is a new one
  int* out = nullptr;  // pinned: host memory a kernel may write (a plain host address it may not)
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&out), sizeof(int)) == cudaSuccess);
  out[0] = -1;
  ul::launch("guard_probe", guard_probe_kernel, dim3(1), dim3(1), 0, nullptr, out, p);
  CHECK(out[0] == 1);
  CHECK(cudaFreeHost(out) == cudaSuccess);
  CHECK(readable(p) == 0);
  char back = 0;
  REQUIRE(cudaMemcpy(&back, p, 1, cudaMemcpyDeviceToHost) == cudaSuccess);  // a copy is device work
  CHECK(back == 7);
  // A host read faults, with a note naming the guard (in a child process: it ends there).
  int err[2];
  REQUIRE(pipe(err) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(err[1], 2);
    volatile char c = *p;
    (void)c;
    _exit(0);
  }
  close(err[1]);
  std::string said;
  char buf[256];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) > 0;) said.append(buf, size_t(n));
  close(err[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK_THAT(said, Catch::Contains("cuda_emu: segmentation fault at") && Catch::Contains("host guard"));
  CHECK(cudaFree(q) == cudaSuccess);  // its past-the-end check reads it
  ul_emu::set_host_guard(false);
  CHECK(readable(p) == 1);
  CHECK(cudaFree(p) == cudaSuccess);
}

TEST_CASE("emu: runtime calls on host memory", "[emu]") {
  float* p = nullptr;
  REQUIRE(cudaMalloc(&p, 16 * sizeof(float)) == cudaSuccess);
  float poison;
  REQUIRE(cudaMemcpy(&poison, p, sizeof poison, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(poison != poison);  // fresh device memory reads as NaN
  std::vector<float> h(16, 2.5f), back(16, 0.f);
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  CHECK(cudaMemcpyAsync(p, h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), p, 16 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == h);
  CHECK(cudaMemsetAsync(p, 0, 16 * sizeof(float), s) == cudaSuccess);
  CHECK(cudaMemcpy(back.data(), p, 16 * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  CHECK(back == std::vector<float>(16, 0.f));
  // Pageable host memory where device memory must be: refused, as a GPU's runtime refuses it (or
  // faults, or copies the wrong way: undefined), not done on the host as if it were the device's.
  CHECK(cudaMemset(h.data(), 0, 16 * sizeof(float)) == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(h.data(), 0, 16 * sizeof(float), s) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(back.data(), h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(back.data(), h.data(), 16 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(p, back.data(), 16 * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(p, p + 8, 8 * sizeof(float), cudaMemcpyHostToHost) == cudaErrorInvalidValue);
  cudaGetLastError();
  CHECK(h == std::vector<float>(16, 2.5f));  // nothing written
  CHECK(cudaMemcpy(back.data(), h.data(), 16 * sizeof(float), cudaMemcpyDefault) == cudaSuccess);  // by pointer
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);

  cudaEvent_t a, b;
  REQUIRE(cudaEventCreate(&a) == cudaSuccess);
  REQUIRE(cudaEventCreate(&b) == cudaSuccess);
  float ms = -1.f;
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);  // not recorded yet
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaSuccess);  // reading the error cleared it
  CHECK(cudaEventRecord(a) == cudaSuccess);
  CHECK(cudaEventRecord(b) == cudaSuccess);
  CHECK(cudaEventSynchronize(b) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  CHECK(ms >= 0.f);
  CHECK(cudaEventDestroy(a) == cudaSuccess);
  CHECK(cudaEventDestroy(b) == cudaSuccess);

  int n = 0;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n == 1);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK_THROWS_WITH(UL_CUDA_CHECK(cudaSetDevice(3)),
                    Catch::Contains("cudaSetDevice(3)") && Catch::Contains("invalid device ordinal") &&
                        Catch::Contains("test_emu_core.cpp:"));
  cudaGetLastError();

  // Round to nearest even, and toward zero.
  CHECK(__bfloat162float(__float2bfloat16(1.00390625f)) == 1.f);          // halfway, even below
  CHECK(__bfloat162float(__float2bfloat16(1.01171875f)) == 1.015625f);    // halfway, even above
  CHECK(__bfloat162float(__float2bfloat16(1.0058594f)) == 1.0078125f);    // above halfway
  CHECK(__bfloat162float(__float2bfloat16_rz(1.0058594f)) == 1.f);
  CHECK(__bfloat162float(__float2bfloat16(-3.f)) == -3.f);
  const float nan = __bfloat162float(__float2bfloat16(std::numeric_limits<float>::quiet_NaN()));
  CHECK(nan != nan);
}
