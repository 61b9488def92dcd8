// The local communicator (one thread per rank): every collective against hand-computed values,
// split / Grid with concurrent group collectives, the byte accounting, failures that must not hang,
// and the Ulysses configuration checks.
// Catch2 assertions are not thread-safe, so rank threads only record what they saw; the checks run
// on the main thread after run_local returns.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "dtype_codec.h"

#include "parallel/comm_local.h"
#include "parallel/comm_util.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/ulysses.h"
#include "parallel/wait_notice.h"
#include "parallel/watchdog.h"
#include "parallel/zero.h"

using namespace ul;
using Catch::Matchers::Contains;

namespace {

using Rows = std::vector<std::vector<double>>;  // per rank: the values it received

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using ul_test::decode;
using ul_test::encode;

const DType kTypes[] = {DType::f32, DType::f64, DType::i32, DType::bf16};

}  // namespace

TEST_CASE("local all_reduce: sum and max at P = 1..4, every dtype, counts 0, 1, 7", "[comm][local]") {
  for (int P = 1; P <= 4; P++)
    for (DType t : kTypes)
      for (size_t n : {size_t(0), size_t(1), size_t(7)})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          Rows got(P);
          run_local(P, [&](Comm& c) {
            std::vector<double> v(n);
            for (size_t i = 0; i < n; i++) v[i] = double((c.rank() * 5 + int(i) * 3) % 11) - 4;  // rank-dependent, signed
            auto buf = encode(v, t);
            c.all_reduce(buf.data(), n, t, op);
            got[c.rank()] = decode(buf, t);
          });
          for (size_t i = 0; i < n; i++) {
            double want = op == ReduceOp::sum ? 0 : -1e9;
            for (int r = 0; r < P; r++) {
              double x = double((r * 5 + int(i) * 3) % 11) - 4;
              want = op == ReduceOp::sum ? want + x : std::max(want, x);
            }
            for (int r = 0; r < P; r++) {
              INFO("P " << P << " " << dtype_name(t) << " n " << n << " op " << int(op) << " rank " << r << " i " << i);
              CHECK(got[r][i] == want);
            }
          }
        }
}

TEST_CASE("local all_reduce of rounding floats: every rank gets the rank-order sum, bit for bit", "[comm][local]") {
  // Each rank reduces a slice and the slices are gathered: the sum must still be x0 + x1 + x2 in that
  // order for every element (floats that round differently in another order), the same on all ranks.
  const int P = 3;
  const size_t n = 1001;  // slices of 333, 333 and 335 elements
  auto x = [](int r, size_t i) { return float(std::sin(double(r * 7919 + i) * 0.37) * std::pow(10.0, double(i % 7) - 3)); };
  Rows got(P);
  run_local(P, [&](Comm& c) {
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; i++) buf[i] = x(c.rank(), i);
    c.all_reduce(buf.data(), n, DType::f32, ReduceOp::sum);
    got[c.rank()].assign(buf.begin(), buf.end());
  });
  int reordered = 0;  // elements where another order gives other bits: the check below can fail
  for (size_t i = 0; i < n; i++) {
    const float want = (x(0, i) + x(1, i)) + x(2, i);
    reordered += want != (x(2, i) + x(1, i)) + x(0, i);
    for (int r = 0; r < P; r++) {
      INFO("rank " << r << " element " << i);
      CHECK(float(got[r][i]) == want);
    }
  }
  CHECK(reordered > 50);
}

