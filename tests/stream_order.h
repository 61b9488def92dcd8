// The emulator's stream order for a test's scope (engine/cuda_emu/runtime.h: StreamOrder). Set it
// from the test's thread while no other thread issues device work; the ranks the test then starts
// follow it.
#pragma once
#include "engine/cuda_runtime.h"

namespace ul_test {

#if ULYSSES_CUDA_EMULATED

struct StreamOrderScope {
  ul_emu::StreamOrder before;
  // A failure in work queued before a switch is left for cudaGetLastError (and printed).
  explicit StreamOrderScope(ul_emu::StreamOrder o) : before(ul_emu::stream_order()) { ul_emu::set_stream_order(o); }
  ~StreamOrderScope() { ul_emu::set_stream_order(before); }
  StreamOrderScope(const StreamOrderScope&) = delete;
  StreamOrderScope& operator=(const StreamOrderScope&) = delete;
};

// The emulator's host guard (runtime.h: set_host_guard) for a test's scope: off for a test of the
// emulator itself that looks into device memory from the host on purpose.
struct HostGuardScope {
  bool before;
  explicit HostGuardScope(bool on) : before(ul_emu::host_guard_on()) { ul_emu::set_host_guard(on); }
  ~HostGuardScope() { ul_emu::set_host_guard(before); }
  HostGuardScope(const HostGuardScope&) = delete;
  HostGuardScope& operator=(const HostGuardScope&) = delete;
};
#endif

// f(name) once per order the device may take: on the emulator each StreamOrder (so a missing wait
// between streams shows in one of them), on a GPU its own.
template <class F>
void in_each_stream_order(F&& f) {
#if ULYSSES_CUDA_EMULATED
  for (ul_emu::StreamOrder o : {ul_emu::StreamOrder::late_side, ul_emu::StreamOrder::late_main}) {
    StreamOrderScope scope(o);
    f(o == ul_emu::StreamOrder::late_main ? "late-main" : "late-side");
  }
#else
  f("the GPU's");
#endif
}

}  // namespace ul_test
