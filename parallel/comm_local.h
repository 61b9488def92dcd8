// The local communicator: P ranks are P threads of this process, so a collective is a rendezvous
// in shared memory (for tests, and for trying sequence parallelism on one machine).
// Each rank calls its collectives on its own Comm from its own thread. Buffers are host memory:
// the cpu device, or the emulated CUDA device (whose device memory is host memory).
#pragma once
#include <functional>

#include "parallel/communicator.h"

namespace ul {

struct LocalOptions {
  Device device = Device::cpu;  // the device the ranks' buffers are on (must be host memory)
  double timeout_s = 60;        // a rank waiting longer than this in one collective throws CommError
  // Where set: called (on the calling thread) when a rank is still running abandon_after_s after
  // another failed, with a message naming both; it should end the process (train: the error, then
  // _Exit), since a thread cannot be stopped. If it returns, run_local joins as without it.
  std::function<void(const std::string&)> abandon;
  double abandon_after_s = 60;
};

// Runs body(comm) on n threads, rank r on thread r, and joins them.
// If a body throws, every rank blocked in (or later entering) a collective of any communicator
// split from this world throws CommError("rank R failed: <what> ..."); so does a rank whose peer
// returned from body without joining the collective, or whose peers called a different collective.
// After the join, the first exception thrown (the original failure, not the CommErrors it caused)
// is rethrown.
void run_local(int n, const std::function<void(Comm&)>& body, const LocalOptions& opt = {});

}  // namespace ul
