// Data sources: the synthetic tasks' layout and determinism, text and llm.c shard round trips,
// the epoch shuffle, the splits, and every bad-input path naming the file and the problem.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <vector>

#include "data/dataset.h"
#include "data/shards.h"
#include "data/synthetic.h"
#include "run_cmd.h"
#include "temp_dir.h"
#include "expect_error.h"

namespace fs = std::filesystem;
using Seq = std::vector<int32_t>;

namespace {

// A fresh directory under the system temp dir, removed at scope exit.
using ul_test::TempDir;

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// An llm.c shard; count < 0 writes the true count, extra appends junk bytes, drop truncates.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int width = 2, int32_t magic = 20240520,
                 int32_t version = 1, int extra = 0, int drop = 0) {
  int32_t h[256] = {magic, version, int32_t(tokens.size())};
  std::vector<uint8_t> b(1024);
  std::memcpy(b.data(), h, 1024);
  for (uint32_t t : tokens) {
    uint8_t le[4] = {uint8_t(t), uint8_t(t >> 8), uint8_t(t >> 16), uint8_t(t >> 24)};
    b.insert(b.end(), le, le + width);
  }
  b.resize(b.size() + size_t(extra) - size_t(drop));
  write_bytes(path, b);
}

std::pair<Seq, Seq> get(const ul::Dataset& d, int64_t i, int T) {
  Seq x(T), y(T);
  d.sequence(i, T, x.data(), y.data());
  return {x, y};
}

using ul_test::require_error;

}  // namespace

TEST_CASE("synthetic tasks are pure functions of (seed, split, i)", "[data]") {
  for (const char* spec : {"recall", "passkey"}) {
    auto a = ul::open_dataset(spec, ul::Split::train, 1, 0), a2 = ul::open_dataset(spec, ul::Split::train, 1, 0);
    auto b = ul::open_dataset(spec, ul::Split::train, 2, 0), v = ul::open_dataset(spec, ul::Split::val, 1, 0);
    CHECK(a->synthetic());
    CHECK(a->num_sequences(256) == -1);
    CHECK(get(*a, 7, 256) == get(*a2, 7, 256));
    CHECK(get(*a, 7, 256) == get(*a, 7, 256));
    CHECK(get(*a, 7, 256).first != get(*a, 8, 256).first);
    CHECK(get(*a, 7, 256).first != get(*b, 7, 256).first);
    CHECK(get(*a, 7, 256).first != get(*v, 7, 256).first);
  }
}

TEST_CASE("recall scores only the query keys, whose values sit far back", "[data]") {
  for (int T : {256, 64, 16}) {
    ul::RecallDataset d(ul::Split::train, 3);
    const int P = d.layout_at(T).pairs;
    REQUIRE(P >= 1);
    for (int64_t i = 0; i < 20; i++) {
      auto [x, y] = get(d, i, T);
      CHECK(x[0] == ul::RecallDataset::BOS);
      int marker = 0;
      while (marker < T && x[marker] != ul::RecallDataset::QUERY) marker++;
      REQUIRE(marker < T);
      if (T == 256) CHECK(marker == 1 + 2 * P + 64);  // the default gap fits
      std::vector<int> first_round;
      int scored = 0;
      for (int t = 0; t < T; t++) {
        CHECK(x[t] >= 0);
        CHECK(x[t] < d.vocab());
        if (y[t] < 0) continue;
        // Scored: a query key after the QUERY marker; the target is the value paired with it.
        CHECK(t > marker);
        CHECK((t - marker) % 2 == 1);
        int p = 1;
        while (p < 1 + 2 * P && x[p] != x[t]) p += 2;
        REQUIRE(p < 1 + 2 * P);
        CHECK(x[p + 1] == y[t]);
        CHECK(y[t] >= d.value_token(0));
        if (scored++ < P) {
          first_round.push_back(x[t]);
          if (T == 256) CHECK(t - p > 64);  // answered from the pairs, across the gap
        }
      }
      CHECK(scored == (T - marker) / 2);  // queries fill the rest
      std::sort(first_round.begin(), first_round.end());
      CHECK(std::unique(first_round.begin(), first_round.end()) == first_round.end());  // every key once
      CHECK(int(first_round.size()) == P);
    }
  }
  // gap = -1 with one round of queries: they end the sequence, as far from the pairs as T allows.
  ul::RecallConfig cfg;
  cfg.pairs = 8;
  cfg.gap = -1;
  cfg.queries = 8;
  auto [x, y] = get(ul::RecallDataset(ul::Split::val, 3, cfg), 0, 128);
  CHECK(x[128 - 16] == ul::RecallDataset::QUERY);
  CHECK(y[127] >= 0);
  // gap = -1 with queries = -1 (the default): the gap takes the room, one round of queries ends the
  // sequence (it was a gap of 0 or 1 with the queries filling the rest: no gap at all).
  cfg.queries = -1;
  const ul::RecallDataset far(ul::Split::val, 3, cfg);
  CHECK(far.layout(128) == "at T = 128: 8 pairs, gap 95, 8 queries");
  CHECK(far.describe().find("gap to the end, one round of queries") != std::string::npos);
  std::tie(x, y) = get(far, 0, 128);
  CHECK(x[128 - 16] == ul::RecallDataset::QUERY);
  CHECK(y[127] >= 0);
  cfg.queries = 8;
  // gap = 0 with one round: the queries follow the pairs and filler ends the sequence.
  cfg.gap = 0;
  std::tie(x, y) = get(ul::RecallDataset(ul::Split::val, 3, cfg), 0, 128);
  CHECK(x[17] == ul::RecallDataset::QUERY);
  CHECK(y[18] >= 0);
  CHECK(x[127] == ul::RecallDataset::FILL);
  CHECK(y[127] == -1);
}

