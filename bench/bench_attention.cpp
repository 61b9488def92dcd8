// Causal attention forward + backward throughput through the op (so the same code runs the CPU
// kernels or, in a CUDA build with --device cuda, the flash kernels). Prints TFLOP/s for each T
// and head dim, counting the causal half of 4·T²·D per head forward and 2.5× that backward
// (the convention of flash-attention papers). On the CPU the last column is that rate over the
// fp32 GEMM peak measured first in the same run (bench/gemm_peak.h: the same threads, the same
// load); on a GPU bench/sdpa_reference.py measures PyTorch's scaled_dot_product_attention on the
// same shapes and bench/gpu_check.sh prints the ratio.
// --doc-len N adds a document mask of packed N-token documents: the FLOPs are then counted for the
// (query, key) pairs the masks leave visible only (causal's count times their share of causal's
// pairs), so TFLOP/s and "vs GEMM" stay rates of work done (counted as causal, they read as many
// times the GEMM peak). The speed-up from the tiles skipped is in the ms (compare a causal run's).
// --falling-ids numbers those documents downwards (the same documents, the same visible pairs):
// the CPU kernels then test every earlier tile's ids instead of finding the document's tiles by
// bisection, as they did for all ids before (the baseline of bench/RESULTS.md's rows).
// --window W adds a sliding window of W keys (its visible pairs counted the same way).
// --query-rows 64|128 picks the bf16 CUDA kernels' query rows per block (forward and dq pass;
// layers/attention.h); the last column says which ran. --dkv-stages 1|2 the bf16 dk/dv pass's stages
// of (Q, dout) tiles (0, the default: as the GPU allows; layers/attention.h).
//   ./build/bench_attention --help   prints the flags and their defaults (the usage string below is the one list)
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "bench/gemm_peak.h"
#include "bench/guarded_main.h"
#include "engine/context.h"
#include "engine/device.h"
#include "layers/attention.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_launch.h"
#include "engine/cuda_runtime.h"
#endif

using namespace ul;

static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// The device's own clock between points of one repetition: CUDA events on the stream the kernels
// run on (the host clock would add the sync's wake-up to a T = 4K run of half a millisecond). On the
// CPU it does nothing and the host clock is used.
class GpuMarks {
 public:
  explicit GpuMarks(Device d) {
#if ULYSSES_HAVE_CUDA
    if (d == Device::cuda)
      for (cudaEvent_t& e : ev_) UL_CUDA_CHECK(cudaEventCreate(&e));
#else
    (void)d;
#endif
  }
  ~GpuMarks() {
#if ULYSSES_HAVE_CUDA
    for (cudaEvent_t e : ev_)
      if (e) cudaEventDestroy(e);
#endif
  }
  GpuMarks(const GpuMarks&) = delete;
  GpuMarks& operator=(const GpuMarks&) = delete;
  bool on() const {
#if ULYSSES_HAVE_CUDA
    return ev_[0] != nullptr;
#else
    return false;
#endif
  }
  void mark(int i) {
#if ULYSSES_HAVE_CUDA
    if (on()) UL_CUDA_CHECK(cudaEventRecord(ev_[i], nullptr));  // the legacy stream: the ops' (layers/op_util.h)
#else
    (void)i;
#endif
  }
  double ms(int from, int to) const {  // after a sync
#if ULYSSES_HAVE_CUDA
    float t = 0;
    UL_CUDA_CHECK(cudaEventElapsedTime(&t, ev_[from], ev_[to]));
    return t;
#else
    (void)from, (void)to;
    return 0;
#endif
  }

 private:
#if ULYSSES_HAVE_CUDA
  cudaEvent_t ev_[3] = {nullptr, nullptr, nullptr};
#endif
};

