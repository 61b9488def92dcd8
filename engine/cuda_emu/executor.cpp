// The SIMT executor: runs a grid's blocks on OpenMP threads, and each block's threads as fibers on
// one OS thread (switched by ul_emu_switch below on x86-64; by ucontext under the sanitizers, with
// CET, or with -DUL_EMU_UCONTEXT). A fiber runs until it parks at a barrier or a warp collective, or
// exits; the scheduler then resumes the next runnable lane of the same warp, so that one warp runs
// as far as it can before the next (see run_block for the order). When a pass
// over the block finds nothing runnable and some fiber has not exited, the block is deadlocked and
// the launch fails with a description of who waits where.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/cuda_emu/cuda_emu.h"
#include "engine/cuda_emu/gpu_models.h"

// Switching fibers: glibc's swapcontext saves and restores the signal mask, two system calls per
// switch, which took half of an emulated kernel's time (every barrier and warp collective switches
// twice per thread). On x86-64 a switch saves only what the System V ABI says a call preserves:
// rbx, rbp, r12-r15, the SSE control word (MXCSR) and the x87 control word, then swaps stacks.
// Elsewhere, under a sanitizer (which must see stack switches), with shadow stacks (CET: the
// switch does not swap them) or with -DUL_EMU_UCONTEXT, ucontext as before.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UL_EMU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)  // clang's spelling
#define UL_EMU_SANITIZED 1
#endif
#endif
#if defined(__x86_64__) && !defined(UL_EMU_SANITIZED) && !(defined(__CET__) && (__CET__ & 2)) && \
    !defined(UL_EMU_UCONTEXT)
#define UL_EMU_FAST_SWITCH 1
// ul_emu_switch(&save_sp, load_sp): pushes the callee-saved state on this stack, stores the stack
// pointer in *save_sp, loads load_sp and pops the state saved there.
extern "C" void ul_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl ul_emu_switch
  .hidden ul_emu_switch
  .type ul_emu_switch, @function
ul_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ul_emu_switch, .-ul_emu_switch
)");
#else
#define UL_EMU_FAST_SWITCH 0
#endif

