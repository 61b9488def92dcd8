#include "engine/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ul {

namespace {

std::atomic<int> g_signal{0};  // lock-free: safe to store from a handler
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};

void say(const char* text) {  // write(2) is async-signal-safe; printf is not
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    say("\ntrain: ");
    say(stop_signal_name(sig));  // a string literal: no allocation in a handler
    say(": stopping after this step (a checkpoint is saved with --save-dir); again to stop now\n");
    return;
  }
  // The second: the default action, now (the process ends by this signal).
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a read or write the signal interrupts goes on
    for (int sig : kSignals) sigaction(sig, &sa, nullptr);
  });
}

int stop_signal() { return g_signal.load(); }

void clear_stop_signal() { g_signal.store(0); }

void test_hold(const std::string& point) {
  static const std::string points = [] {
    const char* v = std::getenv("ULYSSES_TEST_HOLD");
    return v ? "," + std::string(v) + "," : std::string();
  }();
  if (points.empty() || points.find("," + point + ",") == std::string::npos) return;
  // "save" is reached because of a first signal: it waits out its 60 s, or the second one, which
  // ends the process. The others return once a signal is there.
  for (int ms = 0; ms < 60000 && (point == "save" || !stop_signal()); ms++) ::usleep(1000);
}

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
  }
  return "a signal";
}

}  // namespace ul
