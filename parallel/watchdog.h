// A deadline for a wait that cannot be interrupted: NCCL's communicator init blocks until every
// rank of the job has joined, and a rank that never starts (or dies before joining) would leave the
// others there until the scheduler's wall-clock limit. If the guarded scope has not ended within
// `seconds`, `expire` runs on the watchdog's own thread; the NCCL bootstrap's says which wait ran
// out and ends the process (parallel/comm_nccl.cpp), since nothing can return from inside the init.
// RearmableWatchdog does the same for NCCL's other calls, which may block as the init does, and for
// every MPI call (parallel/comm_mpi.cpp; MPI's start-up too, train.cpp); a Watchdog is one of its
// armings, from construction to destruction.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ul {

// One watchdog thread for many short guarded scopes: arm(what) starts a deadline, disarm() ends it
// (ArmedScope does both). For waits that come often, every NCCL call (a thread each would cost more
// than the call): arming is a lock and a notify on the caller's side. `expire(what)` runs on the
// watchdog's thread when a scope outlives `seconds`, at most once per arming.
class RearmableWatchdog {
 public:
  // seconds at most 1e7 (longer counts as 1e7): past about 9e9 the wait's deadline in nanoseconds
  // overflows, and the watchdog would fire at once. notice (optional): called on the watchdog's
  // thread every notice_s seconds of one arming before the deadline, with the scope's name and the
  // seconds it has lasted (a wait that is long but not yet over: parallel/wait_notice.h).
  RearmableWatchdog(double seconds, std::function<void(const char*)> expire, double notice_s = 0,
                    std::function<void(const char*, double)> notice = {})
      : expire_(std::move(expire)), notice_(std::move(notice)), wait_(std::min(seconds, 1e7)),
        notice_every_(notice_ && notice_s > 0 ? std::min(notice_s, 1e7) : 0) {
    thread_ = std::thread([this] {
      using clock = std::chrono::steady_clock;
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        cv_.wait(lock, [this] { return stop_ || armed_; });
        if (stop_) break;
        const unsigned long long arming = arming_;
        const auto deadline = since_ + std::chrono::duration_cast<clock::duration>(wait_);
        const auto every = std::chrono::duration_cast<clock::duration>(notice_every_);
        auto next = every.count() > 0 ? since_ + every : deadline;
        // Until it is disarmed or armed again (a new scope, a new deadline) or the deadline passes;
        // at each notice time on the way, the notice.
        for (;;) {
          const auto until = std::min(next, deadline);
          if (cv_.wait_until(lock, until, [&] { return stop_ || !armed_ || arming_ != arming; })) break;
          const char* what = what_;
          if (until == deadline) {
            armed_ = false;  // once per arming
            lock.unlock();
            expire_(what);
            lock.lock();
            break;
          }
          const double lasted = std::chrono::duration<double>(clock::now() - since_).count();
          lock.unlock();
          notice_(what, lasted);
          lock.lock();
          next += every;  // (a slow notice skips the ones it missed, rather than firing them at once)
          if (next < clock::now()) next = clock::now() + every;
        }
      }
    });
  }
  ~RearmableWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  RearmableWatchdog(const RearmableWatchdog&) = delete;
  RearmableWatchdog& operator=(const RearmableWatchdog&) = delete;

  void arm(const char* what) {  // what: text that outlives the scope (a string literal)
    {
      std::lock_guard<std::mutex> lock(mu_);
      armed_ = true, arming_++, what_ = what, since_ = std::chrono::steady_clock::now();
    }
    cv_.notify_one();
  }
  void disarm() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      armed_ = false;
    }
    cv_.notify_one();
  }

  struct ArmedScope {
    ArmedScope(RearmableWatchdog& w, const char* what) : w_(w) { w_.arm(what); }
    ~ArmedScope() { w_.disarm(); }
    ArmedScope(const ArmedScope&) = delete;
    ArmedScope& operator=(const ArmedScope&) = delete;
    RearmableWatchdog& w_;
  };

 private:
  std::function<void(const char*)> expire_;
  std::function<void(const char*, double)> notice_;
  std::chrono::duration<double> wait_, notice_every_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stop_ = false;
  unsigned long long arming_ = 0;
  const char* what_ = "";
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

// One guarded scope: armed from construction to destruction (`expire` never runs after it);
// `notice`, when given, every notice_s seconds of it before then, with the seconds it has lasted.
class Watchdog {
 public:
  Watchdog(double seconds, std::function<void()> expire, double notice_s = 0, std::function<void(double)> notice = {})
      : w_(seconds, [f = std::move(expire)](const char*) { f(); }, notice_s, adapt(std::move(notice))) {
    w_.arm("");
  }

 private:
  // (a function, not an expression beside notice_s in the initializer: arguments are evaluated in
  // no set order, and a moved-from notice read as none)
  static std::function<void(const char*, double)> adapt(std::function<void(double)> notice) {
    if (!notice) return {};
    return [n = std::move(notice)](const char*, double lasted) { n(lasted); };
  }
  RearmableWatchdog w_;
};

}  // namespace ul
