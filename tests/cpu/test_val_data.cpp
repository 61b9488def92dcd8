// --val-data: evals read another dataset's validation split, bounded by the model's vocabulary.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "engine/trainer.h"
#include "fresh_eval.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::TempDir;

namespace {

ul::EvalResult eval_of(const std::string& args, int ranks = 1) {
  return ul_test::fresh_eval("--threads 1 --quiet --eval-batches 3 --seq 64 --batch 2 --layers 1 --dim 32 --heads 4 " +
                             args, ranks);
}

void write_text(const std::string& path, const std::string& word, int lines) {
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < lines; i++) f << word << ' ' << (i * 7919) % 1000 << '\n';
}

}  // namespace

TEST_CASE("with --val-data the eval reads the other dataset's validation split", "[val_data]") {
  TempDir dir;
  const std::string a = (dir.path / "a.txt").string(), b = (dir.path / "b.txt").string();
  write_text(a, "alpha", 800);
  write_text(b, "omega zz", 800);
  // The same initial model (bytes: vocab 256 either way), so the val loss depends only on the data.
  const ul::EvalResult on_b = eval_of("--data text:" + b);
  const ul::EvalResult a_with_b = eval_of("--data text:" + a + " --val-data text:" + b);
  CHECK(a_with_b.loss == on_b.loss);
  CHECK(a_with_b.answers == on_b.answers);
  CHECK(eval_of("--data text:" + a).loss != on_b.loss);  // and the default is --data's own split
  // Under sp and dp the ranks share the other dataset's sequences as they share --data's.
  const ul::EvalResult sp2 = eval_of("--data text:" + a + " --val-data text:" + b + " --sp 2", 2);
  CHECK(std::fabs(sp2.loss - on_b.loss) < 1e-5 * on_b.loss);
  CHECK(sp2.answers == on_b.answers);
}