TEST_CASE("local all_to_all, all_gather, reduce_scatter, broadcast at P = 1..4", "[comm][local]") {
  for (int P = 1; P <= 4; P++)
    for (size_t n : {size_t(0), size_t(1), size_t(5)}) {
      INFO("P " << P << " count " << n);
      Rows a2a(P), ag(P), rs(P), bc(P * P);
      run_local(P, [&](Comm& c) {
        const int r = c.rank();
        std::vector<float> send(P * n), recv(P * n);
        // all_to_all: element k of chunk j on rank r is 100 r + 10 j + k.
        for (int j = 0; j < P; j++)
          for (size_t k = 0; k < n; k++) send[j * n + k] = 100.f * r + 10.f * j + k;
        c.all_to_all(send.data(), recv.data(), n, DType::f32);
        a2a[r].assign(recv.begin(), recv.end());
        // all_gather: element k on rank r is 10 r + k.
        std::vector<float> mine(n);
        for (size_t k = 0; k < n; k++) mine[k] = 10.f * r + k;
        c.all_gather(mine.data(), recv.data(), n, DType::f32);
        ag[r].assign(recv.begin(), recv.end());
        // reduce_scatter: element k of chunk j on rank r is r + 10 j + 100 k.
        for (int j = 0; j < P; j++)
          for (size_t k = 0; k < n; k++) send[j * n + k] = r + 10.f * j + 100.f * k;
        std::vector<float> out(n, -1.f);
        c.reduce_scatter(send.data(), out.data(), n, DType::f32, ReduceOp::sum);
        rs[r].assign(out.begin(), out.end());
        // broadcast from every root in turn: the root holds 7 root + k, the others garbage.
        for (int root = 0; root < P; root++) {
          std::vector<int32_t> b(n, -99);
          if (r == root)
            for (size_t k = 0; k < n; k++) b[k] = 7 * root + int(k);
          c.broadcast(b.data(), n, DType::i32, root);
          bc[root * P + r].assign(b.begin(), b.end());
        }
        c.barrier();
      });
      for (int r = 0; r < P; r++)
        for (int j = 0; j < P; j++)
          for (size_t k = 0; k < n; k++) {
            CHECK(a2a[r][j * n + k] == 100.0 * j + 10.0 * r + k);  // chunk j came from rank j
            CHECK(ag[r][j * n + k] == 10.0 * j + k);
          }
      for (int r = 0; r < P; r++)
        for (size_t k = 0; k < n; k++) {
          double want = 0;
          for (int q = 0; q < P; q++) want += q + 10.0 * r + 100.0 * k;
          CHECK(rs[r][k] == want);
          for (int root = 0; root < P; root++) CHECK(bc[root * P + r][k] == 7.0 * root + k);
        }
    }
}

TEST_CASE("local split orders by key then rank, negative color gets no communicator", "[comm][local]") {
  const int P = 4;
  std::vector<int> size(P), rank(P), null(P);
  Rows members(P);
  run_local(P, [&](Comm& c) {
    const int r = c.rank();
    // color: r % 2 ({0, 2} and {1, 3}); key: -r, so the group is ordered by descending world rank.
    auto g = c.split(r % 2, -r);
    size[r] = g->size();
    rank[r] = g->rank();
    std::vector<int32_t> all(g->size());
    int32_t me = r;
    g->all_gather(&me, all.data(), 1, DType::i32);
    members[r].assign(all.begin(), all.end());
    auto h = c.split(r == 3 ? -1 : 0, 0);  // equal keys: ordered by old rank
    null[r] = h == nullptr;
    if (h) h->barrier();
  });
  CHECK(size == std::vector<int>{2, 2, 2, 2});
  CHECK(rank == std::vector<int>{1, 1, 0, 0});
  CHECK(members[0] == std::vector<double>{2, 0});
  CHECK(members[3] == std::vector<double>{3, 1});
  CHECK(null == std::vector<int>{0, 0, 0, 1});
}

TEST_CASE("grid 2 x 2: consecutive sp groups, strided dp groups, concurrent group collectives", "[comm][local][grid]") {
  const int P = 4;
  Rows sp_members(P), dp_members(P), sp_sum(P), dp_sum(P);
  std::vector<int> coords(4 * P);
  run_local(P, [&](Comm& world) {
    Grid g(world, 2);
    const int r = world.rank();
    coords[4 * r + 0] = g.dp, coords[4 * r + 1] = g.sp, coords[4 * r + 2] = g.dp_rank, coords[4 * r + 3] = g.sp_rank;
    int32_t me = r, all[2];
    g.sp_group->all_gather(&me, all, 1, DType::i32);
    sp_members[r] = {double(all[0]), double(all[1])};
    g.dp_group->all_gather(&me, all, 1, DType::i32);
    dp_members[r] = {double(all[0]), double(all[1])};
    // Many collectives in both groups, the even ranks yielding between the two (other timings on
    // different ranks), so the sp and dp rendezvous of different groups run at the same time.
    double s = 0, d = 0;
    for (int it = 0; it < 200; it++) {
      double x = r + it, y = 10 * r + it;
      if (r % 2) {
        g.sp_group->all_reduce(&x, 1, DType::f64, ReduceOp::sum);
        g.dp_group->all_reduce(&y, 1, DType::f64, ReduceOp::sum);
      } else {
        g.sp_group->all_reduce(&x, 1, DType::f64, ReduceOp::sum);
        std::this_thread::yield();
        g.dp_group->all_reduce(&y, 1, DType::f64, ReduceOp::sum);
      }
      s += x, d += y;
    }
    sp_sum[r] = {s};
    dp_sum[r] = {d};
  });
  for (int r = 0; r < P; r++) {
    const int dp_rank = r / 2, sp_rank = r % 2;
    CHECK(coords[4 * r] == 2);
    CHECK(coords[4 * r + 1] == 2);
    CHECK(coords[4 * r + 2] == dp_rank);
    CHECK(coords[4 * r + 3] == sp_rank);
    CHECK(sp_members[r] == std::vector<double>{2.0 * dp_rank, 2.0 * dp_rank + 1});
    CHECK(dp_members[r] == std::vector<double>{double(sp_rank), double(sp_rank + 2)});
    double s = 0, d = 0;
    for (int it = 0; it < 200; it++) {
      s += (2 * dp_rank + it) + (2 * dp_rank + 1 + it);
      d += (10 * sp_rank + it) + (10 * (sp_rank + 2) + it);
    }
    CHECK(sp_sum[r][0] == s);
    CHECK(dp_sum[r][0] == d);
  }
}

