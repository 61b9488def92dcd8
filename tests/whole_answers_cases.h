// An eval's whole answers (EvalResult::whole_accuracy): an answer is a maximal run of consecutive
// valid targets (a passkey's digits), right only when every one of its targets is the row's argmax.
// The targets here are made from the model's own argmax (found by the host decoder, another code
// path than the eval's forward), right or wrong by design, in runs that cross the sp ranks'
// slices, so the expected counts are known exactly; every layout must give them. On the CPU
// (tests/cpu/test_whole_answers.cpp), the emulated device and a GPU (fp32: the argmax the decoder
// found must be the device's too; a head dim of 16, as the CUDA attention takes).
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/sample.h"
#include "engine/trainer.h"
#include "options_from.h"
#include "parallel/comm_local.h"

namespace whole_answers {

using namespace ul;

constexpr int kT = 32, kSeqs = 8;
const std::string kArgs =
    "--threads 1 --quiet --layers 1 --dim 64 --heads 4 --seq 32 --batch 2 --eval-batches 2 --seed 5";

// Runs [first, last] of scored targets; `wrong`: which of its positions get a target that is not the
// argmax, for sequence i (the boundaries of 2 and 4 sp slices are 8, 16 and 24).
struct Run {
  int first, last;
  std::vector<int> (*wrong)(int i);
};
const Run kRuns[] = {
    {3, 5, [](int) { return std::vector<int>{}; }},                                    // always right
    {7, 7, [](int) { return std::vector<int>{7}; }},                                   // always wrong
    {14, 17, [](int i) { return i % 2 ? std::vector<int>{17} : std::vector<int>{}; }},  // across 16
    {22, 26, [](int i) { return i % 3 == 0 ? std::vector<int>{22} : std::vector<int>{}; }},  // across 24
    {29, 31, [](int i) { return i % 4 == 1 ? std::vector<int>{29, 31} : std::vector<int>{}; }},
};

inline uint32_t token_of(int i, int t) { return (uint32_t(i) * 2654435761u + uint32_t(t) * 40503u + 7u) >> 7; }

// Inputs from a fixed hash; targets from the argmax the decoder found for each position.
class DesignedAnswers : public Dataset {
 public:
  DesignedAnswers(int vocab, std::vector<std::vector<int>> argmax) : vocab_(vocab), argmax_(std::move(argmax)) {}
  int vocab() const override { return vocab_; }
  int64_t num_sequences(int) const override { return kSeqs; }
  bool synthetic() const override { return true; }
  std::string describe() const override { return "designed answers"; }
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override {
    const int s = int(i % kSeqs);
    for (int t = 0; t < T; t++) inputs[t] = int32_t(token_of(s, t) % uint32_t(vocab_)), targets[t] = -1;
    for (const Run& r : kRuns) {
      const std::vector<int> wrong = r.wrong(s);
      for (int t = r.first; t <= r.last; t++) {
        const bool miss = std::find(wrong.begin(), wrong.end(), t) != wrong.end();
        targets[t] = miss ? (argmax_[size_t(s)][size_t(t)] + 1) % vocab_ : argmax_[size_t(s)][size_t(t)];
      }
    }
  }

 private:
  int vocab_;
  std::vector<std::vector<int>> argmax_;
};

// device: "" (the CPU) or the CUDA backend's flags.
inline void check_whole_answers(const std::string& device) {
  // The model's argmax at every position of the designed inputs, from the host decoder; a position
  // where two logits are close could round the other way in the eval's forward: none is scored.
  std::vector<std::vector<int>> argmax(kSeqs, std::vector<int>(kT));
  int vocab = 0;
  run_local(1, [&](Comm& world) {
    Trainer tr(ul_test::options(kArgs + device), world);
    std::vector<float> copy;
    const float* host = tr.host_weights(true, copy);
    const ModelConfig& cfg = tr.model().cfg;
    vocab = cfg.vocab;
    KvDecoder dec(cfg, tr.model().params.specs(), host, kT);
    std::vector<int> tokens(kT);
    for (int s = 0; s < kSeqs; s++) {
      for (int t = 0; t < kT; t++) tokens[size_t(t)] = int(token_of(s, t) % uint32_t(vocab));
      dec.reset();
      for (int t = 0; t < kT; t++) {
        std::vector<float> l = t == 0 ? dec.prefill(tokens.data(), 1) : dec.step(tokens[size_t(t)]);
        l.resize(size_t(vocab));
        const int best = int(std::max_element(l.begin(), l.end()) - l.begin());
        float second = -1e30f;
        for (int v = 0; v < vocab; v++)
          if (v != best) second = std::max(second, l[size_t(v)]);
        bool scored = false;
        for (const Run& r : kRuns) scored = scored || (r.first <= t && t <= r.last);
        INFO("sequence " << s << " position " << t);
        if (scored) REQUIRE(l[size_t(best)] - second > 1e-5f);  // float rounding in logits: ~1e-7
        argmax[size_t(s)][size_t(t)] = best;
      }
    }
  });
  const DesignedAnswers data(vocab, argmax);
  // What the design says for the first n sequences (those an eval of 2 batches x 2 x dp reads).
  auto expected = [&](int n, int64_t* right, int64_t* hits, int64_t* tokens) {
    *right = *hits = *tokens = 0;
    for (int s = 0; s < n; s++)
      for (const Run& r : kRuns) {
        const int misses = int(r.wrong(s).size());
        *right += misses == 0;
        *tokens += r.last - r.first + 1;
        *hits += r.last - r.first + 1 - misses;
      }
  };
  for (const std::string layout : {"", " --ranks 2 --sp 2", " --ranks 4 --sp 4", " --ranks 2", " --ranks 4 --sp 2"}) {
    CAPTURE(layout);
    const Options o = ul_test::options(kArgs + device + layout);
    const int ranks = o.ranks;
    EvalResult got;
    LocalOptions lo;
    lo.device = run_device(o);  // the communicator moves buffers of the run's device
    run_local(
        ranks,
        [&](Comm& world) {
          Trainer tr(o, world);
          const EvalResult e = tr.evaluate(data);
          if (world.rank() == 0) got = e;
        },
        lo);
    const int dp = ranks / o.sp;
    int64_t right, hits, tokens;
    expected(2 * 2 * dp, &right, &hits, &tokens);
    const int64_t answers = int64_t(2 * 2 * dp) * int64_t(std::size(kRuns));
    CHECK(got.whole_answers == answers);
    CHECK(got.whole_accuracy == Approx(double(right) / double(answers)).epsilon(1e-12));
    CHECK(got.answers == tokens);
    CHECK(got.accuracy == Approx(double(hits) / double(tokens)).epsilon(1e-12));
    CHECK(right > 0);
    CHECK(right < answers);
  }
}

}  // namespace whole_answers
