// --loss-by-position: the classifier's per-token losses, the bands, and the Trainer's eval split
// into them (sp 2 as sp 1, positions in the document with --doc-mask), the line and the log keys.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/trainer.h"
#include "gradcheck.h"
#include "fresh_eval.h"
#include "layers/classifier.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::TempDir;

TEST_CASE("position bands: powers of two from 64, at most 9, the last ending at T", "[loss_by_position]") {
  using Bands = std::vector<std::pair<int, int>>;
  CHECK(ul::position_bands(10) == Bands{{0, 10}});
  CHECK(ul::position_bands(64) == Bands{{0, 64}});
  CHECK(ul::position_bands(65) == Bands{{0, 64}, {64, 65}});
  CHECK(ul::position_bands(256) == Bands{{0, 64}, {64, 128}, {128, 256}});
  CHECK(ul::position_bands(1000) == Bands{{0, 64}, {64, 128}, {128, 256}, {256, 512}, {512, 1000}});
  CHECK(ul::position_bands(16384) == Bands{{0, 64}, {64, 128}, {128, 256}, {256, 512}, {512, 1024}, {1024, 2048},
                                           {2048, 4096}, {4096, 8192}, {8192, 16384}});
  const Bands m = ul::position_bands(1 << 20);  // a million tokens: the first band widened to 4096
  REQUIRE(m.size() == 9);
  CHECK(m.front() == std::make_pair(0, 4096));
  CHECK(m.back() == std::make_pair(1 << 19, 1 << 20));
  for (int T : {1, 63, 300, 16385, 100000, 1 << 21}) {  // contiguous, covering [0, T), at most 9
    const Bands b = ul::position_bands(T);
    INFO("T=" << T);
    CHECK(b.size() <= 9);
    CHECK(b.front().first == 0);
    CHECK(b.back().second == T);
    for (size_t k = 1; k < b.size(); k++) CHECK(b[k].first == b[k - 1].second);
  }
  // --probe-lengths: a shorter row takes the longest one's bands, cut at its length, so a row of
  // the length table is one band (a row at 1000 beside one at 2^20 starts with [0, 4096)).
  CHECK(ul::position_bands(1000, 1 << 20) == Bands{{0, 1000}});
  CHECK(ul::position_bands(20000, 40000) == Bands{{0, 256}, {256, 512}, {512, 1024}, {1024, 2048}, {2048, 4096},
                                                  {4096, 8192}, {8192, 16384}, {16384, 20000}});
  CHECK(ul::position_bands(1000, 16384) == ul::position_bands(1000));
  CHECK(ul::position_bands(17000, 500) == ul::position_bands(17000));  // widest below T: T's own
}

TEST_CASE("the classifier's per-token losses: -log softmax at the target, 0 where ignored", "[loss_by_position]") {
  ul::Context c;
  ul::ContextGuard guard(c);
  const int N = 37, C = 16, V = 50;
  ul::Tensor x = c.empty({N, C}), w = c.empty({64, C}), tg = c.empty({N}, ul::DType::i32);
  const auto xv = ul_test::randn_f(size_t(N) * C, 1), wv = ul_test::randn_f(size_t(64) * C, 2);
  std::copy(xv.begin(), xv.end(), x.f32());
  std::copy(wv.begin(), wv.end(), w.f32());
  for (int n = 0; n < N; n++) tg.i32()[n] = n % 5 == 2 ? -1 : (n * 7) % V;  // ignored rows between valid ones
  std::vector<float> rows(N, -1.f);
  const ul::CrossEntropyStats st = ul::classifier_cross_entropy(x, w, tg, V, 1.0f, rows.data());
  double sum = 0;
  for (int n = 0; n < N; n++) {
    INFO("row " << n);
    if (tg.i32()[n] < 0) {
      CHECK(rows[n] == 0.f);
      continue;
    }
    double mx = -1e300, z = 0, at = 0;  // the definition in double
    std::vector<double> logit(V);
    for (int v = 0; v < V; v++) {
      for (int k = 0; k < C; k++) logit[v] += double(xv[size_t(n) * C + k]) * wv[size_t(v) * C + k];
      mx = std::max(mx, logit[v]);
    }
    for (int v = 0; v < V; v++) z += std::exp(logit[v] - mx);
    at = logit[tg.i32()[n]];
    CHECK(std::fabs(rows[n] - (std::log(z) + mx - at)) < 1e-4);
    sum += rows[n];
  }
  CHECK(std::fabs(sum - st.loss_sum) < 1e-5 * st.loss_sum);
}