namespace ul_emu {
namespace {

constexpr int kMaxThreads = 1024;            // per block, as on every GPU since Fermi
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr size_t kStackBytes = 64 << 10;     // per fiber; kernels keep little on the stack
constexpr size_t kMaxDynamicSmem = 227 << 10;  // the largest opt-in of any GPU (sm_90, sm_100): the mapping's size
constexpr size_t kSmemRedZone = 256;  // poisoned bytes before dynamic shared memory, checked per block
constexpr size_t kDefaultDynamicSmem = 48 << 10;  // more needs cudaFuncSetAttribute first

enum class Wait : uint8_t { ready, barrier, warp, exited };

// A cp.async in flight: the source is read when it is issued (kernels never write what they copy
// from), the destination poisoned then and written when a cp.async.wait_group retires its group.
struct AsyncCopy {
  unsigned char* dst;
  int bytes;
  int group;  // the commit group it belongs to: the fiber's commit count when it was issued
  unsigned char data[16];
};

struct Fiber {
#if UL_EMU_FAST_SWITCH
  void* sp = nullptr;  // its saved stack pointer while it does not run
#else
  ucontext_t ctx;
#endif
  uint3 tid;
  Wait wait;
  std::vector<AsyncCopy> copies;  // issued, not yet retired
  int committed = 0;              // cp.async.commit_group calls so far
};

struct Warp {
  Collective op = Collective::none;  // the collective in flight, if any
  unsigned mask = 0;
  int width = 32;
  unsigned arrived = 0;              // lanes parked in it
  unsigned live = 0;                 // lanes that exist in this block and have not exited
  uint64_t in[32];
  int arg[32];
  uint64_t out[32];
};

const char* op_name(Collective op) {
  switch (op) {
    case Collective::none: return "nothing";
    case Collective::sync: return "__syncwarp";
    case Collective::ballot: return "__ballot_sync/__any_sync/__all_sync";
    case Collective::shfl_idx: return "__shfl_sync";
    case Collective::shfl_up: return "__shfl_up_sync";
    case Collective::shfl_down: return "__shfl_down_sync";
    case Collective::shfl_xor: return "__shfl_xor_sync";
    case Collective::aligned: return "mma.sync/ldmatrix";
  }
  return "?";
}

std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

std::string coord(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// One per OS thread, reused by every block and launch that thread runs: the fiber contexts and
// stacks are made once and only re-pointed at the kernel for each block.
struct Worker {
  std::unique_ptr<Fiber[]> fibers{new Fiber[kMaxThreads]};
  Warp warps[kMaxWarps];
#if UL_EMU_FAST_SWITCH
  void* sched_sp = nullptr;  // the scheduler's, while a fiber runs
#else
  ucontext_t sched;
#endif
  char* stacks = nullptr;  // n_stacks * (guard page + kStackBytes), one mapping
  int n_stacks = 0;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  // Dynamic shared memory: one mapping of sm_90's limit followed by a PROT_NONE page; a launch's
  // smem_bytes (rounded up to 128) end right at the guard, so a kernel that indexes past what it
  // asked for faults there (on a GPU: an out-of-range shared address) instead of reading garbage.
  unsigned char* smem_map = nullptr;
  size_t smem_map_len = 0;
  unsigned char* smem = nullptr;  // this launch's dynamic shared memory

  // The block in flight.
  bool in_block = false;
  const std::function<void()>* body = nullptr;
  size_t smem_bytes = 0;
  bool smem_opted_in = false;  // cudaFuncSetAttribute raised this kernel's dynamic limit
  int n = 0;           // threads per block
  int cur = -1;        // the running fiber
  int at_barrier = 0;
  const char* barrier_file = nullptr;  // where the threads at the barrier called it from
  int barrier_line = 0;
  unsigned barriers = 0;  // __syncthreads completed: each one restarts the warp order
  int exited = 0;
  std::exception_ptr error;
  uint64_t block_serial = 0;  // counts the blocks this OS thread has run
  struct StaticArray {
    void* at;
    size_t bytes;
    uint64_t block;  // the block that last poisoned it
  };
  std::vector<StaticArray> static_arrays;  // each static shared array the kernel declared
  size_t static_bytes = 0;    // the block's static shared memory so far

  ~Worker() {
    if (stacks) munmap(stacks, size_t(n_stacks) * (page + kStackBytes));
    if (smem_map) munmap(smem_map, smem_map_len);
  }

  char* stack(int i) { return stacks + size_t(i) * (page + kStackBytes) + page; }

  // Stacks for n fibers, each above a PROT_NONE guard page so an overflow faults at once instead
  // of corrupting the neighbouring fiber.
  void reserve_stacks(int count) {
    if (count <= n_stacks) return;
    if (stacks) munmap(stacks, size_t(n_stacks) * (page + kStackBytes));
    size_t bytes = size_t(count) * (page + kStackBytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda_emu: cannot map fiber stacks");
    stacks = static_cast<char*>(p);
#if !UL_EMU_FAST_SWITCH
    for (int i = n_stacks; i < count; i++) getcontext(&fibers[i].ctx);
#endif
    n_stacks = count;
    for (int i = 0; i < count; i++) mprotect(stack(i) - page, page, PROT_NONE);
  }

  void reserve_smem(size_t bytes) {
    if (!smem_map) {
      const size_t data = (kMaxDynamicSmem + kSmemRedZone + page - 1) / page * page;
      void* p = mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("cuda_emu: cannot map dynamic shared memory");
      smem_map = static_cast<unsigned char*>(p);
      smem_map_len = data + page;
      mprotect(smem_map + data, page, PROT_NONE);
    }
    smem = smem_map + smem_map_len - page - (bytes + 127) / 128 * 128;
  }
};

thread_local Worker t_worker;

Worker& in_kernel(const char* what) {
  Worker& w = t_worker;
  if (!w.in_block) throw std::runtime_error(std::string(what) + " called outside a kernel");
  return w;
}

// The running fiber hands the OS thread back to the scheduler; the scheduler hands it to fiber i.
void to_scheduler(Worker& w) {
  Fiber& f = w.fibers[w.cur];
#if UL_EMU_FAST_SWITCH
  ul_emu_switch(&f.sp, w.sched_sp);
#else
  swapcontext(&f.ctx, &w.sched);
#endif
}
void to_fiber(Worker& w, int i) {
#if UL_EMU_FAST_SWITCH
  ul_emu_switch(&w.sched_sp, w.fibers[i].sp);
#else
  swapcontext(&w.sched, &w.fibers[i].ctx);
#endif
}

void park(Worker& w, Wait why) {
  w.fibers[w.cur].wait = why;
  to_scheduler(w);
}

// Completes the warp's collective once every running lane of its mask has arrived: computes each
// lane's result (PTX shfl.sync semantics) and makes the parked lanes runnable again.
bool try_complete(Worker& w, int warp) {
  Warp& wp = w.warps[warp];
  const unsigned need = wp.mask & wp.live;
  if (wp.op == Collective::none || (wp.arrived & need) != need) return false;
  const unsigned seg = ~unsigned(wp.width - 1) & 31u;  // lane bits that name the segment
  unsigned ballot = 0;
  if (wp.op == Collective::ballot)
    for (int l = 0; l < 32; l++)
      if ((wp.arrived >> l & 1) && wp.in[l]) ballot |= 1u << l;
  for (int lane = 0; lane < 32; lane++) {
    if (!(wp.arrived >> lane & 1)) continue;
    const int b = wp.arg[lane] & 31;
    const int lo = lane & int(seg), hi = lo | (wp.width - 1);
    int j = lane;
    bool ok = true;
    switch (wp.op) {
      case Collective::shfl_idx: j = lo | (b & (wp.width - 1)); break;
      case Collective::shfl_up: j = lane - b; ok = j >= lo; break;
      case Collective::shfl_down: j = lane + b; ok = j <= hi; break;
      case Collective::shfl_xor: j = lane ^ b; ok = j <= hi; break;
      default: break;
    }
    // Out of the segment: the lane keeps its own value (CUDA's rule). Reading a lane that is not
    // taking part (outside the mask, or exited) is undefined on the GPU; here it yields all-one
    // bits (NaN as a float, -1 as an int), so a reduction that counts on such a lane shows.
    if (!ok) j = lane;
    if (wp.op == Collective::ballot) wp.out[lane] = ballot | (uint64_t(wp.arrived) << 32);
    else wp.out[lane] = wp.arrived >> j & 1 ? wp.in[j] : ~uint64_t(0);
  }
  for (int lane = 0; lane < 32; lane++)
    if (wp.arrived >> lane & 1) w.fibers[warp * 32 + lane].wait = Wait::ready;
  wp.op = Collective::none;
  wp.arrived = 0;
  return true;
}

void fiber_exit(Worker& w) {
  Fiber& f = w.fibers[w.cur];
  f.wait = Wait::exited;
  w.exited++;
  const int warp = w.cur / 32;
  w.warps[warp].live &= ~(1u << (w.cur % 32));
  if (w.at_barrier > 0 && !w.error)
    w.error = std::make_exception_ptr(std::runtime_error(
        "thread " + coord(f.tid) + " exited while " + std::to_string(w.at_barrier) +
        " threads wait at __syncthreads(): a barrier must be reached by every thread of the block"));
  const Warp& wp = w.warps[warp];
  if (wp.op == Collective::aligned && wp.arrived && !w.error)
    w.error = std::make_exception_ptr(std::runtime_error(
        "thread " + coord(f.tid) + " exited while lanes " + hex(wp.arrived) + " of its warp wait in " +
        op_name(wp.op) + ": an .aligned warp instruction must be executed by all 32 lanes of the warp"));
  try_complete(w, warp);  // the lanes still in a collective may no longer wait for this one
}

void fiber_main() {
  Worker& w = t_worker;
  try {
    (*w.body)();
  } catch (...) {
    if (!w.error) w.error = std::current_exception();
  }
  fiber_exit(w);
  // ucontext: returning resumes uc_link, the scheduler. The fast switch: fiber_start hands back.
}

#if UL_EMU_FAST_SWITCH
// Where a fiber's first switch lands (its stack is laid out by run_block so that ul_emu_switch's
// `ret` enters here as a call would). It never returns: the exited fiber is not resumed.
[[noreturn]] void fiber_start() {
  fiber_main();
  Worker& w = t_worker;
  to_scheduler(w);
  std::abort();
}

// A fresh stack for fiber i: what ul_emu_switch pops (the control words, six registers, the
// return address fiber_start), so that fiber_start begins with the ABI's alignment (rsp + 8 a
// multiple of 16).
void* fresh_stack(char* base, size_t bytes) {
  uintptr_t top = (uintptr_t(base) + bytes) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 16);  // the return address sits at a multiple of 16
  sp[0] = uint64_t(uintptr_t(&fiber_start));
  sp -= 6;
  for (int r = 0; r < 6; r++) sp[r] = 0;  // r15, r14, r13, r12, rbx, rbp
  sp -= 1;
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  return sp;
}
#endif

std::string deadlock_report(Worker& w) {
  std::string s = "deadlock: " + std::to_string(w.at_barrier) + " threads wait at __syncthreads(), " +
                  std::to_string(w.exited) + " exited";
  for (int k = 0; k < (w.n + 31) / 32; k++) {
    const Warp& wp = w.warps[k];
    if (wp.op == Collective::none) continue;
    s += "; warp " + std::to_string(k) + ": lanes " + hex(wp.arrived) + " wait in " + op_name(wp.op) +
         " (mask " + hex(wp.mask) + ") for lanes " + hex(wp.mask & wp.live & ~wp.arrived);
  }
  return s + " (a barrier or warp collective that part of the block or warp never reaches)";
}

void run_block(Worker& w, uint3 block_idx, unsigned flip) {
  blockIdx = block_idx;
  w.at_barrier = 0;
  w.barrier_file = nullptr;
  w.exited = 0;
  w.error = nullptr;
  for (int k = 0; k < (w.n + 31) / 32; k++) {
    Warp& wp = w.warps[k];
    wp.op = Collective::none;
    wp.arrived = 0;
    const int lanes = w.n - k * 32 < 32 ? w.n - k * 32 : 32;
    wp.live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  }
  // Shared memory starts as garbage on a GPU; NaN bits make a read-before-write show (the static
  // arrays are filled as the block first reaches them: static_smem). The rounding's slack past the
  // end too, and a red zone before the start, checked when the block ends: a negative index reads
  // NaN and a write there is caught (the guard page only catches the end).
  if (w.smem_bytes) std::memset(w.smem - kSmemRedZone, 0xff, kSmemRedZone + (w.smem_bytes + 127) / 128 * 128);
  w.block_serial++;
  w.static_bytes = 0;
  const unsigned bx = blockDim.x, by = blockDim.y;
  for (int i = 0; i < w.n; i++) {
    Fiber& f = w.fibers[i];
    f.tid = {i % bx, (i / bx) % by, i / (bx * by)};
    f.wait = Wait::ready;
    f.copies.clear();  // what a previous block left in flight died with its shared memory
    f.committed = 0;
#if UL_EMU_FAST_SWITCH
    f.sp = fresh_stack(w.stack(i), kStackBytes);
#else
    f.ctx.uc_stack.ss_sp = w.stack(i);
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &w.sched;
    makecontext(&f.ctx, fiber_main, 0);
#endif
  }
  // Warps run one at a time, each as far as it gets (to a __syncthreads or its exit), in order in
  // even blocks and in reverse in odd ones: the most lopsided interleavings a GPU may produce, so
  // that shared memory written or refilled without a barrier between warps shows up as stale or
  // NaN data instead of passing because every warp happened to keep pace with the others. The
  // lanes of a warp take turns the same way (first to last, or last to first), since Volta a
  // warp's lanes are not in lockstep either: one lane's shared-memory write is visible to another
  // only after a __syncwarp (or a barrier), and reading it earlier shows as a stale value.
  const int warps = (w.n + 31) / 32;
  // Alternating by launch too (flip: the kernel's launches so far on this thread): a one-block
  // grid is not always walked forward.
  const bool reverse = (block_idx.x + block_idx.y + block_idx.z + flip) % 2 == 1;
  w.barriers = 0;
  for (;;) {
    bool ran = false;
    const unsigned barriers = w.barriers;
    for (int k = 0; k < warps && w.barriers == barriers; k++) {
      const int warp = reverse ? warps - 1 - k : k;
      const int lo = warp * 32, hi = std::min(lo + 32, w.n);
      // Lanes meet at warp collectives: run them round until none is ready or a barrier opens.
      for (bool again = true; again && w.barriers == barriers;) {
        again = false;
        for (int k = 0; k < hi - lo && w.barriers == barriers; k++) {
          const int i = reverse ? hi - 1 - k : lo + k;
          if (w.fibers[i].wait != Wait::ready) continue;
          w.cur = i;
          threadIdx = w.fibers[i].tid;
          to_fiber(w, i);
          ran = again = true;
          // The other fibers are abandoned mid-kernel; their stacks are reused by the next block.
          if (w.error) std::rethrow_exception(w.error);
        }
      }
    }
    if (w.exited == w.n) {
      for (size_t i = 0; w.smem_bytes && i < kSmemRedZone; i++)
        if ((w.smem - kSmemRedZone)[i] != 0xff)  // on a GPU: another array of the block corrupted
          throw std::runtime_error("a block wrote " + std::to_string(kSmemRedZone - i) +
                                   " byte(s) before the start of its dynamic shared memory");
      return;
    }
    if (!ran) throw std::runtime_error(deadlock_report(w));
  }
}

// A launch the GPU would refuse for its configuration, found only as the block runs (its static
// shared memory): the launch's error, not a fault of the kernel, so not sticky.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ULYSSES_EMU_FAULT / inject_fault: the kernel name and which of its launches faults.
struct Injection {
  std::mutex mu;
  std::string kernel;
  long nth = 0, seen = 0;
  Injection() {
    const char* v = std::getenv("ULYSSES_EMU_FAULT");
    if (!v || !*v) return;
    const std::string spec = v;
    const size_t colon = spec.rfind(':');
    kernel = spec.substr(0, colon);
    nth = 1;
    if (colon != std::string::npos) {
      char* end = nullptr;
      nth = std::strtol(spec.c_str() + colon + 1, &end, 10);
      if (*end || nth < 1 || kernel.empty())
        throw std::runtime_error("ULYSSES_EMU_FAULT=" + spec + ": want KERNEL or KERNEL:N (N >= 1)");
    }
  }
};
Injection& injection() {
  static Injection i;
  return i;
}
// Whether this launch of `name` is the one to fault.
bool injected_here(const char* name) {
  Injection& i = injection();
  std::lock_guard<std::mutex> lock(i.mu);
  return !i.kernel.empty() && i.kernel == name && ++i.seen == i.nth;
}

std::mutex g_smem_mu;
std::map<const void*, size_t> g_smem_opt_in;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize

// The dynamic shared memory a launch of `kernel` may ask: its cudaFuncAttributeMaxDynamicSharedMemorySize
// when set (opted_in), else 48 KiB (less its static shared memory: checked as the block declares it).
size_t smem_limit(const void* kernel, bool* opted_in = nullptr) {
  std::lock_guard<std::mutex> lock(g_smem_mu);
  const auto it = g_smem_opt_in.find(kernel);
  const bool set = it != g_smem_opt_in.end();
  if (opted_in) *opted_in = set;
  return set ? it->second : kDefaultDynamicSmem;
}

// The emulated GPU's opt-in limit (ULYSSES_EMU_GPU): what a launch or cudaFuncSetAttribute may ask.
size_t device_smem_optin() { return std::min(kMaxDynamicSmem, emulated_gpu().smem_optin); }

void check_config(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem) {
  auto bad = [&](const std::string& why) {
    throw std::runtime_error(std::string("kernel '") + name + "': invalid configuration argument: " + why);
  };
  const GpuModel& gpu = emulated_gpu();
  if (!has_kernel_image(kernel_archs(), gpu.major, gpu.minor))
    throw std::runtime_error(std::string("kernel '") + name +
                             "': no kernel image is available for execution on the device");
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || block.z > 64)
    bad("block " + coord({block.x, block.y, block.z}) + " (1 to 1024 threads, z at most 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    bad("grid " + coord({grid.x, grid.y, grid.z}));
  if (smem > device_smem_optin())
    bad(std::to_string(smem) + " bytes of dynamic shared memory (" + gpu.name + " allows " +
        std::to_string(device_smem_optin()) + ")");
  bool opted_in = false;
  const size_t limit = smem_limit(kernel, &opted_in);
  if (smem > limit)
    bad(std::to_string(smem) + " bytes of dynamic shared memory " +
        (opted_in ? "past the " + std::to_string(limit) + " bytes cudaFuncSetAttribute(kernel, "
                        "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) allowed"
                  : std::string("without cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                                "bytes) first (the default limit is 48 KiB)")));
}

}  // namespace

void syncthreads(const char* file, int line) {
  Worker& w = in_kernel("__syncthreads()");
  if (w.exited > 0)
    throw std::runtime_error("__syncthreads() reached by thread " + coord(w.fibers[w.cur].tid) + " after " +
                             std::to_string(w.exited) + " of the block's " + std::to_string(w.n) +
                             " threads exited: a barrier must be reached by every thread of the block");
  // bar.sync is .aligned: every thread of the block must reach the same barrier. Threads that meet
  // at two different __syncthreads() calls (one in each arm of a branch that splits the block)
  // would pass here, counting arrivals, but are undefined on the GPU (a hang, or a barrier that
  // opens too early); the call's source line tells them apart.
  if (w.at_barrier == 0) {
    w.barrier_file = file;
    w.barrier_line = line;
  } else if (line != w.barrier_line || std::strcmp(file, w.barrier_file) != 0) {
    throw std::runtime_error("thread " + coord(w.fibers[w.cur].tid) + " reached __syncthreads() at " + file + ":" +
                             std::to_string(line) + " while " + std::to_string(w.at_barrier) +
                             " threads wait at the one at " + w.barrier_file + ":" + std::to_string(w.barrier_line) +
                             ": every thread of the block must reach the same barrier (bar.sync is .aligned)");
  }
  if (++w.at_barrier == w.n) {
    for (int i = 0; i < w.n; i++)
      if (w.fibers[i].wait == Wait::barrier) w.fibers[i].wait = Wait::ready;
    w.at_barrier = 0;
    w.barriers++;
    park(w, Wait::ready);  // the last to arrive yields too: the scheduler restarts the warp order
    return;
  }
  park(w, Wait::barrier);
}

uint64_t warp_collective(Collective op, unsigned mask, uint64_t value, int arg, int width) {
  Worker& w = in_kernel(op_name(op));
  const int lane = w.cur % 32, warp = w.cur / 32;
  Warp& wp = w.warps[warp];
  auto who = [&] { return "lane " + std::to_string(lane) + " of warp " + std::to_string(warp); };
  // mma.sync and ldmatrix are .aligned: all 32 lanes must execute them (exited lanes, or a block
  // whose last warp is partial, leave their fragments undefined on the GPU, where a shuffle only
  // waits for the lanes that still run).
  if (op == Collective::aligned && (mask != 0xffffffffu || wp.live != 0xffffffffu))
    throw std::runtime_error(who() + " executed " + op_name(op) + " with lanes " + hex(~wp.live & 0xffffffffu) +
                             " of its warp exited or absent (a block of " + std::to_string(w.n) +
                             " threads): an .aligned warp instruction needs all 32 lanes");
  if (!(mask >> lane & 1))
    throw std::runtime_error(who() + " called " + op_name(op) + " with mask " + hex(mask) + ", which leaves it out");
  if (width < 1 || width > 32 || (width & (width - 1)))
    throw std::runtime_error(who() + " called " + op_name(op) + " with width " + std::to_string(width) +
                             " (a power of two from 1 to 32)");
  if (wp.op == Collective::none) {
    wp.op = op;
    wp.mask = mask;
    wp.width = width;
  } else if (wp.op != op || wp.mask != mask || wp.width != width) {
    throw std::runtime_error(who() + " called " + op_name(op) + " (mask " + hex(mask) + ") while lanes " +
                             hex(wp.arrived) + " wait in " + op_name(wp.op) + " (mask " + hex(wp.mask) +
                             "): the lanes of a warp must meet at the same collective");
  }
  wp.in[lane] = value;
  wp.arg[lane] = arg;
  wp.arrived |= 1u << lane;
  if (!try_complete(w, warp)) park(w, Wait::warp);
  return wp.out[lane];
}

bool is_shared(const void* p, size_t bytes) {
  Worker& w = in_kernel("a shared-memory address");
  const auto* b = static_cast<const unsigned char*>(p);
  if (w.smem_bytes && b >= w.smem && b + bytes <= w.smem + w.smem_bytes) return true;
  for (const Worker::StaticArray& a : w.static_arrays)
    if (a.block == w.block_serial && b >= static_cast<unsigned char*>(a.at) &&
        b + bytes <= static_cast<unsigned char*>(a.at) + a.bytes)
      return true;
  return false;
}

void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
  Worker& w = in_kernel("cp.async");
  if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes < 0 || src_bytes > bytes)
    throw std::runtime_error("cp.async of " + std::to_string(bytes) + " bytes with src-size " +
                             std::to_string(src_bytes) + " (4, 8 or 16 bytes; src-size at most that)");
  if (reinterpret_cast<uintptr_t>(dst) % unsigned(bytes) || reinterpret_cast<uintptr_t>(src) % unsigned(bytes))
    throw std::runtime_error("cp.async of " + std::to_string(bytes) + " bytes from or to an address not aligned to " +
                             std::to_string(bytes));
  // cp.async.*.shared.global: into this block's shared memory, from device memory (a GPU faults
  // on anything else; here a host source would be read as if the GPU could reach it).
  if (!is_shared(dst, size_t(bytes)))
    throw std::runtime_error("cp.async to an address outside this block's shared memory (it copies global to shared)");
  if (src_bytes > 0 && !device_reachable(src))
    throw std::runtime_error("cp.async from host memory (it copies device memory from cudaMalloc to shared)");
  Fiber& f = w.fibers[w.cur];
  AsyncCopy c{static_cast<unsigned char*>(dst), bytes, f.committed, {}};
  std::memcpy(c.data, src, size_t(src_bytes));  // the rest stays zero: cp.async zero-fills
  // Until the wait the destination is undefined on the GPU (the copy may land at any moment): here
  // it holds NaN bytes, so reading a buffer whose refill was issued too early shows, as does
  // reading one before its wait.
  std::memset(dst, 0xff, size_t(bytes));
  f.copies.push_back(c);
}

void cp_async_commit() {
  Worker& w = in_kernel("cp.async.commit_group");
  w.fibers[w.cur].committed++;
}

void cp_async_wait(int pending) {
  Worker& w = in_kernel("cp.async.wait_group");
  Fiber& f = w.fibers[w.cur];
  const int retire_below = f.committed - pending;  // groups older than the `pending` newest
  size_t kept = 0;
  for (const AsyncCopy& c : f.copies) {
    if (c.group < retire_below) std::memcpy(c.dst, c.data, size_t(c.bytes));
    else f.copies[kept++] = c;
  }
  f.copies.resize(kept);
}

void* dynamic_smem() {
  Worker& w = in_kernel("dynamic shared memory");
  return w.smem_bytes ? w.smem : nullptr;
}

void static_smem(void* array, size_t bytes) {
  Worker& w = in_kernel("static shared memory");
  auto it = std::find_if(w.static_arrays.begin(), w.static_arrays.end(), [&](const auto& a) { return a.at == array; });
  if (it != w.static_arrays.end() && it->block == w.block_serial) return;  // this block's already
  if (it == w.static_arrays.end()) it = w.static_arrays.insert(w.static_arrays.end(), {array, bytes, 0});
  it->block = w.block_serial;
  std::memset(array, 0xff, bytes);
  w.static_bytes += bytes;
  if (w.static_bytes > kDefaultDynamicSmem)
    throw ConfigError(std::to_string(w.static_bytes) + " bytes of static shared memory (the GPU allows 48 KiB; "
                      "use dynamic shared memory for more)");
  // Without the opt-in, static and dynamic together must fit the default 48 KiB.
  if (!w.smem_opted_in && w.static_bytes + w.smem_bytes > kDefaultDynamicSmem)
    throw ConfigError(std::to_string(w.static_bytes) + " bytes of static and " + std::to_string(w.smem_bytes) +
                      " of dynamic shared memory: past the 48 KiB a block gets without "
                      "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)");
  if (w.static_bytes + w.smem_bytes > device_smem_optin())
    throw ConfigError(std::to_string(w.static_bytes) + " bytes of static and " + std::to_string(w.smem_bytes) +
                      " of dynamic shared memory: past the " + std::to_string(device_smem_optin()) + " bytes a block " +
                      emulated_gpu().name + " allows");
}

bool set_max_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes > device_smem_optin()) return false;
  std::lock_guard<std::mutex> lock(g_smem_mu);
  g_smem_opt_in[kernel] = bytes;
  return true;
}