TEST_CASE("recall's log line says what a sequence of length T holds, clipped or not", "[data]") {
  ul::RecallDataset d(ul::Split::train, 3);  // 16 pairs, gap 64, queries fill the rest
  CHECK(d.layout(256) == "at T = 256: 16 pairs, gap 64, 79 queries");
  // T = 64 holds 15 pairs and a round of queries; the gap gets what is left.
  CHECK(d.layout(64) == "at T = 64: 15 pairs, gap 3, 15 queries (pairs=16 clipped to fit T, gap=64 clipped to fit T)");
  // The layout is the one sequence() writes: the QUERY marker after the pairs and the gap.
  for (int T : {256, 64}) {
    const ul::RecallDataset::Layout l = d.layout_at(T);
    auto [x, y] = get(d, 0, T);
    CHECK(x[1 + 2 * l.pairs + l.gap] == ul::RecallDataset::QUERY);
    CHECK(std::count_if(y.begin(), y.end(), [](int32_t v) { return v >= 0; }) == l.queries);
  }
  ul::RecallConfig cfg;
  cfg.queries = 3;  // fewer than one round: raised, and said
  CHECK(ul::RecallDataset(ul::Split::train, 3, cfg).layout(256) ==
        "at T = 256: 16 pairs, gap 64, 16 queries (queries=3 raised to one round)");
  // More pairs than distinct keys can never be met: refused, naming both.
  require_error([] { ul::open_dataset("recall:pairs=40", ul::Split::train, 0, 0); }, {"recall:pairs=40", "40", "keys 32"});
  require_error([] { ul::open_dataset("recall:keys=8", ul::Split::train, 0, 0); }, {"recall:keys=8", "pairs 16", "keys 8"});
  CHECK(ul::PasskeyDataset(ul::Split::train, 3).layout(256).empty());  // passkey refuses a short T instead
}

TEST_CASE("passkey scores exactly the digits of the key", "[data]") {
  for (double depth : {0.0, 0.5, 1.0, -1.0}) {
    ul::PasskeyConfig cfg;
    cfg.depth = depth;
    ul::PasskeyDataset d(ul::Split::train, 5, cfg);
    for (int64_t i = 0; i < 10; i++) {
      const int T = 100;
      auto [x, y] = get(d, i, T);
      int key = 0;
      while (key < T && x[key] != ul::PasskeyDataset::KEY) key++;
      REQUIRE(key < T);
      if (depth == 0.0) CHECK(key == 1);
      if (depth == 1.0) CHECK(x[key + cfg.digits + 1] == ul::PasskeyDataset::QUERY);
      std::vector<int32_t> want(x.begin() + key + 1, x.begin() + key + 1 + cfg.digits), got;
      for (int t = 0; t < T; t++) {
        CHECK(x[t] < d.vocab());
        if (y[t] >= 0) got.push_back(y[t]);
      }
      CHECK(got == want);
      CHECK(x[T - cfg.digits] == ul::PasskeyDataset::QUERY);
    }
  }
}

