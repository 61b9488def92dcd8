// The emulated CUDA runtime: "device" memory is host memory; every call is synchronous except the
// work of the stream that runs late (see ul_emu::StreamOrder in runtime.h, and CUstream_st).
#include "engine/cuda_emu/runtime.h"

#include "engine/cuda_emu/gpu_models.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

ul_emu::StreamOrder order_from_env() {
  const char* v = std::getenv("ULYSSES_EMU_STREAMS");
  if (!v || !*v || std::string(v) == "late-side") return ul_emu::StreamOrder::late_side;
  if (std::string(v) == "late-main") return ul_emu::StreamOrder::late_main;
  throw std::runtime_error(std::string("ULYSSES_EMU_STREAMS=") + v +
                           ": not a stream order (late-side, the default, or late-main)");
}

std::atomic<ul_emu::StreamOrder>& order_now() {
  static std::atomic<ul_emu::StreamOrder> o{order_from_env()};
  return o;
}

}  // namespace

// A stream that runs late queues its work: it runs only when the program makes it observable (an
// event on that stream synchronized or waited on, the stream synchronized, the device
// synchronized, a blocking copy on it, memory freed). Which streams run late is the StreamOrder's
// choice, made at each call. A stream belongs to the thread that made it (each rank of the local
// communicator is a thread with its own streams, and its own legacy stream: legacy_stream).
struct CUstream_st {
  bool legacy = false;  // the legacy stream, or a blocking stream (which shares the legacy one's queue)
  struct Op {
    std::function<void()> run;
    bool waits_on_peers = false;  // ul_emu::on_stream_polled: a poll runs it beside the host thread
    std::future<void> running;    // so started, and not yet collected
  };
  std::deque<Op> queue;
  uint64_t issued = 0, done = 0;
  std::thread::id owner = std::this_thread::get_id();
  uint64_t id = next_id();  // an ended thread's legacy stream may leave its address to a new one

  static uint64_t next_id() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }

  bool late() const {
    return (ul_emu::stream_order() == ul_emu::StreamOrder::late_main) == legacy;
  }
  // Runs the queue up to its n-th operation. Queued work that fails (a kernel's misuse or fault) is
  // reported as a GPU reports an asynchronous error: the call that finds it returns the fault's code
  // (an error code, so a destructor that frees memory does not throw), the message goes to stderr,
  // and the work queued after it is dropped. A poll (cudaStreamQuery) starts work that waits on
  // other processes on a thread of its own, as a GPU runs it beside the host, and answers
  // cudaErrorNotReady until it has ended; any other call waits for it.
  cudaError_t run_until(uint64_t n, bool poll = false) {
    while (done < n && !queue.empty()) {
      try {
        Op& front = queue.front();
        if (front.waits_on_peers && poll) {
          if (!front.running.valid()) front.running = std::async(std::launch::async, front.run);
          if (front.running.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return cudaErrorNotReady;
        }
        Op op = std::move(front);
        queue.pop_front();
        done++;
        op.running.valid() ? op.running.get() : op.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "cuda_emu: queued work failed: %s\n", e.what());
        done += queue.size();
        queue.clear();
        // A kernel's fault says which (an injected one: an illegal address); other work's failure
        // (an emulated NCCL collective's) is a launch failure.
        const cudaError_t fault = ul_emu::device_fault();
        return fault != cudaSuccess ? fault : cudaErrorLaunchFailure;
      }
    }
    return cudaSuccess;
  }
  cudaError_t run_all() { return run_until(issued); }
};
struct CUevent_st {
  // When the work before its record had run: set at the record on a stream that runs at issue, by
  // a queued stamp on one that runs late (so --profile times the work, not its issue). Shared with
  // that stamp, which may run after the event is re-recorded or destroyed.
  struct Stamp {
    std::chrono::steady_clock::time_point t;
    bool done = false;
  };
  std::shared_ptr<Stamp> stamp;
  bool timing = true;  // false: created with cudaEventDisableTiming
  bool recorded = false;
  cudaStream_t stream = nullptr;  // the late stream it was recorded on, and how much of it it covers
  uint64_t stream_id = 0, upto = 0;
};

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;
thread_local cudaError_t t_fault = cudaSuccess;  // the sticky fault of this thread's device (runtime.h)

