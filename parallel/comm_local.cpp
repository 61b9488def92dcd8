// Local communicator: one thread per rank, collectives as a two-barrier rendezvous.
//   1. every rank posts its call (name, count, dtype, send and recv pointers) and waits for all;
//   2. every rank copies (or reduces) what it needs from the others' send buffers into its recv;
//   3. every rank waits for all again, after which any buffer may be reused.
// A barrier is a mutex, a condition variable and a generation counter: the last rank to arrive
// bumps the generation and wakes the others. Waits also wake on a world-wide failure flag.
#include "parallel/comm_local.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm_util.h"
#include "parallel/wait_notice.h"

namespace ul {
namespace {

struct Post {  // one rank's part of the current collective
  const char* what = "";
  size_t count = 0;
  DType dtype = DType::f32;
  int arg = 0, key = 0;  // arg: reduce op, broadcast root or split color; key: split key
  const void* send = nullptr;
  void* recv = nullptr;
};

// The rendezvous of one communicator: the world, or a group made by split().
struct Group {
  explicit Group(std::vector<int> m)
      : members(std::move(m)), posts(members.size()), here(members.size(), 0), split_out(members.size()) {}
  std::vector<int> members;  // world rank of each rank of this group
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<Post> posts;
  std::vector<char> here;    // arrived in the current barrier
  std::string mismatch;      // set by the last arrival when the posts disagree
  std::vector<std::pair<std::shared_ptr<Group>, int>> split_out;  // split(): each rank's new group and rank
};

struct World {
  World(int n, const LocalOptions& o) : opt(o), finished(n) {}
  LocalOptions opt;
  std::mutex mu;  // guards groups and the failure message; never held while locking a group
  std::vector<std::shared_ptr<Group>> groups;
  std::atomic<bool> failed{false};
  std::string failure;  // written once, before failed is set
  std::vector<std::atomic<bool>> finished;

  void add(std::shared_ptr<Group> g) { std::lock_guard<std::mutex> lk(mu); groups.push_back(std::move(g)); }
  std::vector<std::shared_ptr<Group>> all_groups() { std::lock_guard<std::mutex> lk(mu); return groups; }
  void wake_all() {  // a waiter checks the flags under its group's lock, so no wake-up is lost
    for (auto& g : all_groups()) {
      std::lock_guard<std::mutex> lk(g->mu);
      g->cv.notify_all();
    }
  }
  void fail(const std::string& msg) {
    std::unique_lock<std::mutex> lk(mu);
    if (failed.load()) return;
    failure = msg;
    failed.store(true);
    lk.unlock();
    wake_all();
  }
  void finish(int world_rank) {
    finished[world_rank].store(true);
    wake_all();
  }
};

class LocalComm : public Comm {
 public:
  LocalComm(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank)
      : Comm(w->opt.device), w_(std::move(w)), g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return int(g_->members.size()); }
  const char* backend() const override { return "local"; }

  // The ranks' threads read each other's buffers with the host's memcpy: device buffers (on a GPU,
  // and on the emulated device too, so that CI runs this path) go through host copies, in before
  // the rendezvous and out after it. All ranks share the process's one GPU and its legacy default
  // stream, so a copy is ordered after every kernel that wrote the buffer.
  // Two exchanges: each rank reduces one slice of every rank's buffer into its own scratch (the
  // same elements in the same rank order as a whole-buffer reduction, so every rank gets the same
  // bits), then copies every rank's reduced slice into its buffer. The buffers are only read in the
  // first and only written in the second, so no rank needs a copy of its input, and each reduces
  // 1/P of the elements instead of all of them. The scratch (one slice) is kept between calls: a
  // gradient-sized allocation per step would map and fault in fresh pages every time.
  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    stats.all_reduce += comm_volume::all_reduce(count, t, size());
    const size_t es = dtype_size(t), P = size_t(size());
    auto lo = [&](size_t r) { return count * r / P; };  // rank r's slice: [lo(r), lo(r + 1))
    const size_t mine = lo(rank_ + 1) - lo(rank_);
    if (slice_.size() < mine * es) slice_.resize(mine * es);
    Staged io(device_, buf, count * es, true);
    char* host = static_cast<char*>(io.host());
    exchange({"all_reduce", count, t, int(op), 0, host, slice_.data()}, [&] {
      std::vector<const void*> src = sends();
      for (auto& p : src) p = static_cast<const char*>(p) + lo(rank_) * es;
      reduce_many(slice_.data(), src.data(), int(P), mine, t, op);
    });
    exchange({"all_reduce (gather)", count, t, int(op), 0, slice_.data(), host}, [&] {
      for (size_t j = 0; j < P; j++) copy(host + lo(j) * es, g_->posts[j].send, (lo(j + 1) - lo(j)) * es);
    });
    io.copy_out();
  }

