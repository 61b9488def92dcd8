// --probe-lengths (engine/length_probe.h): the decoder's accuracy scores exactly what the full
// forward predicts and its per-token losses are the full forward's; the rows at the run's own
// length equal its eval (passkey: and its depth probes; text: and its loss by position); the log
// records and the refusals.
#include <catch2/catch.hpp>
#include <cstdint>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/dataset.h"
#include "engine/length_probe.h"
#include "engine/planner.h"
#include "engine/probe_plot.h"
#include "engine/run_log.h"
#include "engine/sample.h"
#include "parallel/comm_local.h"
#include "parallel/hosts.h"
#include "model_logits.h"
#include "run_cmd.h"
#include "temp_dir.h"

using namespace ul;
using ul_test::full_logits;
using ul_test::host_params;
using ul_test::small;

namespace {

// Fixed sequences with the targets a test chose: a synthetic task, as far as the probe can tell.
class FixedTask : public Dataset {
 public:
  FixedTask(std::vector<std::vector<int32_t>> in, std::vector<std::vector<int32_t>> tgt, int vocab)
      : in_(std::move(in)), tgt_(std::move(tgt)), vocab_(vocab) {}
  int vocab() const override { return vocab_; }
  int64_t num_sequences(int) const override { return int64_t(in_.size()); }
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override {
    REQUIRE(T == int(in_[size_t(i)].size()));
    std::copy(in_[size_t(i)].begin(), in_[size_t(i)].end(), inputs);
    std::copy(tgt_[size_t(i)].begin(), tgt_[size_t(i)].end(), targets);
  }
  bool synthetic() const override { return true; }
  std::string describe() const override { return "fixed"; }

 private:
  std::vector<std::vector<int32_t>> in_, tgt_;
  int vocab_;
};

int argmax(const float* row, int V) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

// -log softmax(z)[target] over V logits, in double.
double neg_log_softmax(const float* z, int V, int target) {
  double mx = z[0], sum = 0;
  for (int v = 1; v < V; v++) mx = std::max(mx, double(z[v]));
  for (int v = 0; v < V; v++) sum += std::exp(z[v] - mx);
  return std::log(sum) + mx - z[target];
}

// The number in "<label>12.34%" after position `from` of `text`, as a fraction.
double percent_after(const std::string& text, const std::string& label, size_t from) {
  const size_t at = text.find(label, from);
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + label.size())) / 100.0;
}

// Finite weights whose logits overflow: the final norm's weight and the head scaled by 1e30 (all
// of them: the norms would take a scaled earlier weight back).
void overflow_logits(const Transformer& m, std::vector<float>& h) {
  for (const ParamSpec& p : m.params.specs())
    if (p.name == "lnfw" || p.name == "lm_head")
      for (size_t i = 0; i < size_t(p.shape.numel()); i++) h[p.offset + i] *= 1e30f;
}

}  // namespace

TEST_CASE("the decoded accuracy counts exactly the targets the full forward predicts", "[length_probe]") {
  omp_set_num_threads(1);
  for (int window : {0, 6}) {
    CAPTURE(window);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small("llama");
    cfg.sliding_window = window;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 31);
    const int T = 20, V = cfg.vocab;
    std::vector<std::vector<int32_t>> in, hit, miss;
    Rng rng(9);
    for (int i = 0; i < 3; i++) {  // scored positions: the first one early, gaps, the last one last
      std::vector<int32_t> seq(T);
      for (int32_t& t : seq) t = int32_t(rng.uniform() * V) % V;
      c.arena.reset();
      const std::vector<float> logits = full_logits(m, seq);
      std::vector<int32_t> right(T, -1), wrong(T, -1);
      for (int t : {2 + i, 7, 8, 13, T - 1}) {
        right[size_t(t)] = argmax(&logits[size_t(t) * V], V);
        wrong[size_t(t)] = (right[size_t(t)] + 1) % V;
      }
      in.push_back(seq), hit.push_back(right), miss.push_back(wrong);
    }
    int64_t answers = 0;
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, hit, V), T, 3, &answers) == 1.0);
    CHECK(answers == 15);
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, miss, V), T, 3, &answers) == 0.0);
    // Whole answers (runs of scored targets: position 2 + i, 7-8, 13, the last): with only 8 missed,
    // 4 of 5 tokens and 3 of 4 answers are right.
    std::vector<std::vector<int32_t>> one_off = hit;
    for (size_t i = 0; i < one_off.size(); i++) one_off[i][8] = miss[i][8];
    double whole = -1;
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, one_off, V), T, 3, &answers, {}, &whole) ==
          Approx(0.8));
    CHECK(whole == Approx(0.75));
    // The same with 7 missed, the run's first token: its last right does not make the answer right.
    one_off = hit;
    for (size_t i = 0; i < one_off.size(); i++) one_off[i][7] = miss[i][7];
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, one_off, V), T, 3, &answers, {}, &whole) ==
          Approx(0.8));
    CHECK(whole == Approx(0.75));
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, hit, V), T, 3, &answers, {}, &whole) == 1.0);
    CHECK(whole == 1.0);
    // Two sequences of three: ten answer tokens.
    CHECK(decoded_accuracy(cfg, m.params.specs(), h.data(), FixedTask(in, hit, V), T, 2, &answers) == 1.0);
    CHECK(answers == 10);
  }
}