// Like the real runtime: a failing call returns its error and also leaves it for cudaGetLastError.
cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}
// Every call below that touches the device starts with this: after a kernel's fault it fails.
#define UL_EMU_STICKY() \
  if (t_fault != cudaSuccess) return fail(t_fault)
// A call's result when all it did was run queued work: success, or that work's failure.
cudaError_t report(cudaError_t e) { return e == cudaSuccess ? e : fail(e); }

// Every live stream (made by cudaStreamCreate*, or a thread's legacy stream): a thread drains its
// own on cudaDeviceSynchronize and before a free, and an event whose stream is gone (destroyed, or
// its thread ended) covers nothing left to run.
// Never destroyed, as the mappings below: a static destructor may still free device memory at exit.
struct Streams {
  std::mutex mu;
  std::map<cudaStream_t, uint64_t> live;  // -> the stream's id
};
Streams& streams() {
  static Streams* s = new Streams;
  return *s;
}

void track(cudaStream_t s, bool live) {
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mu);
  if (live) ss.live[s] = s->id;
  else ss.live.erase(s);
}

bool alive(cudaStream_t s, uint64_t id) {
  Streams& ss = streams();
  std::lock_guard<std::mutex> lock(ss.mu);
  const auto it = ss.live.find(s);
  return it != ss.live.end() && it->second == id;
}

// The calling thread's legacy stream (nullptr); a blocking stream runs in its queue too, so two
// blocking streams are ordered with each other here, which on a GPU they are not. On a GPU the
// legacy stream is the device's, shared by every host thread; here each thread (each rank of the
// local communicator, as if it had a GPU of its own) has one, run on that thread. Work a thread
// leaves queued when it ends would still run on a GPU and cannot here (the executor's thread state
// may be gone): the emulator stops the program, rather than give other results than a GPU would.
struct LegacyStream {
  CUstream_st s;
  LegacyStream() {
    s.legacy = true;
    track(&s, true);
  }
  ~LegacyStream() {
    track(&s, false);
    // After a kernel's fault a GPU abandons the work left pending (the device is in error for good).
    if (s.queue.empty() || ul_emu::device_fault() != cudaSuccess) return;
    std::fprintf(stderr, "cuda_emu: a thread ended with %zu operation(s) queued on its legacy stream, never "
                 "awaited (synchronize before a thread ends)\n", s.queue.size());
    std::abort();
  }
};
CUstream_st& legacy_stream() {
  thread_local LegacyStream l;
  return l.s;
}
cudaStream_t resolve(cudaStream_t s) { return !s || s->legacy ? &legacy_stream() : s; }

// The work an event covers, when its stream still lives.
cudaError_t run_event(cudaEvent_t e) {
  return e->stream && alive(e->stream, e->stream_id) ? e->stream->run_until(e->upto) : cudaSuccess;
}

// Runs the calling thread's streams (its legacy stream included, once it has one); the first
// failure found.
cudaError_t drain_this_thread() {
  std::vector<cudaStream_t> mine;
  {
    Streams& ss = streams();
    std::lock_guard<std::mutex> lock(ss.mu);
    for (const auto& live : ss.live)
      if (live.first->owner == std::this_thread::get_id()) mine.push_back(live.first);
  }
  cudaError_t first = cudaSuccess;
  for (cudaStream_t s : mine) {
    const cudaError_t e = s->run_all();
    if (first == cudaSuccess) first = e;
  }
  return first;
}

// Pinned host memory (cudaMallocHost): an async copy to or from it reads and writes it when the copy
// runs. Pageable memory is read at issue (the runtime stages it); an async copy into it is done
// when the call returns (the documentation says such a copy "might be synchronous": the emulator
// takes that choice, so a program that counts on it passes here).
std::mutex g_pinned_mu;
std::map<const char*, size_t> g_pinned;  // start -> bytes