TEST_CASE("grid refuses a world size that sp does not divide", "[comm][local][grid]") {
  REQUIRE_THROWS_WITH(run_local(4, [](Comm& w) { Grid g(w, 3); }),
                      Contains("does not divide the world size 4") && Contains("sp values that divide it: 1, 2, 4"));
}

TEST_CASE("data parallel: gradient all-reduce and global count", "[comm][local]") {
  const int P = 3;
  Rows grads(P);
  std::vector<int64_t> counts(P);
  run_local(P, [&](Comm& w) {
    std::vector<float> g(10);
    for (int i = 0; i < 10; i++) g[i] = float(w.rank() + i);
    all_reduce_gradients(w, g.data(), g.size());
    grads[w.rank()].assign(g.begin(), g.end());
    counts[w.rank()] = global_count(w, int64_t(w.rank()) * 1000000000LL + 7);
  });
  for (int r = 0; r < P; r++) {
    for (int i = 0; i < 10; i++) CHECK(grads[r][i] == 3.0 * i + 3);
    CHECK(counts[r] == 3000000000LL + 21);
  }
}

TEST_CASE("ZeRO shards start on a 4-element boundary, cover the buffer once, and reduce and gather", "[comm][local][zero]") {
  for (size_t n : {0, 1, 3, 7, 12, 13, 1003, 4099})
    for (int W : {1, 2, 3, 4, 6}) {
      INFO("n=" << n << " world=" << W);
      const size_t s = zero_shard_size(n, W);
      CHECK(s % 4 == 0);
      CHECK(n - s * size_t(W) < 4 * size_t(W));  // the last rank's extra
      size_t next = 0;
      for (int k = 0; k < W; k++) {
        const ZeroShard z = zero_shard(n, W, k);
        CHECK(z.lo == next);
        CHECK(z.lo % 4 == 0);
        CHECK(z.hi - z.lo == (k < W - 1 ? s : n - s * size_t(W - 1)));
        next = z.hi;
      }
      CHECK(next == n);
    }
  // Three ranks, 1003 elements: shards of 332 and a tail of 7 the last rank owns too. Each rank's
  // shard of the gradient becomes the sum over ranks; each rank's shard of the weights reaches all.
  const int W = 3;
  const size_t n = 1003;
  std::vector<std::vector<float>> grads(W), weights(W);
  run_local(W, [&](Comm& w) {
    const int r = w.rank();
    const ZeroShard mine = zero_shard(n, W, r);
    std::vector<float> g(n), p(n, -1.f), scratch(zero_scratch_elems(n, W));
    for (size_t i = 0; i < n; i++) g[i] = float(r) + 0.5f * float(i);
    for (size_t i = mine.lo; i < mine.hi; i++) p[i] = 10000.f * float(r) + float(i);
    zero_reduce_gradients(w, g.data(), n, scratch.data());
    zero_gather_params(w, p.data(), n, scratch.data());
    grads[r] = g, weights[r] = p;
  });
  for (int r = 0; r < W; r++) {
    const ZeroShard mine = zero_shard(n, W, r);
    for (size_t i = mine.lo; i < mine.hi; i++)
      if (grads[r][i] != 3.f + 1.5f * float(i)) FAIL("rank " << r << ": gradient " << i << " is " << grads[r][i]);
    for (size_t i = 0; i < n; i++) {
      int owner = 0;
      while (zero_shard(n, W, owner).hi <= i) owner++;
      if (weights[r][i] != 10000.f * float(owner) + float(i))
        FAIL("rank " << r << ": weight " << i << " is " << weights[r][i] << ", not rank " << owner << "'s");
    }
  }
}