namespace {

ul::EvalResult eval_on(const std::string& args, int ranks) {
  return ul_test::fresh_eval("--threads 1 --quiet --eval-every 0 --eval-batches 2 --seq 192 --batch 2 --layers 2 "
                             "--dim 32 --heads 4 " + args, ranks);
}

}  // namespace

TEST_CASE("the eval by position: the bands add up to the val loss, sp 2 as sp 1, in-document positions",
          "[loss_by_position]") {
  TempDir dir;
  const std::string file = (dir.path / "lines.txt").string();
  {
    std::ofstream f(file, std::ios::binary);
    for (int i = 0; i < 2000; i++) f << "line " << (i * 7919) % 1000 << (i % 3 ? " ab" : " cde") << '\n';
  }
  for (std::string model : {"gpt2", "llama"}) {
    INFO(model);
    const std::string base = "--model " + model + " --data text:" + file + " --loss-by-position";
    const ul::EvalResult r = eval_on(base, 1);
    REQUIRE(r.by_position.size() == 3);  // T = 192: [0, 64), [64, 128), [128, 192)
    CHECK(r.by_position[2].lo == 128);
    CHECK(r.by_position[2].hi == 192);
    double loss = 0;
    int64_t n = 0;
    for (const ul::PositionLoss& p : r.by_position) {
      // Text scores every position: each band holds its width times the 4 sequences (2 batches of 2).
      CHECK(p.count == 4 * (p.hi - p.lo));
      CHECK(std::isfinite(p.loss));
      loss += p.loss * double(p.count);
      n += p.count;
    }
    CHECK(n == r.answers);
    CHECK(std::fabs(loss / double(n) - r.loss) < 1e-6 * r.loss);

    // Under sp each rank scores its own slice of positions: the same bands in the end.
    const ul::EvalResult r2 = eval_on(base + " --sp 2", 2);
    REQUIRE(r2.by_position.size() == r.by_position.size());
    for (size_t k = 0; k < r.by_position.size(); k++) {
      CHECK(r2.by_position[k].count == r.by_position[k].count);
      CHECK(std::fabs(r2.by_position[k].loss - r.by_position[k].loss) < 1e-5 * r.by_position[k].loss);
    }

    // With --doc-mask a position is in the document: every line starts one, so all of them fall
    // into the first band (each line is far shorter than 64 bytes).
    const ul::EvalResult d = eval_on(base + " --doc-mask --eot 10", 1);
    CHECK(d.by_position[0].count == d.answers);
    CHECK(d.by_position[1].count == 0);
  }
  CHECK(eval_on("--data text:" + file, 1).by_position.empty());  // only when asked
}

TEST_CASE("train --loss-by-position prints the bands after each eval and logs them", "[loss_by_position]") {
  TempDir dir;
  const std::string log = (dir.path / "run.jsonl").string();
  const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(
      "--data recall --seq 128 --batch 2 --steps 2 --eval-every 1 --eval-batches 1 --threads 1 --loss-by-position "
      "--log " + log));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("eval      1 | val loss by position | 0-63 ") != std::string::npos);
  CHECK(r.out.find(" | 64-127 ") != std::string::npos);
  std::ifstream f(log);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  CHECK(text.find("\"val_loss_pos_64\":") != std::string::npos);
}