  void all_to_all(const void* send, void* recv, size_t count, DType t) override {
    stats.all_to_all += comm_volume::all_to_all(count, t, size());
    const size_t bytes = count * dtype_size(t);
    Staged in(device_, send, bytes * size(), true), out(device_, recv, bytes * size(), false);
    exchange({"all_to_all", count, t, 0, 0, in.host(), out.host()}, [&] {
      for (int j = 0; j < size(); j++)  // chunk rank_ of rank j's send -> chunk j of my recv
        copy(static_cast<char*>(out.host()) + j * bytes, static_cast<const char*>(g_->posts[j].send) + rank_ * bytes,
             bytes);
    });
    out.copy_out();
  }

  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    stats.all_gather += comm_volume::all_gather(count, t, size());
    const size_t bytes = count * dtype_size(t);
    Staged in(device_, send, bytes, true), out(device_, recv, bytes * size(), false);
    exchange({"all_gather", count, t, 0, 0, in.host(), out.host()}, [&] {
      for (int j = 0; j < size(); j++) copy(static_cast<char*>(out.host()) + j * bytes, g_->posts[j].send, bytes);
    });
    out.copy_out();
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    stats.reduce_scatter += comm_volume::reduce_scatter(count, t, size());
    const size_t bytes = count * dtype_size(t);
    Staged in(device_, send, bytes * size(), true), out(device_, recv, bytes, false);
    exchange({"reduce_scatter", count, t, int(op), 0, in.host(), out.host()}, [&] {
      std::vector<const void*> mine = sends();  // chunk rank_ of every rank's send, in rank order
      for (auto& p : mine) p = static_cast<const char*>(p) + rank_ * bytes;
      reduce_many(out.host(), mine.data(), size(), count, t, op);
    });
    out.copy_out();
  }

  void broadcast(void* buf, size_t count, DType t, int root) override {
    if (root < 0 || root >= size())
      throw CommError("local comm: broadcast root " + std::to_string(root) + " is not in [0, " + std::to_string(size()) + ")");
    stats.broadcast += comm_volume::broadcast(count, t, size(), rank_ == root);
    const size_t bytes = count * dtype_size(t);
    Staged io(device_, buf, bytes, rank_ == root);
    exchange({"broadcast", count, t, root, 0, io.host(), io.host()}, [&] {
      if (rank_ != root) copy(io.host(), g_->posts[root].send, bytes);
    });
    if (rank_ != root) io.copy_out();
  }

  void barrier() override { exchange({"barrier"}, [] {}); }

  // Ranks with a negative color get no communicator (nullptr), like MPI_UNDEFINED.
  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_ptr<Comm> out;
    exchange({"split", 0, DType::f32, color, key}, [&] {
      if (auto& s = g_->split_out[rank_]; s.first) out.reset(new LocalComm(w_, s.first, s.second));
    }, [this] { make_groups(); });
    return out;
  }

 private:
  std::vector<const void*> sends() const {
    std::vector<const void*> s(size());
    for (int j = 0; j < size(); j++) s[j] = g_->posts[j].send;
    return s;
  }
  static void copy(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }

  // Runs by the last rank to arrive at split's first barrier: forms every color's group.
  void make_groups() {
    Group& g = *g_;
    std::vector<int> order(size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return g.posts[a].arg != g.posts[b].arg ? g.posts[a].arg < g.posts[b].arg : g.posts[a].key < g.posts[b].key;
    });
    for (auto& o : g.split_out) o = {nullptr, -1};
    for (size_t i = 0, e; i < order.size(); i = e) {  // [i, e): one color
      for (e = i; e < order.size() && g.posts[order[e]].arg == g.posts[order[i]].arg;) e++;
      if (g.posts[order[i]].arg < 0) continue;
      std::vector<int> members;
      for (size_t k = i; k < e; k++) members.push_back(g.members[order[k]]);
      auto ng = std::make_shared<Group>(members);
      w_->add(ng);  // takes the world lock; World never holds it while taking a group lock
      for (size_t k = i; k < e; k++) g.split_out[order[k]] = {ng, int(k - i)};
    }
  }

  // The rendezvous. Once every rank has passed the first barrier, all of them are copying, which
  // cannot block, so the second barrier always completes: it neither times out nor looks at the
  // failure flag (a rank leaving early could free a buffer that a slower rank is still reading).
  template <class Work>
  void exchange(const Post& p, Work work, const std::function<void()>& on_last = {}) {
    arrive_and_wait(&p, on_last);
    std::exception_ptr err;
    try { work(); } catch (...) { err = std::current_exception(); }
    arrive_and_wait(nullptr, {});
    if (err) std::rethrow_exception(err);
  }

  // Blocks until every rank of the group has arrived. post: this rank's call (first barrier), or
  // nullptr (second barrier).
  void arrive_and_wait(const Post* post, const std::function<void()>& on_last) {
    Group& g = *g_;
    std::unique_lock<std::mutex> lk(g.mu);
    const uint64_t gen = g.generation;
    if (!post) {
      if (++g.arrived == size()) next_generation(g);
      else g.cv.wait(lk, [&] { return g.generation != gen; });
      return;
    }
    const char* what = post->what;
    check_failed(what);
    g.posts[rank_] = *post;
    g.here[rank_] = 1;
    if (++g.arrived == size()) {
      g.mismatch = find_mismatch();
      if (g.mismatch.empty() && on_last) on_last();
      next_generation(g);
    } else {
      const auto start = std::chrono::steady_clock::now();
      const auto deadline = start + std::chrono::duration<double>(w_->opt.timeout_s);
      // World rank 0 says what it waits for, every wait_notice() seconds (parallel/wait_notice.h).
      const double every = g.members[rank_] == 0 ? wait_notice() : 0;
      using clock = std::chrono::steady_clock;
      const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(every));
      clock::time_point next_notice = every > 0 ? start + period : clock::time_point::max();
      while (g.generation == gen) {
        check_failed(what);
        for (size_t k = 0; k < g.members.size(); k++)
          if (!g.here[k] && w_->finished[g.members[k]].load())
            throw CommError("local comm: rank " + std::to_string(g.members[k]) + " returned without joining " + what +
                            " (rank " + std::to_string(g.members[rank_]) + " waited for it)");
        if (next_notice < deadline) {
          if (g.cv.wait_until(lk, next_notice) == std::cv_status::timeout && g.generation == gen) {
            std::string whom = "rank(s)";
            for (size_t k = 0; k < g.members.size(); k++)
              if (!g.here[k]) whom += " " + std::to_string(g.members[k]);
            const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            lk.unlock();  // (the peers may arrive meanwhile: the loop looks again)
            print_wait_notice(what, waited, whom, w_->opt.timeout_s);
            lk.lock();
            // the next period's end, or a period from now when that is past (a slow print skips the
            // ones it missed rather than printing them back to back)
            next_notice += period;
            if (next_notice < clock::now()) next_notice = clock::now() + period;
          }
          continue;
        }
        if (g.cv.wait_until(lk, deadline) == std::cv_status::timeout && g.generation == gen) {
          char secs[32];
          std::snprintf(secs, sizeof secs, "%g", w_->opt.timeout_s);
          // (world ranks, as the waiting notice names them: in a split group its own numbers differ)
          std::string msg = std::string("local comm: ") + what + " timed out after " + secs + " s on rank " +
                            std::to_string(g.members[rank_]) + ", waiting for rank(s)";
          for (size_t k = 0; k < g.members.size(); k++)
            if (!g.here[k]) msg += " " + std::to_string(g.members[k]);
          // This rank's arrival withdrawn before the lock goes: a peer coming between the unlock
          // and fail() would otherwise complete the barrier with it and wait for ever in the
          // second one, which this rank never reaches.
          g.arrived--;
          g.here[rank_] = 0;
          lk.unlock();
          // (tests: ULYSSES_TEST_TIMEOUT_GAP_MS widens that gap, so a peer lands in it for sure)
          if (const char* gap = std::getenv("ULYSSES_TEST_TIMEOUT_GAP_MS"))
            std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(gap)));
          w_->fail("rank " + std::to_string(g.members[rank_]) + " failed: " + msg);  // the group is unusable now
          throw CommError(msg);
        }
      }
    }
    if (!g.mismatch.empty()) throw CommError("local comm: " + g.mismatch);
  }

  static void next_generation(Group& g) {
    g.arrived = 0;
    std::fill(g.here.begin(), g.here.end(), 0);
    g.generation++;
    g.cv.notify_all();
  }

  void check_failed(const char* what) const {
    if (w_->failed.load())
      throw CommError(w_->failure + " (seen by rank " + std::to_string(rank_) + " in " + what + ")");
  }

  // The ranks of one collective must agree on the call; differing calls would corrupt memory.
  std::string find_mismatch() const {
    auto call = [&](int k) {
      const Post& p = g_->posts[k];
      return "rank " + std::to_string(k) + " called " + p.what + "(count " + std::to_string(p.count) + ", " +
             dtype_name(p.dtype) + ")";
    };
    const Post& a = g_->posts[0];
    for (int k = 1; k < size(); k++) {
      const Post& b = g_->posts[k];
      if (std::strcmp(a.what, b.what) != 0 || a.count != b.count || a.dtype != b.dtype ||
          (std::strcmp(a.what, "split") != 0 && a.arg != b.arg))  // same reduce op, same root
        return "ranks disagree on the collective: " + call(0) + ", " + call(k);
    }
    return "";
  }

  std::shared_ptr<World> w_;
  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<char> slice_;  // all_reduce: this rank's reduced slice, kept between calls
};

}  // namespace