TEST_CASE("stats count the bytes sent to other ranks by the standard algorithms", "[comm][local]") {
  for (int P : {1, 2, 3, 4}) {
    std::vector<CommStats> st(P);
    const size_t n = 5;
    run_local(P, [&](Comm& c) {
      std::vector<float> a(P * n, 1.f), b(P * n);
      c.all_to_all(a.data(), b.data(), n, DType::f32);
      c.all_gather(a.data(), b.data(), n, DType::f32);
      c.reduce_scatter(a.data(), b.data(), n, DType::f32, ReduceOp::sum);
      c.all_reduce(a.data(), n, DType::f32, ReduceOp::sum);
      c.broadcast(a.data(), n, DType::f32, P - 1);
      c.all_reduce(a.data(), 3, DType::bf16, ReduceOp::sum);
      st[c.rank()] = c.stats;
    });
    for (int r = 0; r < P; r++) {
      INFO("P " << P << " rank " << r);
      CHECK(st[r].all_to_all == n * (P - 1) * 4);
      CHECK(st[r].all_gather == n * (P - 1) * 4);
      CHECK(st[r].reduce_scatter == n * (P - 1) * 4);
      CHECK(st[r].all_reduce == 2 * n * (P - 1) * 4 / P + 2 * 3 * (P - 1) * 2 / P);
      CHECK(st[r].broadcast == (r == P - 1 && P > 1 ? n * 4 : 0));
    }
  }
}

TEST_CASE("a throwing rank makes the others throw CommError quickly", "[comm][local][failure]") {
  for (int P : {2, 4}) {
    std::vector<std::string> seen(P);
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(run_local(P, [&](Comm& w) {
      Grid g(w, 2);
      w.barrier();
      if (w.rank() == P - 1) throw std::runtime_error("boom");
      try {
        // Rank 0 waits in the world, the others in their dp / sp group: all must be woken.
        for (int i = 0; i < 3; i++) (w.rank() == 0 ? w : *g.dp_group).barrier();
        g.sp_group->barrier();
      } catch (const CommError& e) {
        seen[w.rank()] = e.what();
        throw;
      }
    }), "boom");
    CHECK(seconds_since(t0) < 5);
    for (int r = 0; r < P - 1; r++) CHECK_THAT(seen[r], Contains("rank " + std::to_string(P - 1) + " failed: boom"));
  }
}

TEST_CASE("a wait longer than the timeout throws CommError naming the collective", "[comm][local][failure]") {
  LocalOptions opt;
  opt.timeout_s = 0.2;
  std::string seen;
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(run_local(2, [&](Comm& c) {
    float x = 1;
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    try {
      c.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    } catch (const CommError& e) {
      if (c.rank() == 0) seen = e.what();
      throw;
    }
  }, opt), CommError);
  CHECK(seconds_since(t0) < 5);
  CHECK_THAT(seen, Contains("all_reduce timed out") && Contains("waiting for rank(s) 1"));
}

TEST_CASE("a peer arriving just after a rank timed out fails with it, not hang in the second barrier",
          "[comm][local][failure]") {
  // Rank 0 times out at 0.2 s and, with the test's gap, calls fail() 0.3 s later; rank 1 arrives at
  // 0.3 s, in that gap. The timed-out rank's arrival once stayed counted: rank 1 completed the
  // first barrier with it and waited in the second for ever.
  ::setenv("ULYSSES_TEST_TIMEOUT_GAP_MS", "300", 1);
  LocalOptions opt;
  opt.timeout_s = 0.2;
  std::atomic<bool> done{false};
  std::thread guard([&] {
    for (int i = 0; i < 1000 && !done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done) {
      std::fprintf(stderr, "run_local hung: the late peer waits in the second barrier\n");
      std::_Exit(1);
    }
  });
  CHECK_THROWS_AS(run_local(2, [&](Comm& c) {
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.barrier();
  }, opt), CommError);
  done = true;
  guard.join();
  ::unsetenv("ULYSSES_TEST_TIMEOUT_GAP_MS");
}

