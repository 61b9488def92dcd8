#include "engine/heartbeat.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/file_io.h"

namespace ul {

namespace {

double clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::function<std::string()> Heartbeat::bytes_written_from_now() {
  return [base = io_bytes_written()] { return bytes_text(double(io_bytes_written() - base)) + " written"; };
}

std::function<std::string()> Heartbeat::bytes_read_from_now() {
  return [base = io_bytes_read()] { return bytes_text(double(io_bytes_read() - base)) + " read"; };
}

// (at most 1e7 s, as wait_notice_period: a deadline in nanoseconds past 9e9 s overflows into the
// past, and the clock's wait returned at once, spinning with the lock held)
Heartbeat::Heartbeat(double every_s, std::FILE* out)
    : every_ms_(every_s > 0 ? std::min(every_s, 1e7) * 1000 : 0), out_(out) {
  if (every_ms_ <= 0) return;
  // The clock's thread takes no signals: a stop signal goes to the threads that act on it (one
  // delivered here would wake no blocking call of theirs). It inherits the mask set around its start.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    clock_ = std::thread([this] { run(); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Heartbeat::~Heartbeat() {
  if (!clock_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(m_);
    quit_ = true;
  }
  cv_.notify_all();
  clock_.join();
}

Heartbeat::Phase Heartbeat::begin(std::string what, std::function<std::string()> status) {
  if (every_ms_ <= 0) return Phase(nullptr);
  std::lock_guard<std::mutex> lock(m_);
  what_ = std::move(what);
  status_ = std::move(status);
  where_.clear();
  start_ = last_line_ = last_milestone_ = clock_ms();
  open_ = true;
  cv_.notify_all();
  return Phase(this);
}

void Heartbeat::at(const std::string& where) {
  if (every_ms_ <= 0) return;
  std::lock_guard<std::mutex> lock(m_);
  if (!open_) return;
  const double t = clock_ms();
  where_ = where;
  last_milestone_ = t;
  if (t - last_line_ >= every_ms_) print_locked(t, false);
}

void Heartbeat::close() {
  std::lock_guard<std::mutex> lock(m_);
  open_ = false;
}

void Heartbeat::print_locked(double now, bool clocked) {
  const double previous_line = last_line_;
  last_line_ = now;
  const double total_s = (now - start_) / 1000.0;
  // A milestone that came since the last line, and just now (under 0.05 s: the clock wakes when
  // at() would first print, and often comes first), is said as its own line would say it; any
  // other carries its age (one that came mid-period is a period old by the clock's line).
  const bool repeated = last_milestone_ <= previous_line || now - last_milestone_ >= 50.0;
  if (clocked && status_)
    std::fprintf(out_, "  ...   %s | %s | %.1f s\n", what_.c_str(), status_().c_str(), total_s);
  else if (where_.empty())
    std::fprintf(out_, "  ...   %s | %.1f s\n", what_.c_str(), total_s);
  else if (clocked && repeated)
    std::fprintf(out_, "  ...   %s | %s %s (%.1f s ago) | %.1f s\n", what_.c_str(), where_.c_str(), word_,
                (now - last_milestone_) / 1000.0, total_s);
  else
    std::fprintf(out_, "  ...   %s | %s %s | %.1f s\n", what_.c_str(), where_.c_str(), word_, total_s);
  std::fflush(out_);
}

void Heartbeat::run() {
  using ms = std::chrono::duration<double, std::milli>;
  std::unique_lock<std::mutex> lock(m_);
  while (!quit_) {
    if (!open_) {
      cv_.wait(lock);  // begin() or the end wakes it
      continue;
    }
    // A period after the last line, the milestones' included (their line counts); 0.1 s at least.
    const double now = clock_ms();
    cv_.wait_for(lock, ms(std::max(last_line_ + every_ms_, now + 100.0) - now));
    const double t = clock_ms();
    if (!quit_ && open_ && t - last_line_ >= every_ms_) print_locked(t, true);
  }
}

}  // namespace ul
