#include "data/synthetic.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "data/rng.h"

namespace ul {

namespace {

// Each (task, split) pair draws from its own stream, so val never replays train sequences.
uint64_t stream_id(uint64_t task, Split split) { return task * 2 + (split == Split::val ? 1 : 0); }

// s: T+1 tokens; scored[t]: whether input position t is scored (its target is s[t+1]).
void emit(const std::vector<int32_t>& s, const std::vector<char>& scored, int T, int32_t* inputs,
          int32_t* targets) {
  for (int t = 0; t < T; t++) {
    inputs[t] = s[t];
    targets[t] = scored[t] ? s[t + 1] : -1;
  }
}

}  // namespace

// ---- recall ----

RecallDataset::RecallDataset(Split split, uint64_t seed, RecallConfig cfg)
    : split_(split), seed_(seed), cfg_(cfg) {
  if (cfg_.queries == 0 || cfg_.queries < -1)
    throw std::runtime_error("recall: queries must be >= 1, or -1 for as many as fit (got " + std::to_string(cfg_.queries) + ")");
  if (cfg_.num_keys < 1 || cfg_.num_values < 2 || cfg_.pairs < 1 || cfg_.pairs > cfg_.num_keys)
    throw std::runtime_error("recall: need num_keys >= 1, num_values >= 2, 1 <= pairs <= num_keys (got " +
                             std::to_string(cfg_.num_keys) + ", " + std::to_string(cfg_.num_values) +
                             ", " + std::to_string(cfg_.pairs) + ")");
  if (3 + int64_t(cfg_.num_keys) + cfg_.num_values > INT32_MAX)
    throw std::runtime_error("recall: num_keys + num_values + 3 = " +
                             std::to_string(3 + int64_t(cfg_.num_keys) + cfg_.num_values) +
                             " token ids, more than 2^31 - 1");
}

RecallDataset::Layout RecallDataset::layout_at(int T) const {
  // T+1 tokens: BOS, 2P (pairs), the gap, QUERY, 2Q (queries).
  const int L = T + 1;
  Layout l;
  l.pairs = std::min(cfg_.pairs, (L - 2) / 4);  // room for the pairs and one round of queries
  if (l.pairs < 1) throw std::runtime_error("recall: sequence length " + std::to_string(T) + " is too short (need T >= 5)");
  const int room = L - (1 + 2 * l.pairs) - 1;  // after the pairs and the QUERY marker
  l.gap = cfg_.gap < 0 ? 0 : std::min(cfg_.gap, room - 2 * l.pairs);
  l.queries = (room - l.gap) / 2;  // queries = -1: as many as fit
  if (cfg_.queries > 0) l.queries = std::max(l.pairs, std::min(cfg_.queries, l.queries));
  // gap = -1 with queries = -1: both ask for the spare room; the gap takes it (one round of queries
  // at the end), which is what gap = -1 is for: the answers as far back as T allows.
  if (cfg_.gap < 0 && cfg_.queries < 0) l.queries = l.pairs;
  if (cfg_.gap < 0) l.gap = room - 2 * l.queries;  // all spare room before the queries: they end the sequence
  return l;
}

std::string RecallDataset::layout(int T) const {
  const Layout l = layout_at(T);
  std::string s = "at T = " + std::to_string(T) + ": " + std::to_string(l.pairs) + " pairs, gap " +
                  std::to_string(l.gap) + ", " + std::to_string(l.queries) + " queries";
  // Say what the length, not the settings, decided: the log must not claim a task it is not running.
  std::string clipped;
  auto note = [&](const std::string& what) { clipped += (clipped.empty() ? "" : ", ") + what; };
  if (l.pairs < cfg_.pairs) note("pairs=" + std::to_string(cfg_.pairs) + " clipped to fit T");
  if (cfg_.gap >= 0 && l.gap < cfg_.gap) note("gap=" + std::to_string(cfg_.gap) + " clipped to fit T");
  if (cfg_.queries > 0 && l.queries < cfg_.queries) note("queries=" + std::to_string(cfg_.queries) + " clipped to fit T");
  if (cfg_.queries > 0 && l.queries > cfg_.queries) note("queries=" + std::to_string(cfg_.queries) + " raised to one round");
  return clipped.empty() ? s : s + " (" + clipped + ")";
}

void RecallDataset::sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const {
  const Layout l = layout_at(T);
  const int P = l.pairs;
  DataRng rng(seed_, stream_id(1, split_), uint64_t(i));
  const int L = T + 1;
  std::vector<int32_t> s(L, FILL);
  std::vector<char> scored(L, 0);

  // P distinct keys: a partial Fisher-Yates shuffle of all keys.
  std::vector<int> keys(cfg_.num_keys);
  for (int k = 0; k < cfg_.num_keys; k++) keys[k] = k;
  for (int k = 0; k < P; k++) std::swap(keys[k], keys[k + rng.below(uint32_t(cfg_.num_keys - k))]);
  std::vector<int> vals(P);
  for (int k = 0; k < P; k++) vals[k] = int(rng.below(uint32_t(cfg_.num_values)));

  int pos = 0;
  s[pos++] = BOS;
  for (int k = 0; k < P; k++) {
    s[pos++] = key_token(keys[k]);
    s[pos++] = value_token(vals[k]);
  }
  // After the pairs: the gap, the QUERY marker, then Q query/answer pairs.
  const int Q = l.queries;
  pos += l.gap;
  s[pos++] = QUERY;
  // Rounds of every key once, each round in a fresh random order: the first round can only be
  // answered from the pairs at the start; later rounds also from earlier queries.
  std::vector<int> order(P);
  for (int q = 0; q < Q; q++) {
    if (q % P == 0) {
      for (int k = 0; k < P; k++) order[k] = k;
      for (int k = P - 1; k > 0; k--) std::swap(order[k], order[rng.below(uint32_t(k + 1))]);
    }
    const int k = order[q % P];
    scored[pos] = 1;  // the query key's target is its value
    s[pos++] = key_token(keys[k]);
    s[pos++] = value_token(vals[k]);
  }
  emit(s, scored, T, inputs, targets);
}

std::string RecallDataset::describe() const {
  return std::string("recall (") + split_name(split_) + "): " + std::to_string(cfg_.pairs) +
         " key/value pairs, " + std::to_string(cfg_.num_keys) + " keys, " + std::to_string(cfg_.num_values) +
         " values, gap " + (cfg_.gap < 0 ? std::string("to the end") : std::to_string(cfg_.gap)) + ", " +
         (cfg_.queries >= 0   ? std::to_string(cfg_.queries) + " queries"
          : cfg_.gap < 0      ? std::string("one round of queries")
                              : std::string("queries fill the rest")) +
         ", vocab " + std::to_string(vocab());
}

// ---- passkey ----

PasskeyDataset::PasskeyDataset(Split split, uint64_t seed, PasskeyConfig cfg)
    : split_(split), seed_(seed), cfg_(cfg) {
  if (cfg_.digits < 1 || cfg_.filler_words < 1 || !(cfg_.depth == -1.0 || (cfg_.depth >= 0 && cfg_.depth <= 1)))
    throw std::runtime_error("passkey: need digits >= 1, filler_words >= 1, depth in [0, 1] (or -1 for random)");
  if (13 + int64_t(cfg_.filler_words) > INT32_MAX)
    throw std::runtime_error("passkey: filler_words + 13 = " + std::to_string(13 + int64_t(cfg_.filler_words)) +
                             " token ids, more than 2^31 - 1");
}

int PasskeyDataset::filler_at(int T) const {
  const int n = cfg_.digits;
  // In 64 bits: digits near 2^30 must not wrap the room left into a positive number.
  const int64_t room = int64_t(T) + 1 - (2 * int64_t(n) + 3);  // BOS, KEY, n digits, QUERY, n digits
  if (room < 0)
    throw std::runtime_error("passkey: sequence length " + std::to_string(T) + " is too short for " +
                             std::to_string(n) + " digits (need T >= " + std::to_string(2 * int64_t(n) + 2) + ")");
  return int(room);  // < T + 1
}

void PasskeyDataset::sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const {
  const int n = cfg_.digits, L = T + 1;
  const int filler = filler_at(T);
  DataRng rng(seed_, stream_id(2, split_), uint64_t(i));
  std::vector<int32_t> s(L);
  std::vector<char> scored(L, 0);
  std::vector<int32_t> key(n);
  for (int d = 0; d < n; d++) key[d] = DIGIT0 + int(rng.below(10));
  const double depth = cfg_.depth < 0 ? rng.uniform() : cfg_.depth;
  const int before = std::min(filler, int(std::lround(depth * filler)));

  int pos = 0;
  s[pos++] = BOS;
  auto words = [&](int count) {
    for (int w = 0; w < count; w++) s[pos++] = FILLER0 + int(rng.below(uint32_t(cfg_.filler_words)));
  };
  words(before);
  s[pos++] = KEY;
  for (int d = 0; d < n; d++) s[pos++] = key[d];
  words(filler - before);
  scored[pos] = 1;  // QUERY predicts the first digit ...
  s[pos++] = QUERY;
  for (int d = 0; d < n; d++) {
    if (d + 1 < n) scored[pos] = 1;  // ... and each digit but the last predicts the next
    s[pos++] = key[d];
  }
  emit(s, scored, T, inputs, targets);
}

std::vector<std::pair<std::string, std::unique_ptr<Dataset>>> PasskeyDataset::probes() const {
  std::vector<std::pair<std::string, std::unique_ptr<Dataset>>> out;
  if (cfg_.depth >= 0) return out;  // one depth already: the eval is the breakdown
  for (double depth : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    PasskeyConfig c = cfg_;
    c.depth = depth;
    char name[32];
    std::snprintf(name, sizeof name, "depth %g", depth);
    out.emplace_back(name, std::make_unique<PasskeyDataset>(split_, seed_, c));
  }
  return out;
}

std::string PasskeyDataset::describe() const {
  char depth[32] = "random";  // as written: 0.9, not to_string's 0.900000
  if (cfg_.depth >= 0) std::snprintf(depth, sizeof depth, "%g", double(cfg_.depth));
  return std::string("passkey (") + split_name(split_) + "): " + std::to_string(cfg_.digits) + " digits, depth " +
         depth + ", " +
         std::to_string(cfg_.filler_words) + " filler words, vocab " + std::to_string(vocab());
}

}  // namespace ul
