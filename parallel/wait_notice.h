// A rank waiting in a collective for its peers says so: a wait for a slow or stuck peer (a rank's
// long save, a node's slow disk, a hang) would otherwise be silent until --comm-timeout ends it,
// 10 minutes by default. The lead rank (world rank 0) prints a line every `every_s` seconds of one
// wait, at most, in the heartbeat's form (train sets --heartbeat's period for a run that prints):
//   ...   waiting 30.0 s in all_reduce for rank(s) 3 (--comm-timeout 600 s)
#pragma once
#include <string>

namespace ul {

// 0 (the default): no line. Process-wide: set by the lead rank's process (MPI, NCCL) or thread
// (local; the communicator prints on world rank 0's thread only).
void set_wait_notice(double every_s);
double wait_notice();
// --heartbeat S as a notice period: 0 stays 0 (none); else at least 1 s (a heartbeat of 1e-9,
// which tests use to see every progress line, would print a line per loop of a wait).
inline double wait_notice_period(double heartbeat_s) {
  // (at most 1e7 s, as the deadlines: a period in nanoseconds past 9e9 s overflows into the past)
  return heartbeat_s > 0 ? (heartbeat_s < 1 ? 1 : heartbeat_s > 1e7 ? 1e7 : heartbeat_s) : 0;
}
// One line on stdout, flushed. whom: "rank(s) 3" or "the other ranks".
void print_wait_notice(const char* what, double waited_s, const std::string& whom, double timeout_s);

// Sets the period for its lifetime, then 0 again.
struct WaitNoticeScope {
  explicit WaitNoticeScope(double every_s) { set_wait_notice(every_s); }
  ~WaitNoticeScope() { set_wait_notice(0); }
  WaitNoticeScope(const WaitNoticeScope&) = delete;
  WaitNoticeScope& operator=(const WaitNoticeScope&) = delete;
};

}  // namespace ul
