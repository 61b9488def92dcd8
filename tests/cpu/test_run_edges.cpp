// What a run prints and logs at its edges: the first loss of a resumed run, the step a resume past
// --steps logs its length rows at, a sample at a --sample-every step that is also the last, the
// memory line of an eval-only run. Each was found untested by mutating the code.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/run_log.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::run_cmd;
using ul_test::train_cmd;

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

const std::string kRun = "--eval-every 0 --eval-batches 1 --threads 1 --batch 2 --seq 64";

}  // namespace

TEST_CASE("a resumed run's done line starts from its own first step's loss", "[cli]") {
  ul_test::TempDir dir;
  const std::string args = kRun + " --steps 4 --save-dir " + dir / "run";
  REQUIRE(run_cmd(train_cmd(args + " --stop-after 2")).code == 0);
  const ul_test::CmdResult r = run_cmd(train_cmd(args + " --resume"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::string step3;
  for (const ul::LogRecord& rec : ul::read_run_log(dir / "run/log.jsonl"))
    if (rec.at("type") == "step" && rec.at("step") == "3") step3 = rec.at("loss");
  REQUIRE(!step3.empty());
  char want[64];
  std::snprintf(want, sizeof want, "done | train loss %.4f -> ", std::stod(step3));
  CHECK(r.out.find(want) != std::string::npos);  // (it once said 0.0000: the loss of a step not run)
}

TEST_CASE("a resume from a checkpoint past --steps logs its length rows at the checkpoint's step", "[cli][length_probe]") {
  ul_test::TempDir dir;
  const std::string args = kRun + " --save-dir " + dir / "run";
  REQUIRE(run_cmd(train_cmd(args + " --steps 4")).code == 0);
  ul_test::CmdResult r = run_cmd(train_cmd(args + " --steps 2 --resume --probe-lengths 64"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  int rows = 0;
  for (const ul::LogRecord& rec : ul::read_run_log(dir / "run/log.jsonl")) {
    if (rec.at("type") != "length") continue;
    rows++;
    CHECK(rec.at("step") == "4");  // the weights probed are step 4's
  }
  CHECK(rows == 1);
  r = run_cmd(train_cmd(args + " --steps 2 --resume --probe-lengths 64"));
  CHECK(r.out.find("length     64 | logged already at step 4") != std::string::npos);
}

TEST_CASE("a --sample-every step that is the last samples once, the final sample", "[cli][sample]") {
  const ul_test::CmdResult r = run_cmd(train_cmd(kRun + " --steps 4 --sample 3 --sample-every 2 --prompt ids:1,2,3"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(count(r.out, "sample  | ") == 2);  // step 2's and the end's, not step 4's as well
  CHECK(count(r.out, "sample  | step 2 |") == 1);
}

TEST_CASE("an eval-only run reports its arena's high-water against the plan", "[cli][memory]") {
  const ul_test::CmdResult r = run_cmd(train_cmd("--steps 0 --eval-batches 1 --threads 1 --batch 2 --seq 64"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("memory  | arena high-water ") != std::string::npos);
  CHECK(r.out.find(": an eval's forward)") != std::string::npos);
}

TEST_CASE("a step that reads exactly the train split is not said to repeat any of it", "[cli][data]") {
  ul_test::TempDir dir;
  const std::string text = dir / "t.txt";
  {
    std::string s;
    for (int i = 0; i < 900; i++) s += "line " + std::to_string(i * 7919 % 1000) + "\n";
    FILE* f = std::fopen(text.c_str(), "wb");
    REQUIRE(f);
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
  const std::string args = "--data text:" + text + " --steps 1 --threads 1 --seq 64 --eval-batches 1 --eval-every 0 --batch ";
  const std::string said = "train sequences (--batch x --grad-accum x dp) but the train split holds ";
  // What the split holds, from the dataset itself (a first run at a batch past it, to read its
  // note, once trained a step of 10000 sequences: 9 GiB and a minute).
  const int holds = int(ul::open_dataset("text:" + text, ul::Split::train, 1337, 0)->num_sequences(64));
  REQUIRE(holds > 1);
  ul_test::CmdResult r = run_cmd(train_cmd(args + std::to_string(holds)));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find(said) == std::string::npos);
  r = run_cmd(train_cmd(args + std::to_string(holds + 1)));
  CHECK(r.out.find(said + std::to_string(holds) + " at --seq 64: each step repeats some") != std::string::npos);
}