TEST_CASE("KvDecoder::score gives the full forward's -log p of every target", "[length_probe]") {
  omp_set_num_threads(1);
  for (const std::string arch : {"gpt2", "llama"}) {
    CAPTURE(arch);
    Context c;
    ContextGuard g(c);
    Transformer m(small(arch));
    const std::vector<float> h = host_params(m, 37);
    const int T = 22, V = m.cfg.vocab;
    std::vector<int32_t> seq(T), tgt(T);
    Rng rng(4);
    for (int t = 0; t < T; t++) {
      seq[size_t(t)] = int32_t(rng.uniform() * V) % V;
      tgt[size_t(t)] = t % 5 == 3 ? -1 : int32_t(rng.uniform() * V) % V;  // some ignored
    }
    const std::vector<float> logits = full_logits(m, seq);
    const std::vector<int> tokens(seq.begin(), seq.end());
    for (int chunk : {7, 64}) {
      CAPTURE(chunk);
      KvDecoder dec(m.cfg, m.params.specs(), h.data(), T, chunk);
      std::vector<float> nll(T, -1.0f);
      dec.score(tokens.data(), tgt.data(), T, nll.data());
      CHECK(dec.position() == T);
      for (int t = 0; t < T; t++) {
        CAPTURE(t);
        if (tgt[size_t(t)] < 0) {
          CHECK(nll[size_t(t)] == 0.0f);
          continue;
        }
        const double want = neg_log_softmax(&logits[size_t(t) * V], V, tgt[size_t(t)]);
        CHECK(std::fabs(nll[size_t(t)] - want) < 1e-5 * std::max(1.0, want));
      }
    }
    KvDecoder dec(m.cfg, m.params.specs(), h.data(), T);
    std::vector<int32_t> bad = tgt;
    bad[5] = V;
    std::vector<float> nll(T);
    CHECK_THROWS_WITH(dec.score(tokens.data(), bad.data(), T, nll.data()), Catch::Contains("target 50 is outside the vocab"));
  }
}

TEST_CASE("a probe whose loss is not finite fails, as the eval does, rather than print nan", "[length_probe]") {
  omp_set_num_threads(1);
  Context c;
  ContextGuard g(c);
  Transformer m(small("llama"));
  std::vector<float> h = host_params(m, 37);
  std::vector<int32_t> stream(40);
  for (size_t i = 0; i < stream.size(); i++) stream[i] = int32_t(i * 7 % size_t(m.cfg.vocab));
  const LengthProbe fine = decoded_loss(m.cfg, m.params.specs(), h.data(), stream, 16, 2, -1, nullptr);
  CHECK(std::isfinite(fine.loss));
  CHECK(fine.answers == 32);
  REQUIRE(m.cfg.has_lm_head());
  overflow_logits(m, h);
  CHECK_THROWS_WITH(decoded_loss(m.cfg, m.params.specs(), h.data(), stream, 16, 2, -1, nullptr),
                    Catch::Contains("--probe-lengths 16: the val loss is not finite") &&
                        Catch::Contains("over 32 targets): the weights' outputs overflow"));
}