TEST_CASE("passkey's probes hold the needle at fixed depths, other tasks have none", "[data]") {
  ul::PasskeyDataset d(ul::Split::val, 5);  // random depth
  const auto probes = d.probes();
  REQUIRE(probes.size() == 5);
  const int T = 100;
  const double depths[] = {0.0, 0.25, 0.5, 0.75, 1.0};
  for (size_t k = 0; k < probes.size(); k++) {
    INFO(probes[k].first);
    CHECK(probes[k].first == "depth " + std::string(k == 0 ? "0" : k == 1 ? "0.25" : k == 2 ? "0.5" : k == 3 ? "0.75" : "1"));
    CHECK(probes[k].second->vocab() == d.vocab());
    for (int64_t i = 0; i < 5; i++) {
      auto [x, y] = get(*probes[k].second, i, T);
      int key = 0;
      while (key < T && x[key] != ul::PasskeyDataset::KEY) key++;
      REQUIRE(key < T);
      const int filler = T + 1 - (2 * 5 + 3);
      CHECK(key == 1 + int(std::lround(depths[k] * filler)));  // BOS, then that share of the filler
    }
    CHECK(probes[k].second->probes().empty());  // a fixed depth has no breakdown of its own
  }
  CHECK(ul::RecallDataset(ul::Split::val, 5).probes().empty());
}

TEST_CASE("open_dataset rejects unknown specs and too small a model vocab", "[data]") {
  require_error([] { ul::open_dataset("recal", ul::Split::train, 0, 0); },
                {"recal", "recall", "passkey", "text:FILE", "shards:GLOB"});
  require_error([] { ul::open_dataset("text:", ul::Split::train, 0, 0); }, {"text:FILE"});
  require_error([] { ul::open_dataset("recall", ul::Split::train, 0, 32); }, {"recall", "64", "32"});
}

TEST_CASE("text: bytes are tokens, sequences tile the stream, the last 10% are val", "[data]") {
  TempDir dir;
  std::vector<uint8_t> bytes(1001);
  // Hashed bytes: any 7 in a row occur once, so a window's bytes say where it is.
  for (size_t k = 0; k < bytes.size(); k++) bytes[k] = uint8_t((uint32_t(k + 1) * 2654435761u) >> 24);
  const std::string path = dir.file("t.txt");
  write_bytes(path, bytes);
  auto tr = ul::open_dataset("text:" + path, ul::Split::train, 0, 0);
  auto va = ul::open_dataset("text:" + path, ul::Split::val, 0, 0);
  CHECK(tr->vocab() == 256);
  // The start-up lines give each split's own bytes.
  CHECK(tr->describe() == "text " + path + " (train): 901 of 1001 bytes, vocab 256");
  CHECK(va->describe() == "text " + path + " (val): the last 100 of 1001 bytes, vocab 256");
  // The last 100 bytes are val: bytes [0, 901] hold 90 train sequences of T = 10, bytes [901, 1001)
  // 9 val ones.
  const int T = 10;
  CHECK(tr->num_sequences(T) == 90);
  CHECK(va->num_sequences(T) == 9);
  for (int64_t i = 0; i < 99; i++) {
    const int64_t at = i < 90 ? i * T : 901 + (i - 90) * T;
    auto [x, y] = i < 90 ? get(*tr, i, T) : get(*va, i - 90, T);
    for (int t = 0; t < T; t++) {
      CHECK(x[t] == bytes[at + t]);
      CHECK(y[t] == bytes[at + t + 1]);  // the last target is the next sequence's first input
    }
  }
  CHECK(get(*tr, 90, T) == get(*tr, 0, T));  // the next epoch starts over
  CHECK(get(*va, 12, T) == get(*va, 3, T));
  // The cut is the same at every length: an eval at a longer --seq reads no byte a run at a
  // shorter one trained on (beyond the one they share: the train split's last target).
  for (int L : {7, 10, 33, 99}) {
    INFO("T = " << L);
    const int64_t ntr = tr->num_sequences(L), nva = va->num_sequences(L);
    CHECK(ntr == 901 / L);
    CHECK(nva == 99 / L);
    auto where = [&](const std::vector<int32_t>& x) {
      for (int64_t k = 0; k + L <= 1001; k++)
        if (std::equal(x.begin(), x.end(), bytes.begin() + k)) return k;
      return int64_t(-1);
    };
    const int64_t last = where(get(*tr, ntr - 1, L).first);
    REQUIRE(last >= 0);  // its bytes are the text's (-1, not found, would pass the bound below)
    CHECK(last + L <= 901);  // the last train target is byte 901 at most
    CHECK(where(get(*va, 0, L).first) == 901);
  }
}