// Whether p falls in one of the ranges keyed by their start; bytes(value) is a range's length.
template <class V, class Bytes>
bool in_ranges(const std::map<const char*, V>& ranges, const void* p, Bytes bytes) {
  const char* c = static_cast<const char*>(p);
  auto it = ranges.upper_bound(c);
  if (it == ranges.begin()) return false;
  --it;
  return c < it->first + bytes(it->second);
}

bool is_pinned(const void* p) {
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  return in_ranges(g_pinned, p, [](size_t n) { return n; });
}

bool valid_kind(cudaMemcpyKind k) { return k >= cudaMemcpyHostToHost && k <= cudaMemcpyDefault; }

// Device allocations: each is its own mapping and ends right before a PROT_NONE page, so a kernel
// that reads or writes past the end of a buffer (by more than the buffer's rounding up to 256
// bytes) faults at that access, where on a GPU it would read or corrupt a neighbouring buffer
// without a word. Keyed by the pointer cudaMalloc returned, in order: is_device finds the buffer
// a pointer falls in.
struct Mapping {
  char* base;
  size_t len;
  size_t bytes, rounded;  // asked for; with the rounding up to 256 (poisoned, checked at the free)
};
struct Mappings {
  std::mutex mu;
  std::map<const char*, Mapping> by_ptr;
  size_t held = 0;  // bytes cudaMalloc was asked for and not yet freed
};
// Never destroyed: static destructors elsewhere may still free device memory at exit.
Mappings& mappings() {
  static Mappings* m = new Mappings;
  return *m;
}

bool is_device(const void* p) {
  Mappings& ms = mappings();
  std::lock_guard<std::mutex> lock(ms.mu);
  return in_ranges(ms.by_ptr, p, [](const Mapping& m) { return m.rounded; });
}

// ULYSSES_EMU_HOST_GUARD=1 (or ul_emu::set_host_guard): device memory is PROT_NONE except while
// device work runs (a kernel, a copy, a memset, a collective; any thread's, so ranks of the local
// communicator open it for each other, which can hide an access but never fault a legal one). Host
// code that dereferences a device pointer then faults here, as on a GPU, where that address is not
// the host's: read through cudaMemcpy instead. Off by default: every toggle is an mprotect of every
// buffer (CI runs one emu pass with it).
// An emulator switch from the environment: set, and not "0".
bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

std::atomic<bool>& host_guard_flag() {
  static std::atomic<bool> on{env_switch("ULYSSES_EMU_HOST_GUARD")};
  return on;
}
bool host_guard() { return host_guard_flag().load(std::memory_order_relaxed); }

void on_host_fault(int sig, siginfo_t* info, void*) {
  char msg[200];
  const int n = std::snprintf(msg, sizeof msg,
                              "cuda_emu: segmentation fault at %p; under the host guard (ULYSSES_EMU_HOST_GUARD) that "
                              "is often host code reading or writing device memory\n", info->si_addr);
  if (n > 0) (void)!write(2, msg, size_t(n));
  signal(sig, SIG_DFL);  // the access faults again, now to the default action (a core, a debugger stop)
}

void note_host_faults() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_host_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, nullptr) == 0;
  }();
  (void)installed;
}

// How many device operations run now; its mutex orders the guard's toggles with new buffers.
struct DeviceAccess {
  std::mutex mu;
  int running = 0;
};
DeviceAccess& device_access() {
  static DeviceAccess* a = new DeviceAccess;
  return *a;
}

void protect_device(int prot) {  // with device_access().mu held
  Mappings& ms = mappings();
  std::lock_guard<std::mutex> lock(ms.mu);
  for (const auto& [q, m] : ms.by_ptr) mprotect(m.base, m.len - size_t(sysconf(_SC_PAGESIZE)), prot);
}

