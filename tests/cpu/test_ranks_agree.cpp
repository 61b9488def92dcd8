// Every rank must run the same job (engine/ranks_agree.h): a rank whose flags, model or data files
// differ from rank 0's is refused at start-up, on every rank, naming the rank, the field and its flag.
// Rank threads only record results (Catch2 is not thread-safe); the checks run on the main thread.
#include <catch2/catch.hpp>

#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "engine/options.h"
#include "engine/ranks_agree.h"
#include "engine/trainer.h"
#include "options_from.h"
#include "parallel/comm_local.h"
#include "temp_dir.h"

namespace {

// Each rank's exception message ("" if it did not throw).
std::vector<std::string> messages_of(int ranks, const std::function<void(ul::Comm&)>& body) {
  std::vector<std::string> what(ranks);
  std::mutex mu;
  try {
    ul::run_local(ranks, [&](ul::Comm& world) {
      try {
        body(world);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        what[world.rank()] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  return what;
}

}  // namespace

TEST_CASE("ranks that agree pass and one field off on one rank is refused on every rank", "[ranks_agree]") {
  auto fields = [](int rank, int odd_rank) {
    std::vector<ul::RunField> f = {{"seq", "64", "--seq"}, {"data_files", "\"3 file(s)\"", "--data"}, {"seed", "1", "--seed"}};
    if (rank == odd_rank) f[1].json = "\"2 file(s)\"";
    return f;
  };
  for (int P : {1, 2, 3}) {
    const std::vector<std::string> same = messages_of(P, [&](ul::Comm& w) { ul::check_ranks_agree(w, fields(w.rank(), -1)); });
    for (int r = 0; r < P; r++) CHECK(same[r].empty());
  }
  const std::vector<std::string> odd = messages_of(3, [&](ul::Comm& w) { ul::check_ranks_agree(w, fields(w.rank(), 2)); });
  for (int r = 0; r < 3; r++) {
    INFO("rank " << r << ": " << odd[r]);
    CHECK(odd[r].find("rank 2 runs with another data_files than rank 0 (--data)") != std::string::npos);
    CHECK(odd[r].find("rank " + std::to_string(r) + " has \"" + (r == 2 ? "2" : "3") + " file(s)\"") != std::string::npos);
  }
  // Rank 0 odd: every other rank differs from it; the first is named.
  const std::vector<std::string> first = messages_of(3, [&](ul::Comm& w) { ul::check_ranks_agree(w, fields(w.rank(), 0)); });
  for (int r = 0; r < 3; r++) CHECK(first[r].find("rank 1 runs with another data_files") != std::string::npos);
}

TEST_CASE("a trainer whose ranks see other flags or other data refuses to start", "[ranks_agree]") {
  ul_test::TempDir dir;
  const std::string a = (dir.path / "a.txt").string(), b = (dir.path / "b.txt").string();
  for (const std::string& p : {a, b}) {
    std::ofstream f(p);
    for (int i = 0; i < 400; i++) f << (p == a ? "alpha " : "omega ") << i << '\n';
  }
  const std::string common = "--threads 1 --quiet --ranks 2 --seq 32 --batch 1 --layers 1 --dim 32 --heads 4 ";
  auto start = [&](const std::string& rank0, const std::string& rank1) {
    return messages_of(2, [&](ul::Comm& w) {
      const std::string mine = w.rank() == 0 ? rank0 : rank1;
      const ul::Options o = ul_test::options(common + mine + (mine.find("--steps") == std::string::npos ? " --steps 1" : ""));
      ul::Trainer tr(o, w);
    });
  };
  const std::vector<std::string> ok = start("--data text:" + a, "--data text:" + a);
  CHECK((ok[0].empty() && ok[1].empty()));
  const std::vector<std::string> seed = start("--data text:" + a + " --seed 1", "--data text:" + a + " --seed 2");
  for (const std::string& m : seed) CHECK(m.find("rank 1 runs with another seed than rank 0 (--seed)") != std::string::npos);
  const std::vector<std::string> data = start("--data text:" + a, "--data text:" + b);
  for (const std::string& m : data) CHECK(m.find("rank 1 runs with another data than rank 0 (--data)") != std::string::npos);
  // The same spec: a dp replica on another schedule.
  const std::vector<std::string> steps = start("--data text:" + a + " --steps 2", "--data text:" + a + " --steps 3");
  for (const std::string& m : steps) CHECK(m.find("rank 1 runs with another steps than rank 0 (--steps)") != std::string::npos);
  // Any other flag: the command line, each rank's own in its message (--threads may differ).
  const std::vector<std::string> evals = start("--data text:" + a + " --eval-batches 1", "--data text:" + a + " --eval-batches 2");
  CHECK(evals[0].find("rank 1 runs with another command_line than rank 0") != std::string::npos);
  CHECK(evals[1].find("--eval-batches 2") != std::string::npos);
  const std::vector<std::string> threads = start("--data text:" + a + " --threads 2", "--data text:" + a + " --quiet");
  CHECK((threads[0].empty() && threads[1].empty()));
}

TEST_CASE("the weights once loaded: a fingerprint that tells other weights apart, compared over the ranks",
          "[ranks_agree]") {
  // Params::fingerprint samples the buffer: equal for equal weights, different for another seed's
  // (they differ everywhere) and for one sampled element changed.
  auto fingerprints = [](const std::string& args) {
    const ul::Options o = ul_test::options("--dim 32 --heads 2 --layers 1 --seq 16 --threads 1 " + args);
    std::vector<uint32_t> fp;
    ul::run_local(1, [&](ul::Comm& world) {
      ul::Trainer tr(o, world);
      ul::Params& p = tr.model().params;
      fp.push_back(p.fingerprint());
      p.data()[0] += 1.0f;  // the first element is always sampled
      fp.push_back(p.fingerprint());
    });
    return fp;
  };
  const std::vector<uint32_t> a = fingerprints("--seed 1"), b = fingerprints("--seed 1"), c = fingerprints("--seed 2");
  CHECK(a == b);
  CHECK(a[0] != c[0]);
  CHECK(a[0] != a[1]);
  // Over the ranks: rank 2 of 3 with other weights is refused on every rank, naming the source.
  const std::vector<std::string> odd = messages_of(3, [&](ul::Comm& w) {
    ul::check_same_weights(w, w.rank() == 2 ? 7u : 5u, "loading --checkpoint m.bin", ul::kSameFile);
  });
  for (const std::string& m : odd)
    CHECK(m.find("rank 2 holds other weights than rank 0 after loading --checkpoint m.bin") != std::string::npos);
  const std::vector<std::string> same = messages_of(3, [&](ul::Comm& w) { ul::check_same_weights(w, 5u, "x", "y"); });
  for (const std::string& m : same) CHECK(m.empty());
}