TEST_CASE("text: missing, empty, too short and out-of-vocab files are errors naming the file", "[data]") {
  TempDir dir;
  const std::string missing = dir.file("missing.txt"), empty = dir.file("empty.txt"), tiny = dir.file("tiny.txt");
  write_bytes(empty, {});
  write_bytes(tiny, {1, 2, 3, 200});
  require_error([&] { ul::open_dataset("text:" + missing, ul::Split::train, 0, 0); }, {missing, "cannot open"});
  require_error([&] { ul::open_dataset("text:" + empty, ul::Split::train, 0, 0); }, {empty, "empty"});
  auto d = ul::open_dataset("text:" + tiny, ul::Split::train, 0, 0);
  require_error([&] { d->num_sequences(8); }, {tiny, "too short"});
  require_error([&] { ul::open_dataset("text:" + tiny, ul::Split::train, 0, 128); }, {tiny, "200", "offset 3"});
  // A file larger than memory (text:FILE is read whole): named, with the way on, not "std::bad_alloc".
  // (A sparse 100 GiB file, under an address-space limit, in a child: this process keeps its own.
  // Not in a sanitizer build: ASan and TSan reserve terabytes of shadow address space at start-up,
  // which no `ulimit -v` allows.)
#if !defined(ULYSSES_SANITIZED) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  const std::string huge = dir.file("huge.txt");
  const ul_test::CmdResult r = ul_test::run_cmd("truncate -s 100G " + huge + " && ulimit -v 4000000 && " +
                                                ul_test::train_cmd("--data text:" + huge + " --steps 1 --threads 1"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("train: error: --data: " + huge + ": 107374182400 bytes do not fit in memory (text:FILE is read "
                   "whole): `train prepare --out DIR " + huge + "` makes shards of it") != std::string::npos);
#endif
}

TEST_CASE("shard permutation is a bijection of 0..n-1", "[data]") {
  for (int64_t n : {1, 2, 3, 5, 17, 64, 100, 1000}) {
    std::set<int64_t> seen;
    for (int64_t j = 0; j < n; j++) {
      int64_t p = ul::ShardDataset::permute(j, n, 42);
      CHECK(p >= 0);
      CHECK(p < n);
      seen.insert(p);
    }
    CHECK(int64_t(seen.size()) == n);
  }
}

TEST_CASE("shards: uint16 and uint32 round trips, epoch shuffle, train/val split", "[data]") {
  TempDir dir;
  const int T = 8;
  // Token = base + shard * 1000 + position, so each sequence reveals where it came from.
  for (int width : {2, 4}) {
    const uint32_t base = width == 2 ? 0 : 70000;
    const int32_t magic = width == 2 ? 20240520 : 20240801, version = width == 2 ? 1 : 7;
    const std::string sub = dir.file("w" + std::to_string(width));
    fs::create_directories(sub);
    // 159 tokens; no val file, so the last 15 are val (the cut at token 144, 18 into the last shard):
    // train 10 + 5 + 2 sequences of T = 8 (the last shard's [0, 19)), val 1 (its [18, 33)).
    const int sizes[3] = {81, 45, 33};
    for (int s = 0; s < 3; s++) {
      std::vector<uint32_t> tok(sizes[s]);
      for (int k = 0; k < sizes[s]; k++) tok[k] = base + uint32_t(s * 1000 + k);
      write_shard(sub + "/train_00" + std::to_string(s) + ".bin", tok, width, magic, version);
    }
    const int vocab = int(base) + 3000;
    auto tr = ul::open_dataset("shards:" + sub + "/*.bin", ul::Split::train, 9, vocab);
    auto va = ul::open_dataset("shards:" + sub + "/*.bin", ul::Split::val, 9, vocab);
    REQUIRE(tr->num_sequences(T) == 17);
    REQUIRE(va->num_sequences(T) == 1);
    auto [vx, vy] = get(*va, 0, T);
    CHECK(vx[0] == int32_t(base + 2000 + 18));  // the val part starts at the cut
    std::set<int32_t> starts;
    Seq order0, order1;
    for (int64_t i = 0; i < 34; i++) {
      auto [x, y] = get(*tr, i, T);
      const int32_t pos = (x[0] - int32_t(base)) % 1000;
      CHECK(pos % T == 0);
      for (int t = 0; t < T; t++) {
        CHECK(x[t] == x[0] + t);
        CHECK(y[t] == x[0] + t + 1);
      }
      CHECK(x[0] != vx[0]);
      if (x[0] >= int32_t(base + 2000)) CHECK(y[T - 1] <= int32_t(base + 2000 + 18));  // nothing past the cut
      (i < 17 ? order0 : order1).push_back(x[0]);
      if (i < 17) starts.insert(x[0]);
    }
    CHECK(starts.size() == 17);  // epoch 0 visits every train sequence once
    CHECK(std::set<int32_t>(order1.begin(), order1.end()) == starts);
    CHECK(order0 != order1);  // each epoch has its own order
    auto other = ul::open_dataset("shards:" + sub + "/*.bin", ul::Split::train, 10, vocab);
    Seq order_other;
    for (int64_t i = 0; i < 17; i++) order_other.push_back(get(*other, i, T).first[0]);
    CHECK(order_other != order0);
  }
  // A file named *val* is the val split, the rest train.
  const std::string sub = dir.file("split");
  fs::create_directories(sub);
  write_shard(sub + "/fineweb_train_000.bin", std::vector<uint32_t>(17, 5));
  write_shard(sub + "/fineweb_val_000.bin", std::vector<uint32_t>(25, 7));
  auto tr = ul::open_dataset("shards:" + sub + "/fineweb_*.bin", ul::Split::train, 0, 50257);
  auto va = ul::open_dataset("shards:" + sub + "/fineweb_*.bin", ul::Split::val, 0, 50257);
  CHECK(tr->num_sequences(T) == 2);
  CHECK(va->num_sequences(T) == 3);
  CHECK(get(*tr, 1, T).first[0] == 5);
  CHECK(get(*va, 2, T).first[0] == 7);
  CHECK(ul::open_dataset("shards:" + sub + "/*val*", ul::Split::val, 0, 0)->vocab() == 50257);
  // A val file is one with a word of its name starting with "val"; a glob of val files alone has
  // no train split (evaluating them is --val-data's job).
  for (const char* name : {"fineweb_val_000.bin", "validation.bin", "val.bin", "shakespeare-val.bin", "a.val.bin",
                           "VAL_000.bin", "Validation.bin", "fineweb_Val_001.bin"})
    CHECK(ul::ShardDataset::is_val_name(name));
  for (const char* name : {"interval_000.bin", "eval_000.bin", "fineweb_train_000.bin", "oval.bin", "x2val.bin", "OVAL.bin", "myVal.bin"})
    CHECK_FALSE(ul::ShardDataset::is_val_name(name));
  write_shard(sub + "/fineweb_interval_000.bin", std::vector<uint32_t>(17, 9));
  auto tr2 = ul::open_dataset("shards:" + sub + "/fineweb_*.bin", ul::Split::train, 0, 50257);
  CHECK(tr2->num_sequences(T) == 4);  // the interval file is train
  require_error([&] { ul::open_dataset("shards:" + sub + "/*_val_*", ul::Split::train, 0, 0); },
                {"no train file", "--val-data"});
}

TEST_CASE("sequence_at_length: a resume at another --seq goes on where the epoch stood", "[data][change-seq]") {
  TempDir dir;
  // Byte k of the text is k % 251, so an input reveals its offset; 1000 bytes: train [0, 900].
  std::vector<uint8_t> bytes(1000);
  for (size_t k = 0; k < bytes.size(); k++) bytes[k] = uint8_t(k % 251);
  write_bytes(dir.file("t.txt"), bytes);
  auto text = ul::open_dataset("text:" + dir.file("t.txt"), ul::Split::train, 1, 0);
  // Read in order: at T = 8, 5 sequences read bytes [0, 40); at 16 the next unread one starts at 48.
  CHECK(ul::sequence_at_length(*text, 5, 8, 16) == 3);
  CHECK(get(*text, 3, 16).first[0] == 48);
  CHECK(ul::sequence_at_length(*text, 6, 8, 16) == 3);   // [0, 48) read: 48 is next
  CHECK(ul::sequence_at_length(*text, 3, 16, 8) == 6);   // shorter: the same place
  CHECK(ul::sequence_at_length(*text, 0, 8, 24) == 0);
  // Every index of three epochs, lengths up and down, against the rule: the same epoch, the first
  // sequence at the new length that starts at or after what the old ones read, else the next
  // epoch's first (checked through the bytes the new sequence reads).
  for (auto [from, to] : {std::pair{8, 16}, {16, 8}, {7, 32}, {32, 7}, {8, 8}}) {
    const int64_t n_from = text->num_sequences(from), n_to = text->num_sequences(to);
    for (int64_t next = 0; next < 3 * n_from; next++) {
      INFO("--seq " << from << " -> " << to << ", sequence " << next);
      const int64_t r = ul::sequence_at_length(*text, next, from, to), read = (next % n_from) * from;
      const int64_t epoch = next / n_from;
      if (r / n_to == epoch) {
        const int64_t start = (r % n_to) * to;
        CHECK(start >= read);
        CHECK(start < read + to);
        CHECK(get(*text, r, to).first[0] == int32_t(start % 251));
      } else {
        CHECK(r == (epoch + 1) * n_to);
        CHECK((n_to - 1) * to < read);  // no sequence of that epoch at the new length was left unread
      }
    }
  }
  // Shards (shuffled per epoch): the epoch is kept, and the share of it read. Ten shards of 100
  // tokens hold 10 x 12 windows of 8 but only 10 of 64 (each loses 35 tokens, not 3), so 84 of
  // 120 read (70%) is 7 of 10 (a token count, 672 of 64, would end the epoch there).
  const std::string sub = dir.file("shards");
  fs::create_directories(sub);
  for (int k = 0; k < 10; k++) write_shard(sub + "/train_00" + std::to_string(k) + ".bin", std::vector<uint32_t>(100, 3));
  write_shard(sub + "/val_000.bin", std::vector<uint32_t>(300, 4));
  auto shards = ul::open_dataset("shards:" + sub + "/*.bin", ul::Split::train, 9, 0);
  REQUIRE(shards->num_sequences(8) == 120);
  REQUIRE(shards->num_sequences(64) == 10);
  CHECK(ul::sequence_at_length(*shards, 84, 8, 64) == 7);
  CHECK(ul::sequence_at_length(*shards, 2 * 120 + 84, 8, 64) == 2 * 10 + 7);
  CHECK(ul::sequence_at_length(*shards, 7, 64, 8) == 84);
  CHECK(ul::sequence_at_length(*shards, 119, 8, 64) == 10);  // 99%: the next epoch's first
  for (auto [from, to] : {std::pair{8, 64}, {64, 8}, {8, 24}, {24, 8}}) {
    const int64_t n_from = shards->num_sequences(from), n_to = shards->num_sequences(to);
    for (int64_t next = 0; next < 3 * n_from; next++) {
      INFO("--seq " << from << " -> " << to << ", sequence " << next);
      const int64_t r = ul::sequence_at_length(*shards, next, from, to), done = next % n_from, epoch = next / n_from;
      if (r / n_to == epoch) {  // the least share of the new epoch at or past the old one's
        CHECK((r % n_to) * n_from >= done * n_to);
        CHECK((r % n_to - 1) * n_from < done * n_to);
      } else {
        CHECK(r == (epoch + 1) * n_to);
        CHECK((n_to - 1) * n_from < done * n_to);
      }
    }
  }
  // Synthetic tasks: each sequence is a fresh draw at any length; the count goes on.
  auto passkey = ul::open_dataset("passkey", ul::Split::train, 1, 0);
  CHECK(ul::sequence_at_length(*passkey, 77, 64, 256) == 77);
}

TEST_CASE("shards: bad files are errors naming the file and the problem", "[data]") {
  TempDir dir;
  std::vector<uint32_t> tok(40, 3);
  auto open = [&](const std::string& path) { return ul::open_dataset("shards:" + path, ul::Split::train, 0, 100); };
  const std::string magic = dir.file("magic.bin"), version = dir.file("version.bin"), trunc = dir.file("trunc.bin"),
                    trail = dir.file("trail.bin"), hdr = dir.file("hdr.bin"), big = dir.file("big.bin");
  write_shard(magic, tok, 2, 12345);
  write_shard(version, tok, 2, 20240520, 3);
  write_shard(trunc, tok, 2, 20240520, 1, 0, 3);
  write_shard(trail, tok, 2, 20240520, 1, 2);
  write_bytes(hdr, std::vector<uint8_t>(100, 0));
  tok[21] = 100;
  write_shard(big, tok);
  require_error([&] { open(magic); }, {magic, "bad magic 12345"});
  require_error([&] { open(version); }, {version, "version 3"});
  require_error([&] { open(trunc); }, {trunc, "truncated"});
  require_error([&] { open(trail); }, {trail, "trailing bytes"});
  require_error([&] { open(hdr); }, {hdr, "truncated", "header"});
  require_error([&] { open(dir.file("none_*.bin")); }, {"none_*.bin", "no file matches"});
  auto d = open(big);
  get(*d, 0, 8);  // tokens 0..8 are fine; the bad one is read by the sequence holding offset 21
  bool thrown = false;
  for (int64_t i = 0; i < 4 && !thrown; i++) {
    try {
      get(*d, i, 8);
    } catch (const std::exception& e) {
      thrown = true;
      std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(big) != std::string::npos);
      CHECK(msg.find("token id 100") != std::string::npos);
      CHECK(msg.find("offset 21") != std::string::npos);
    }
  }
  CHECK(thrown);
}