// Device memory is open while one lives (anywhere in the process). Counted with the guard off too,
// so that the guard can be turned on between two operations.
class DeviceWork {
 public:
  DeviceWork() {
    DeviceAccess& a = device_access();
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.running++ == 0 && host_guard()) protect_device(PROT_READ | PROT_WRITE);
  }
  ~DeviceWork() {
    DeviceAccess& a = device_access();
    std::lock_guard<std::mutex> lock(a.mu);
    if (--a.running == 0 && host_guard()) protect_device(PROT_NONE);
  }
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
};

}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  UL_EMU_STICKY();
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
  // nothing wrote poisons its result instead of silently reading zeros. The slack around it too
  // (the page's head before it, the rounding past its end): a read just outside a buffer reads NaN
  // (on a GPU, a neighbour's data), and a write there is caught when the buffer is freed.
  std::memset(base, 0xff, data);
  {
    // The host guard: closed as the others are, unless device work runs now.
    std::lock_guard<std::mutex> guard(device_access().mu);
    if (host_guard()) {
      note_host_faults();
      if (device_access().running == 0) mprotect(base, data, PROT_NONE);
    }
    Mappings& ms = mappings();
    std::lock_guard<std::mutex> lock(ms.mu);
    ms.by_ptr[q] = {base, data + page, bytes, rounded};
    ms.held += bytes;
  }
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  UL_EMU_STICKY();
  const cudaError_t queued = drain_this_thread();  // cudaFree synchronizes the device
  if (queued != cudaSuccess) return fail(queued);  // the memory stays: the device is in error
  if (!p) return cudaSuccess;
  Mapping m;
  {
    Mappings& ms = mappings();
    std::lock_guard<std::mutex> lock(ms.mu);
    const auto it = ms.by_ptr.find(static_cast<const char*>(p));
    if (it == ms.by_ptr.end()) return fail(cudaErrorInvalidValue);  // not from cudaMalloc, or freed twice
    m = it->second;
    ms.by_ptr.erase(it);
    ms.held -= m.bytes;
  }
  mprotect(m.base, m.len - size_t(sysconf(_SC_PAGESIZE)), PROT_READ);  // the host guard's: no longer listed, ours alone
  // The poisoned slack on either side as cudaMalloc left it: a write there (an index past the end,
  // or a negative one) would on a GPU corrupt a neighbouring buffer without a word.
  auto check_slack = [&](const char* from, size_t n, const char* side) {
    for (size_t i = 0; i < n; i++)
      if (static_cast<unsigned char>(from[i]) != 0xff) {
        std::fprintf(stderr, "cuda_emu: something wrote into the %zu byte(s) %s a %zu-byte cudaMalloc buffer\n", n,
                     side, m.bytes);
        std::abort();
      }
  };
  check_slack(static_cast<const char*>(p) + m.bytes, m.rounded - m.bytes, "past the end of");
  check_slack(m.base, size_t(static_cast<const char*>(p) - m.base), "before the start of");
  munmap(m.base, m.len);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  UL_EMU_STICKY();
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!*p) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  g_pinned[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  UL_EMU_STICKY();
  const cudaError_t queued = drain_this_thread();
  if (queued != cudaSuccess) return fail(queued);
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(static_cast<const char*>(p));
  }
  std::free(p);
  return cudaSuccess;
}

namespace {

// Which side of a copy is device memory: by its kind, or for cudaMemcpyDefault by the pointer.
struct Sides {
  bool dst_device, src_device;
};
Sides sides(const void* dst, const void* src, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault) return {is_device(dst), is_device(src)};
  return {kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice,
          kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice};
}

// A copy whose kind the pointers contradict (a host buffer given as the device side, or device
// memory as the host side): undefined on a GPU, which may fault or copy the wrong way; here an
// error, as the real runtime reports for what it can tell (cudaErrorInvalidValue).
bool kind_contradicted(const void* dst, const void* src, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault) return false;
  const Sides d = sides(dst, src, kind);
  auto wrong = [](const void* p, bool device_side) {
    return device_side ? !ul_emu::device_reachable(p) : is_device(p);
  };
  return wrong(dst, d.dst_device) || wrong(src, d.src_device);
}

