#include "engine/stop_signal.h"

#include <unistd.h>

#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ul {

namespace {

std::atomic<int> g_signal{0};           // lock-free: safe to store from a handler
std::atomic<long long> g_first_ms{0};  // when the first came (CLOCK_MONOTONIC)
std::atomic<int> g_count{0};           // signals received (the test hold "save" waits for a second)
std::atomic<int> g_training{0};        // 0 during start-up: what the first signal's line says
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");
static_assert(std::atomic<long long>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
// A second SIGINT sooner than this after the first is the same Ctrl-C delivered twice. Read once as
// the handlers are installed (getenv is not safe in a handler): ULYSSES_TEST_REPEAT_MS, for tests.
std::atomic<long long> g_repeat_ms{2000};

void say(const char* text) {  // write(2) is async-signal-safe; printf is not
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

long long monotonic_ms() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void on_signal(int sig) {
  g_count.fetch_add(1);
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {
    g_first_ms.store(monotonic_ms());
    say("\ntrain: ");
    say(stop_signal_name(sig));  // a string literal: no allocation in a handler
    say(g_training.load() ? ": stopping after this step, or an eval before its next batch (a checkpoint is"
                            " saved with --save-dir); Ctrl-C again to stop now\n"
                          : ": stopping once start-up is done, before any step; Ctrl-C again to stop now\n");
    return;
  }
  // The first's time, or (a handler on another thread between its exchange and its store) now.
  const long long first = g_first_ms.load(), since = first ? monotonic_ms() - first : 0;
  // A later one. Only a person means "now": a SIGINT (Ctrl-C) two seconds or more after the first.
  // Schedulers and launchers send one signal twice (to the job and to each task, or forwarded by
  // mpirun), or SIGTERM at the time limit after an early SIGUSR1: ending then would lose the very
  // checkpoint the stop is for. Noted, and the save goes on.
  if (sig != SIGINT || since < g_repeat_ms.load()) {
    say("train: ");
    say(stop_signal_name(sig));
    say(" again: already stopping after this step (a Ctrl-C two seconds after the first stops now)\n");
    return;
  }
  std::signal(sig, SIG_DFL);  // the default action, now (the process ends by this signal)
  std::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* v = std::getenv("ULYSSES_TEST_REPEAT_MS")) g_repeat_ms.store(std::atoll(v));
  });
  // Each call installs them again (the same handler): once before MPI starts, so a signal during
  // its start-up is caught, and again after, in case it took one of them for itself.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  // While one of them is handled the others wait: the handler's first-signal bookkeeping is
  // not interrupted halfway by its own second call on this thread.
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaddset(&sa.sa_mask, sig);
  sa.sa_flags = SA_RESTART;  // a read or write the signal interrupts goes on
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return g_signal.load(); }

void started_training() { g_training.store(1); }

void test_hold(const std::string& point) {
  static const std::string points = [] {
    const char* v = std::getenv("ULYSSES_TEST_HOLD");
    return v ? "," + std::string(v) + "," : std::string();
  }();
  if (points.empty() || points.find("," + point + ",") == std::string::npos) return;
  // "save" made by a first signal waits for a second (which ends the process, or is noted and the
  // save goes on), a periodic save for a first; at most 60 s. The others return once a signal is
  // there. (A second signal already in counts: the test may send it before the save begins.)
  const int want = point == "save" && g_signal.load() ? 2 : 1;
  std::fprintf(stderr, "test hold | %s\n", point.c_str());
  std::fflush(stderr);
  for (int ms = 0; ms < 60000 && g_count.load() < want; ms++) ::usleep(1000);
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
