#include "parallel/wait_notice.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace ul {

namespace {
std::atomic<double> g_every{0};
}  // namespace

void set_wait_notice(double every_s) { g_every.store(every_s > 0 ? std::min(every_s, 1e7) : 0); }
double wait_notice() { return g_every.load(); }

void print_wait_notice(const char* what, double waited_s, const std::string& whom, double timeout_s) {
  std::printf("  ...   waiting %.1f s in %s for %s (--comm-timeout %g s)\n", waited_s, what, whom.c_str(), timeout_s);
  std::fflush(stdout);
}

}  // namespace ul