static int run(int argc, char** argv) {
  BenchArgs args(argc, argv,
                 "usage: bench_attention [--device cpu|cuda] [--dtype f32|bf16] [--heads 16] [--seqs 1024,2048]\n"
                 "                       [--dims 64] [--reps 3] [--doc-len N [--falling-ids]] [--window W]\n"
                 "                       [--query-rows 64|128] [--dkv-stages 0|1|2]\n"
                 "  with --doc-len or --window, TFLOP/s counts only the (query, key) pairs the mask leaves visible");
  const std::string device = args.choice("--device", "cpu", {"cpu", "cuda"});
  const std::string dtype = args.choice("--dtype", "f32", {"f32", "bf16"});
  const int H = args.positive("--heads", 16), reps = args.positive("--reps", 3);
  const int doc_len = int(args.integer("--doc-len", 0, 0, INT_MAX));  // 0: no document mask
  const bool falling = args.flag("--falling-ids");
  if (falling && doc_len == 0) args.refuse("--falling-ids needs --doc-len");
  const int window = int(args.integer("--window", 0, 0, INT_MAX));    // 0: no sliding window
  const bool rows_given = args.given("--query-rows");
  const int query_rows = int(args.integer("--query-rows", 64));
  const bool stages_given = args.given("--dkv-stages");
  const int dkv_stages = int(args.integer("--dkv-stages", 0));  // cuda only
  const std::vector<int> seqs = args.ints("--seqs", {1024, 2048}, 1), dims = args.ints("--dims", {64}, 1);
  args.done();
  (void)dkv_stages;
  if (dtype == "bf16" && device != "cuda")  // (found once the GEMM peak had been timed, by the op)
    args.refuse("--dtype bf16: the CPU backend runs f32 only (--device cuda)");
  if ((rows_given || stages_given) && device != "cuda")
    args.refuse(std::string(rows_given ? "--query-rows" : "--dkv-stages") +
                " picks the CUDA kernels' blocks: it needs --device cuda");
  Device dev = Device::cpu;
  if (device == "cuda") {
#if ULYSSES_HAVE_CUDA
    init_cuda_backend();
    cuda::set_attention_query_rows(query_rows);  // throws on anything but 64 or 128
    cuda::set_attention_dkv_stages(dkv_stages);  // throws on anything but 0, 1 or 2
    dev = Device::cuda;
#else
    args.refuse("--device cuda: this build has no CUDA backend");
#endif
  }
  const DType dt = dtype == "bf16" ? DType::bf16 : DType::f32;
  // The CPU's baseline: a 2048^3 product's rate on the threads the attention loops use.
  const double peak_tflops = dev == Device::cpu ? eigen_gemm_peak_gflops(2048, 3) / 1000.0 : 0.0;
  if (dev == Device::cpu) std::printf("fp32 GEMM peak (Eigen, 2048^3, this run): %.3f TFLOP/s\n", peak_tflops);
  std::printf("%-6s %-5s %8s %5s %12s %12s %10s %8s %6s %8s %8s\n", "device", "dtype", "T", "D", "fwd ms", "fwd+bwd ms",
              "TFLOP/s", "doc-len", "rows", "window", "vs GEMM");
  for (int D : dims)
    for (int T : seqs) {
      Context c(dev);
      ContextGuard g(c);
      const int64_t n = int64_t(T) * 3 * H * D;
      // Uniform on [-sqrt 3, sqrt 3] (variance 1) from a 64-bit LCG: the timing does not need
      // normal draws, and Box-Muller for T = 64K, D = 128 took longer than the kernels' runs.
      std::vector<float> host(n);
      uint64_t state = 1;
      for (auto& x : host) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = float((double(state >> 11) * 0x1p-53 * 2.0 - 1.0) * 1.7320508075688772);
      }
      // Outside the arena: the arena is reset between repetitions, qkv must survive them.
      Tensor qkv;
      qkv.shape = {1, T, 3 * H, D};
      qkv.dtype = dt;
      qkv.device = dev;
      qkv.ptr = device_alloc(dev, qkv.nbytes());
      if (dt == DType::bf16) {
        std::vector<uint16_t> h16(n);
        for (int64_t i = 0; i < n; i++) h16[i] = to_bf16(host[i]);
        copy_from_host(qkv, h16.data());
      } else {
        copy_from_host(qkv, host.data());
      }
      qkv = c.tape.track(qkv);
      Tensor doc;  // (1, T) ids t / doc_len (or minus it), outside the arena like qkv
      if (doc_len > 0) {
        doc.shape = {1, T};
        doc.dtype = DType::i32;
        doc.device = dev;
        doc.ptr = device_alloc(dev, doc.nbytes());
        std::vector<int32_t> ids(T);
        for (int t = 0; t < T; t++) ids[t] = falling ? -(t / doc_len) : t / doc_len;
        copy_from_host(doc, ids.data());
      }
      // The output's gradient: random (uniform, variance 1), as sdpa_reference.py's. Zeros would
      // feed four of the backward's five products zeros, which tensor cores run at a higher clock
      // than real data. Copied into the tape's buffer each repetition, device to device.
      Tensor dout;
      dout.shape = {1, T, H, D};
      dout.dtype = dt;
      dout.device = dev;
      dout.ptr = device_alloc(dev, dout.nbytes());
      {
        const int64_t m = dout.numel();
        std::vector<float> g(size_t(m), 0.f);
        for (auto& x : g) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          x = float((double(state >> 11) * 0x1p-53 * 2.0 - 1.0) * 1.7320508075688772);
        }
        if (dt == DType::bf16) {
          std::vector<uint16_t> g16(static_cast<size_t>(m));
          for (int64_t i = 0; i < m; i++) g16[size_t(i)] = to_bf16(g[size_t(i)]);
          copy_from_host(dout, g16.data());
        } else {
          copy_from_host(dout, g.data());
        }
      }
      double best_f = 1e30, best_fb = 1e30;
      GpuMarks marks(dev);  // on a GPU: CUDA events, as PyTorch's side times itself
      for (int r = 0; r < reps + 1; r++) {
        marks.mark(0);
        auto t0 = std::chrono::steady_clock::now();
        Tensor out;
        {
          Recording rec(true);
          out = attention(qkv, H, H, doc, window);
        }
        marks.mark(1);
        // Timed by events, the backward is queued right behind the forward, as PyTorch's is; by
        // the host clock, the forward must end before t1.
        if (!marks.on()) device_ops(dev).sync();
        auto t1 = std::chrono::steady_clock::now();
        device_copy(c.tape.grad(out), dev, dout.ptr, dev, out.nbytes());
        c.tape.backward();
        marks.mark(2);
        device_ops(dev).sync();
        auto t2 = std::chrono::steady_clock::now();
        if (r > 0) {  // the first run warms up
          const double f = marks.on() ? marks.ms(0, 1) : std::chrono::duration<double, std::milli>(t1 - t0).count();
          const double fb = marks.on() ? marks.ms(0, 2) : std::chrono::duration<double, std::milli>(t2 - t0).count();
          best_f = std::min(best_f, f);
          best_fb = std::min(best_fb, fb);
        }
        c.arena.reset();
        qkv = c.tape.track(qkv);
      }
      // The mask's visible (query, key) pairs over causal's T (T + 1) / 2: query t sees the keys of
      // its document (doc ids t / doc_len) no older than t - W + 1. 1 without a mask.
      double visible = 0;
      for (int t = 0; t < T; t++) {
        int lo = doc_len > 0 ? t / doc_len * doc_len : 0;
        if (window > 0) lo = std::max(lo, t - window + 1);
        visible += t - lo + 1;
      }
      const double share = visible / (0.5 * double(T) * (double(T) + 1));
      const double fwd_flops = 4.0 * double(T) * T * D * H / 2.0 * share;  // causal: half the square
      const double total = fwd_flops * 3.5;                         // forward + backward (2.5x)
      const double tflops = total / (best_fb / 1000.0) / 1e12;
      char vs[16] = "-";  // a GPU's ratio is against SDPA, in gpu_check.sh
      if (peak_tflops > 0) std::snprintf(vs, sizeof vs, "%.2f", tflops / peak_tflops);
      std::printf("%-6s %-5s %8d %5d %12.2f %12.2f %10.3f %8d %6d %8d %8s\n", device.c_str(), dtype.c_str(), T, D, best_f,
                  best_fb, tflops, doc_len, dev == Device::cuda ? query_rows : 0, window, vs);
      device_free(dev, qkv.ptr);
      device_free(dev, dout.ptr);
      if (doc.ptr) device_free(dev, doc.ptr);
    }
  return 0;
}

int main(int argc, char** argv) { return guarded_main(run, argc, argv); }
