// The train binary end to end: bad input is refused with a message naming the flag or file and a
// non-zero exit; the reference state passes; a short run learns; the optimizer flags reach AdamW.
#include "gradcheck.h"
#include "options_from.h"
#include "engine/planner.h"
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/optimizer.h"
#include "engine/run_log.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#include "run_cmd.h"
#include "temp_dir.h"

using namespace ul_test;
namespace fs = std::filesystem;

// A failing run whose output names `needle`; refused at start-up unless `trained` (a check moved
// to where the file is written, after the training, would fail with the same message).
static void expect_refused(const std::string& args, const std::string& needle, bool trained = false) {
  CmdResult r = run_cmd(train_cmd(args));
  INFO("train " << args << "\n" << r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(needle) != std::string::npos);
  if (trained) return;
  CHECK(r.out.rfind("step ", 0) != 0);
  CHECK(r.out.find("\nstep ") == std::string::npos);
  CHECK(r.out.find("done |") == std::string::npos);
}

TEST_CASE("train --log refuses another run's: in its --save-dir, or locked by a run writing it", "[cli]") {
  TempDir dir;
  const std::string d = dir.path.string();
  const std::string run = "--steps 1 --seq 32 --batch 1 --eval-batches 1 --threads 1 --eval-every 0";
  // Another run's save directory: its log and plot stay as they were, fresh run or resume.
  REQUIRE(ul_test::run_cmd(ul_test::train_cmd(run + " --save-dir " + d + "/other")).code == 0);
  const std::string other_log = d + "/other/log.jsonl";
  std::string before;
  {
    std::ifstream f(other_log);
    before.assign(std::istreambuf_iterator<char>(f), {});
  }
  REQUIRE(!before.empty());
  expect_refused(run + " --log " + other_log, "--log " + other_log + ": it is a file of another run's --save-dir (" + d +
                                                  "/other holds its checkpoints or lock): this run would replace it; "
                                                  "write it elsewhere, or under a new name");
  // A new log name whose plot is that run's (log -> log.svg) is refused as well.
  expect_refused(run + " --log " + d + "/other/log", "--log " + d + "/other/log: its plot " + d + "/other/log.svg is a "
                                                     "file of another run's --save-dir");
  { std::ofstream(d + "/other/custom.jsonl") << "{\"type\": \"step\"}\n"; }  // (that run's own --log name)
  expect_refused(run + " --steps 2 --save-dir " + d + "/mine --resume --log " + d + "/other/custom.jsonl",
                 "is a file of another run's --save-dir");
  // A new name there (an eval's log beside the checkpoint it read) touches nothing of that run.
  CHECK(ul_test::run_cmd(ul_test::train_cmd(run + " --log " + d + "/other/eval_step1.jsonl")).code == 0);
  {
    std::ifstream f(other_log);
    CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == before);
  }
  CHECK(std::filesystem::exists(d + "/other/log.svg"));
  // Its own --save-dir's log by name is its own.
  CHECK(ul_test::run_cmd(ul_test::train_cmd(run + " --save-dir " + d + "/own --log " + d + "/own/log.jsonl")).code == 0);
  // A log another process holds (a run writing it: RunLog's flock) is refused before it is emptied.
  const std::string held = d + "/held.jsonl";
  { std::ofstream(held) << "{\"type\": \"step\"}\n"; }
  const int fd = ::open(held.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  expect_refused(run + " --log " + held, held + ": another run is writing this log now (it holds its lock): give this "
                                                "run another --log");
  ::close(fd);
  {
    std::ifstream f(held);
    CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == "{\"type\": \"step\"}\n");
  }
  // Unheld, a fresh run replaces it (a rerun of one command with one --log).
  CHECK(ul_test::run_cmd(ul_test::train_cmd(run + " --log " + held)).code == 0);
}

