#include "engine/stop_signal.h"

#include <fcntl.h>
#include <unistd.h>

#include <time.h>

#include <atomic>
#include <cerrno>
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
std::atomic<int> g_sigterms{0};        // SIGTERMs received (sigterms_so_far)
std::atomic<bool> g_multi_process{false};  // in_multi_process_job()
std::atomic<bool> g_silent{false};         // in_multi_process_job(false): a rank other than 0 says nothing
std::atomic<int> g_phase{0};  // what the first signal's line says: 0 start-up, 1 training, 2 final, 3 outputs
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");
static_assert(std::atomic<long long>::is_always_lock_free, "a signal handler may only touch lock-free atomics");
static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

// SIGHUP: the terminal closed (an ssh session lost). SIGPIPE: the reader of train's output is gone
// (`train | tee log` after Ctrl-C reached tee first, `train | head`): by default it ended the run
// at its next line, before the save the stop was for.
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGPIPE};
// SIGINT, SIGHUP and SIGPIPE that the parent set to be ignored stay ignored: a shell starts a
// background job with SIGINT ignored (a Ctrl-C meant for the script), nohup ignores SIGHUP, and
// Python's os.system and os.popen and systemd's services start with SIGPIPE ignored (a write to a
// closed pipe then fails, and the run goes on, as it did). Read at the first install (a later one would
// see this file's handler).
bool g_left_ignored[NSIG] = {};
// A second SIGINT sooner than this after the first is the same Ctrl-C delivered twice. Read once as
// the handlers are installed (getenv is not safe in a handler): ULYSSES_TEST_REPEAT_MS, for tests.
std::atomic<long long> g_repeat_ms{2000};

void say(const char* text) {  // write(2) is async-signal-safe; printf is not
  if (g_silent.load()) return;
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

long long monotonic_ms() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Handlers on two threads at once (a SIGPIPE goes to the thread that wrote, a Ctrl-C to any) take
// turns: their lines are not interleaved, and the bookkeeping below is one handler's at a time. A
// spin, not a lock: the holder is another thread's handler, which these signals cannot interrupt
// (atomic_flag is lock-free by the standard).
std::atomic_flag g_in_handler = ATOMIC_FLAG_INIT;

void on_signal_locked(int sig) {
  // The phase as the signal came, read before g_signal is set: the main thread, seeing the stop,
  // may move on to the outputs (started_outputs) while this handler runs on another thread, and
  // the line would promise what that phase does instead.
  const int phase = g_phase.load();
  const int had = g_signal.load();
  // The first, or the first from a person or a scheduler after a SIGPIPE: `train | tee` under
  // Ctrl-C gets both in either order, and the stop (its record, the exit status) is the Ctrl-C's.
  if (had == 0 || (had == SIGPIPE && sig != SIGPIPE)) {
    g_signal.store(sig);
    g_first_ms.store(monotonic_ms());  // (a Ctrl-C's repeat window starts at the Ctrl-C)
    say("\ntrain: ");
    say(stop_signal_name(sig));  // a string literal: no allocation in a handler
    if (sig == SIGPIPE) say(" (a write to a closed pipe or socket: the reader of train's output is gone?)");
    say(phase == 1   ? ": stopping after this step, or an eval before its next batch (a checkpoint is"
                       " saved with --save-dir)"
        : phase == 2 ? ": stopping before the final eval's next batch, or after the length probe in flight (the"
                       " rest, the exports and the sample are skipped)"
        : phase == 3 ? ": the run is ending: what it writes now (plots, exports, the sample) finishes first, then it stops"
                     : ": stopping once start-up is done, before any step");
    // (where SIGINT is left ignored, a Ctrl-C cannot end it: then SIGKILL is the way)
    if (!g_multi_process.load()) {
      say(g_left_ignored[SIGINT] ? "; SIGKILL to stop now" : "; Ctrl-C again to stop now");
    } else {
      // A launcher turns a Ctrl-C into a SIGTERM to every process and kills them soon after (Open
      // MPI 4.1's mpirun: SIGKILL 2 s later, before most saves); it forwards SIGUSR1 alone.
      if (sig == SIGTERM)
        say(" (a launcher also sends SIGTERM to end the job when another process failed: then that process's "
            "error says why)");
      say("; a launcher may kill the job soon after a SIGTERM or a Ctrl-C: to stop under mpirun and save, send it "
          "SIGUSR1");
    }
    say("\n");
    return;
  }
  // A SIGPIPE again is the next line to the same closed pipe (this handler's own, when stderr is
  // that pipe too): saying so would raise another.
  if (sig == SIGPIPE) return;
  const long long first = g_first_ms.load(), since = first ? monotonic_ms() - first : 0;
  // A later one. Only a person means "now": a SIGINT (Ctrl-C) two seconds or more after the first.
  // Schedulers and launchers send one signal twice (to the job and to each task, or forwarded by
  // mpirun), or SIGTERM at the time limit after an early SIGUSR1: ending then would lose the very
  // checkpoint the stop is for. Noted, and the save goes on.
  if (sig != SIGINT || since < g_repeat_ms.load()) {
    say("train: ");
    say(stop_signal_name(sig));
    say(phase == 1   ? " again: already stopping after this step"
        : phase == 0 ? " again: already stopping once start-up is done"
                     : " again: already stopping, as said above");
    // (under a launcher a Ctrl-C reaches the ranks as SIGTERM, which is noted here too)
    say(g_multi_process.load() ? "\n" : " (a Ctrl-C two seconds after the first stops now)\n");
    return;
  }
  std::signal(sig, SIG_DFL);  // the default action, now (the process ends by this signal)
  std::raise(sig);            // (pending until the handler returns: it is in the handler's mask)
}

void on_signal(int sig) {
  const int saved_errno = errno;  // a handler must leave errno as the interrupted code had it
  while (g_in_handler.test_and_set(std::memory_order_acquire)) {
  }
  on_signal_locked(sig);
  if (sig == SIGTERM) g_sigterms.fetch_add(1);
  // Counted once its line is written: a test hold (test_hold) waiting for it then finds the line
  // out before the run moves on.
  g_count.fetch_add(1);
  g_in_handler.clear(std::memory_order_release);
  errno = saved_errno;
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
  static std::once_flag ignored_once;
  std::call_once(ignored_once, [] {
    for (int sig : {SIGINT, SIGHUP, SIGPIPE}) {
      struct sigaction now {};
      g_left_ignored[sig] = sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN;
    }
  });
  for (int sig : kSignals)
    if (!g_left_ignored[sig]) sigaction(sig, &sa, nullptr);
}

void guard_process() {
  // A descriptor 0-2 closed by the caller (`train >&-`) would be the first file train opens, and
  // its step lines would be written into the run log or a checkpoint's files.
  for (int fd = 0; fd <= 2; fd++)
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      const int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) {  // open takes the lowest free number: fd itself
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  // A file-size limit (ulimit -f) reached by a save: the write fails with EFBIG and the save's
  // error path says which file, rather than the process ending silently mid-save.
  std::signal(SIGXFSZ, SIG_IGN);
}

int stop_signal() { return g_signal.load(); }
int sigterms_so_far() { return g_sigterms.load(); }

void in_multi_process_job(bool lead) {
  g_multi_process.store(true);
  g_silent.store(!lead);
}
void started_training() { g_phase.store(1); }
void started_final() { g_phase.store(2); }
void started_outputs() { g_phase.store(3); }

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
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
  }
  return "a signal";
}

}  // namespace ul