TEST_CASE("a rank busy outside any collective after another failed is given up on past abandon_after_s",
          "[comm][local][failure]") {
  // Rank 0 blocks in a loop of its own (train: reading a slow --prompt-file -), which no failure
  // flag wakes; rank 1 fails. abandon() is called once the grace has passed (train exits there);
  // this one lets rank 0 go instead, so that run_local can join and rethrow the first failure.
  LocalOptions opt;
  opt.abandon_after_s = 0.3;
  std::atomic<bool> released{false};
  std::string said;
  double said_at = -1;
  const auto t0 = std::chrono::steady_clock::now();
  opt.abandon = [&](const std::string& why) {
    said = why;
    said_at = seconds_since(t0);
    released = true;
  };
  REQUIRE_THROWS_WITH(run_local(2, [&](Comm& c) {
    if (c.rank() == 1) throw std::runtime_error("boom");
    while (!released) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }, opt), "boom");
  CHECK_THAT(said, Contains("rank 1 failed: boom") && Contains("rank(s) 0 still running 0.3 s later"));
  CHECK(said_at >= 0.3);
  CHECK(said_at < 5);
  // Ranks that all return (one failing, the other leaving on its own) give abandon() nothing to say.
  said.clear();
  released = false;
  REQUIRE_THROWS_WITH(run_local(2, [&](Comm& c) {
    if (c.rank() == 1) throw std::runtime_error("boom");
  }, opt), "boom");
  CHECK(said.empty());
}

namespace {
// What fn printed on stdout (file descriptor 1: print_wait_notice writes there).
template <class Fn>
std::string stdout_of(Fn fn) {
  std::fflush(stdout);
  char path[] = "/tmp/ulysses_stdout_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(1);
  ::dup2(fd, 1);
  fn();
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  std::string text;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  ::close(fd);
  ::unlink(path);
  return text;
}
}  // namespace

// parallel/wait_notice.h: world rank 0, waiting, says for whom every period; a waiting non-lead
// rank, or a lead with no period set, says nothing.
TEST_CASE("a lead rank waiting in a collective says for which ranks, at the notice period", "[comm][local][failure]") {
  LocalOptions opt;
  opt.timeout_s = 30;
  auto late = [](int slow, int ms) {
    return [slow, ms](Comm& c) {
      float x = 1;
      if (c.rank() == slow) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      c.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    };
  };
  std::string out;
  {
    WaitNoticeScope notice(0.2);
    out = stdout_of([&] { run_local(3, late(2, 900), opt); });
  }
  CHECK_THAT(out, Contains("  ...   waiting 0.") && Contains(" s in all_reduce for rank(s) 2 (--comm-timeout 30 s)\n"));
  CHECK_THAT(out, !Contains("rank(s) 1"));  // rank 1 had come
  const size_t lines = size_t(std::count(out.begin(), out.end(), '\n'));
  CHECK(lines >= 2);  // about four (0.2 s each of 0.9 s), at least two on a loaded machine
  CHECK(lines <= 5);
  {
    WaitNoticeScope notice(0.2);
    CHECK(stdout_of([&] { run_local(2, late(0, 600), opt); }).empty());  // rank 1 waits: not the lead
  }
  CHECK(stdout_of([&] { run_local(2, late(1, 600), opt); }).empty());  // no period set
}