TEST_CASE("train checks its outputs and inputs and switches before any work", "[cli]") {
  TempDir dir;
  const std::string d = dir.path.string(), text = d + "/book.txt";
  { std::ofstream f(text); for (int i = 0; i < 300; i++) f << "line " << i << " of a small book\n"; }
  const std::string run = "--data text:" + text + " --steps 1 --seq 32 --batch 1 --eval-batches 1 --threads 1";
  // An output that is a directory, or that names an input or another output.
  std::filesystem::create_directories(d + "/adir");
  expect_refused(run + " --log " + d + "/adir", "--log: " + d + "/adir exists and is not a regular file (a directory)");
  expect_refused(run + " --export-llmc " + d + "/adir", "--export-llmc: " + d + "/adir exists and is not a regular file");
  // An llm.c file under a name --checkpoint reads as safetensors could not be loaded back.
  for (const char* name : {"/m.safetensors", "/m.safetensors.index.json"})
    expect_refused(run + " --export-llmc " + d + name, "--export-llmc " + d + name + ": an llm.c checkpoint under a "
                   "Hugging Face name would be read back as one (--checkpoint tells the formats apart by the name)");
  expect_refused(run + " --log " + text, "--log " + text + " is --data's file: the run would overwrite its own input");
  expect_refused(run + " --log " + d + "/x.bin --export-llmc " + d + "/./x.bin", "is also --log's: one would overwrite the other");
  // A hard link to the text is the text (the log's open would have emptied it); the save
  // directory is not a log file.
  fs::create_hard_link(text, d + "/hard.txt");
  expect_refused(run + " --log " + d + "/hard.txt", "--log " + d + "/hard.txt is --data's file");
  expect_refused(run + " --log " + d + "/sd --save-dir " + d + "/sd", "--log " + d + "/sd is --save-dir's directory");
  // Nor may an output land in a checkpoint (an export once replaced a step's model.bin).
  expect_refused(run + " --save-dir " + d + "/sd --export-llmc " + d + "/sd/step_00000001/model.bin",
                 "--export-llmc " + d + "/sd/step_00000001/model.bin is inside --save-dir's checkpoint step_00000001");
  // Nor on a file of another run's checkpoint (only this run's --save-dir was checked: an export
  // or a log there replaced its model.bin or rank_0.json); a new name beside them is left alone.
  REQUIRE(run_cmd(train_cmd(run + " --quiet --save-dir " + d + "/other")).code == 0);
  const std::string theirs = d + "/other/step_00000001/";
  expect_refused(run + " --export-llmc " + theirs + "model.bin",
                 "--export-llmc " + theirs + "model.bin is a file of the checkpoint " + d + "/other/step_00000001");
  expect_refused(run + " --log " + theirs + "rank_0.json", "--log " + theirs + "rank_0.json is a file of the checkpoint");
  expect_refused(run + " --log " + theirs + "COMPLETE", "is a file of the checkpoint");
  REQUIRE(run_cmd(train_cmd("--steps 0 --quiet --checkpoint " + theirs + "model.bin --export-llmc " + theirs +
                            "gpt2.bin")).code == 0);
  // Nor on a name the log's length plot takes, without --probe-lengths too (a log with no length
  // record removes a plot of that name: it deleted the training text).
  std::ofstream(d + "/x_lengths.svg") << std::string(4000, 'a');
  expect_refused(run + " --data text:" + d + "/x_lengths.svg --log " + d + "/x.jsonl",
                 "--log (its length plot) " + d + "/x_lengths.svg is --data's file");
  CHECK(fs::exists(d + "/x_lengths.svg"));
  // Nor on the save directory's rollback record, which every resume reads.
  expect_refused(run + " --save-dir " + d + "/sd --log " + d + "/sd/rollback.json", "is --save-dir's rollback record");
  // Nor where a shards: pattern matches what the run writes (it would train, and then neither
  // resume nor start again on that pattern: a log or a step directory read as a shard).
  const std::string shards = " --data shards:" + d + "/sh/*";
  fs::create_directories(d + "/sh");
  expect_refused("--steps 1 --threads 1" + shards + " --save-dir " + d + "/sh",
                 "--save-dir's log " + d + "/sh/log.jsonl matches --data's pattern shards:" + d + "/sh/*");
  expect_refused("--steps 1 --threads 1" + shards + " --save-dir " + d + "/sh/run",
                 "--save-dir " + d + "/sh/run matches --data's pattern");
  expect_refused("--steps 1 --threads 1" + shards + " --log " + d + "/sh/train.jsonl", "--log " + d + "/sh/train.jsonl matches");
  // ... also a checkpoint's files under a pattern one level down; an empty pattern is --data's
  // own refusal, not a file system error.
  expect_refused("--steps 1 --threads 1 --data shards:" + d + "/*/*.bin --save-dir " + d,
                 "--save-dir (a checkpoint's file) " + d + "/step_00000001/model.bin matches --data's pattern");
  expect_refused("--steps 1 --threads 1 --data shards:", "unknown dataset \"shards:\"");
  expect_refused("--steps 1 --threads 1 --val-data shards:" + d + "/sh/*.bin --export-llmc " + d + "/sh/m.bin",
                 "--export-llmc " + d + "/sh/m.bin matches --val-data's pattern");
  // (A file beside the checkpoints whose name only starts like one is no checkpoint.)
  REQUIRE(run_cmd(train_cmd(run + " --quiet --save-dir " + d + "/sd2 --export-llmc " + d + "/sd2/step_final.bin")).code == 0);
  // A log in a directory that does not exist yet: made, as an export's is.
  REQUIRE(run_cmd(train_cmd(run + " --quiet --log " + d + "/new/dir/log.jsonl")).code == 0);
  CHECK(fs::file_size(d + "/new/dir/log.jsonl") > 0);
  // An export beside a Hugging Face --checkpoint would replace the config.json it was read with.
  const std::string hf = d + "/base/model.safetensors";
  REQUIRE(run_cmd(train_cmd(run + " --model llama --export-safetensors " + hf)).code == 0);
  expect_refused("--checkpoint " + hf + " --steps 1 --seq 32 --export-safetensors " + d + "/base/long.safetensors",
                 "base/config.json is --checkpoint (its config.json)'s file");
  // A non-finite weight in a Hugging Face file is named as the file names it, not by our stacked tensor.
  {
    const ul::SafetensorsFile f(hf, /*header_only=*/true);
    const ul::SafeTensorInfo* ln = nullptr;
    for (const ul::SafeTensorInfo& t : f.tensors())
      if (t.name == "model.layers.1.input_layernorm.weight") ln = &t;
    REQUIRE(ln != nullptr);
    REQUIRE(ln->dtype == "F32");
    std::ifstream in(hf, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    uint64_t header = 0;
    std::memcpy(&header, all.data(), 8);
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(&all[8 + header + ln->begin + 4 * 3], &inf, 4);
    fs::create_directories(d + "/inf");
    fs::copy_file(d + "/base/config.json", d + "/inf/config.json");
    std::ofstream(d + "/inf/model.safetensors", std::ios::binary) << all;
  }
  expect_refused("--checkpoint " + d + "/inf/model.safetensors --steps 0 --seq 16 --data passkey",
                 "inf/model.safetensors: tensor 'model.layers.1.input_layernorm.weight' holds a non-finite value (inf at element 3)");
  // A sharded checkpoint's shards are its inputs too (the log once overwrote one).
  const std::string index = d + "/base/model.safetensors.index.json";
  std::ofstream(index) << "{\"weight_map\":{\"model.embed_tokens.weight\":\"model.safetensors\"}}";
  expect_refused("--checkpoint " + index + " --steps 1 --seq 32 --log " + hf, hf + " is --checkpoint (a shard)'s file");
  std::ifstream still(text);
  std::string first;
  std::getline(still, first);
  CHECK(first == "line 0 of a small book");  // the refusal touched nothing
  // Inputs that are not regular files are named, not read as empty or forever.
  expect_refused("--data text:" + d + "/adir --steps 1", d + "/adir: not a regular file (a directory)");
  expect_refused("--data text:/dev/zero --steps 1", "/dev/zero: not a regular file (a device or socket)");
  // A switch takes no value; a flag only another mode reads is refused; impossible values too.
  expect_refused("--tie-embeddings=0 --model llama", "--tie-embeddings is a switch and takes no value (got '0')");
  expect_refused("--doc-mask=false", "--doc-mask is a switch");
  expect_refused("--ranks 5000", "--ranks 5000: --comm local runs one thread per rank, at most 1024");
  expect_refused("--grad-accum 100000000", "tokens per rank per step, more than 2^31 - 1");
  // What a checkpoint's rank file could not read back, and counts past int's end.
  expect_refused("--seq 1073741825 --batch 1", "--seq 1073741825: at most 2^30 (1073741824)");
  expect_refused("--batch 1073741825 --seq 1", "--batch 1073741825: at most 2^30");
  expect_refused("--eval-batches 300000000 --steps 1", "--eval-batches x dp x --batch = 2400000000 val sequences");
  expect_refused("--device cuda --batch 70000 --seq 64", "--batch 70000: the CUDA attention kernels take at most 65535");
  expect_refused("--val-data ''", "--val-data: empty");
  expect_refused("--data recall:queries=0", "recall: queries must be >= 1, or -1");
  expect_refused("--model llama --sliding-window 8 --full-attention-first 0", "--full-attention-first needs --full-attention-every");
  expect_refused("--model llama --sliding-window 8 --full-attention-every 5 --steps 1",
                 "the model has only 2 layers, so no layer would attend to every earlier token");
  expect_refused("--model llama --sliding-window 8 --full-attention-every 1 --steps 1",
                 "--full-attention-every 1: every layer attends to every earlier token, so --sliding-window 8 would apply to none");
  {  // (also on --auto-resume's fresh start: only a resume of a run saved so is exempt)
    ul_test::TempDir fresh;
    expect_refused("--model llama --sliding-window 8 --full-attention-every 1 --steps 1 --auto-resume --save-dir " +
                       (fresh / "run"),
                   "--full-attention-every 1: every layer attends to every earlier token");
  }
  expect_refused("--checkpoint m.bin --check-state s.bin --steps 3", "--steps: --check-state runs one step against its file");
  expect_refused("--checkpoint m.bin --check-state s.bin --seq 8", "--seq: --check-state takes its tokens (batch and length) from its file");
  expect_refused("--checkpoint m.bin --check-state s.bin --data passkey", "--data: --check-state takes its tokens");
  // Weights that are not numbers are refused as the checkpoint loads, naming the file and tensor.
  std::string model = source_path("tests/data/gpt2_tiny_model.bin"), nan_model = d + "/nan.bin";
  {
    std::ifstream in(model, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    const float nan = std::nanf("");
    std::memcpy(&all[1024 + 4 * 100], &nan, 4);  // a value in wte (llm.c: 1024-byte header, then wte)
    std::ofstream(nan_model, std::ios::binary) << all;
  }
  expect_refused("--checkpoint " + nan_model + " --steps 0 --seq 16 --data passkey", "nan.bin: tensor wte holds a non-finite value");
}

TEST_CASE("train notes what a run will not do as its flags suggest", "[cli]") {
  TempDir dir;
  const std::string text = dir.path.string() + "/t.txt";
  std::ofstream(text) << std::string(2000, 'a');
  const std::string base = "--data text:" + text + " --seq 32 --eval-batches 1 --threads 1 --layers 1 --dim 32 ";
  // A run inside its warmup (the default 20 steps) never reaches --lr.
  CmdResult r = run_cmd(train_cmd(base + "--batch 1 --steps 4"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --steps 4 < --warmup 20: the run ends inside the warmup, at lr 0.0006 (--lr 0.003)") !=
        std::string::npos);
  r = run_cmd(train_cmd(base + "--batch 1 --steps 4 --warmup 2"));
  REQUIRE(r.code == 0);  // a run that failed would print no note either
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("inside the warmup") == std::string::npos);
  CHECK(r.out.find("= --warmup") == std::string::npos);
  // One as long as its warmup ends at --lr, its decay never begun.
  r = run_cmd(train_cmd(base + "--batch 1 --steps 3 --warmup 3 --schedule wsd"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --steps 3 = --warmup: the run ends as its warmup does, at --lr, with no wsd decay") !=
        std::string::npos);
  // A train split (56 sequences of 32 bytes) smaller than a step's 64: some repeat in every step.
  r = run_cmd(train_cmd(base + "--batch 32 --grad-accum 2 --steps 1 --warmup 1"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("a step reads 64 train sequences (--batch x --grad-accum x dp) but the train split holds 56") !=
        std::string::npos);
  // An evaluation reads no training flag, and says which it was given.
  r = run_cmd(train_cmd(base + "--batch 1 --steps 0 --lr 1 --grad-clip 0 --beta1 0.8"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --steps 0 trains nothing: --lr, --grad-clip, --beta1 not read") != std::string::npos);
  // An export alone evaluates nothing either: its eval flags are named too.
  const std::string out = (dir.path / "e.bin").string();
  r = run_cmd(train_cmd("--data text:" + text + " --seq 32 --threads 1 --layers 1 --dim 32 --steps 0 --export-llmc " + out +
                        " --val-data text:" + text + " --loss-by-position --lr 1"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --steps 0 trains nothing and evaluates nothing (give --eval-batches N for an eval): --lr, "
                   "--val-data, --loss-by-position not read") != std::string::npos);
  // A text prompt is its bytes without --tokenizer: said for a model of more ids than bytes (a
  // GPT-2's 72 105 are not "Hi"), not for a byte model, nor for a prompt of ids.
  const std::string bytes_note = "note    | --prompt is read as bytes (no --tokenizer), but the model has 300 token ids";
  r = run_cmd(train_cmd(base + "--batch 1 --steps 1 --vocab 300 --sample 2 --prompt Hi"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find(bytes_note) != std::string::npos);
  r = run_cmd(train_cmd(base + "--batch 1 --steps 1 --vocab 300 --sample 2 --prompt ids:72,105"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("is read as bytes") == std::string::npos);
  r = run_cmd(train_cmd(base + "--batch 1 --steps 1 --sample 2 --prompt Hi"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | train loss") != std::string::npos);
  CHECK(r.out.find("is read as bytes") == std::string::npos);
  // A checkpoint of 2000 ids over text:FILE's bytes: said (the ids are other tokens than it learned);
  // over the bytes of its own 300-id byte model, not.
  const std::string big = (dir.path / "big").string(), small = (dir.path / "small").string();
  REQUIRE(run_cmd(train_cmd(base + "--batch 1 --steps 1 --vocab 2000 --quiet --export-llmc " + big)).code == 0);
  REQUIRE(run_cmd(train_cmd(base + "--batch 1 --steps 1 --vocab 300 --quiet --export-llmc " + small)).code == 0);
  const std::string from = "--data text:" + text + " --seq 32 --eval-batches 1 --threads 1 --batch 1 --steps 1 --checkpoint ";
  r = run_cmd(train_cmd(from + big));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --data's files name 256 token ids (bytes, no end-of-text) but " + big +
                   "'s model has 2000: unless it was trained on this tokenizer's ids") != std::string::npos);
  r = run_cmd(train_cmd(from + small));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("token ids (bytes") == std::string::npos);
}

TEST_CASE("train refuses bad flags before any work", "[cli]") {
  // In process (no run): more threads than OpenMP makes (100000 crashed), an infinite --memory,
  // a length probed twice.
  CHECK_THROWS_WITH(options("--threads 2000"), Catch::Contains("--threads 2000: at most 1024"));
  CHECK_THROWS_WITH(options("--plan --memory inf"), Catch::Contains("--memory: expected a positive size like 24G (bytes, "
                                                                     "or K, M, G, T: powers of 1024), got 'inf'"));
  CHECK_THROWS_WITH(options("--plan --memory 24GB"), Catch::Contains("like 24G (bytes, or K, M, G, T: powers of 1024), got '24GB'"));
  CHECK_THROWS_WITH(options("--probe-lengths 128,64,64"), Catch::Contains("--probe-lengths: length 64 is given twice"));
  // A flag given twice counts as given last (a script appends overrides to a base line).
  CHECK(options("--steps 3 --lr 0.1 --steps 5").steps == 5);
  CHECK(options("--data recall --data passkey").data == "passkey");
  // Numbers are decimal, as given: no hex floats, no leading blanks (strtod and strtol take both),
  // no float so small it keeps only a few digits (a subnormal).
  CHECK_THROWS_WITH(options("--lr 0x10"), Catch::Contains("--lr: expected a number, got '0x10'"));
  CHECK_THROWS_WITH(options("--lr 0x1p-8"), Catch::Contains("--lr: expected a number, got '0x1p-8'"));
  CHECK_THROWS_WITH(ul::parse_float("--lr", " 5"), Catch::Contains("--lr: expected a number, got ' 5'"));
  CHECK_THROWS_WITH(ul::parse_int("--steps", " 3"), Catch::Contains("--steps: expected an integer, got ' 3'"));
  CHECK_THROWS_WITH(options("--lr 1e-45"), Catch::Contains("--lr: 1e-45 is outside the range of a float"));
  CHECK(options("--lr 2e-38").lr == 2e-38f);  // the smallest normal floats are still taken
  // Past even a double's range: not 0 (which turns clipping and the heartbeat off, sampling greedy).
  for (const char* f : {"--grad-clip", "--heartbeat", "--temperature", "--weight-decay"})
    CHECK_THROWS_WITH(options(std::string(f) + " 1e-400"), Catch::Contains(std::string(f) + ": 1e-400 is too small to be told from 0"));
  CHECK(options("--grad-clip 0").grad_clip == 0);
  CHECK(options("--grad-clip 0e-400").grad_clip == 0);  // a zero written so is 0
  // A value that looks like a flag, known or not (a typo trained afresh into ./--resum), is a
  // value forgotten; spelled --flag=VALUE it is taken.
  CHECK_THROWS_WITH(options("--save-dir --resum --steps 1"),
                    Catch::Contains("--save-dir: missing value (the next argument, --resum, is a flag"));
  CHECK(options("--log=--x").log == "--x");
  // An empty --precision is no choice.
  CHECK_THROWS_WITH(options("--precision="), Catch::Contains("--precision: expected fp32 or bf16, got ''"));
  // --help lists the flags whatever else the line holds.
  CHECK(options("--help --steps -1").help);
  CHECK(options("--steps abc --help").help);
  CHECK(options("--help --bogus").help);
  CHECK(options("-h").help);
  CHECK(options("--steps 3 -h").help);
  // ... but -h where a value goes is a value forgotten, as any flag there (it printed the help and
  // exited 0, running nothing the script asked for); a value spelled so goes with '='.
  CHECK_THROWS_WITH(options("--save-dir -h --steps 1"),
                    Catch::Contains("--save-dir: missing value (the next argument, -h, is a flag"));
  CHECK_THROWS_WITH(options("--prompt -h"), Catch::Contains("--prompt: missing value"));
  CHECK(options("--sample 3 --prompt=-h").prompt == "-h");
  // A model file's header may name any dim: the MLP's width is computed in 64 bits and refused
  // past int (a fuzzed model.bin overflowed 8 x dim).
  {
    ul::ModelConfig huge;
    huge.arch = "llama";
    huge.dim = 2063597576;
    CHECK_THROWS_WITH(huge.ffn_dim(), Catch::Contains("dim 2063597576: the MLP would be 5502926912 wide, more than "
                                                      "2^31 - 1 (give a smaller --dim or --ffn)"));
    huge.arch = "gpt2";
    CHECK_THROWS_WITH(huge.ffn_dim(), Catch::Contains("the MLP would be 8254390304 wide") && !Catch::Contains("--ffn"));
  }
  // A vocabulary whose padding would overflow int; a preset's kv heads that a given --heads breaks
  // (the message names the flag the user gave, not one the preset set).
  expect_refused("--vocab 2147483647 --steps 1", "--vocab 2147483647: at most 1073741824");
  CHECK_THROWS_WITH(ul::model_config(options("--model llama"), (1 << 30) + 1),  // from shard headers: no flag
                    Catch::Contains("the data's vocabulary 1073741825: at most 1073741824"));
  expect_refused("--model llama --heads 1", "--heads 1: the preset's 2 kv heads do not divide it; give --kv-heads too");
  // Data with more tokens than a preset's vocabulary: the message names the preset that set it,
  // not a --vocab never given; with --vocab given, the flag.
  CHECK_THROWS_WITH(ul::model_config(options("--model gpt2-124M"), 100000),
                    Catch::Contains("--model gpt2-124M's vocabulary 50257 is smaller than --data's vocabulary (100000)"));
  CHECK_THROWS_WITH(ul::model_config(options("--model gpt2 --vocab 300"), 1000),
                    Catch::Contains("--vocab 300 is smaller than --data's vocabulary (1000)"));
  // A shape whose parameter count wraps around 2^64 to 65536 (as a crafted model.bin or config.json
  // declared it, which then passed the file-size check): counted in 128 bits, refused.
  {
    ul::ModelConfig wrap;
    wrap.arch = "gpt2", wrap.layers = 1431608435, wrap.dim = 32768, wrap.heads = 256, wrap.kv_heads = 256;
    wrap.vocab = 32, wrap.padded_vocab = 128, wrap.max_seq = 134569;
    CHECK_THROWS_WITH(wrap.validate(), Catch::Contains("layers 1431608435: at most 100000"));  // first, as --layers
    CHECK_THROWS_WITH(ul::param_count(wrap), Catch::Contains("layers=1431608435"));
    ul::ModelConfig wide = wrap;  // within the layer cap, past 2^50 by width
    wide.layers = 100000, wide.dim = 1 << 20, wide.heads = 256, wide.kv_heads = 256, wide.max_seq = 1024;
    CHECK_THROWS_WITH(wide.validate(), Catch::Contains("gives more than 2^50 parameters"));
    // 2^50: the planner's sums (18 bytes a bf16 parameter, and more) stay within 64 bits; at 2^60
    // `--plan` once said such a model fit in 24G. Just past it: refused, just under: counted.
    wide.layers = 1, wide.dim = 1 << 24, wide.heads = 1, wide.kv_heads = 1, wide.vocab = 32, wide.padded_vocab = 128;
    wide.max_seq = 1;  // 1 layer of width 2^24: 16 x 2^48 + ... > 2^50
    CHECK_THROWS_WITH(ul::param_count(wide), Catch::Contains("gives more than 2^50 parameters"));
    wide.dim = 1 << 22;  // 16 x 2^44 + ...: about 2^48
    CHECK(ul::param_count(wide) > (size_t(1) << 47));
    wrap.layers = 1;  // the same widths in one layer: about 2^32 parameters, counted
    CHECK(ul::param_count(wrap) == size_t(128) * 32768 + size_t(134569) * 32768 + 2 * 32768 +
                                       (2 * 32768 + 3 * 32768 * size_t(32768) + 3 * 32768 + size_t(32768) * 32768 +
                                        32768 + 2 * 32768 + 2 * 4 * size_t(32768) * 32768 + 4 * 32768 + 32768));
  }
  // A step whose loss or gradient norm is not finite stops the run, saying what to change.
  expect_refused("--steps 3 --lr 1e20 --warmup 0 --threads 1", "step 2: loss or gradient norm is not finite", true);
  expect_refused("--steps 3 --lr 1e20 --warmup 0 --threads 1", "try a lower --lr", true);
  {
    // ... and says so in its log, where an unattended run's history is read.
    TempDir dir;
    const std::string log = (dir.path / "log.jsonl").string();
    CHECK(run_cmd(train_cmd("--steps 3 --lr 1e20 --warmup 0 --threads 1 --log " + log)).code != 0);
    const std::vector<ul::LogRecord> recs = ul::read_run_log(log);
    REQUIRE_FALSE(recs.empty());
    CHECK(recs.back().at("type") == "error");
    CHECK(recs.back().at("step") == "2");
    CHECK(recs.back().at("message").find("loss or gradient norm is not finite") != std::string::npos);
  }
  // A save that fails: `prefix` makes it fail (shell commands or variables before train). Returns
  // the run's output and its log's last record, which must be the error of step 2's save; nothing
  // counts as a checkpoint.
  auto failed_save = [](const std::string& prefix, const std::string& flags) {
    TempDir dir;
    const std::string run = (dir.path / "run").string();
    const CmdResult r = run_cmd(prefix + train_cmd(flags + " --steps 2 --threads 1 --dim 32 --heads 2 --layers 1 "
                                                   "--seq 16 --batch 2 --eval-every 0 --eval-batches 1 --quiet "
                                                   "--save-dir " + run));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK_FALSE(fs::exists(run + "/step_00000002/COMPLETE"));
    const std::vector<ul::LogRecord> recs = ul::read_run_log(run + "/log.jsonl");
    REQUIRE(recs.size() == 3);  // two steps, then the error
    CHECK(recs.back().at("type") == "error");
    CHECK(recs.back().at("step") == "2");
    const std::string message = recs.back().at("message"), want = "saving " + run + "/step_00000002 failed: ";
    CHECK(message.rfind(want, 0) == 0);
    return std::make_pair(r.out, message.substr(std::min(want.size(), message.size())));
  };
  {
    // A full disk or a quota: here a file-size limit, its signal ignored so that the write fails
    // with EFBIG. The run stops naming the file, and its log says so.
    const auto [out, cause] = failed_save("trap '' XFSZ; ulimit -f 64; ", "");
    CHECK(out.find("step_00000002/model.bin.tmp: write failed") != std::string::npos);
    CHECK(cause.find("step_00000002/model.bin.tmp: write failed") != std::string::npos);
  }
  {
    // One rank of two cannot write (a test hook, as a full disk): both stop with its error, and rank
    // 0's log names the rank and the cause.
    const auto [out, cause] = failed_save("ULYSSES_TEST_FAIL_SAVE_RANK=1 ", "--ranks 2");
    CHECK(cause.rfind("rank 1: ", 0) == 0);
    CHECK(cause.find("/step_00000002: cannot write (ULYSSES_TEST_FAIL_SAVE_RANK)") != std::string::npos);
  }
  expect_refused("--no-such-flag", "unknown flag '--no-such-flag'");
  expect_refused("--steps", "--steps: missing value");
  expect_refused("--batch x", "--batch: expected an integer");
  expect_refused("--batch 0", "--batch must be >= 1");
  expect_refused("--model gpt3", "--model: unknown model 'gpt3'");
  expect_refused("--dim 100 --heads 3", "not divisible by --heads");
  expect_refused("--check-state x.bin", "--check-state needs --checkpoint");
  expect_refused("--data nonsense", "nonsense");
  expect_refused("--data passkey:depth=2", "depth is a fraction in [0, 1]");
  expect_refused("--data recall:gap=x", "'gap' needs a number");
  expect_refused("--data passkey:digits=0x3", "'digits' needs a number, got '0x3'");  // decimal, as the flags
  expect_refused("--data 'passkey:filler= 7'", "'filler' needs a number, got ' 7'");
  expect_refused("--data recall:foo=1", "train: error: --data: recall:foo=1: unknown setting 'foo'");
  // --val-data's named as such (the message once said "--val-data: --data passkey:...").
  expect_refused("--data recall --val-data passkey:foo=1 --steps 1",
                 "train: error: --val-data: passkey:foo=1: unknown setting 'foo'");
  expect_refused("--comm carrier-pigeon", "--comm");
  expect_refused("--offload --recompute", "--offload moves block inputs from GPU memory");
  expect_refused("--offload --device cuda --plan", "--offload needs --recompute");
  expect_refused("--profile-step 2", "--profile-step times GPU ops with CUDA events: it needs --device cuda");
  expect_refused("--profile-step 0 --device cuda --plan", "--profile-step must be >= 1");
  expect_refused("--profile-step 9 --steps 5 --device cuda --plan", "--profile-step 9 is past the last step");
  expect_refused("--steps 3 --sample 2 --prompt ids:1 --sample-every 4", "--sample-every 4 is past the last step");
  CHECK(options("--steps 3 --sample 2 --prompt ids:1 --sample-every 3").sample_every == 3);
  // A value left out before a flag: `--save-dir --resume` once trained afresh into ./--resume, and
  // `--log --doc-mask` trained without the mask. A value that is spelled like a flag goes with '='.
  expect_refused("--steps 1 --save-dir --resume", "--save-dir: missing value (the next argument, --resume, is a flag");
  expect_refused("--steps 1 --log --doc-mask", "--log: missing value (the next argument, --doc-mask, is a flag");
  expect_refused("--log --steps=2", "--log: missing value (the next argument, --steps=2, is a flag");
  CHECK(options("--log=--quiet").log == "--quiet");
  CHECK(options("--sample 2 --prompt --not-a-flag").prompt == "--not-a-flag");  // free text: taken
  CHECK_THROWS_WITH(options("--sample 2 --prompt --steps"), Catch::Contains("--prompt: missing value"));
  // Numbers that parse but mean nothing sane: refused, not trained on.
  expect_refused("--batch 4294967297", "--batch: 4294967297 is out of range");  // int(...) would make it 1
  expect_refused("--steps 99999999999999999999", "--steps: 99999999999999999999 is out of range");
  expect_refused("--lr inf", "--lr must be a finite number > 0");
  expect_refused("--lr 1e39", "--lr: 1e39 is outside the range of a float");  // inf as a float
  expect_refused("--final-lr-frac 2", "--final-lr-frac must be in [0, 1]");
  expect_refused("--final-lr-frac nan", "--final-lr-frac must be in [0, 1]");
  expect_refused("--schedule linear", "--schedule must be cosine, wsd or constant, got 'linear'");
  expect_refused("--schedule wsd --decay-frac 0", "--decay-frac must be in (0, 1]");
  expect_refused("--decay-frac 0.5", "--decay-frac is for --schedule wsd (this run's schedule is cosine)");
  expect_refused("--schedule constant --final-lr-frac 0.5", "--final-lr-frac: --schedule constant does not decay");
  expect_refused("--weight-decay -0.1", "--weight-decay must be a finite number >= 0");
  expect_refused("--grad-clip -1", "--grad-clip must be a finite number >= 0");
  expect_refused("--beta1 1", "--beta1 must be in [0, 1)");
  expect_refused("--beta2 -0.5", "--beta2 must be in [0, 1)");
  expect_refused("--beta2 nan", "--beta2 must be in [0, 1)");
  // In [0, 1) as typed, 1 as a float: said (the message once read "got 1.000000" for 0.99999999999).
  expect_refused("--beta2 0.99999999999", "--beta2 must be in [0, 1), got 0.99999999999, which is 1 as a float");
  expect_refused("--beta1 1", "--beta1 must be in [0, 1), got 1\n");  // typed as 1: no remark
  expect_refused("--adam-eps 0", "--adam-eps must be a finite number > 0");
  expect_refused("--rope-theta 0", "--rope-theta must be a finite number > 0");
  expect_refused("--heartbeat -1", "--heartbeat must be a finite number of seconds >= 0");
  // Flags only one mode reads are refused elsewhere instead of ignored.
  expect_refused("--comm mpi --ranks 4", "--ranks sets the world of --comm local");
  expect_refused("--nccl-id-file id.txt", "--nccl-id-file needs --comm nccl");
  expect_refused("--comm nccl", "--comm nccl is for GPU ranks: give --device cuda");
  expect_refused("--check-tol 1e-3", "--check-tol needs --check-state");
  expect_refused("--threads 1 prepare --out d a.txt", "'prepare' is a command, not a flag: it comes first");
  expect_refused("--checkpoint m.bin --check-state s.bin --check-tol nan", "--check-tol must be a finite number > 0");
  expect_refused("--comm-timeout 0", "--comm-timeout must be a number of seconds in (0, 1e7]");
  // 1e10 s past now overflows a clock reading in nanoseconds: every wait would have timed out at once.
  CHECK_THROWS_WITH(options("--comm-timeout 1e10"), Catch::Contains("in (0, 1e7]"));
  CHECK(options("--comm mpi --comm-timeout 30").comm_timeout == 30);  // MPI's calls run under it too
  // A run larger than the machine (17 TB of activations): refused before allocating, saying what to shrink.
  expect_refused("--model llama --seq 1048576 --batch 1024", "but this machine has");
  expect_refused("--model gpt2 --ffn 100", "--ffn: gpt2's MLP is 4 x --dim");
  expect_refused("--rope-theta 500", "--rope-theta: gpt2 has learned positions");
  expect_refused("--seed -1", "--seed must be >= 0");
  expect_refused("--temperature 1e39 --sample 3 --prompt ab", "--temperature: 1e39 is outside the range of a float");
  // The model overrides mean "the preset's" at 0 only by default; written out, 0 is refused.
  for (const char* f : {"--layers", "--dim", "--heads", "--kv-heads", "--vocab", "--max-seq", "--ffn"})
    expect_refused(std::string(f) + " 0", std::string(f) + " must be >= 1");
}

TEST_CASE("an update that overflows the weights fails its step, before a save or an export uses them, and a val loss "
          "that is not finite fails its eval", "[cli]") {
  TempDir dir;
  const std::string run = (dir.path / "run").string(), exported = (dir.path / "ex/model.safetensors").string();
  const std::string base = "--threads 1 --dim 32 --heads 2 --layers 1 --seq 16 --batch 2 --warmup 1 --eval-every 0 "
                           "--eval-batches 1 --save-dir " + run;
  // lr 3e38: the first step's loss and norm are finite, its update is not.
  CmdResult r = run_cmd(train_cmd(base + " --steps 2 --save-every 1 --lr 3e38 --export-safetensors " + exported));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("step 1: the update made weights that are not finite (lr 3e+38") != std::string::npos);
  CHECK_FALSE(fs::exists(run + "/step_00000001"));
  CHECK_FALSE(fs::exists(dir.path / "ex"));
  std::vector<ul::LogRecord> recs = ul::read_run_log(run + "/log.jsonl");
  REQUIRE(recs.size() == 1);
  CHECK(recs.back().at("type") == "error");
  CHECK(recs.back().at("step") == "1");
  // lr 1e30: finite weights whose outputs overflow; the final eval fails rather than print nan.
  fs::remove_all(run);
  r = run_cmd(train_cmd(base + " --steps 1 --lr 1e30"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("the val loss is not finite") != std::string::npos);
  CHECK(r.out.find("done") == std::string::npos);
  recs = ul::read_run_log(run + "/log.jsonl");
  REQUIRE_FALSE(recs.empty());
  CHECK(recs.back().at("type") == "error");
  CHECK(recs.back().at("message").find("eval: the val loss is not finite") == 0);
}

TEST_CASE("train --plan says when this --seq does not fit --memory, and that --zero 1 on one rank shards nothing", "[cli][planner]") {
  const std::string plan = "--plan --model llama-3.2-1B --device cuda --batch 1 --recompute --offload --mlp-chunks 8";
  // A gpt2's learned positions end at its max_seq: the run refuses a longer --seq, and so does its plan.
  CmdResult past = run_cmd(train_cmd("--plan --model gpt2 --layers 1 --dim 32 --heads 4 --max-seq 64 --seq 128"));
  CHECK(past.code == 1);
  CHECK_THAT(past.out, Catch::Contains("--seq 128 exceeds the model's max sequence 64 (learned positions)"));
  CmdResult over = run_cmd(train_cmd(plan + " --seq 65536 --memory 24G"));
  INFO(over.out);
  CHECK(over.code == 0);
  CHECK_THAT(over.out, Catch::Contains("plan | --seq 65536 does not fit") && Catch::Contains("GiB over"));
  CmdResult fits = run_cmd(train_cmd(plan + " --seq 8192 --memory 24G"));
  CHECK(fits.out.find("does not fit") == std::string::npos);
  CHECK(fits.out.find("--zero 1 with one rank") == std::string::npos);
  CmdResult zero = run_cmd(train_cmd(plan + " --seq 8192 --zero 1"));
  CHECK_THAT(zero.out, Catch::Contains("note: --zero 1 with one rank shards nothing"));
  CmdResult zero2 = run_cmd(train_cmd(plan + " --seq 8192 --zero 1 --ranks 2"));
  CHECK(zero2.out.find("--zero 1 with one rank") == std::string::npos);
  // A run says it too.
  CmdResult run = run_cmd(train_cmd("--zero 1 --steps 1 --seq 32 --batch 2 --eval-every 0 --eval-batches 1"));
  CHECK(run.code == 0);
  CHECK_THAT(run.out, Catch::Contains("note    | --zero 1 with one rank shards nothing"));
}

TEST_CASE("train --plan plans a GPU run in any build, offload included", "[cli][planner]") {
  CmdResult r = run_cmd(train_cmd("--plan --model gpt2-124M --device cuda --recompute --offload --seq 8192 "
                                  "--memory 141G"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("cuda bf16 | recompute | offload") != std::string::npos);
  CHECK(r.out.find("pinned host memory") != std::string::npos);
  CHECK(r.out.find("longest --seq that fits") != std::string::npos);
  // Ranks as threads: on the CPU the all-reduce's kept slice is in the total; on a device the local
  // communicator stages through host memory, which the device total leaves out and a row shows.
  const std::string two = "--plan --model gpt2-124M --ranks 2 --sp 2 --seq 1024 --batch 1";
  CmdResult cpu = run_cmd(train_cmd(two));
  CHECK(cpu.out.find("local all-reduce slice") != std::string::npos);
  CHECK(cpu.out.find("host staging") == std::string::npos);
  CmdResult dev = run_cmd(train_cmd(two + " --device cuda"));
  INFO(dev.out);
  CHECK(dev.out.find("local all-reduce slice") == std::string::npos);
  CHECK(dev.out.find("host staging           712.3 MiB") != std::string::npos);  // the gradient + its slice
  // MPI stages a device's collectives through host memory alike (each process its own); NCCL
  // reads device memory.
  CmdResult mpi = run_cmd(train_cmd(two + " --device cuda --comm mpi"));
  INFO(mpi.out);
  CHECK(mpi.out.find("host staging           712.3 MiB") != std::string::npos);
  CmdResult nccl = run_cmd(train_cmd(two + " --device cuda --comm nccl"));
  INFO(nccl.out);
  CHECK(nccl.out.find("host staging") == std::string::npos);
}

TEST_CASE("train heartbeat: a long step says which block it reached, a short one says nothing", "[cli]") {
  const std::string run = "--layers 3 --seq 32 --batch 2 --steps 2 --eval-every 0 --eval-batches 1 --threads 1";
  // Every block is past the interval: one line per block forward, the classifier, then per block
  // backward, the last block's first; then the step's own line. The eval's forward likewise.
  CmdResult r = run_cmd(train_cmd(run + " --heartbeat 1e-9 --recompute"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::vector<std::string> got;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const bool milestone = line.find(" done | ") != std::string::npos;  // not the clock's (heartbeat_clock below)
    if (milestone && line.rfind("  ...   step 1/2 | ", 0) == 0) got.push_back(line.substr(19, line.find(" done") - 19));
    if (line.rfind("step     1/2", 0) == 0) got.push_back("step line");
  }
  CHECK(got == std::vector<std::string>{"forward 1/3 blocks", "forward 2/3 blocks", "forward 3/3 blocks", "classifier",
                                        "backward 1/3 blocks", "backward 2/3 blocks", "backward 3/3 blocks", "step line"});
  CHECK(r.out.find("  ...   eval 2 | classifier done") != std::string::npos);
  // Several micro-batches or eval batches: each line names the one reached.
  r = run_cmd(train_cmd(run + " --heartbeat 1e-9 --grad-accum 2 --eval-batches 3"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("  ...   step 2/2 | micro-batch 2/2, backward 3/3 blocks done") != std::string::npos);
  CHECK(r.out.find("  ...   eval 2 | batch 3/3, classifier done") != std::string::npos);
  // A step shorter than the default 30 s, --heartbeat 0 or --quiet: no progress line.
  for (const char* quiet : {"", " --heartbeat 0", " --heartbeat 1e-9 --quiet"}) {
    CmdResult q = run_cmd(train_cmd(run + quiet));
    INFO(quiet << "\n" << q.out);
    CHECK(q.code == 0);
    CHECK(q.out.find("  ...   ") == std::string::npos);
  }
}

TEST_CASE("train heartbeat_clock: a long stretch between milestones still prints, naming the last one", "[cli]") {
  // One block at T = 12288 on one thread: its attention backward runs for a while after the
  // classifier's milestone, with none of its own (a 64K block is minutes). The clock prints every
  // --heartbeat seconds, the last milestone with its age once it is not news, and never after the
  // step's own line.
  CmdResult r = run_cmd(train_cmd("--data recall --layers 1 --seq 12288 --batch 1 --steps 1 --eval-every 0 "
                                  "--eval-batches 1 --threads 1 --heartbeat 0.1"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  int clocked = 0;
  bool step_line = false, late = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("step     1/1", 0) == 0) step_line = true;
    if (line.rfind("  ...   step 1/1 | ", 0) != 0) continue;
    late |= step_line;
    double ago = -1, total = -1;
    const size_t at = line.find(" done (");
    if (at != std::string::npos && std::sscanf(line.c_str() + at, " done (%lf s ago) | %lf s", &ago, &total) == 2) {
      clocked++;
      CHECK(ago >= 0);
      CHECK(ago <= total);
    }
  }
  CHECK(step_line);
  CHECK(clocked >= 1);
  CHECK_FALSE(late);
  CHECK(r.out.find("  ...   step 1/1 | classifier done (") != std::string::npos);
  // A period past 9.2e9 s (nanoseconds past int64) once put the clock's deadline in the past: it
  // spun holding its lock, and the run never finished. Now a period that long is silent.
  r = run_cmd("timeout -s KILL 60 " + train_cmd("--data recall --layers 1 --seq 1024 --batch 1 --steps 1 --eval-every 0 "
                                                "--eval-batches 1 --threads 1 --heartbeat 1e12"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("  ...   ") == std::string::npos);
}

TEST_CASE("train --comm local: a rank stuck outside any collective ends the run --comm-timeout after another failed",
          "[cli][comm]") {
  // Rank 0 reads --prompt-file - from a FIFO whose writer sleeps (a slow pipe); rank 1 times out
  // in the broadcast that waits for it, after 1 s. Rank 0's read is no collective, which the failure
  // flag would wake: the process once stayed alive, silent, until the pipe closed (here 30 s).
  const fs::path dir = fs::temp_directory_path() / ("ulysses_stuck_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string fifo = (dir / "in").string();
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = run_cmd("mkfifo " + fifo + "; (exec sleep 30 > " + fifo + " 2>/dev/null) & writer=$!; " +
                        train_cmd("--ranks 2 --threads 1 --steps 1 --eval-every 0 --eval-batches 1 --sample 5 "
                                  "--prompt-file - --comm-timeout 1 < " + fifo) +
                        " 2>&1; rc=$?; kill $writer 2>/dev/null; exit $rc");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(took < 20);
  CHECK(r.out.find("train: error: rank 1 failed: --prompt-file -: local comm: broadcast timed out after 1 s on rank 1, "
                   "waiting for rank(s) 0 (rank 0 reads it for every rank); rank(s) 0 still running 1 s later, "
                   "outside any collective (given up on)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a passkey run ends with its accuracy at each needle depth", "[cli]") {
  const std::string run = "--seq 32 --batch 2 --steps 2 --eval-every 1 --eval-batches 1 --threads 1";
  CmdResult r = run_cmd(train_cmd(run));
  INFO(r.out);
  REQUIRE(r.code == 0);
  // Once, after the last eval only.
  CHECK(r.out.find("probe     1") == std::string::npos);
  const size_t at = r.out.find("probe     2 | depth 0: ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  for (const char* depth : {"| depth 0: ", "| depth 0.25: ", "| depth 0.5: ", "| depth 0.75: ", "| depth 1: "})
    CHECK(line.find(depth) != std::string::npos);
  CHECK(line.find("(accuracy, 10 answer tokens each)") != std::string::npos);  // 1 batch of 2 sequences x 5 digits
  // A fixed depth, or another task: no probe line.
  for (const char* data : {" --data passkey:depth=0.5", " --data recall"}) {
    CmdResult q = run_cmd(train_cmd(run + data));
    INFO(data << "\n" << q.out);
    CHECK(q.code == 0);
    CHECK(q.out.find("probe ") == std::string::npos);
  }
}

TEST_CASE("train --help lists the flags and exits 0, or 1 when its output cannot be written", "[cli]") {
  CmdResult r = run_cmd(train_cmd("--help"));
  CHECK(r.code == 0);
  for (const char* f : {"--model", "--layers", "--dim", "--heads", "--kv-heads", "--vocab", "--max-seq", "--data", "--batch",
                        "--seq", "--steps", "--lr", "--warmup", "--weight-decay", "--grad-clip", "--beta1", "--beta2", "--adam-eps", "--seed", "--threads",
                        "--eval-every", "--checkpoint", "--check-state", "--sp", "--grad-accum", "--comm", "--ranks"})
    CHECK(r.out.find(f) != std::string::npos);
  // Standard output that cannot be written (a full disk): an error and status 1, not 0 with the
  // text lost (for --help, --plan and --sample it is all the command makes).
  for (const std::string args : {"--help", "--plan --steps 1"}) {
    CAPTURE(args);
    r = run_cmd("(" + train_cmd(args) + " > /dev/full)");
    CHECK(r.code == 1);
    CHECK(r.out.find("train: error: writing the standard output: ") != std::string::npos);
  }
}

TEST_CASE("train refuses bad files with a message naming them", "[cli]") {
  fs::path dir = fs::temp_directory_path() / ("ulysses_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string bad = (dir / "bad_magic.bin").string();
  { std::ofstream f(bad, std::ios::binary); int h[256] = {12345, 3}; f.write((char*)h, sizeof h); }
  expect_refused("--checkpoint " + bad + " --steps 1", "bad_magic.bin");
  expect_refused("--checkpoint " + bad + " --steps 1", "--checkpoint takes an llm.c GPT-2 .bin, a ulysses model.bin");
  std::string model = source_path("tests/data/gpt2_tiny_model.bin");
  std::string trunc = (dir / "truncated.bin").string();
  {
    std::ifstream in(model, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    std::ofstream f(trunc, std::ios::binary);
    f.write(all.data(), all.size() / 2);
  }
  expect_refused("--checkpoint " + trunc + " --steps 1", "truncated.bin");
  expect_refused("--checkpoint " + model + " --check-state " + trunc, "truncated.bin");
  expect_refused("--checkpoint " + model + " --vocab 999 --steps 1", "--vocab: the model's shape comes from --checkpoint");
  // Bytes >= 100 in a text file are token ids outside --vocab 100.
  std::string text = (dir / "text.txt").string();
  { std::ofstream f(text); for (int i = 0; i < 400; i++) f << "zzzz hello world "; }
  expect_refused("--data text:" + text + " --vocab 100 --steps 1 --seq 32", "text.txt");
  fs::remove_all(dir);
}

TEST_CASE("train --check-state passes on the committed reference", "[cli][reference]") {
  std::string args = "--checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") + " --check-state " +
                     source_path("tests/data/gpt2_tiny_state.bin");
  CmdResult r = run_cmd(train_cmd(args));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("check-state: PASS") != std::string::npos);
  for (const char* name : {"logits", "loss", "wte", "wpe", "qkvw", "fcprojb", "lnfb"})
    CHECK(r.out.find(name) != std::string::npos);
  // The memory flags run the step another way (they were once ignored here, a PASS of the plain path).
  r = run_cmd(train_cmd(args + " --recompute --mlp-chunks 2"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("check-state: PASS") != std::string::npos);
  CHECK(r.out.find("dp 1 x sp 1, --recompute, --mlp-chunks 2, tolerance") != std::string::npos);
  // Flags of a training run are refused, not ignored.
  for (const char* f : {"--profile-step 1", "--zero 1", "--seed 9", "--warmup 3", "--grad-clip 0", "--plan", "--rope-theta 5",
                        "--sliding-window 4"}) {
    CAPTURE(f);
    const CmdResult t = run_cmd(train_cmd(args + " " + f));
    CHECK(t.code == 1);
    CHECK(t.out.find("--check-state") != std::string::npos);
  }
  ul_test::TempDir dir;
  // The same weights in the other formats --checkpoint takes: refused naming the conversion (it
  // read them as llm.c's and said "bad magic").
  const std::string st = dir / "m.safetensors", mb = dir / "run/step_00000001/model.bin";
  const CmdResult exported = run_cmd(train_cmd("--steps 0 --checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") +
                                               " --export-safetensors " + st));
  REQUIRE(exported.code == 0);
  CHECK(exported.out.find(" | not read (--steps 0 with no eval)\n") != std::string::npos);  // (an export reads no data)
  // (a name other than model.safetensors, which from_pretrained(DIR) would not find: noted)
  CHECK(exported.out.find("note    | --export-safetensors " + st + ": transformers' from_pretrained(DIR) reads "
                          "DIR/model.safetensors, not this name") != std::string::npos);
  const CmdResult plain = run_cmd(train_cmd("--steps 0 --checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") +
                                            " --export-safetensors " + dir / "hf/model.safetensors"));
  REQUIRE(plain.code == 0);
  CHECK(plain.out.find("from_pretrained") == std::string::npos);
  REQUIRE(run_cmd(train_cmd("--steps 1 --seq 16 --eval-batches 1 --threads 1 --checkpoint " +
                            source_path("tests/data/gpt2_tiny_model.bin") + " --save-dir " + dir / "run")).code == 0);
  for (const std::string& other : {st, mb}) {
    const CmdResult t = run_cmd(train_cmd("--checkpoint " + other + " --check-state " +
                                          source_path("tests/data/gpt2_tiny_state.bin")));
    INFO(t.out);
    CHECK(t.code == 1);
    CHECK(t.out.find("--check-state compares an llm.c GPT-2 checkpoint (.bin) with its debug state, and " + other +
                     " is " + (other == st ? "a Hugging Face checkpoint" : "one of this engine's model.bin files") +
                     ": a gpt2 converts with --steps 0 --checkpoint " + other +
                     " --export-llmc FILE.bin") != std::string::npos);
  }
  // A NaN in the reference fails (std::max dropped it, and a damaged reference passed): one logit,
  // then one gradient (the file's last float, lnfb's).
  std::ifstream in(source_path("tests/data/gpt2_tiny_state.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  const size_t first_logit = sizeof header + 8 * size_t(header[2]) * size_t(header[3]);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const size_t at : {first_logit, bytes.size() - sizeof(float)}) {
    std::string bad = bytes;
    std::memcpy(&bad[at], &nan, sizeof nan);
    const std::string path = (dir.path / "nan_state.bin").string();
    std::ofstream(path, std::ios::binary) << bad;
    const CmdResult n = run_cmd(train_cmd("--checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") + " --check-state " + path));
    INFO(n.out);
    CHECK(n.code == 1);
    CHECK(n.out.find("check-state: FAIL") != std::string::npos);
  }
  // A finite difference past the tolerance fails too, and --check-tol moves the line: lnfb's last
  // gradient (max |ref| 0.015) moved by 1e-3, 7% of it (a verdict of isfinite alone passed this).
  std::string off = bytes;
  float last;
  std::memcpy(&last, &off[off.size() - sizeof last], sizeof last);
  last += 1e-3f;
  std::memcpy(&off[off.size() - sizeof last], &last, sizeof last);
  const std::string path = (dir.path / "off_state.bin").string();
  std::ofstream(path, std::ios::binary) << off;
  const std::string base = "--checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") + " --check-state " + path;
  CmdResult f = run_cmd(train_cmd(base));
  INFO(f.out);
  CHECK(f.code == 1);
  CHECK(f.out.find("lnfb") != std::string::npos);
  CHECK(f.out.find("<-- FAIL") != std::string::npos);
  CHECK(f.out.find("check-state: FAIL") != std::string::npos);
  f = run_cmd(train_cmd(base + " --check-tol 0.1"));
  INFO(f.out);
  CHECK(f.code == 0);
  CHECK(f.out.find("check-state: PASS") != std::string::npos);
  CHECK(f.out.find("tolerance 1.0e-01 relative") != std::string::npos);
}

TEST_CASE("learning-rate schedules: cosine, wsd and constant, step by step", "[cli][optimizer]") {
  const float lr = 3e-3f, fin = 0.1f;
  auto at = [&](const char* kind, int step, int steps, double decay_frac = 0.2) {
    return double(ul::lr_at(step, {kind, steps, 4, lr, fin, decay_frac}));
  };
  for (const char* kind : {"cosine", "wsd", "constant"})
    for (int s = 0; s < 4; s++) CHECK(at(kind, s, 20) == Approx(lr * (s + 1) / 4.0).epsilon(1e-6));  // the warmup
  // cosine: lr at the first step after the warmup, lr * fin at the last, half way at the middle.
  CHECK(at("cosine", 4, 20) == Approx(lr).epsilon(1e-6));
  CHECK(at("cosine", 19, 20) == Approx(lr * fin).epsilon(1e-6));
  CHECK(at("cosine", 12, 21) == Approx(lr * (fin + 1) / 2).epsilon(1e-6));  // 8 of the 16 steps after step 4
  // A quarter of the way: the cosine's 0.854, where a straight line (which meets the three above
  // as well) gives 0.75.
  CHECK(at("cosine", 8, 21) == Approx(lr * (fin + (1 - fin) * 0.5 * (1 + std::cos(M_PI / 4)))).epsilon(1e-6));
  // One step after the warmup: it is the last, on the floor as wsd's is (it once stayed at lr).
  CHECK(at("cosine", 4, 5) == Approx(lr * fin).epsilon(1e-6));
  CHECK(at("wsd", 4, 5) == Approx(lr * fin).epsilon(1e-6));
  // wsd, 20 steps, decay 0.2: steps 4-15 at lr, then 16-19 down in four equal notches to lr * fin.
  for (int s = 4; s < 16; s++) CHECK(at("wsd", s, 20) == Approx(lr).epsilon(1e-6));
  for (int k = 1; k <= 4; k++) CHECK(at("wsd", 15 + k, 20) == Approx(lr * (1 - (1 - fin) * k / 4.0)).epsilon(1e-6));
  // Lengthened to 40 steps before its decay: the same rates until the new decay (step 32).
  for (int s = 0; s < 32; s++) CHECK(at("wsd", s, 40) == (s < 16 ? at("wsd", s, 20) : double(lr)));
  CHECK(at("wsd", 39, 40) == Approx(lr * fin).epsilon(1e-6));
  CHECK(at("wsd", 19, 20, 1.0f) == Approx(lr * fin).epsilon(1e-6));  // all of it: decays from the warmup's end
  CHECK(at("wsd", 4, 20, 1.0f) < lr);
  // Halves round up as written: 0.7 x 5 = 3.5 -> 4 decay steps (0.7f is 0.69999999: once 3), and
  // 0.0012 x 1250 = 1.5 -> 2 (in binary 1.4999999999999998).
  CHECK(at("wsd", 1247, 1250, 0.0012) == double(lr));
  CHECK(at("wsd", 1248, 1250, 0.0012) < lr);  // steps 1248-1249 decay
  ul::LrSchedule five{"wsd", 5, 0, lr, fin, 0.7};
  CHECK(double(ul::lr_at(0, five)) == double(lr));
  CHECK(double(ul::lr_at(1, five)) < lr);  // steps 1-4 decay
  for (int s = 4; s < 20; s++) CHECK(at("constant", s, 20) == double(lr));
  // The flags reach the trainer's steps.
  ul::Options o = options("--threads 1 --quiet --eval-every 0 --seq 16 --batch 1 --layers 1 --dim 32 --steps 10 "
                          "--warmup 2 --schedule wsd --decay-frac 0.5 --final-lr-frac 0.5");  // (not the default 0.1)
  std::vector<double> got;
  ul::run_local(1, [&](ul::Comm& world) {
    ul::Trainer tr(o, world);
    for (int s = 0; s < 10; s++) got.push_back(tr.step().lr);
  });
  for (int s = 0; s < 10; s++) CHECK(got[s] == double(ul::lr_at(s, {"wsd", 10, 2, o.lr, o.final_lr_frac, 0.5f})));
  CHECK(got[4] == o.lr);  // steps 5-9 decay: the first a fifth of the way
  CHECK(got[5] == Approx(o.lr * (1 - (1 - o.final_lr_frac) / 5)).epsilon(1e-6));
  CHECK(got[9] == Approx(o.lr * 0.5).epsilon(1e-6));  // --final-lr-frac 0.5 reached the last step
}

TEST_CASE("a Trainer refuses to run under another one's context on its thread", "[trainer]") {
  // The second trainer's context is current on the thread while it lives: the first, stepping,
  // would take its arena and tape (a NaN norm, seen once); it refuses instead, and runs again
  // once the second is gone.
  const ul::Options o = options("--threads 1 --quiet --seq 16 --batch 1 --layers 1 --dim 32");
  ul::run_local(1, [&](ul::Comm& world) {
    ul::Trainer first(o, world);
    {
      ul::Trainer second(o, world);
      CHECK_THROWS_WITH(first.step(), Catch::Contains("Trainer::step: another context is current on this thread"));
      CHECK_THROWS_WITH(first.evaluate(), Catch::Contains("Trainer::evaluate: another context is current"));
      CHECK(std::isfinite(second.step().grad_norm));
    }
    CHECK(std::isfinite(first.step().grad_norm));
  });
  // Replaced by another (built before the old one goes): the new one stays current, and once it is
  // gone too no context is left pointing at a dead trainer's.
  ul::run_local(1, [&](ul::Comm& world) {
    auto tr = std::make_unique<ul::Trainer>(o, world);
    tr = std::make_unique<ul::Trainer>(o, world);
    CHECK(std::isfinite(tr->step().grad_norm));
    tr.reset();
    CHECK(ul::ctx_or_null() == nullptr);
  });
}

TEST_CASE("the optimizer flags beta1 and beta2 and adam-eps reach AdamW", "[cli][optimizer]") {
  // Two steps with these flags, replayed in double from the recorded gradients. Step 2 is where the
  // betas show (at step 1 bias correction cancels them); eps 1e-3 is near the gradients' own size,
  // so it shows from step 1. No clipping or decay: the update is Adam's alone.
  const ul::AdamWConfig def;  // the defaults, which an ignored flag would leave in place
  ul::Options o = options("--threads 1 --quiet --eval-every 0 --seq 32 --batch 2 --layers 1 --dim 32 --grad-clip 0 "
                          "--weight-decay 0 --warmup 0 --beta1 0.5 --beta2 0.75 --adam-eps 1e-3");
  const double b1 = o.beta1, b2 = o.beta2, eps = o.adam_eps;
  REQUIRE((b1 != def.beta1 && b2 != def.beta2 && eps != def.eps));
  std::vector<std::vector<float>> p(3), g(2);
  std::vector<float> lr(2);
  ul::run_local(1, [&](ul::Comm& world) {
    ul::Trainer tr(o, world);
    const ul::Params& ps = tr.model().params;
    p[0].assign(ps.data(), ps.data() + ps.numel());
    for (int s = 0; s < 2; s++) {
      lr[s] = tr.step().lr;
      g[s].assign(ps.grad(), ps.grad() + ps.numel());
      p[s + 1].assign(ps.data(), ps.data() + ps.numel());
    }
  });
  const size_t n = p[0].size();
  size_t worse = 0, shown_eps = 0, shown_betas = 0;
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double m = 0, v = 0, m_default = 0, v_default = 0;
    for (int s = 0; s < 2; s++) {
      const int t = s + 1;
      const double gi = g[s][i];
      m = b1 * m + (1 - b1) * gi;
      v = b2 * v + (1 - b2) * gi * gi;
      const double want = p[s][i] - lr[s] / (1 - std::pow(b1, t)) * m / (std::sqrt(v / (1 - std::pow(b2, t))) + eps);
      // The same step from the same point with a default in place of a flag (step 1: eps, step 2:
      // the betas): an ignored flag would land there instead.
      m_default = def.beta1 * m_default + (1 - def.beta1) * gi;
      v_default = def.beta2 * v_default + (1 - def.beta2) * gi * gi;
      const double other = p[s][i] - lr[s] / (1 - std::pow(def.beta1, t)) * m_default /
                                         (std::sqrt(v_default / (1 - std::pow(def.beta2, t))) + (s == 0 ? def.eps : eps));
      // AdamW runs in float: about eight roundings (the moments, the bias corrections, sqrt, the
      // division, the product, the subtraction), each within half an ulp of the parameter or of
      // the update (at most ~lr here).
      const double tol = 8 * 6e-8 * (std::fabs(want) + lr[s]);
      const double err = std::fabs(double(p[s + 1][i]) - want);
      worst = ul_test::max_err(worst, err / tol);
      worse += !(err <= tol);  // a NaN parameter counts
      if (std::fabs(other - want) > 100 * tol) (s == 0 ? shown_eps : shown_betas)++;
    }
  }
  INFO(n << " parameters; worst error " << worst << " of the tolerance; steps that tell the flags from the defaults: "
         << shown_eps << " at step 1, " << shown_betas << " at step 2");
  CHECK(worse == 0);
  CHECK(shown_eps > n / 10);
  CHECK(shown_betas > n / 10);
}

TEST_CASE("weight decay and gradient clipping act as defined, decay on the matrices only", "[cli][optimizer]") {
  // One step replayed in double from the recorded (unclipped) gradients. A clip of 0.05 binds
  // (the norm at init is ~5); Adam's first step is g / (|g| + eps), blind to g's scale unless eps
  // is near it, so eps is 1e-3 here and a wrong clip factor moves most parameters. Decay 0.3 at
  // lr 0.01 takes 0.3% off each weight of a matrix and nothing off a bias or a norm's gain.
  ul::Options o = options("--threads 1 --quiet --eval-every 0 --seq 32 --batch 2 --layers 1 --dim 32 --warmup 0 "
                          "--lr 0.01 --schedule constant --grad-clip 0.05 --weight-decay 0.3 --adam-eps 1e-3");
  std::vector<float> p0, g, p1;
  std::vector<ul::ParamSpec> specs;
  ul::StepResult r;
  ul::run_local(1, [&](ul::Comm& world) {
    ul::Trainer tr(o, world);
    const ul::Params& ps = tr.model().params;
    specs = ps.specs();
    p0.assign(ps.data(), ps.data() + ps.numel());
    r = tr.step();
    g.assign(ps.grad(), ps.grad() + ps.numel());
    p1.assign(ps.data(), ps.data() + ps.numel());
  });
  std::set<std::string> decayed;
  for (const ul::ParamSpec& s : specs)
    if (s.decay) decayed.insert(s.name);
  CHECK(decayed == std::set<std::string>{"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"});
  // The clip factor itself: min(1, max / norm); 0 turns clipping off; a norm that is not finite
  // is the step's error, not a factor.
  CHECK(ul::clip_factor(2.0, 1.f) == 0.5f);
  CHECK(ul::clip_factor(0.5, 1.f) == 1.f);
  CHECK(ul::clip_factor(7.0, 0.f) == 1.f);
  // The norm the step reports, against the recorded gradients' own, summed here in double: the clip
  // below follows from this one, so a norm off by any factor (or without its square root) fails here.
  double squares = 0;
  for (float x : g) squares += double(x) * double(x);
  const double norm = std::sqrt(squares);
  CHECK(r.grad_norm == Approx(norm).epsilon(1e-6));
  REQUIRE(norm > 10 * o.grad_clip);
  const double clip = double(o.grad_clip) / norm, lr = r.lr, b1 = o.beta1, b2 = o.beta2, eps = o.adam_eps;
  size_t worse = 0, checked = 0, shown_clip = 0;
  double worst = 0;
  auto update = [&](double gi) { return lr / (1 - b1) * ((1 - b1) * gi) / (std::sqrt((1 - b2) * gi * gi / (1 - b2)) + eps); };
  for (const ul::ParamSpec& s : specs)
    for (size_t i = s.offset; i < s.offset + size_t(s.shape.numel()); i++) {
      const double decayed_p = p0[i] - (s.decay ? lr * o.weight_decay * p0[i] : 0.0);
      const double want = decayed_p - update(g[i] * clip);
      const double tol = 8 * 6e-8 * (std::fabs(want) + lr);  // AdamW's float roundings (test above)
      const double err = std::fabs(double(p1[i]) - want);
      worst = ul_test::max_err(worst, err / tol);
      worse += !(err <= tol);  // a NaN parameter counts
      shown_clip += std::fabs(update(g[i]) - update(g[i] * clip)) > 100 * tol;  // what no clip would give
      checked++;
    }
  INFO(checked << " parameters; worst error " << worst << " of the tolerance; " << shown_clip
               << " tell the clip from none");
  CHECK(checked == p0.size());
  CHECK(worse == 0);
  CHECK(shown_clip > checked / 10);  // (rows of unused tokens and positions have no gradient)
}
