// Synthetic long-context tasks: generated from (seed, split, i), unlimited, with only the answer
// tokens scored (every other target is -1), so accuracy on them measures long-range retrieval.
//
// recall — multi-query associative recall. One sequence of T+1 tokens (inputs = the first T,
// targets = the next token where scored):
//
//   BOS  k1 v1  k2 v2 ... kP vP   FILL x gap   QUERY  q1 a1  q2 a2 ... qQ aQ   [FILL]
//   |<-- P pairs, distinct keys -->|                  |<- rounds of every key once, each shuffled ->|
//
// Scored: the input position of each query key q_j, whose target is its value a_j (the value that
// followed q_j among the pairs). The first round of queries can only be answered from the pairs,
// at least `gap` tokens back; later rounds could also copy an earlier query's answer. With
// queries = -1 they fill the sequence after the gap (many scored targets per sequence); with
// gap = -1 all spare room goes into the gap, so the queries end the sequence (one round of them
// unless queries = N).
// Vocabulary: BOS=0, FILL=1, QUERY=2, keys [3, 3+K), values [3+K, 3+K+V).
// Solving it needs an induction circuit (value tokens remember their key; the query key finds the
// position after its earlier copy), which a 2-layer transformer can learn.
//
// passkey — passkey retrieval. T+1 tokens:
//
//   BOS  w w w ... KEY d1 .. dn  w w w ...  QUERY d1 .. dn
//
// w are random filler words, d the passkey digits. Scored: the targets of QUERY and of d1..d(n-1)
// in the final query, i.e. the n digits. The needle's depth is configurable (fraction of the
// filler before it); by default it is uniform random per sequence. Vocabulary: BOS=0, KEY=1,
// QUERY=2, digits [3, 13), filler words [13, 13+W).
#pragma once
#include <vector>

#include "data/dataset.h"

namespace ul {

struct RecallConfig {
  int num_keys = 32;    // key tokens; each pair has its own, so pairs <= num_keys
  int num_values = 29;  // value tokens: chance accuracy is 1/num_values (defaults: vocab 64)
  int pairs = 16;       // key/value pairs at the start (fewer when T cannot hold them)
  int gap = 64;         // filler between the pairs and the queries (clipped to fit one round);
                        // -1: all spare room, so that the queries end the sequence
  int queries = -1;     // query/answer pairs (at least one round of every key); -1: fill the rest
                        // (with gap = -1: one round)
};

struct PasskeyConfig {
  int digits = 5;         // passkey length
  double depth = -1.0;    // needle position in [0, 1] of the filler; -1: uniform random per sequence
  int filler_words = 19;  // distinct filler tokens (defaults: vocab 32)
};

// Both tasks: val uses a different random stream than train, so no val sequence is a train one.
class RecallDataset : public Dataset {
 public:
  RecallDataset(Split split, uint64_t seed, RecallConfig cfg = {});
  int vocab() const override { return 3 + cfg_.num_keys + cfg_.num_values; }
  // Unlimited (-1), once T is checked to be long enough for the task (the refusal sequence() makes).
  int64_t num_sequences(int T) const override { return layout_at(T), -1; }
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override;
  bool synthetic() const override { return true; }
  std::string describe() const override;

  static constexpr int BOS = 0, FILL = 1, QUERY = 2;
  int key_token(int k) const { return 3 + k; }
  int value_token(int v) const { return 3 + cfg_.num_keys + v; }
  // What a sequence of length T holds: the config, clipped so that the pairs and one round of
  // queries fit (pairs first, then the gap); queries is at least one round.
  struct Layout {
    int pairs, gap, queries;
  };
  Layout layout_at(int T) const;
  std::string layout(int T) const override;

 private:
  Split split_;
  uint64_t seed_;
  RecallConfig cfg_;
};

class PasskeyDataset : public Dataset {
 public:
  PasskeyDataset(Split split, uint64_t seed, PasskeyConfig cfg = {});
  int vocab() const override { return 13 + cfg_.filler_words; }
  int64_t num_sequences(int T) const override { return filler_at(T), -1; }  // as recall's
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override;
  bool synthetic() const override { return true; }
  std::string describe() const override;
  std::vector<std::pair<std::string, std::unique_ptr<Dataset>>> probes() const override;

  static constexpr int BOS = 0, KEY = 1, QUERY = 2, DIGIT0 = 3, FILLER0 = 13;

 private:
  int filler_at(int T) const;  // filler words in a sequence of length T; throws when none fit
  Split split_;
  uint64_t seed_;
  PasskeyConfig cfg_;
};

}  // namespace ul