// The deadline NCCL's init runs under (parallel/comm_nccl.cpp): it fires once, on its own thread,
// only when the scope outlives it.
TEST_CASE("a watchdog fires after its deadline and never once its scope has ended", "[comm][failure]") {
  std::atomic<int> fired{0};
  auto t0 = std::chrono::steady_clock::now();
  {
    Watchdog w(0.05, [&] { fired++; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(fired == 1);  // while the scope is still open: the wait it guards never returned
  }
  {
    Watchdog w(30, [&] { fired++; });  // ends at once: its destructor does not wait out the 30 s
  }
  {
    Watchdog w(1e300, [&] { fired++; });  // "never": held to 1e7 s (a longer deadline overflowed and fired at once)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(fired == 1);
  CHECK(seconds_since(t0) < 5);
}

// The guard around each NCCL call (parallel/comm_nccl.cpp): one thread, armed per call. It fires
// once for a scope that outlives the deadline, naming it; never for one disarmed in time, however
// many; and a new arming starts a new deadline.
TEST_CASE("a rearmable watchdog fires for the scope that outlives its deadline, once, and for no other", "[comm][failure]") {
  std::mutex mu;
  std::vector<std::string> fired;
  auto t0 = std::chrono::steady_clock::now();
  {
    RearmableWatchdog w(2.0, [&](const char* what) {
      std::lock_guard<std::mutex> lock(mu);
      fired.push_back(what);
    });
    for (int i = 0; i < 2000; i++) RearmableWatchdog::ArmedScope quick(w, "quick");  // each ends in time
    w.arm("first");
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    w.arm("rearmed");  // armed again, still armed: the deadline counts from here, not from the first arming
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    {
      std::lock_guard<std::mutex> lock(mu);
      // 2.4 s since "first" was armed, 1.2 s since this arming: 0.8 s to spare for a loaded
      // machine's oversleeping on either side of the 2 s deadline.
      CHECK(fired.empty());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1600));
    {
      std::lock_guard<std::mutex> lock(mu);
      CHECK(fired == std::vector<std::string>{"rearmed"});  // past its deadline: fired, once
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    w.disarm();
  }
  CHECK(fired == std::vector<std::string>{"rearmed"});  // not again for the same arming
  {
    RearmableWatchdog w(1e300, [&](const char*) { fired.push_back("never"); });  // held to 1e7 s
    RearmableWatchdog::ArmedScope s(w, "long");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(fired.size() == 1);
  CHECK(seconds_since(t0) < 10);
}

// The MPI communicator's guard also notices a long wait (comm_mpi.cpp: the lead's "waiting" line):
// at each period of one arming, before its deadline, with the scope's name.
TEST_CASE("a rearmable watchdog's notice comes at each period of a long arming, and not for a short one",
          "[comm][failure]") {
  std::mutex mu;
  std::vector<std::pair<std::string, double>> notes;
  int expired = 0;
  {
    RearmableWatchdog w(5.0, [&](const char*) { expired++; }, 0.2, [&](const char* what, double lasted) {
      std::lock_guard<std::mutex> lock(mu);
      notes.push_back({what, lasted});
    });
    for (int i = 0; i < 200; i++) RearmableWatchdog::ArmedScope quick(w, "quick");
    RearmableWatchdog::ArmedScope slow(w, "slow");
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
  }
  CHECK(expired == 0);
  std::lock_guard<std::mutex> lock(mu);
  REQUIRE(notes.size() >= 2);
  CHECK(notes.size() <= 5);
  for (size_t i = 0; i < notes.size(); i++) {
    CHECK(notes[i].first == "slow");
    CHECK(notes[i].second >= 0.2 * double(i + 1) - 1e-3);  // its period's multiple, or later
  }
}

TEST_CASE("mismatched or missing collectives throw instead of corrupting or hanging", "[comm][local][failure]") {
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(run_local(2, [](Comm& c) {
    float x[8] = {};
    c.all_reduce(x, c.rank() == 0 ? 4 : 5, DType::f32, ReduceOp::sum);
  }), Contains("ranks disagree on the collective"));
  REQUIRE_THROWS_WITH(run_local(3, [](Comm& c) {
    if (c.rank() != 2) c.barrier();
  }), Contains("rank 2 returned without joining barrier"));
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("check_ulysses_config refuses what cannot be split and says what would work", "[ulysses][config]") {
  CHECK_NOTHROW(check_ulysses_config(8, 8, 64, 4));
  CHECK_NOTHROW(check_ulysses_config(8, 4, 64, 2));
  CHECK_NOTHROW(check_ulysses_config(8, 2, 64, 4));  // kv heads replicated on 2 ranks each
  CHECK_NOTHROW(check_ulysses_config(8, 1, 64, 8));
  CHECK_THROWS_WITH(check_ulysses_config(12, 12, 1200, 8),
                    Contains("query heads are not divisible by sp") && Contains("work for this model and sequence: 1, 2, 3, 4, 6, 12"));
  CHECK_THROWS_WITH(check_ulysses_config(12, 6, 48, 4),
                    Contains("kv heads are not divisible by sp") && Contains(": 1, 2, 3, 6, 12"));
  CHECK_THROWS_WITH(check_ulysses_config(12, 4, 24, 6),
                    Contains("sp is not a multiple of the kv heads") && Contains(": 1, 2, 4, 12"));
  CHECK_THROWS_WITH(check_ulysses_config(8, 8, 100, 8),
                    Contains("sequence length is not divisible by sp") && Contains(": 1, 2, 4"));
  CHECK_THROWS_WITH(check_ulysses_config(8, 3, 64, 2), Contains("multiple of the kv heads"));
  CHECK_THROWS_WITH(check_ulysses_config(8, 8, 64, 0), Contains("must all be positive"));
}