// Queues a copy on r whose source is read now (staged) when it is pageable host memory, and when
// the copy runs otherwise, as a GPU's DMA reads it.
void queue_copy(cudaStream_t r, void* dst, const void* src, size_t bytes, bool stage) {
  if (!stage) {
    ul_emu::on_stream(r, [=] { std::memmove(dst, src, bytes); });
    return;
  }
  const char* from = static_cast<const char*>(src);
  auto staged = std::make_shared<std::vector<char>>(from, from + bytes);
  ul_emu::on_stream(r, [=] { std::memcpy(dst, staged->data(), bytes); });
}

}  // namespace

// On the legacy stream, as the real runtime has it: a copy between device buffers returns at once;
// one from pageable host memory to the device returns once the source is staged (after what the
// stream has queued), and lands later; any other is done when the call returns. "Later" is when
// the legacy stream runs late.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  UL_EMU_STICKY();
  if (!valid_kind(kind)) return fail(cudaErrorInvalidValue);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || kind_contradicted(dst, src, kind)) return fail(cudaErrorInvalidValue);
  const Sides d = sides(dst, src, kind);
  if (d.dst_device && d.src_device) {
    queue_copy(nullptr, dst, src, bytes, false);
    return cudaSuccess;
  }
  if (const cudaError_t queued = legacy_stream().run_all()) return fail(queued);
  if (d.dst_device && !is_pinned(src)) {
    queue_copy(nullptr, dst, src, bytes, true);
    return cudaSuccess;
  }
  DeviceWork copy;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  UL_EMU_STICKY();
  if (!valid_kind(kind)) return fail(cudaErrorInvalidValue);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || kind_contradicted(dst, src, kind)) return fail(cudaErrorInvalidValue);
  const cudaStream_t r = resolve(s);
  if (!r->late()) {
    DeviceWork copy;
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  const Sides d = sides(dst, src, kind);
  // Host to host is synchronous; so is a copy into pageable memory (see g_pinned).
  if (!d.dst_device && (!d.src_device || !is_pinned(dst))) {
    if (const cudaError_t queued = r->run_all()) return fail(queued);
    DeviceWork copy;
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  queue_copy(r, dst, src, bytes, !d.src_device && !is_pinned(src));
  return cudaSuccess;
}

// Returns at once on device memory, as the real call does (queued when the legacy stream runs late).
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  UL_EMU_STICKY();
  if (bytes == 0) return cudaSuccess;
  if (!p || !ul_emu::device_reachable(p)) return fail(cudaErrorInvalidValue);  // (pageable host memory: refused)
  if (is_device(p)) {
    ul_emu::on_stream(nullptr, [=] { std::memset(p, value, bytes); });
    return cudaSuccess;
  }
  if (const cudaError_t queued = legacy_stream().run_all()) return fail(queued);
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  UL_EMU_STICKY();
  if (bytes == 0) return cudaSuccess;
  if (!p || !ul_emu::device_reachable(p)) return fail(cudaErrorInvalidValue);
  ul_emu::on_stream(s, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  UL_EMU_STICKY();
  if (!s) return fail(cudaErrorInvalidValue);
  *s = new CUstream_st;
  (*s)->legacy = (flags & cudaStreamNonBlocking) == 0;
  track(*s, true);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  UL_EMU_STICKY();
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t queued = resolve(s)->run_all();  // the real call lets queued work finish too
  track(s, false);
  delete s;
  return report(queued);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  UL_EMU_STICKY();
  return report(resolve(s)->run_all());
}

// Runs what is queued, up to work that waits on other processes (an emulated NCCL collective
// whose peers have not all come): cudaErrorNotReady. CUDA does not document whether that answer
// is also left for cudaGetLastError (other stacks clear it after a poll, as if it were): it is
// here, the stricter reading, so that a poller that leaves it behind fails its next launch in CI
// (ul::launch checks cudaGetLastError here as after <<<>>>), not only on some GPU.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  UL_EMU_STICKY();
  return report(resolve(s)->run_until(resolve(s)->issued, true));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return fail(cudaErrorInvalidValue);
  a->type = is_device(p) ? cudaMemoryTypeDevice : is_pinned(p) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->device = a->type == cudaMemoryTypeUnregistered ? -2 : 0;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  UL_EMU_STICKY();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  // Whatever waits, the work the event covers must be done before the waiter's next operation:
  // running it now is a legal order, whichever of the two streams runs late.
  return report(run_event(e));
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  UL_EMU_STICKY();
  if (!e) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  UL_EMU_STICKY();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  UL_EMU_STICKY();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  const cudaStream_t r = resolve(s);
  auto stamp = std::make_shared<CUevent_st::Stamp>();
  e->stamp = stamp;
  ul_emu::on_stream(r, [stamp] {
    stamp->t = std::chrono::steady_clock::now();
    stamp->done = true;
  });
  e->recorded = true;
  e->stream = r->late() ? r : nullptr;
  e->stream_id = r->id;
  e->upto = r->issued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  UL_EMU_STICKY();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  return report(run_event(e));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  UL_EMU_STICKY();
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (!start->timing || !end->timing) return fail(cudaErrorInvalidResourceHandle);
  // As on a GPU: an event whose work has not run yet has no time.
  if (!start->stamp->done || !end->stamp->done) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->stamp->t - start->stamp->t).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  UL_EMU_STICKY();
  return report(drain_this_thread());
}

