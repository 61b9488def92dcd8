// "shards:GLOB": llm.c token shards. Each file: a header of 256 int32 [magic, version, token count,
// 0...], then the tokens — magic 20240520 / version 1: uint16 (GPT-2); magic 20240801 / version 7
// (llm.c's llama-3 writer) or 2: uint32. Every file is validated when opened; each sequence's
// tokens are read from it (pread) as the run asks for them.
// A shard `train prepare` writes also names its tokenizer in the header's unused ints (which
// llm.c's readers ignore): [3] = kShardTag ('ULYS'), [4] = vocab, [5] = the end-of-text id. When
// every file says the same, they are the default vocab and --eot, instead of the format's.
//
// Split: files with a word of their name starting with "val" (fineweb_val_000.bin, validation.bin;
// not interval.bin or eval.bin) are the val split, the others train; with no val file,
// the last 10% of the train files' tokens (in sorted file order) are held out as val, the same cut
// at every T (data/dataset.h: holdout_start).
// Sequences never cross a shard boundary (shards are independent document collections, as in
// llm.c): the split's part of shard k, [lo_k, hi_k) (all of it but at the holdout's cut), gives
// (hi_k - lo_k - 1) / T sequences of T inputs + T shifted targets, and the split's sequences are
// those of its shards in sorted file order.
// Train order is shuffled per epoch: index i -> epoch e = i / n, position i % n, mapped through a
// permutation of [0, n) seeded by (seed, e). The permutation is a keyed Feistel network with cycle
// walking: O(1) per lookup and no table, so any rank can map any index. Val is read in order.
#pragma once
#include <utility>
#include <vector>

#include "data/dataset.h"

namespace ul {

constexpr int32_t kShardTag = 0x53594c55;  // "ULYS" read as little-endian bytes
// `train prepare` puts this file in --out before it renames its shards into place and removes it
// once every rename is durable: where it is, the set is partial (a kill -9, a lost node), and
// shards: refuses the directory rather than training on part of the data.
constexpr const char* kPrepareIncomplete = "prepare.incomplete";

class ShardDataset : public Dataset {
 public:
  // model_vocab <= 0: the vocab the headers name (train prepare's shards), else the format's
  // tokenizer vocab (50257 for uint16 GPT-2 shards, 128256 for uint32 llama-3 shards). A token id
  // >= vocab() is an error naming the file and offset when read.
  ShardDataset(const std::string& glob, Split split, uint64_t seed, int model_vocab);
  ~ShardDataset() override;
  ShardDataset(const ShardDataset&) = delete;
  ShardDataset& operator=(const ShardDataset&) = delete;

  int vocab() const override { return vocab_; }
  // llm.c's writers start every document with one token: 50256 <|endoftext|> in uint16 GPT-2
  // shards, 128000 <|begin_of_text|> in uint32 llama-3 shards, or the one the headers name (every
  // file the glob matches must agree: the constructor refuses a mix).
  int32_t eot() const override;
  int64_t num_sequences(int T) const override;  // throws naming the glob when it is 0
  // Val (read in order): the next sequence is in the same file; train (shuffled): never.
  bool continues(int64_t i, int T) const override;
  bool shuffled() const override { return split_ == Split::train; }
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override;
  std::string describe() const override;
  // The split's files (names, token counts, tokenizer) as "N file(s), T tokens, digest X": the
  // contents are not read (terabytes), but a file added, removed, renamed, cut or rewritten at
  // another length changes it.
  std::string identity() const override;
  std::vector<FileSpan> file_spans() const override;
  int64_t held_out_tokens() const override;
  std::string token_kind() const override { return shards_.front().kind(); }

  // A permutation of [0, n) keyed by key: exposed for tests.
  static int64_t permute(int64_t j, int64_t n, uint64_t key);
  // Whether a file name makes a val shard: "val" at its start or after a character that is not a
  // letter or digit.
  static bool is_val_name(const std::string& name);

 private:
  struct Shard {
    std::string path;
    int width = 2;  // bytes per token
    int32_t vocab = 0, eot = -1;  // named by the header (kShardTag), else 0 and -1
    int64_t count = 0;
    // The file that was opened, as it was: one renamed over it, or written again in place (even at
    // the same size), is another.
    uint64_t dev = 0, ino = 0;
    int64_t mtime_ns = 0;
    int32_t effective_eot() const;  // the header's, else the format's
    std::string kind() const;       // "vocab V, end-of-text E": the header's, else the format's
  };
  // A file's header, validated against its size.
  static Shard read_header(const std::string& path);
  // n tokens from token `off` of s into out (n x s.width bytes), read from the file; a file whose
  // size is no longer what its header counted is refused, naming it (thread-safe: each call opens
  // the file).
  static void read_tokens(const Shard& s, int64_t off, int n, uint8_t* out);
  // The tokens [lo, hi) of each shard (in order) that this split reads (T does not matter): made
  // once, by the constructor.
  std::vector<std::pair<int64_t, int64_t>> compute_spans() const;
  // The split's number of sequences at length T; throws naming the glob when it has none.
  int64_t count_sequences(int T) const;

  std::string glob_;
  Split split_;
  uint64_t seed_;
  int vocab_ = 0;
  bool holdout_ = false;  // no val files: both splits come from the train files
  std::vector<Shard> shards_;
  std::vector<std::pair<int64_t, int64_t>> spans_;  // compute_spans()
};

// Whether --val-data's token_kind means --data's ids: the same, either naming none (""), or
// text:FILE's bytes beside `train prepare`'s byte shards (256 or 257 ids: the bytes and an EOT
// inside or past them). A shard set of more ids is a tokenizer's: its id 97 is no 'a'.
bool token_kinds_agree(const std::string& a, const std::string& b);
// How many ids a token_kind names (256 for text:FILE's bytes), 0 when it names none.
int token_kind_vocab(const std::string& kind);

}  // namespace ul
