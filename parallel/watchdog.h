// A deadline for a wait that cannot be interrupted: NCCL's communicator init blocks until every
// rank of the job has joined, and a rank that never starts (or dies before joining) would leave the
// others there until the scheduler's wall-clock limit. If the guarded scope has not ended within
// `seconds`, `expire` runs on the watchdog's own thread; the NCCL bootstrap's says which wait ran
// out and ends the process (parallel/comm_nccl.cpp), since nothing can return from inside the init.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ul {

class Watchdog {
 public:
  // seconds at most 1e7 (longer counts as 1e7): past about 9e9 the wait's deadline in nanoseconds
  // overflows, and the watchdog would fire at once.
  Watchdog(double seconds, std::function<void()> expire) : expire_(std::move(expire)) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mu_);
      const auto wait = std::chrono::duration<double>(std::min(seconds, 1e7));
      if (!cv_.wait_for(lock, wait, [this] { return done_; })) expire_();
    });
  }
  ~Watchdog() {  // the scope ended in time (or unwound): `expire` never runs after this
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::function<void()> expire_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace ul