void run_local(int n, const std::function<void(Comm&)>& body, const LocalOptions& opt) {
  if (n < 1) throw std::invalid_argument("run_local: need at least one rank, got " + std::to_string(n));
  if (!(opt.timeout_s > 0)) throw std::invalid_argument("run_local: timeout_s must be positive");
  auto world = std::make_shared<World>(n, opt);
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  auto group = std::make_shared<Group>(all);
  world->add(group);

  // The first exception (rethrown after the join), when it came, and which ranks have returned.
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr first;
  std::string first_what;
  std::chrono::steady_clock::time_point first_at;
  std::vector<char> returned(size_t(n), 0);
  auto all_returned = [&] { return std::count(returned.begin(), returned.end(), 1) == n; };
  auto failed = [&](int r, const std::string& what) {  // record the first exception, then wake everyone
    std::unique_lock<std::mutex> lk(mu);
    if (!first) {
      first = std::current_exception();
      first_what = "rank " + std::to_string(r) + " failed: " + what;
      first_at = std::chrono::steady_clock::now();
      cv.notify_all();
    }
    lk.unlock();
    world->fail("rank " + std::to_string(r) + " failed: " + what);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++)
    threads.emplace_back([&, r] {
      try {
        LocalComm comm(world, group, r);
        body(comm);
        world->finish(r);
      } catch (const std::exception& e) {
        failed(r, e.what());
      } catch (...) {
        failed(r, "unknown exception");
      }
      std::lock_guard<std::mutex> lk(mu);
      returned[size_t(r)] = 1;
      cv.notify_all();
    });
  if (opt.abandon) {
    // A rank that failed wakes every rank waiting in a collective, but not one busy outside any
    // (blocked reading its standard input, in a loop of its own): past the grace after the first
    // failure, the ranks still running are given up on, and abandon() says so (train exits).
    std::unique_lock<std::mutex> lk(mu);
    const auto grace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(opt.abandon_after_s, 1e7)));
    cv.wait(lk, [&] { return all_returned() || first; });
    if (!all_returned() && !cv.wait_until(lk, first_at + grace, all_returned)) {
      std::string running;
      for (int r = 0; r < n; r++)
        if (!returned[size_t(r)]) running += (running.empty() ? "" : " ") + std::to_string(r);
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", opt.abandon_after_s);
      const std::string msg = first_what + "; rank(s) " + running + " still running " + secs +
                              " s later, outside any collective (given up on)";
      lk.unlock();
      opt.abandon(msg);
    }
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace ul