cudaError_t cudaGetLastError() {
  if (t_fault != cudaSuccess) return t_fault;  // sticky: not reset
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_fault != cudaSuccess ? t_fault : t_last_error; }

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
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorHardwareStackError: return "hardware stack error";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorInvalidAddressSpace: return "operation not supported on global/shared address space";
    case cudaErrorInvalidPc: return "invalid program counter";
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
  UL_EMU_STICKY();
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
  UL_EMU_STICKY();
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
  UL_EMU_STICKY();
  if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      !ul_emu::set_max_dynamic_smem(func, size_t(value)))
    return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

namespace ul_emu {

StreamOrder stream_order() { return order_now().load(std::memory_order_relaxed); }

void set_host_guard(bool on) {
  if (on) note_host_faults();
  DeviceAccess& a = device_access();
  std::lock_guard<std::mutex> lock(a.mu);
  host_guard_flag().store(on, std::memory_order_relaxed);
  if (a.running == 0) protect_device(on ? PROT_NONE : PROT_READ | PROT_WRITE);
}

bool host_guard_on() { return host_guard(); }

cudaError_t device_fault() { return t_fault; }
namespace {
std::atomic<bool>& approx_math_flag() {
  static std::atomic<bool> on{env_switch("ULYSSES_EMU_APPROX_MATH")};
  return on;
}
}  // namespace
bool approx_math() { return approx_math_flag().load(std::memory_order_relaxed); }
void set_approx_math(bool on) { approx_math_flag().store(on, std::memory_order_relaxed); }
bool device_reachable(const void* p) { return is_device(p) || is_pinned(p); }
void note_device_fault(cudaError_t e) {
  if (t_fault == cudaSuccess) t_fault = e;  // the first fault is the one every call reports
}
void clear_device_fault() {
  t_fault = cudaSuccess;
  t_last_error = cudaSuccess;
}

cudaError_t set_stream_order(StreamOrder order) {
  const cudaError_t queued = drain_this_thread();
  order_now().store(order, std::memory_order_relaxed);
  return report(queued);
}

namespace {
void run_or_queue(cudaStream_t s, std::function<void()> work, bool waits_on_peers) {
  std::function<void()> op = [work = std::move(work)] {
    DeviceWork open;  // ULYSSES_EMU_HOST_GUARD
    work();
  };
  const cudaStream_t r = resolve(s);
  if (!r->late()) {
    op();
    return;
  }
  r->queue.push_back({std::move(op), waits_on_peers, {}});
  r->issued++;
}
}  // namespace

void on_stream(cudaStream_t s, std::function<void()> op) { run_or_queue(s, std::move(op), false); }
void on_stream_polled(cudaStream_t s, std::function<void()> op) { run_or_queue(s, std::move(op), true); }

}  // namespace ul_emu