TEST_CASE("a synthetic task's probe whose logits are not finite fails on every rank together", "[length_probe]") {
  // One sequence over two ranks: rank 0 decodes it, rank 1 has none and waits in the all-reduce.
  // Rank 0 must not throw alone (its peers would wait there for it): both get the same JobError.
  omp_set_num_threads(1);
  Context c;
  ContextGuard g(c);
  Transformer m(small("llama"));
  std::vector<float> h = host_params(m, 41);
  overflow_logits(m, h);
  const int T = 12, V = m.cfg.vocab;
  std::vector<int32_t> in(T), tgt(T, -1);
  for (int t = 0; t < T; t++) in[size_t(t)] = (t * 5) % V;
  tgt[size_t(T - 2)] = 3, tgt[size_t(T - 1)] = 4;
  const FixedTask task({in}, {tgt}, V);
  std::vector<std::string> error(2);
  run_local(2, [&](Comm& world) {
    try {
      probe_length(m.cfg, m.params.specs(), h.data(), task, T, T, 1, -1, &world, {});
    } catch (const JobError& e) {
      error[size_t(world.rank())] = e.what();
    }
  });
  for (const std::string& e : error) CHECK(e == "--probe-lengths 12: the model's logits are not finite (all): the "
                                                "weights' outputs overflow");
}

TEST_CASE("with packed documents the decoder attends within each and counts positions from its start", "[length_probe][doc]") {
  omp_set_num_threads(1);
  struct Case { std::string arch; int window; };
  for (const Case& k : {Case{"gpt2", 0}, Case{"llama", 0}, Case{"llama", 5}}) {
    CAPTURE(k.arch, k.window);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small(k.arch);
    cfg.sliding_window = k.window;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 41);
    const int T = 23, V = cfg.vocab, eot = 7;
    std::vector<int32_t> seq(T), tgt(T);
    Rng rng(8);
    for (int t = 0; t < T; t++) seq[size_t(t)] = 8 + int32_t(rng.uniform() * (V - 8)) % (V - 8), tgt[size_t(t)] = t % 4;
    for (int t : {0, 6, 7, 15}) seq[size_t(t)] = eot;  // documents [0,6) [6,7) [7,15) [15,23)
    const std::vector<float> logits = full_logits(m, seq, eot);
    const std::vector<int> tokens(seq.begin(), seq.end());
    for (int chunk : {4, 64}) {
      CAPTURE(chunk);
      KvDecoder dec(cfg, m.params.specs(), h.data(), T, chunk);
      dec.set_document_token(eot);
      std::vector<float> nll(T);
      dec.score(tokens.data(), tgt.data(), T, nll.data());
      for (int t = 0; t < T; t++) {
        CAPTURE(t);
        const double want = neg_log_softmax(&logits[size_t(t) * V], V, tgt[size_t(t)]);
        CHECK(std::fabs(nll[size_t(t)] - want) < 1e-5 * std::max(1.0, want));
      }
    }
    // Without the document token the same tokens give other losses after the first document.
    KvDecoder open(cfg, m.params.specs(), h.data(), T);
    std::vector<float> a(T), b(T);
    open.score(tokens.data(), tgt.data(), T, a.data());
    KvDecoder packed(cfg, m.params.specs(), h.data(), T);
    packed.set_document_token(eot);
    packed.score(tokens.data(), tgt.data(), T, b.data());
    CHECK(a[3] == b[3]);
    CHECK(std::fabs(a[20] - b[20]) > 1e-4);
  }
}

