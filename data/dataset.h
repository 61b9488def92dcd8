// Dataset: where training and eval sequences come from. Every source is random access — sequence i
// is a pure function of (files, seed, i) — so each rank fetches exactly its own sequences without
// coordination, and resuming a run needs nothing but the sequence counter.
#pragma once
#include <stdexcept>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ul {

// text:FILE's token_kind: its ids are the file's bytes.
inline constexpr const char* kTextBytes = "bytes, no end-of-text";

enum class Split { train, val };

// A token id past the vocabulary, found as a sequence is read (shards check their ids lazily):
// the data's fault at that place, which the same step meets on every resume (its message says how
// to train past it); other read errors (a file gone or cut) are std::runtime_error.
struct BadTokenError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int vocab() const = 0;                   // every token id is < vocab()
  virtual int64_t num_sequences(int T) const = 0;  // per epoch at length T; -1 = unlimited (synthetic)
  // inputs[0..T), targets[0..T): targets[t] is the token that follows inputs[t], or -1 (ignored).
  // Indices past one epoch wrap into the next epoch (reshuffled where the source shuffles).
  virtual void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const = 0;
  virtual bool synthetic() const { return false; }  // evals report the accuracy over answer tokens when true
  // Whether each epoch reads the sequences in an order of its own (shards: train), not in place order.
  virtual bool shuffled() const { return false; }
  // Whether sequence i + 1 at length T starts at sequence i's last target (the two tile one
  // stretch of text, as --probe-lengths' long windows need); false past the split's end.
  virtual bool continues(int64_t i, int T) const { return i + 1 < num_sequences(T); }
  // The id that starts each document in the token stream (--doc-mask's default --eot), -1: none known.
  virtual int32_t eot() const { return -1; }
  virtual std::string describe() const = 0;         // one line for the log
  // What the tokens are, for a resume to check that its files did not change since the save (the
  // shuffle, the sequences and the held-out cut all follow them): "" when the spec and seed say it
  // all (the synthetic tasks).
  virtual std::string identity() const { return ""; }
  // The tokenizer the files name ("vocab V, end-of-text E": token shards; kTextBytes: text:FILE),
  // "" when they name none that could differ (the synthetic tasks). --val-data must match --data's
  // (token_kinds_agree, data/shards.h).
  virtual std::string token_kind() const { return ""; }
  // The token ranges [lo, hi) of each file this split reads (inputs and targets), in order; none
  // for the synthetic tasks. A split's last target and the next split's first input may be one
  // token (holdout_start).
  struct FileSpan {
    std::string path;
    int64_t lo, hi;
  };
  virtual std::vector<FileSpan> file_spans() const { return {}; }
  // The tokens its files hold out as their val split (text:, shards: without val files), 0 when
  // none: with --val-data they are read by nothing (a start-up note says so).
  virtual int64_t held_out_tokens() const { return 0; }
  // For a task that fits itself to the length: what a sequence of length T holds ("" otherwise).
  virtual std::string layout(int) const { return ""; }
  // The same task with one random setting held fixed, named by it, for the breakdown printed after
  // a run's last eval (passkey with a random depth: the needle at depths 0, 0.25, 0.5, 0.75, 1).
  virtual std::vector<std::pair<std::string, std::unique_ptr<Dataset>>> probes() const { return {}; }
};

// Where the held-out validation split of a stream of n tokens starts (text:, and shards: without
// val files): its last tenth, counted in tokens, so the cut is the same at every length T and an
// eval at another --seq reads nothing the run trained on. Train sequences lie in tokens [0, start]
// (the last one's final target may be token `start`), val sequences begin at it.
inline int64_t holdout_start(int64_t n) { return n - n / 10; }

// Where a run whose next sequence at length T_from was `next` goes on at length T_to (a resume with
// --change-seq), in the same epoch (past its last sequence: at the next epoch's first):
//  - read in order (text:): at the first sequence of T_to that starts where those of T_from
//    stopped or after (nothing read twice; up to T_to - 1 tokens never read): the next unread text;
//  - shuffled (shards:): at the same share of the epoch, rounded up (a shard cut into windows of
//    T_to loses another remainder than at T_from, so the epoch holds other token counts), in
//    T_to's order, not T_from's: some of the rest overlaps windows read, some text is not read
//    this epoch;
//  - synthetic tasks (every sequence a fresh draw): `next`.
int64_t sequence_at_length(const Dataset& d, int64_t next, int T_from, int T_to);

// spec: "recall" | "passkey" | "text:FILE" | "shards:GLOB".
// model_vocab: the model's vocabulary; a token id >= it is an error naming the file (and, for
// shards, the offset). model_vocab <= 0 means "use the dataset's own vocab()".
std::unique_ptr<Dataset> open_dataset(const std::string& spec, Split split, uint64_t seed, int model_vocab);
// Whether --data SPEC names a synthetic task (passkey, recall, with or without options): no
// documents, no files.
bool synthetic_spec(const std::string& spec);

const char* split_name(Split s);

}  // namespace ul