TEST_CASE("a --val-data the model cannot read is refused, naming the flag", "[val_data]") {
  TempDir dir;
  const std::string a = (dir.path / "a.txt").string();
  write_text(a, "alpha", 800);
  auto refused = [](const std::string& args, const std::vector<std::string>& parts) {
    const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(args + " --steps 1 --threads 1"));
    INFO(r.out);
    CHECK(r.code != 0);
    for (const std::string& p : parts) CHECK(r.out.find(p) != std::string::npos);
  };
  refused("--data passkey --val-data text:" + a, {"--val-data", "a.txt", ">= the model vocab 32"});
  refused("--data text:" + a + " --val-data nosuch:x", {"--val-data", "unknown dataset \"nosuch:x\""});
  refused("--data text:" + a + " --val-data text:" + (dir.path / "none.txt").string(), {"--val-data", "none.txt"});
  const std::string tiny = (dir.path / "tiny.txt").string();
  std::ofstream(tiny) << "too short for a sequence";
  refused("--data text:" + a + " --seq 64 --val-data text:" + tiny, {"--val-data: ", "tiny.txt", "too short"});
  // llm.c shards name no vocabulary: an id past the model's is found as the eval reads it, and the
  // error still names the flag, the file and the offset.
  const std::string shard = (dir.path / "book_val.bin").string();
  {
    std::ofstream f(shard, std::ios::binary);
    int32_t h[256] = {20240520, 1, 4096};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    for (int i = 0; i < 4096; i++) {
      const uint16_t t = uint16_t(i == 100 ? 999 : i % 20);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  refused("--data passkey --eval-batches 1 --batch 1 --seq 128 --val-data shards:" + shard,
          {"--val-data: ", "book_val.bin", "token id 999", ">= the model vocab 32"});
  // Shards whose headers name a vocabulary larger than the model's are refused before any step.
  const std::string named = (dir.path / "named_val.bin").string();
  {
    std::ofstream f(named, std::ios::binary);
    int32_t h[256] = {20240520, 1, 4096};
    h[3] = 0x53594c55, h[4] = 300, h[5] = 299;  // data/shards.h: kShardTag, the vocabulary, the EOT
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    const std::vector<uint16_t> t(4096, 7);
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
  }
  refused("--data passkey --val-data shards:" + named, {"named_val.bin", "headers name a vocabulary of 300 tokens, larger than the model's 32"});
  // A --val-data split the run trains on: the held-out tail of one train file of --data's glob
  // (the evals would read trained tokens). The same file's own split beside it is fine.
  for (const char* name : {"p_train_0.bin", "p_train_1.bin"}) {
    std::ofstream f((dir.path / name).string(), std::ios::binary);
    int32_t h[256] = {20240520, 1, 4000};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    const std::vector<uint16_t> t(4000, 3);
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
  }
  refused("--data 'shards:" + (dir.path / "p_*.bin").string() + "' --vocab 64 --seq 64 --val-data shards:" +
              (dir.path / "p_train_0.bin").string(),
          {"--val-data: ", "p_train_0.bin's tokens [3600, 4000) are also in --data's training split (its tokens [0, 4000))"});
  // A --val-data of another tokenizer (its ids are other text) is refused.
  refused("--data 'shards:" + (dir.path / "p_*.bin").string() + "' --vocab 512 --seq 64 --val-data shards:" + named,
          {"--val-data shards:", "written by another tokenizer (vocab 300, end-of-text 299) than --data's (vocab 50257, "
                                 "end-of-text 50256)"});
  // text:FILE's ids are its bytes: beside a tokenizer's shards they are other text, either way...
  refused("--data text:" + a + " --vocab 300 --seq 64 --val-data shards:" + named,
          {"--val-data shards:", "written by another tokenizer (vocab 300, end-of-text 299) than --data's (bytes, no end-of-text)"});
  refused("--data 'shards:" + (dir.path / "p_*.bin").string() + "' --vocab 512 --seq 64 --val-data text:" + a,
          {"--val-data text:", "written by another tokenizer (bytes, no end-of-text) than --data's (vocab 50257, end-of-text 50256)"});
  // ... but the same as `train prepare`'s byte shards (the bytes, the EOT past them).
  const std::string bytes_val = (dir.path / "bytes_val.bin").string();
  {
    std::ofstream f(bytes_val, std::ios::binary);
    int32_t h[256] = {20240520, 1, 4096};
    h[3] = 0x53594c55, h[4] = 257, h[5] = 256;
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    const std::vector<uint16_t> t(4096, 'a');
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
  }
  CHECK(ul_test::run_cmd(ul_test::train_cmd("--data text:" + a + " --vocab 257 --val-data shards:" + bytes_val +
                                            " --steps 1 --threads 1 --seq 64 --batch 1 --eval-batches 1")).code == 0);
  // (without --vocab 257 the text: model's 256 ids miss their end-of-text: the refusal says what to give)
  refused("--data text:" + a + " --seq 64 --val-data shards:" + bytes_val,
          {"bytes_val.bin", "a vocabulary of 257 tokens, larger than the model's 256 (token ids up to 256 may occur): a "
                            "model of vocab 257 or more reads them (--vocab 257 on a fresh model; a --checkpoint's "
                            "model keeps its own) (train prepare's byte shards: bytes and the end-of-text id 256)"});
  const ul_test::CmdResult own = ul_test::run_cmd(ul_test::train_cmd(
      "--data text:" + a + " --val-data text:" + a + " --steps 1 --threads 1 --seq 64 --batch 1 --eval-batches 1"));
  CHECK(own.code == 0);
  // --data's own val shard, a link to one of its training shards: the same tokens under a val name.
  std::filesystem::create_directory(dir.path / "linked");
  std::filesystem::copy_file(dir.path / "p_train_0.bin", dir.path / "linked/a_train.bin");
  std::filesystem::create_hard_link(dir.path / "linked/a_train.bin", dir.path / "linked/a_val.bin");
  refused("--data 'shards:" + (dir.path / "linked/*.bin").string() + "' --vocab 64 --seq 64",
          {"--data (its val split): ", "a_val.bin's tokens [0, 4000) are also in --data's training split (",
           "a_train.bin's, the same file, tokens [0, 4000))"});
}

TEST_CASE("the data's own val split is read against the model's vocabulary and a short split or another EOT is noted", "[val_data]") {
  TempDir dir;
  auto shard = [&](const std::string& name, const std::vector<uint16_t>& t, int vocab, int eot) {
    std::ofstream f((dir.path / name).string(), std::ios::binary);
    int32_t h[256] = {20240520, 1, int32_t(t.size())};
    if (vocab > 0) h[3] = 0x53594c55, h[4] = vocab, h[5] = eot;  // data/shards.h: kShardTag
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
  };
  std::vector<uint16_t> train(4000), val(2000);
  for (size_t i = 0; i < train.size(); i++) train[i] = uint16_t(i % 250);
  for (size_t i = 0; i < val.size(); i++) val[i] = uint16_t(i == 50 ? 300 : i % 250);
  shard("d_train_0.bin", train, 257, 256);
  shard("d_val_0.bin", val, 257, 256);  // the train file's tokenizer (a glob of two is refused)
  const std::string base = "--steps 1 --threads 1 --seq 64 --batch 2 --layers 1 --dim 32 --heads 2 ";
  // Id 300 is past the model's 257 (though inside its padded rows): found at the eval, named.
  ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 2 --data 'shards:" +
                                                             (dir.path / "d_*.bin").string() + "'"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("d_val_0.bin: token id 300 at token offset 50 is >= the model vocab 257") != std::string::npos);
  CHECK(r.out.find("train: error: --data (its val split): ") != std::string::npos);  // as start-up names it
  // In the train split: found at the step that reads it, with the way on past that step's data
  // (every resume fails the same way there).
  std::vector<uint16_t> bad(4000, 300);
  shard("e_train_0.bin", bad, 257, 256);
  shard("e_val_0.bin", train, 257, 256);
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1 --data 'shards:" + (dir.path / "e_*.bin").string() + "'"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("e_train_0.bin: token id 300 at token offset ") != std::string::npos);
  CHECK(r.out.find("; this step trains on sequences 0 to 1: resume from a checkpoint before it with --resume-step N "
                   "--skip-batches K") != std::string::npos);
  // --data without val files beside --val-data: its held-out tenth trains nothing, and is said to.
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1 --data shards:" + (dir.path / "d_train_0.bin").string() +
                                          " --val-data shards:" + (dir.path / "e_val_0.bin").string()));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("note    | --data holds out its last 400 tokens as its val split, which --val-data replaces: they "
                   "train nothing") != std::string::npos);
  // The same spec as --val-data reads that very split: nothing to say.
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1 --data shards:" + (dir.path / "d_train_0.bin").string() +
                                          " --val-data shards:" + (dir.path / "d_train_0.bin").string()));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("note    | --data holds out") == std::string::npos);
  // ... and the same files spelled otherwise.
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1 --data shards:" + (dir.path / "d_train_0.bin").string() +
                                          " --val-data shards:" + (dir.path / "." / "d_train_0.bin").string()));
  CHECK(r.code == 0);
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("note    | --data holds out") == std::string::npos);
  // A text too short to hold out a val split at all: --seq cannot help.
  const std::string tiny = (dir.path / "tiny.txt").string();
  std::ofstream(tiny) << "fifteen bytes..";
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--seq 4 --data text:" + tiny));
  CHECK(r.code == 1);
  CHECK(r.out.find("tiny.txt: too short for sequence length 4: its val split (the last 10%, 1 of 15 bytes) holds no "
                   "sequence of 5 bytes; the file is too short to hold out a val split at any --seq: give --val-data") !=
        std::string::npos);
  // A val split smaller than an eval: the note says the eval counts some sequences twice.
  const std::string text = (dir.path / "t.txt").string();
  write_text(text, "alpha", 100);
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 8 --data text:" + text));
  CHECK(r.code == 0);
  CHECK(r.out.find("note    | an eval reads 16 val sequences (--eval-batches x dp x --batch) but the val split holds 1 at "
                   "--seq 64") != std::string::npos);
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1"));  // passkey: unlimited, no note
  REQUIRE(r.code == 0);  // a run that failed would print no note either
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("note    | an eval reads") == std::string::npos);
  // --doc-mask splits --val-data at the run's end-of-text token; data that names another is noted.
  // (`train prepare`'s byte shards: text:FILE's bytes, with their own EOT past them.)
  shard("e_val_0.bin", std::vector<uint16_t>(2000, 7), 257, 256);
  r = ul_test::run_cmd(ul_test::train_cmd(base + "--eval-batches 1 --vocab 257 --doc-mask --eot 10 --data text:" + text +
                                          " --val-data shards:" + (dir.path / "e_val_0.bin").string()));
  CHECK(r.code == 0);
  CHECK(r.out.find("note    | --doc-mask: --val-data's files start documents at token 256, the run at 10") !=
        std::string::npos);
}