TEST_CASE("shards: a file cut, grown or removed while a run reads it is an error naming it, not SIGBUS", "[data]") {
  // The shards were memory-mapped: a file truncated under a running job (llm.c's scripts rewrite
  // shards in place) killed it with SIGBUS at the next read, with no message and no record.
  TempDir dir;
  const std::string path = dir.file("train_000.bin");
  std::vector<uint32_t> tok(400);
  for (size_t i = 0; i < tok.size(); i++) tok[i] = uint32_t(i % 90);
  write_shard(path, tok);
  auto d = ul::open_dataset("shards:" + path, ul::Split::train, 0, 100);
  const int64_t n = d->num_sequences(8);
  for (int64_t i = 0; i < n; i++) get(*d, i, 8);  // every sequence reads as written
  auto every_read_fails = [&](const std::vector<std::string>& words) {
    for (int64_t i = 0; i < n; i++) require_error([&] { get(*d, i, 8); }, words);
  };
  tok.resize(100);
  write_shard(path, tok);  // cut: a rewrite in place at another length
  every_read_fails({path, "now 1224 bytes, not the 1824 its header counted", "cut or rewritten while the run read it"});
  tok.resize(500, 7);
  write_shard(path, tok);  // grown
  every_read_fails({path, "now 2024 bytes"});
  // Written again at its size, in place or as another file renamed over it (rsync, a shard made
  // again): refused too (a path opened per read would take the new bytes without a word).
  // (The in-place write is told by its mtime, which a kernel with coarse timestamps, Linux before
  // 6.13, may leave as it was within one clock tick of the open: moved on explicitly, as any later
  // write would.)
  const fs::file_time_type opened = fs::last_write_time(path);
  write_shard(path, std::vector<uint32_t>(400, 3));
  fs::last_write_time(path, opened + std::chrono::seconds(1));
  every_read_fails({path, "another file than the one the run opened, or written again since"});
  write_shard(path + ".new", std::vector<uint32_t>(400, 3));
  fs::rename(path + ".new", path);
  every_read_fails({path, "another file than the one the run opened, or written again since"});
  fs::remove(path);
  every_read_fails({path, "cannot open it again while the run reads it"});
}