TEST_CASE("train --probe-lengths: the grid at --seq is the eval, at other lengths a row each, logged", "[length_probe][cli]") {
  using namespace ul_test;
  TempDir dir;
  const std::string log = dir / "log.jsonl";
  for (const std::string layout : {"", " --ranks 2 --sp 2"}) {
    CAPTURE(layout);
    CmdResult r = run_cmd(train_cmd("--steps 10 --eval-every 0 --eval-batches 2 --batch 4 --seq 96 --threads 1"
                                    " --probe-lengths 96,40,200 --log " + log + layout));
    REQUIRE(r.code == 0);
    const size_t eval = r.out.find("eval     10 |"), probe = r.out.find("probe    10 |");
    const size_t at96 = r.out.find("length     96 | all: "), at40 = r.out.find("length     40 |");
    const size_t at200 = r.out.find("length    200 |");
    REQUIRE((eval != std::string::npos && probe != std::string::npos && at96 != std::string::npos));
    CHECK((at40 != std::string::npos && at200 != std::string::npos));
    CHECK(r.out.find("(accuracy, 40 answer tokens each;") != std::string::npos);  // 2 batches x 4 sequences x 5 digits
    // At the run's own length the decoder scores what the eval's forward scored: the same argmax
    // over 40 answer tokens, so the same accuracy (one token of slack for a near tie of two logits,
    // whose order the decoder's other summation order may flip; both printed to 0.01%).
    const double slack = 1.0 / 40 + 1e-4;
    CHECK(std::fabs(percent_after(r.out, "length     96 | all: ", 0) - percent_after(r.out, "accuracy ", eval)) < slack);
    // A model this young predicts one digit everywhere (10%): the loss tells more. The decoder's
    // -log p of the same 40 answers is the eval's val loss, to float rounding.
    double eval_loss = -1, row_loss = -2;
    std::string eval_whole, row_whole;  // the answers counted whole: 2 batches x 4 sequences
    for (const LogRecord& rec : read_run_log(log)) {
      if (rec.at("type") == "eval") eval_loss = std::stod(rec.at("val_loss")), eval_whole = rec.at("whole_answers");
      if (rec.at("type") == "length" && rec.at("T") == "96")
        row_loss = std::stod(rec.at("val_loss")), row_whole = rec.at("whole_answers");
    }
    CHECK(std::fabs(row_loss - eval_loss) < 1e-5 * eval_loss);
    CHECK(eval_whole == "8");
    CHECK(row_whole == "8");
    for (const char* depth : {"depth 0: ", "depth 0.25: ", "depth 0.5: ", "depth 0.75: ", "depth 1: "}) {
      CAPTURE(depth);
      CHECK(std::fabs(percent_after(r.out, depth, at96) - percent_after(r.out, depth, probe)) < slack);
    }
    const std::vector<LogRecord> recs = read_run_log(log);
    int rows = 0;
    for (const LogRecord& rec : recs) {
      if (rec.at("type") != "length") continue;
      rows++;
      CHECK(rec.count("acc_all") == 1);
      CHECK(rec.count("acc_depth_0.75") == 1);
      if (rec.at("T") == "96") CHECK(std::fabs(std::stod(rec.at("acc_all")) - percent_after(r.out, "length     96 | all: ", 0)) < 1e-4);
    }
    CHECK(rows == 3);
  }
}