TEST_CASE("a resume with another --val-data probes its lengths again, and --steps 0 probes read --val-data", "[val_data][length_probe]") {
  TempDir dir;
  const std::string a = (dir.path / "a.txt").string(), b = (dir.path / "b.txt").string();
  write_text(a, "alpha", 800);
  write_text(b, "omega zz", 800);
  const std::string run = "--data text:" + a + " --steps 2 --eval-every 0 --eval-batches 1 --threads 1 --batch 2" +
                          " --seq 64 --layers 1 --dim 32 --heads 4 --probe-lengths 64 --save-dir " +
                          (dir.path / "run").string();
  ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(run));
  INFO(r.out);
  REQUIRE(r.code == 0);
  // The row logged at step 2 was measured on a.txt's split: b.txt's is measured, not taken.
  r = ul_test::run_cmd(ul_test::train_cmd(run + " --resume --val-data text:" + b));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("logged already") == std::string::npos);
  CHECK(r.out.find("length     64 | val loss") != std::string::npos);
  // And again on b.txt: that row is this run's own now.
  r = ul_test::run_cmd(ul_test::train_cmd(run + " --resume --val-data text:" + b));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("length     64 | logged already at step 2") != std::string::npos);
  // --steps 0 with a sample and no eval: the probes read --val-data, so no note calls it unread
  // (--loss-by-position is).
  r = ul_test::run_cmd(ul_test::train_cmd("--data text:" + a + " --steps 0 --threads 1 --seq 64 --layers 1 --dim 32"
                                          " --heads 4 --sample 2 --prompt hi --loss-by-position --probe-lengths 64"
                                          " --val-data text:" + b));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("length     64 | val loss") != std::string::npos);
  CHECK(r.out.find("evaluates nothing (give --eval-batches N for an eval): --loss-by-position not read") !=
        std::string::npos);
}

TEST_CASE("an eval over dp ranks reads the sequences one rank reads with their batches together", "[val_data]") {
  // --eval-batches 3 x dp 2 x --batch 2 and 3 x 1 x 4: the same 12 sequences, 0-11 (passkey's
  // differ one from the next, so ranks reading overlapping ones would show in the loss).
  const ul::EvalResult one = eval_of("--data passkey --batch 4"), two = eval_of("--data passkey --batch 2", 2);
  CHECK(std::fabs(two.loss - one.loss) < 1e-5 * one.loss);
  CHECK(two.answers == one.answers);
  CHECK(two.whole_answers == one.whole_answers);
  CHECK(two.accuracy == one.accuracy);
}
