// Per-op GPU time: where a step's time goes on the device (train --profile-step N and
// bench_gpt2_step --profile print it).
//
// Off by default, and then an op pays one thread-local flag test. Between start() and report(),
// every kernel launched through ul::launch, every GEMM (cuda::gemm) and every device memset or
// copy of the CUDA DeviceOps is bracketed by two CUDA events on its stream; report() waits for the
// device and sums each name's elapsed times.
//
// What a row's time means: from the GPU reaching the op's first event to reaching its second. When
// the GPU is busy that is the op's execution; when the host cannot keep up, it also holds the
// host's time to submit the op (the GPU waits in between), so a host-bound step shows up as ops
// whose times add up to the step's wall time rather than to the kernels' own time. Recording the
// events costs host time too: time a step without profiling for its wall time.
//
// Each host thread records its own ops: start(), stop() and report() act on the calling thread's
// record, so each rank of the local communicator (a thread) profiles its own step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cuda_runtime.h"

namespace ul {
namespace gpu_profile {

bool enabled();
// Starts recording, dropping whatever was recorded before.
void start();
// Stops recording; what was recorded stays for report().
void stop();

struct Row {
  std::string name;  // the kernel's launch name; a GEMM's op and shape
  long calls = 0;
  double ms = 0;     // summed over the calls
  double flops = 0;  // summed over the calls; 0 where the op does not say (everything but GEMMs)
};
// Waits for the device, then returns one row per name, the longest total time first, and drops the
// records (recording goes on if it was on).
std::vector<Row> report();

// The rows as a table: a header with the step's wall time and the ops' total, then one line per row
// (ms, % of the ops' total, calls, TFLOP/s where the row has FLOPs, name).
std::string table(const std::vector<Row>& rows, double wall_ms);

// Brackets one op: begin() records the first event (only call it when enabled()), the destructor
// the second, so an op that throws is still closed. A span begun inside another on the same thread
// (the bias kernel a GEMM launches when cuBLASLt's epilogue cannot add it) records nothing: its time
// is the outer op's, and counting it twice would make the table add up to more than the ops took.
class Span {
 public:
  Span() = default;
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  ~Span();
  void begin(std::string name, cudaStream_t stream, double flops = 0);

 private:
  static constexpr size_t kNone = ~size_t(0);
  size_t record_ = kNone;    // index into the recorder's list; kNone when not begun or nested
  bool open_ = false;        // begun: counted among the thread's open spans
  uint64_t generation_ = 0;  // the list's generation at begin(): a report() since then dropped it
  cudaStream_t stream_ = nullptr;
};

}  // namespace gpu_profile
}  // namespace ul
