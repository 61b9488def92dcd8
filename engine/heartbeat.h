// --heartbeat: a step of minutes (gpt2-124M at T = 29K takes 13 minutes on 2 cores) prints a line
// at most every `every` seconds naming how far it got, so that it neither looks hung nor floods a
// short run (a step shorter than `every` prints nothing).
//
// Two sources of lines, one period:
//  - the model's milestones: at() (Transformer::progress: "backward 6/12 blocks done") prints when
//    the period has passed since the last line;
//  - a clock: one stretch between milestones can itself be minutes (a 64K block's attention, a
//    large vocabulary's classifier, a batch read from a slow disk), so a thread prints the last
//    milestone and how long ago it was, once a period, while a phase is open:
//      ...   step 1/1 | backward 6/12 blocks done | 512.3 s
//      ...   step 1/1 | backward 6/12 blocks done (60.0 s ago) | 572.3 s
//      ...   step 1/1 | 30.0 s                      (no milestone yet: loading, the first block)
// A phase with no milestones but a measure of its own (a save, an export, a resume's load) gives
// the clock a status to print instead:
//      ...   save step_001500 | 3.20 GiB written | 30.0 s
// A phase is open from begin() until its Phase ends (the step's or eval's own line comes after).
#pragma once
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ul {

class Heartbeat {
 public:
  // every_s <= 0: silent (no thread). The clock's thread wakes at most every 0.1 s: a tiny period
  // (tests use 1e-9 to see every milestone) must not spin it.
  explicit Heartbeat(double every_s, std::FILE* out = stdout);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Closes the phase (no line from the clock after it) when it ends or end() is called.
  class Phase {
   public:
    explicit Phase(Heartbeat* b) : b_(b) {}
    Phase(Phase&& p) noexcept : b_(p.b_) { p.b_ = nullptr; }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    Phase& operator=(Phase&&) = delete;
    ~Phase() { end(); }
    void end() {
      if (b_) b_->close();
      b_ = nullptr;
    }

   private:
    Heartbeat* b_;
  };

  // "step 3/10", "eval 250": the clock starts. `status`, where given, is what the clock prints
  // (called on its thread, under the heartbeat's lock).
  [[nodiscard]] Phase begin(std::string what, std::function<std::string()> status = {});
  // Statuses of the bytes this process writes or reads from now on (engine/file_io.h's counts):
  // "3.20 GiB written", "812.0 MiB read".
  static std::function<std::string()> bytes_written_from_now();
  static std::function<std::string()> bytes_read_from_now();
  // A milestone of the open phase, "forward 3/12 blocks".
  void at(const std::string& where);
  // What a milestone is said to be: "done" (the CPU runs an op as it is called), or "queued" on a
  // GPU, whose kernels run after their launch returns: a block launched is not a block run (the
  // first wait for the device may be the step's classifier, long after).
  void milestones_are(const char* word) { word_ = word; }

 private:
  void close();
  void run();  // the clock's thread
  void print_locked(double now, bool clocked);

  const double every_ms_;
  std::FILE* const out_;
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false, quit_ = false;
  std::string what_, where_;
  const char* word_ = "done";
  std::function<std::string()> status_;
  double start_ = 0, last_line_ = 0, last_milestone_ = 0;
  std::thread clock_;
};

}  // namespace ul