TEST_CASE("task settings in the data spec reach the generator", "[data]") {
  // Counts are whole numbers an int holds (2.5 digits once ran as 2; 1e10 was an undefined cast),
  // and a setting is given once.
  for (const char* bad : {"passkey:digits=2.5", "passkey:digits=1e10", "passkey:filler=3.5", "recall:pairs=1e12",
                          "passkey:digits=1e1", "recall:pairs=1.6e1", "recall:gap=16.0"})  // (written as integers)
    CHECK_THROWS_WITH(ul::open_dataset(bad, ul::Split::train, 1, -1),
                      Catch::Contains("counts something: a whole number as written"));
  CHECK_THROWS_WITH(ul::open_dataset("recall:pairs=3000000000", ul::Split::train, 1, -1),
                    Catch::Contains("pairs is past an int's range"));
  CHECK_NOTHROW(ul::open_dataset("recall:gap=-1,pairs=4", ul::Split::train, 1, -1));  // -1: all spare room
  CHECK_THROWS_WITH(ul::open_dataset("passkey:digits=3,digits=4", ul::Split::train, 1, -1),
                    Catch::Contains("'digits' is given twice"));
  // depth: a fraction, or -1 for random (-0.5 was taken as random too).
  for (const char* bad : {"passkey:depth=-0.5", "passkey:depth=1.5", "passkey:depth=-2"})
    CHECK_THROWS_WITH(ul::open_dataset(bad, ul::Split::train, 1, -1), Catch::Contains("depth is a fraction in [0, 1]"));
  CHECK_NOTHROW(ul::open_dataset("passkey:depth=-1", ul::Split::train, 1, -1));
  // The start-up line gives the depth as written (it read "depth 0.900000").
  CHECK_THAT(ul::open_dataset("passkey:depth=0.9", ul::Split::train, 1, -1)->describe(), Catch::Contains("depth 0.9, "));
  CHECK_THAT(ul::open_dataset("passkey", ul::Split::train, 1, -1)->describe(), Catch::Contains("depth random, "));
  // Counts near 2^31 once wrapped: 2n + 3 for the digits passed the length check (and the
  // sequence overran its buffer), keys + values + 3 made a negative vocab.
  std::vector<int32_t> in1(257), tg1(257);
  CHECK_THROWS_WITH(ul::open_dataset("passkey:digits=1200000000", ul::Split::train, 1, -1)
                        ->sequence(0, 256, in1.data(), tg1.data()),
                    Catch::Contains("is too short for 1200000000 digits (need T >= 2400000002)"));
  CHECK_THROWS_WITH(ul::open_dataset("recall:keys=2000000000,values=2000000000", ul::Split::train, 1, -1),
                    Catch::Contains("more than 2^31 - 1"));
  CHECK_THROWS_WITH(ul::open_dataset("passkey:filler=2147483640", ul::Split::train, 1, -1),
                    Catch::Contains("more than 2^31 - 1"));
  // depth 0: the needle right after BOS; depth 1: right before the query. Recall: 4 pairs.
  auto near = ul::open_dataset("passkey:depth=0,digits=3", ul::Split::train, 1, -1);
  auto far = ul::open_dataset("passkey:depth=1,digits=3", ul::Split::train, 1, -1);
  const int T = 128;
  std::vector<int32_t> in(T), tg(T);
  auto key_at = [&](const ul::Dataset& d) {
    d.sequence(0, T, in.data(), tg.data());
    for (int t = 0; t < T; t++)
      if (in[t] == ul::PasskeyDataset::KEY) return t;
    return -1;
  };
  int a = key_at(*near), b = key_at(*far);
  CHECK(a >= 0);
  CHECK(b > a + T / 2);
  int scored = 0;
  near->sequence(0, T, in.data(), tg.data());
  for (int t = 0; t < T; t++) scored += tg[t] >= 0;
  CHECK(scored == 3);  // digits=3 reached the generator
}
