// `train prepare` (data/prepare.h): text files -> llm.c shards that shards:GLOB loads back.
//   - the shards hold exactly EOT + bytes per file, in order, split into train then val, each
//     shard at most --shard-tokens, headers as llm.c writes them, no .tmp file left behind;
//   - shards:GLOB reads them: the val split in order, every train sequence a window of the stream;
//   - training on them with --doc-mask runs;
//   - bad input (missing file, an EOT byte inside a file, stale shards, bad flags) is refused,
//     naming the problem, with nothing written.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "data/dataset.h"
#include "expect_error.h"
#include "run_cmd.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using ul_test::run_cmd;
using ul_test::train_cmd;

namespace {

using ul_test::TempDir;

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The tokens of one shard, after checking its llm.c header against its size.
std::vector<int32_t> shard_tokens(const std::string& path) {
  const std::string b = bytes_of(path);
  REQUIRE(b.size() >= 1024);
  int32_t h[3];
  std::memcpy(h, b.data(), sizeof h);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  REQUIRE(b.size() == 1024 + size_t(h[2]) * 2);
  std::vector<int32_t> t(static_cast<size_t>(h[2]));
  for (size_t k = 0; k < t.size(); k++) t[k] = uint8_t(b[1024 + 2 * k]) | uint8_t(b[1025 + 2 * k]) << 8;
  return t;
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("prepare: text files become shards that shards:GLOB reads back byte for byte", "[prepare]") {
  TempDir d;
  std::string a, b;
  for (int i = 0; i < 300; i++) a += "alpha " + std::to_string(i * 31 % 97) + (i % 5 ? " " : "\n");
  for (int i = 0; i < 256; i++) b += char(i);  // every byte value, NUL included: EOT 256 collides with none
  std::ofstream(d.file("a.txt"), std::ios::binary) << a;
  std::ofstream(d.file("b.bin"), std::ios::binary) << b;
  const std::string out = d.file("shards");
  auto r = run_cmd(train_cmd("prepare --out " + out + " --val-frac=0.2 --shard-tokens 500 " + d.file("a.txt") + " " +
                             d.file("b.bin")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("train with: train --data 'shards:" + out + "/text_*.bin' --doc-mask\n") != std::string::npos);
  CHECK(r.out.find("note    | shards of 500 tokens: a training sequence lies within one shard") != std::string::npos);
  // One document: no boundary for --doc-mask to mask, so it is not suggested.
  const auto one = run_cmd(train_cmd("prepare --out " + d.file("one") + " " + d.file("a.txt")));
  CHECK(one.out.find("train with: train --data 'shards:" + d.file("one") + "/text_*.bin'\n") != std::string::npos);
  // An --out that glob or the shell would read otherwise: the line given runs as printed (it said
  // 'shards:DIR/run[1]/text_*.bin', a pattern that matches run1, not run[1]).
  const std::string odd = d.file("run[1]'s");
  fs::create_directories(d.file("run1's"));
  const auto o = run_cmd(train_cmd("prepare --out \"" + odd + "\" " + d.file("a.txt") + " " + d.file("b.bin")));
  REQUIRE(o.code == 0);
  const size_t at = o.out.find("train with: train ");
  REQUIRE(at != std::string::npos);
  const std::string given = o.out.substr(at + 18, o.out.find('\n', at) - at - 18);
  CHECK(given == "--data 'shards:" + d.file("run\\[1\\]'\\''s") + "/text_*.bin' --doc-mask");
  const auto runs = run_cmd(train_cmd(given + " --steps 1 --seq 16 --layers 1 --dim 32 --heads 2 --eval-batches 1"));
  INFO(runs.out);
  CHECK(runs.code == 0);

  // The stream: EOT, a, EOT, b; its last 20% (rounded) is val.
  std::vector<int32_t> stream{256};
  for (char c : a) stream.push_back(uint8_t(c));
  stream.push_back(256);
  for (char c : b) stream.push_back(uint8_t(c));
  const size_t val = size_t(std::llround(0.2 * double(stream.size()))), train = stream.size() - val;

  std::vector<std::string> names = listing(out);
  std::vector<int32_t> got_train, got_val;
  size_t train_shards = 0;
  for (const std::string& n : names) {
    INFO(n);
    REQUIRE(n.rfind("text_", 0) == 0);  // nothing else, no .tmp left
    std::vector<int32_t> t = shard_tokens(out + "/" + n);
    CHECK(t.size() <= 500);
    bool is_val = n.find("_val_") != std::string::npos;
    train_shards += !is_val;
    (is_val ? got_val : got_train).insert((is_val ? got_val : got_train).end(), t.begin(), t.end());
  }
  CHECK(train_shards == (train + 499) / 500);
  CHECK(names.size() - train_shards == (val + 499) / 500);
  CHECK(got_train == std::vector<int32_t>(stream.begin(), stream.begin() + long(train)));
  CHECK(got_val == std::vector<int32_t>(stream.begin() + long(train), stream.end()));

  // shards:GLOB: val in order; each train sequence a window of its shard (train order is shuffled).
  const int T = 16;
  auto vds = ul::open_dataset("shards:" + out + "/text_*.bin", ul::Split::val, 1, 257);
  auto tds = ul::open_dataset("shards:" + out + "/text_*.bin", ul::Split::train, 1, 257);
  CHECK(vds->vocab() == 257);
  std::vector<int32_t> x(T), y(T);
  vds->sequence(0, T, x.data(), y.data());
  CHECK(x == std::vector<int32_t>(got_val.begin(), got_val.begin() + T));
  CHECK(y == std::vector<int32_t>(got_val.begin() + 1, got_val.begin() + T + 1));
  for (int64_t i = 0; i < tds->num_sequences(T); i++) {
    tds->sequence(i, T, x.data(), y.data());
    CHECK(std::equal(x.begin() + 1, x.end(), y.begin()));  // targets are the inputs shifted
    std::vector<int32_t> window(x);
    window.push_back(y.back());
    CHECK(std::search(got_train.begin(), got_train.end(), window.begin(), window.end()) != got_train.end());
  }

  // The headers name the tokenizer: vocab 257 and EOT 256 without --vocab or --eot.
  auto named = ul::open_dataset("shards:" + out + "/text_*.bin", ul::Split::train, 1, 0);
  CHECK(named->vocab() == 257);
  CHECK(named->eot() == 256);

  // And they train, packed with the document mask, as the hint line says; a sample prints as text
  // (bytes, the EOT as <|endoftext|>), not as ids.
  r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --doc-mask --seq 32 --batch 2 "
                        "--steps 2 --eval-batches 1 --threads 1 --sample 40 --prompt ids:104,105,256,104"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("vocab=257 (padded 384)") != std::string::npos);
  CHECK(r.out.find("--doc-mask: documents start at token 256") != std::string::npos);
  CHECK(r.out.find("done |") != std::string::npos);
  CHECK(r.out.find("\nhi<|endoftext|>h") != std::string::npos);
  CHECK(r.out.find("ids:") == std::string::npos);
}

TEST_CASE("prepare names an empty input file (a typo'd or truncated one shows), bytes or BPE", "[prepare]") {
  TempDir d;
  std::ofstream(d.file("a.txt")) << "some text to train on, long enough for both splits\n";
  std::ofstream(d.file("empty.txt")).flush();
  for (const std::string& tok : {std::string(), " --tokenizer " + ul_test::source_path("tests/data/bpe_tiny_tokenizer.bin")}) {
    const std::string out = d.file(tok.empty() ? "bytes" : "bpe");
    auto r = run_cmd(train_cmd("prepare --out " + out + tok + " " + d.file("a.txt") + " " + d.file("empty.txt")));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("note    | " + d.file("empty.txt") + " is empty: it adds nothing but a document boundary") !=
          std::string::npos);
    CHECK(r.out.find(d.file("a.txt") + " is empty") == std::string::npos);
  }
}

TEST_CASE("prepare's header ints: checked, and the format's defaults when a file lacks them", "[prepare]") {
  TempDir d;
  std::ofstream(d.file("ok.txt")) << "some text for a shard, long enough for both splits\n";
  const std::string out = d.file("shards");
  // A stopped run's temporaries are cleared (they are never shards: a glob of *.bin misses them).
  std::filesystem::create_directories(out);
  std::ofstream(out + "/text_train_000007.bin.tmp") << "left by a run that was stopped";
  REQUIRE(run_cmd(train_cmd("prepare --out " + out + " --val-frac 0 " + d.file("ok.txt"))).code == 0);
  CHECK_FALSE(std::filesystem::exists(out + "/text_train_000007.bin.tmp"));
  const std::string shard = out + "/text_train_000000.bin";
  std::string bytes = bytes_of(shard);
  auto with_header = [&](const std::string& name, int slot, int32_t value) {
    std::string b = bytes;
    std::memcpy(&b[size_t(4 * slot)], &value, 4);
    std::ofstream(d.file(name), std::ios::binary) << b;
    return d.file(name);
  };
  // A vocab the ids cannot reach, or an EOT outside it: refused, naming the file.
  for (auto [slot, value] : {std::pair<int, int32_t>{4, 0}, {4, 70000}, {5, 257}, {5, -1}}) {
    const std::string bad = with_header("bad.bin", slot, value);
    ul_test::require_error([&] { ul::open_dataset("shards:" + bad, ul::Split::train, 1, 0); }, {bad, "header names vocab"});
  }
  // Without the tag (an llm.c shard), the format's defaults. Beside a tagged one of another
  // tokenizer (bytes, 257): refused, naming both (it once trained at the larger vocab, no EOT known);
  // beside one tagged with GPT-2's own vocab and EOT, the same tokenizer: taken.
  const std::string plain = with_header("plain.bin", 3, 0);
  auto p = ul::open_dataset("shards:" + plain, ul::Split::train, 1, 0);
  CHECK(p->vocab() == 50257);
  CHECK(p->eot() == 50256);
  std::filesystem::copy_file(shard, d.file("plain_b.bin"));
  ul_test::require_error([&] { ul::open_dataset("shards:" + d.file("plain*.bin"), ul::Split::train, 1, 0); },
                         {"different tokenizers", plain + ": vocab 50257, end-of-text 50256 (its format's",
                          d.file("plain_b.bin") + ": vocab 257, end-of-text 256"});
  // A val file of another tokenizer in the glob counts too, though the train split never reads it.
  std::filesystem::rename(d.file("plain_b.bin"), d.file("plain_val.bin"));
  ul_test::require_error([&] { ul::open_dataset("shards:" + d.file("plain*.bin"), ul::Split::train, 1, 0); },
                         {"different tokenizers"});
  std::filesystem::remove(d.file("plain_val.bin"));
  {
    std::string b = bytes;
    const int32_t vocab = 50257, eot = 50256;
    std::memcpy(&b[16], &vocab, 4), std::memcpy(&b[20], &eot, 4);
    std::ofstream(d.file("plain_gpt2.bin"), std::ios::binary) << b;
  }
  auto same = ul::open_dataset("shards:" + d.file("plain*.bin"), ul::Split::train, 1, 0);
  CHECK(same->vocab() == 50257);
  CHECK(same->eot() == 50256);
  // What a resume checks (Dataset::identity): the same files say the same; one file more, or one
  // cut to another length, does not.
  CHECK(ul::open_dataset("shards:" + d.file("plain*.bin"), ul::Split::train, 1, 0)->identity() == same->identity());
  CHECK(same->identity().rfind("2 file(s), ", 0) == 0);
  CHECK(p->identity() != same->identity());
  {
    std::string b = bytes;
    const int32_t fewer = int32_t((b.size() - 1024) / 2 - 1), vocab = 50257, eot = 50256;
    std::memcpy(&b[8], &fewer, 4), std::memcpy(&b[16], &vocab, 4), std::memcpy(&b[20], &eot, 4);
    std::ofstream(d.file("plain_gpt2.bin"), std::ios::binary) << b.substr(0, b.size() - 2);
  }
  CHECK(ul::open_dataset("shards:" + d.file("plain*.bin"), ul::Split::train, 1, 0)->identity() != same->identity());
  // An id past the vocabulary the header names (257) but inside the model's: refused as it is read.
  {
    std::string b = bytes;
    const uint16_t id = 1000;
    std::memcpy(&b[1024 + 2 * 5], &id, 2);
    std::ofstream(d.file("big_id.bin"), std::ios::binary) << b;
  }
  auto big = ul::open_dataset("shards:" + d.file("big_id.bin"), ul::Split::train, 1, 2000);
  std::vector<int32_t> in(8), tg(8);
  ul_test::require_error([&] {
    for (int64_t i = 0; i < big->num_sequences(8); i++) big->sequence(i, 8, in.data(), tg.data());
  }, {d.file("big_id.bin"), "token id 1000 at token offset 5 is >= the vocab its header names, 257"});
}

TEST_CASE("prepare: bad input is refused and nothing is written", "[prepare]") {
  TempDir d;
  std::ofstream(d.file("ok.txt")) << "some text for a shard, long enough for both splits\n";
  std::ofstream(d.file("nul.txt"), std::ios::binary) << std::string("ab\0cd", 5);
  std::ofstream(d.file("mb.txt")) << std::string(1200000, 'x');
  const std::string out = d.file("out");
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--out " + out + " " + d.file("missing.txt") + " " + d.file("ok.txt"), "missing.txt: cannot open input file"},
      {"--out " + out + " " + d.path.string(), d.path.string() + ": a directory; to prepare the files under it: find '" +
                                                   d.path.string() + "' -type f -name '*.txt' | sort | train prepare "
                                                   "--files-from - --out '" + out + "' (with the other flags given"},
      {"--out " + out + " --eot 0 " + d.file("ok.txt") + " " + d.file("nul.txt"), "nul.txt: byte 0 at offset 2"},
      {"--out " + out + " --val-frac 1 " + d.file("ok.txt"), "--val-frac must be in [0, 1)"},
      // A fraction that leaves the val split under 2 tokens says so (it once printed "a val split of 0.000000").
      {"--out " + out + " --val-frac 0.00000001 " + d.file("ok.txt"),
       "at --val-frac 1e-08, a val split of 0 (each needs >= 2 tokens): use --val-frac 0 (no val split) or a larger one"},
      {"--out " + out + " --shard-tokens 0 " + d.file("ok.txt"), "--shard-tokens must be"},
      {"--out " + out + " --eot 70000 " + d.file("ok.txt"), "--eot 70000 is not in [0, 256]"},
      {"--out " + out + " --eot 50256 " + d.file("ok.txt"), "--eot 50256 is not in [0, 256]"},
      {"--out " + out + " --eot 257 " + d.file("ok.txt"), "--eot 257 is not in [0, 256]"},
      {"--out " + out + " --bogus 1 " + d.file("ok.txt"), "unknown flag '--bogus'"},
      // Unknown given last: named as unknown (it once said "missing value"), as with =VALUE.
      {"--out " + out + " " + d.file("ok.txt") + " --bogus", "unknown flag '--bogus'"},
      {"--out " + out + " " + d.file("ok.txt") + " --bogus=1", "unknown flag '--bogus'"},
      {"--out " + out + " --raw=1 " + d.file("ok.txt"), "--raw is a switch and takes no value"},
      {"--out " + out + " --val-frac=1 " + d.file("ok.txt"), "--val-frac must be in [0, 1)"},  // =VALUE is read
      {"--out " + out, "no input files"},
      {d.file("ok.txt"), "--out DIR is required"},
      // An empty value (a shell variable unset) is refused, not taken as the flag left out (byte
      // shards where BPE ones were asked for).
      {"--out " + out + " --tokenizer= " + d.file("ok.txt"), "prepare: --tokenizer: empty path"},
      {"--out= " + d.file("ok.txt"), "prepare: --out: empty path"},
      // -h where a value goes: a value forgotten, not the help with status 0 and nothing written.
      {"--out -h " + d.file("ok.txt"), "prepare: --out: missing value (the next argument, -h, is a flag"},
      // More shards than six digits name (their names would sort out of order): a flag's slip.
      {"--out " + out + " --shard-tokens 1 " + d.file("mb.txt"),
       "--shard-tokens 1 cuts the train split's 1080001 tokens into 1080001 shards"},
      {"--out " + out + " --shard-tokens 1 --val-frac 0 " + d.file("mb.txt"), "into 1200001 shards, more than 999999"},
  };
  for (const Case& c : cases) {
    auto r = run_cmd(train_cmd("prepare " + c.args));
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(c.message) != std::string::npos);
    CHECK_FALSE(fs::exists(out));  // not even empty: a directory a failed run made goes again
  }
  // --out: a failed run leaves it as it found it, missing parents included (a name part too long
  // fails after they are made); a successful one keeps every directory it made, also one its path
  // only passes through, so the path it prints works.
  const std::string too_long = "new/sub/" + std::string(300, 'x');
  std::ofstream(d.file("empty.txt")).flush();
  for (const auto& [dir, message] : {std::pair<std::string, std::string>{too_long, "(File name too long)"},
                                     {"ok.txt", "ok.txt: cannot create the output directory (something that is not a"},
                                     {"new/sub", "prepare: 1 tokens give a train split of 1"}}) {
    auto r = run_cmd("cd " + d.path.string() + " && " + train_cmd("prepare --val-frac 0 --out " + dir + " empty.txt"));
    INFO(dir << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(message) != std::string::npos);
    CHECK_FALSE(fs::exists(d / "new"));
  }
  CHECK(run_cmd("cd " + d.path.string() + " && " + train_cmd("prepare --val-frac 0 --out new/b/../c ok.txt")).code == 0);
  CHECK(listing(d / "new/b/../c") == std::vector<std::string>{"text_train_000000.bin"});
  // A byte EOT is fine when no file contains it; a second run into the same directory is refused.
  auto r = run_cmd(train_cmd("prepare --out " + out + " --eot 0 --val-frac 0 " + d.file("ok.txt")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(listing(out) == std::vector<std::string>{"text_train_000000.bin"});
  CHECK(shard_tokens(out + "/text_train_000000.bin").front() == 0);
  r = run_cmd(train_cmd("prepare --out " + out + " " + d.file("ok.txt")));
  CHECK(r.code == 1);
  CHECK(r.out.find("already holds shard text_train_000000.bin") != std::string::npos);
  CHECK(run_cmd(train_cmd("prepare --help")).out.find("usage: train prepare") != std::string::npos);
}

TEST_CASE("a prepare killed among its renames: shards: refuses the partial set, a rerun clears it", "[prepare]") {
  // What a kill -9 between two renames leaves (data/shards.h, kPrepareIncomplete): the marker that
  // lists the set, some shards under their final names, the rest as .tmp.
  TempDir d;
  {
    std::ofstream f(d.file("a.txt"));
    for (int i = 0; i < 400; i++) f << "line " << i << " of a text long enough for several shards\n";
  }
  const std::string out = d.file("out"), prep = "prepare --shard-tokens 2000 --out " + out + " " + d.file("a.txt");
  REQUIRE(run_cmd(train_cmd(prep)).code == 0);
  const std::vector<std::string> whole = listing(out);
  REQUIRE(whole.size() >= 6);
  CHECK_FALSE(fs::exists(out + "/prepare.incomplete"));  // a finished run leaves none
  std::string listed;
  for (const std::string& name : whole) listed += name + "\n";
  std::ofstream(out + "/prepare.incomplete") << listed;
  for (size_t i = 3; i < whole.size(); i++) fs::rename(out + "/" + whole[i], out + "/" + whole[i] + ".tmp");
  std::ofstream(out + "/notes.txt") << "the user's own file";
  auto r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --steps 1 --seq 64"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find(out + "/prepare.incomplete is there: the `train prepare` that wrote") != std::string::npos);
  CHECK(r.out.find("so the set is partial; run the prepare again") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  // The rerun removes the listed shards (and the temporaries) and writes the whole set again.
  r = run_cmd(train_cmd(prep));
  CHECK(r.code == 0);
  CHECK(r.out.find("prepare | removed 3 shard(s) an interrupted prepare left in " + out) != std::string::npos);
  std::vector<std::string> after = whole;
  after.push_back("notes.txt");
  std::sort(after.begin(), after.end());
  CHECK(listing(out) == after);
  CHECK(run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --steps 1 --seq 64")).code == 0);
  // The marker never removes what it does not name as a shard, nor an input.
  std::ofstream(out + "/prepare.incomplete") << "notes.txt\n../a.txt\ntext_train_000000.bin\n";
  fs::rename(out + "/text_train_000000.bin", d.file("in.bin"));
  fs::create_symlink(d.file("in.bin"), out + "/text_train_000000.bin");
  r = run_cmd(train_cmd("prepare --out " + out + " " + d.file("in.bin")));
  CHECK(r.code == 1);
  CHECK(r.out.find("lists as a shard of an interrupted prepare (which it would remove)") != std::string::npos);
  CHECK(fs::exists(out + "/notes.txt"));
  CHECK(fs::exists(d.file("a.txt")));
}

TEST_CASE("a stop signal during prepare's renames: the whole set lands, and a line says so before it stops",
          "[prepare]") {
  TempDir d;
  {
    std::ofstream f(d.file("a.txt"));
    for (int i = 0; i < 400; i++) f << "line " << i << " of a text long enough for several shards\n";
  }
  const std::string out = d.file("out");
  const auto r = run_cmd("ULYSSES_TEST_RAISE='prepare renames' " +
                         train_cmd("prepare --shard-tokens 2000 --out " + out + " " + d.file("a.txt")));
  INFO(r.out);
  CHECK(r.code == 128 + SIGTERM);  // the held signal, delivered once the renames are done
  CHECK(r.out.find("prepare | SIGTERM came during the final renames and was held until they were done: the ") !=
        std::string::npos);
  CHECK(r.out.find("shard(s) under " + out + " are complete; stopping") != std::string::npos);
  CHECK_FALSE(fs::exists(out + "/prepare.incomplete"));
  CHECK(listing(out).size() >= 6);
  for (const std::string& name : listing(out)) CHECK(name.find(".tmp") == std::string::npos);
  CHECK(run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --steps 1 --seq 64")).code == 0);
  // A SIGTERM the caller ignores ends nothing: no "stopping" line, and prepare finishes as usual.
  const auto quiet = run_cmd("trap '' TERM; ULYSSES_TEST_RAISE='prepare renames' " +
                             train_cmd("prepare --shard-tokens 2000 --out " + d.file("out2") + " " + d.file("a.txt")));
  INFO(quiet.out);
  CHECK(quiet.code == 0);
  CHECK(quiet.out.find("stopping") == std::string::npos);
  CHECK(quiet.out.find("prepare | ") != std::string::npos);
}

TEST_CASE("prepare holds one shard open at a time, one prepare a directory, and never removes an input named as "
          "its marker", "[prepare]") {
  TempDir d;
  {
    std::ofstream f(d.file("a.txt"));
    for (int i = 0; i < 300; i++) f << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  // Hundreds of shards under an open-file limit of 64, bytes and BPE (the BPE cut kept every
  // shard open until the end, then failed blaming the disk: "tokens ... missing on reading back").
  const std::string tok = " --tokenizer " + ul_test::source_path("tests/data/bpe_tiny_tokenizer.bin");
  for (const std::string& how : {std::string(), tok}) {
    const std::string out = d.file(how.empty() ? "bytes" : "bpe");
    auto r = run_cmd("ulimit -n 64 && " + train_cmd("prepare --shard-tokens 20 --out " + out + how + " " + d.file("a.txt")));
    INFO(how << "\n" << r.out);
    CHECK(r.code == 0);
    CHECK(listing(out).size() > 200);
  }
  // Another prepare writing to --out (here: its lock held by this process) is refused before
  // anything is touched.
  const std::string busy = d.file("busy");
  fs::create_directory(busy);
  std::ofstream(busy + "/text_train_000000.bin.tmp") << "the other run's";
  const int fd = ::open(busy.c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  auto r = run_cmd(train_cmd("prepare --out " + busy + " " + d.file("a.txt")));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find(busy + ": another process holds this --out's lock (another train prepare writing shards?") !=
        std::string::npos);
  CHECK(listing(busy) == std::vector<std::string>{"text_train_000000.bin.tmp"});
  ::close(fd);
  // An input with the marker's name (or its temporary's) in --out is refused, not removed.
  for (const char* name : {"prepare.incomplete", "prepare.incomplete.tmp"}) {
    const std::string in = busy + "/" + name;
    std::ofstream(in) << "some text of the user's, long enough for both splits\n";
    r = run_cmd(train_cmd("prepare --out " + busy + " " + in));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(in + ": an input file named like prepare's own marker") != std::string::npos);
    CHECK(fs::exists(in));
    fs::remove(in);
  }
}

TEST_CASE("a val split too short for --seq fails at start-up, saying what to change", "[prepare]") {
  TempDir d;
  std::ofstream(d.file("a.txt"), std::ios::binary) << std::string(1000, 'x');
  const std::string out = d.file("shards");
  REQUIRE(run_cmd(train_cmd("prepare --out " + out + " --val-frac 0.1 " + d.file("a.txt"))).code == 0);
  // 901 train tokens, 100 val: --seq 200 fits the train split only. Before, the error came at the
  // first eval, after the whole training run.
  auto r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --seq 200 --batch 1 --steps 3 --threads 1"));
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("the val split has no sequence of length 200 (its 1 file(s) hold 100 tokens") != std::string::npos);
  CHECK(r.out.find("a larger --val-frac in train prepare") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  // A run that never evaluates (--steps 0 with an export) does not need the val split.
  r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --seq 200 --steps 0 --export-safetensors " +
                        d.file("m.safetensors")));
  INFO(r.out);
  CHECK(r.code == 0);
  // And --seq 64 fits both.
  r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --seq 64 --batch 1 --steps 1 --threads 1"));
  CHECK(r.code == 0);
}