TEST_CASE("a long --probe-lengths window says how far into it the decoder got (--heartbeat)", "[length_probe][cli]") {
  using namespace ul_test;
  // A 600-token window runs in chunks of 256 rows: a heartbeat so short that every call prints
  // shows each chunk's place, not only each finished window (a 64K window of a large model is minutes).
  CmdResult r = run_cmd(train_cmd("--steps 1 --eval-every 0 --eval-batches 1 --batch 2 --seq 96 --threads 1 "
                                  "--probe-lengths 600 --heartbeat 0.000001"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  // (passkey: six cells, the whole val set and one per needle depth, each named with its place)
  CHECK(r.out.find("all (1/6) 0/2 sequences, position 256/600 of the next done") != std::string::npos);
  CHECK(r.out.find("all (1/6) 1/2 sequences, position 512/600 of the next done") != std::string::npos);
  CHECK(r.out.find("all (1/6) 2/2 sequences done") != std::string::npos);
  CHECK(r.out.find("depth 1 (6/6) 2/2 sequences done") != std::string::npos);
}

TEST_CASE("a passkey probe's cells are shared out in turn: fewer windows than ranks leave no rank with all six",
          "[length_probe][cli]") {
  using namespace ul_test;
  // One window per cell (dp 1 x --batch 1 x --eval-batches 1) on 2 ranks: rank 0 (whose progress
  // lines print) decodes all, depth 0.25 and depth 0.75, rank 1 the other three. Once rank 0 took
  // every cell's window and rank 1 waited in the all-reduce for six decodes (past --comm-timeout at
  // long T).
  CmdResult r = run_cmd(train_cmd("--model llama --ranks 2 --sp 2 --batch 1 --eval-batches 1 --steps 1 --seq 64 "
                                  "--threads 1 --eval-every 0 --probe-lengths 128 --heartbeat 0.000001"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (const char* cell : {"all (1/6)", "depth 0.25 (3/6)", "depth 0.75 (5/6)"})
    CHECK(r.out.find(std::string("length 128 | ") + cell + " 1/1 sequences (this rank's share) done") != std::string::npos);
  for (const char* cell : {"depth 0 ", "depth 0.5", "depth 1 "})
    CHECK(r.out.find(std::string("length 128 | ") + cell) == std::string::npos);
  CHECK(r.out.find("length    128 | all: ") != std::string::npos);
}

TEST_CASE("train --probe-lengths refuses what it cannot probe, before training", "[length_probe][cli]") {
  using namespace ul_test;
  TempDir dir;
  const std::string text = dir / "t.txt";
  std::ofstream(text) << std::string(5000, 'a');
  struct Bad { std::string args, message; };
  for (const Bad& b : {Bad{"--model llama --probe-lengths 2000000000", "--probe-lengths 2000000000: the KV-cache decoder needs "},
                       Bad{"--model llama --data text:" + text + " --seq 64 --probe-lengths 64,4096", "--probe-lengths 4096: the val split (text "},
                       Bad{"--model gpt2 --max-seq 256 --probe-lengths 128,512", "--probe-lengths 512: longer than the model's max sequence 256"},
                       Bad{"--probe-lengths 8", "--probe-lengths 8: passkey: sequence length 8 is too short"},
                       Bad{"--probe-lengths 64,,128", "--probe-lengths: expected an integer, got ''"},
                       Bad{"--probe-lengths 0", "--probe-lengths: lengths must be >= 1, got 0"}}) {
    CAPTURE(b.args);
    const CmdResult r = run_cmd(train_cmd("--steps 2 --threads 1 " + b.args));
    CHECK(r.code != 0);
    CHECK(r.out.find(b.message) != std::string::npos);
    CHECK(r.out.find("step ") == std::string::npos);
  }
}

TEST_CASE("train --probe-lengths on text: the row at --seq is the eval's loss and its bands, with --doc-mask too", "[length_probe][cli]") {
  using namespace ul_test;
  TempDir dir;
  const std::string text = dir / "t.txt", log = dir / "log.jsonl";
  {
    std::ofstream f(text);
    Rng rng(3);
    for (int i = 0; i < 40000; i++) f << char('a' + int(rng.uniform() * 6) % 6) << (i % 7 == 6 ? " " : "") << (i % 90 == 89 ? "\n" : "");
  }
  // Also with packed documents: a newline opens each (--eot 10, every ~100 bytes), so the bands count
  // from line starts.
  for (const std::string layout : {"", " --ranks 2 --sp 2", " --doc-mask --eot 10"}) {
    CAPTURE(layout);
    CmdResult r = run_cmd(train_cmd("--data text:" + text + " --model llama --steps 20 --eval-every 0 --eval-batches 2"
                                    " --batch 2 --seq 128 --threads 1 --loss-by-position --probe-lengths 128,300 --log " +
                                    log + layout));
    REQUIRE(r.code == 0);
    CHECK(r.out.find("length    300 | val loss ") != std::string::npos);
    CHECK(std::filesystem::exists(dir / "log_lengths.svg"));  // the table, beside the loss plot
    std::map<std::string, std::string> eval, at128;
    for (const LogRecord& rec : read_run_log(log)) {
      if (rec.at("type") == "eval") eval = rec;
      if (rec.at("type") == "length" && rec.at("T") == "128") at128 = rec;
    }
    REQUIRE(!eval.empty());
    REQUIRE(!at128.empty());
    CHECK(at128.at("answers") == "512");  // 2 batches x 2 sequences x 128 targets
    for (const char* key : {"val_loss", "val_loss_pos_0", "val_loss_pos_64"}) {
      CAPTURE(key);
      const double a = std::stod(eval.at(key)), b = std::stod(at128.at(key));
      CHECK(std::fabs(a - b) < 1e-5 * a);
    }
  }

  // Val split over several shard files: a stretch of text ends with each (its last (count - 1) % T
  // tokens are in no sequence), so the windows stay inside one file, and at --seq are the eval's
  // sequences exactly (joined across files, each file's last target was the next file's first token).
  const std::string sh = dir / "sh";
  REQUIRE(run_cmd(train_cmd("prepare --out " + sh + " --val-frac 0.5 --shard-tokens 300 " + text)).code == 0);
  CmdResult r = run_cmd(train_cmd("--data 'shards:" + sh + "/text_*.bin' --model llama --steps 20 --eval-every 0 "
                                  "--eval-batches 2 --batch 2 --seq 128 --threads 1 --probe-lengths 128,256 --log " + log));
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::map<std::string, std::string> eval, at128;
  for (const LogRecord& rec : read_run_log(log)) {
    if (rec.at("type") == "eval") eval = rec;
    if (rec.at("type") == "length" && rec.at("T") == "128") at128 = rec;
  }
  REQUIRE((!eval.empty() && !at128.empty()));
  CHECK(std::fabs(std::stod(eval.at("val_loss")) - std::stod(at128.at("val_loss"))) < 1e-5 * std::stod(eval.at("val_loss")));
  CHECK(r.out.find("length    256 | val loss ") != std::string::npos);  // 257 tokens: one file's stretch
  r = run_cmd(train_cmd("--data 'shards:" + sh + "/text_*.bin' --model llama --steps 1 --seq 128 --threads 1 "
                        "--probe-lengths 300"));
  CHECK(r.out.find("--probe-lengths 300: the val split") != std::string::npos);
  CHECK(r.out.find("holds 257 tokens in a row at --seq 128; a window needs 301") != std::string::npos);
  // A short first val file does not hide a long second one: windows are counted stretch by stretch.
  const std::string mixed = dir / "mixed";
  std::filesystem::create_directories(mixed);
  auto shard = [&](const std::string& name, int count) {
    std::ofstream f(mixed + "/" + name, std::ios::binary);
    int32_t h[256] = {20240520, 1, count};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    for (int i = 0; i < count; i++) {
      const uint16_t t = uint16_t(97 + (i * 7) % 20);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
  };
  shard("d_train_0.bin", 4000);
  shard("d_val_0.bin", 100);
  shard("d_val_1.bin", 5000);
  r = run_cmd(train_cmd("--data 'shards:" + mixed + "/*.bin' --vocab 128 --model llama --steps 1 --seq 64 --threads 1 "
                        "--eval-batches 1 --probe-lengths 100"));
  CHECK(r.code == 0);
  CHECK(r.out.find("length    100 | val loss") != std::string::npos);
  // A token id past the vocabulary that the evals do not reach but a longer probe does: the run
  // fails on it, and the log's last record says so (as a step's or an eval's failure does).
  const std::string bad = dir / "bad";
  std::filesystem::create_directories(bad);
  std::filesystem::copy_file(mixed + "/d_train_0.bin", bad + "/d_train_0.bin");
  {
    std::ofstream f(bad + "/d_val_0.bin", std::ios::binary);
    int32_t h[256] = {20240520, 1, 5000};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    for (int i = 0; i < 5000; i++) {
      const uint16_t t = uint16_t(i >= 1000 && i < 1100 ? 200 : 97 + (i * 7) % 20);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  // On 2 ranks too: their failures are agreed on (engine/ranks_agree.h) before the probe's all-reduce.
  for (const std::string ranks : {"", " --ranks 2"}) {
    CAPTURE(ranks);
    std::filesystem::remove(log);
    r = run_cmd(train_cmd("--data 'shards:" + bad + "/*.bin' --vocab 128 --model llama --steps 1 --seq 64 --batch 2 "
                          "--threads 1 --eval-batches 1 --probe-lengths 500 --log " + log + ranks));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find("eval      1 | val loss") != std::string::npos);  // the eval read only good tokens
    const std::vector<LogRecord> records = read_run_log(log);
    REQUIRE(!records.empty());
    CHECK(records.back().at("type") == "error");
    CHECK(records.back().at("message").find(bad + "/d_val_0.bin: token id 200") != std::string::npos);
    CHECK(records.back().at("message").find("length 500: ") == 0);
  }
}

TEST_CASE("the --probe-lengths table: one cell per row and length, coloured by value", "[length_probe][plot]") {
  auto rec = [](std::map<std::string, std::string> m) { return LogRecord(m.begin(), m.end()); };
  // A passkey run probed at two lengths, and an older probe of another step that is not drawn.
  const std::vector<LogRecord> passkey = {
      rec({{"type", "step"}, {"step", "10"}, {"loss", "1"}}),
      rec({{"type", "length"}, {"step", "5"}, {"T", "64"}, {"acc_all", "0.01"}}),
      rec({{"type", "length"}, {"step", "10"}, {"T", "512"}, {"acc_all", "0.25"}, {"acc_depth_0", "0"}, {"acc_depth_1", "1"}}),
      rec({{"type", "length"}, {"step", "10"}, {"T", "256"}, {"acc_all", "0.5"}, {"acc_depth_0", "0.375"}, {"acc_depth_1", "1"}}),
  };
  const std::string svg = probe_plot_svg(passkey);
  auto count = [&](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) n++;
    return n;
  };
  CHECK(count(svg, "<rect x=") == 6);  // 3 rows x 2 lengths; step 5's row is not drawn
  CHECK(svg.find(">64<") == std::string::npos);
  CHECK(svg.find(">256<") < svg.find(">512<"));  // lengths ascending
  CHECK(svg.find(">37.5%<") != std::string::npos);
  CHECK(svg.find("retrieval accuracy by sequence length at step 10 (--probe-lengths)") != std::string::npos);
  CHECK(svg.find(">depth 0<") < svg.find(">depth 1<"));
  CHECK(svg.find("fill=\"#d73027\"") != std::string::npos);  // 0: red
  CHECK(svg.find("fill=\"#1a9850\"") != std::string::npos);  // 1: green
  // Text: the loss and its bands; a band a shorter length lacks is a grey "-".
  const std::vector<LogRecord> text = {
      rec({{"type", "length"}, {"step", "3"}, {"T", "128"}, {"val_loss", "3.5"}, {"val_loss_pos_0", "3.5"}}),
      rec({{"type", "length"}, {"step", "3"}, {"T", "256"}, {"val_loss", "3.0"}, {"val_loss_pos_0", "3.25"}, {"val_loss_pos_128", "2.75"}}),
  };
  const std::string t = probe_plot_svg(text);
  CHECK(count(t, "<rect x=") == 6);  // all positions, from 0, from 128 x 2 lengths
  CHECK(count(t, ">-<") == 1);
  CHECK(t.find(">from position 128<") != std::string::npos);
  CHECK(t.find("val loss by sequence length at step 3 (--probe-lengths)") != std::string::npos);
  // Drawn after a resume that trained on unprobed: the rows' step, and how far the run went.
  std::vector<LogRecord> later = text;
  later.push_back(rec({{"type", "step"}, {"step", "40"}, {"loss", "2"}}));
  CHECK(probe_plot_svg(later).find("at step 3 (the run went on to step 40) (--probe-lengths)") != std::string::npos);
  CHECK(t.find("fill=\"#1a9850\"") != std::string::npos);  // 2.75, the lowest
  CHECK(t.find("fill=\"#d73027\"") != std::string::npos);  // 3.5, the highest
  CHECK_THROWS_WITH(probe_plot_svg({passkey[0]}), Catch::Contains("no length row"));
  CHECK(probe_plot_path_for_log("runs/a/log.jsonl") == "runs/a/log_lengths.svg");
}

TEST_CASE("a probe's decoders are checked beside what the run holds, the weights copy only off the CPU", "[length_probe]") {
  const ModelConfig cfg = small("llama");
  const std::unique_ptr<Dataset> val = open_dataset("passkey", Split::val, 1, cfg.vocab);
  // Room enough, then too little (what the run leaves a rank).
  CHECK_NOTHROW(check_probe_lengths({64}, *val, cfg, 64, size_t(1) << 30, false));
  CHECK_THROWS_WITH(check_probe_lengths({64}, *val, cfg, 64, 1 << 10, false),
                    Catch::Contains("--probe-lengths 64: the KV-cache decoder needs ") &&
                        Catch::Contains(" MiB a rank, but beside what the run holds this machine has 0 MiB a rank"));
  // The weights' copy a device run makes is counted; the CPU reads them in place.
  const size_t with = KvDecoder::host_bytes(cfg, 64, true, KvDecoder::kDefaultChunk, true),
               without = KvDecoder::host_bytes(cfg, 64, true, KvDecoder::kDefaultChunk, false);
  CHECK(with - without == param_count(cfg) * sizeof(float));
  CHECK_NOTHROW(check_probe_lengths({64}, *val, cfg, 64, without + 64 * 5 * 4, false));
  CHECK_THROWS(check_probe_lengths({64}, *val, cfg, 64, without + 64 * 5 * 4, true));
}

TEST_CASE("the room a decoder has beside the run: per limit, with the ranks that share it", "[length_probe]") {
  const size_t G = size_t(1) << 30;
  // One rank holding 10 GiB of a 24 GiB machine: 14 GiB left, for one decoder or each.
  CHECK(decoder_room(10 * G, 1, 24 * G, 1, 24 * G, false) == 14 * G);
  CHECK(decoder_room(10 * G, 1, 24 * G, 1, 24 * G, true) == 14 * G);
  // Two ranks in one process (or one cgroup): 4 GiB left, 2 GiB each when both decode.
  CHECK(decoder_room(10 * G, 2, 24 * G, 2, 24 * G, false) == 4 * G);
  CHECK(decoder_room(10 * G, 2, 24 * G, 2, 24 * G, true) == 2 * G);
  // A cgroup of its own per rank (12 GiB each on a 24 GiB machine): its limit holds one rank's
  // state, and the machine both (the cgroup's 2 GiB is the smaller room).
  CHECK(decoder_room(10 * G, 1, 12 * G, 2, 24 * G, false) == 2 * G);
  CHECK(decoder_room(10 * G, 1, 12 * G, 2, 40 * G, true) == 2 * G);
  // Nothing left: no room, not a wrapped-around one.
  CHECK(decoder_room(30 * G, 1, 24 * G, 1, 24 * G, false) == 0);
}

TEST_CASE("a resume probes again a length whose logged row was measured on another model", "[length_probe][cli]") {
  // A --change-rope resume with no step left logs rows under its RoPE but saves nothing: the
  // checkpoint keeps the old one. A later plain resume must probe that model, not take the rows.
  using namespace ul_test;
  TempDir dir;
  const std::string run = "--model llama --steps 2 --eval-every 0 --eval-batches 1 --threads 1 --batch 2 --seq 128"
                          " --save-dir " + dir / "run";
  REQUIRE(run_cmd(train_cmd(run)).code == 0);
  CmdResult r = run_cmd(train_cmd(run + " --probe-lengths 128 --resume --change-rope --rope-theta 500000"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = run_cmd(train_cmd(run + " --probe-lengths 128 --resume"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("logged already") == std::string::npos);
  CHECK(r.out.find("done | no step left, its --probe-lengths rows made: the checkpoint is at step 2") !=
        std::string::npos);
  // The same model and flags again: that row is its own, not made twice.
  r = run_cmd(train_cmd(run + " --probe-lengths 128 --resume"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("length    128 | logged already at step 2") != std::string::npos);
  CHECK(r.out.find("done | nothing to do: the checkpoint is at step 2") != std::string::npos);
  std::map<std::string, int> rows;
  for (const LogRecord& rec : read_run_log(dir / "run/log.jsonl"))
    if (rec.at("type") == "length") rows[rec.at("measured")]++;
  CHECK(rows.size() == 2);
  for (const auto& [measured, count] : rows) CHECK(count == 1);
}

TEST_CASE("the length plot follows the log: its title after a resume without probes, gone after a rollback voids its rows",
          "[length_probe][cli]") {
  using namespace ul_test;
  TempDir dir;
  const std::string args = "--seq 64 --batch 2 --eval-every 0 --eval-batches 1 --threads 1 --quiet ";
  auto svg = [](const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  // Probed at step 4, then resumed to 8 without --probe-lengths: the redrawn title says the run went on.
  const std::string a = dir / "a";
  REQUIRE(run_cmd(train_cmd(args + "--steps 4 --save-dir " + a + " --probe-lengths 32,48")).code == 0);
  REQUIRE(run_cmd(train_cmd(args + "--steps 8 --save-dir " + a + " --resume")).code == 0);
  CHECK(svg(a + "/log_lengths.svg").find("at step 4 (the run went on to step 8)") != std::string::npos);
  // Probed at step 8, then rolled back to step 4 (no row there): the table of the voided rows goes.
  const std::string b = dir / "b";
  REQUIRE(run_cmd(train_cmd(args + "--steps 8 --save-every 4 --save-dir " + b + " --probe-lengths 32,48")).code == 0);
  REQUIRE(std::filesystem::exists(b + "/log_lengths.svg"));
  REQUIRE(run_cmd(train_cmd(args + "--steps 8 --save-every 4 --save-dir " + b + " --resume-step 4")).code == 0);
  CHECK_FALSE(std::filesystem::exists(b + "/log_lengths.svg"));
  CHECK(std::filesystem::exists(b + "/log.svg"));
}