size_t kernel_smem_limit(const void* kernel) { return smem_limit(kernel); }

std::string host_pointer_arg(const char* kernel, size_t index, const void* p) {
  char at[32];
  std::snprintf(at, sizeof at, "%p", p);
  return std::string("emulated kernel '") + kernel + "': argument " + std::to_string(index + 1) + " (" + at +
         ") is host memory, not device memory from cudaMalloc or pinned memory from cudaMallocHost: a GPU "
         "faults on it (an illegal address)";
}

void check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  check_config(name, kernel, grid, block, smem_bytes);
  injection();  // a bad ULYSSES_EMU_FAULT is refused at the first launch, whichever stream runs late
}

void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
              const std::function<void()>& body) {
  if (t_worker.in_block)
    throw std::runtime_error(std::string("kernel '") + name + "' launched from inside a kernel");
  check_config(name, kernel, grid, block, smem_bytes);
  if (injected_here(name)) {
    note_device_fault(cudaErrorIllegalAddress);
    throw std::runtime_error(std::string("emulated kernel '") + name + "' faulted: injected (ULYSSES_EMU_FAULT)");
  }
  // Counted per kernel (and per launching thread: the same sequence on every run): one count for
  // all kernels gave a kernel at a fixed place in a fixed pair of launches (a partial sum, then its
  // one-block final; every step's sequence) the same order every time.
  static thread_local std::unordered_map<const void*, unsigned> launches;
  const unsigned flip = launches[kernel]++ & 1u;
  const long long gx = grid.x, gy = grid.y;
  const long long blocks = gx * gy * grid.z;
  bool opted_in = false;
  smem_limit(kernel, &opted_in);
  std::atomic<bool> failed{false}, config{false};
  std::string message;
#pragma omp parallel
  {
    Worker& w = t_worker;
    bool ready = true;
    try {
      w.reserve_stacks(int(block.x * block.y * block.z));
      w.reserve_smem(smem_bytes);
    } catch (const std::exception& e) {  // the emulator's own memory: out of resources, no fault
      ready = false;
#pragma omp critical(ul_emu_error)
      if (message.empty()) message = e.what();
      failed = true;
      config = true;
    }
    blockDim = block;
    gridDim = grid;
    w.n = int(block.x * block.y * block.z);
    w.smem_bytes = smem_bytes;
    w.smem_opted_in = opted_in;
    w.body = &body;
    w.in_block = true;
#pragma omp for schedule(dynamic, 1)
    for (long long i = 0; i < blocks; i++) {
      if (!ready || failed.load(std::memory_order_relaxed)) continue;
      // Blocks in the other order on alternate launches: a GPU orders none of them, so a block that
      // reads what a lower-numbered one wrote in the same launch must not always find it written.
      const long long b = flip ? blocks - 1 - i : i;
      const uint3 idx = {unsigned(b % gx), unsigned(b / gx % gy), unsigned(b / (gx * gy))};
      try {
        run_block(w, idx, flip);
      } catch (const ConfigError& e) {
        // A GPU refuses such a launch before any block runs: this is the launch's error, whatever
        // another block hit first.
#pragma omp critical(ul_emu_error)
        if (!config) {
          message = "block " + coord(idx) + ": " + e.what();
          config = true;
        }
        failed = true;
      } catch (const std::exception& e) {
#pragma omp critical(ul_emu_error)
        if (message.empty()) message = "block " + coord(idx) + ": " + e.what();
        failed = true;
      } catch (...) {
#pragma omp critical(ul_emu_error)
        if (message.empty()) message = "block " + coord(idx) + ": unknown exception";
        failed = true;
      }
    }
    w.in_block = false;
    w.body = nullptr;
    w.error = nullptr;
  }
  if (failed) {
    if (!config) note_device_fault(cudaErrorLaunchFailure);  // sticky, as a GPU's fault is
    throw std::runtime_error(std::string("emulated kernel '") + name + "' failed in " + message);
  }
}

void inject_fault(const char* kernel, long nth) {
  Injection& i = injection();
  std::lock_guard<std::mutex> lock(i.mu);
  i.kernel = kernel ? kernel : "";
  i.nth = nth;
  i.seen = 0;
}

}  // namespace ul_emu
