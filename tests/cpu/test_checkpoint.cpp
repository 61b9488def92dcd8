// Checkpoints, the run log and the loss plot, through the train binary: resume is bit-exact
// (1 rank, 2 ranks x sp 2, gpt2 and llama) and follows the run on another layout, a crash in the middle of a save leaves the previous
// checkpoint usable, --keep prunes, damaged or mismatched checkpoints are refused naming the file,
// the log has a record per step and eval, and the plot has both series.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gradcheck.h"
#include "data/dataset.h"
#include "engine/checkpoint.h"
#include "engine/checkpoint_files.h"
#include "engine/export.h"
#include "engine/file_io.h"
#include "engine/loss_plot.h"
#include "engine/probe_plot.h"
#include "engine/run_log.h"
#include "engine/trainer.h"
#include "options_from.h"
#include "parallel/comm_local.h"
#include "run_cmd.h"
#include "temp_dir.h"

using namespace ul_test;
namespace fs = std::filesystem;

namespace {

// Tiny and quick: six steps, a checkpoint every three, an eval every two.
const std::string kArgs =
    "--dim 32 --heads 2 --layers 1 --seq 16 --batch 2 --steps 6 --eval-every 2 --eval-batches 1 --threads 1 --quiet";

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ulysses_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// env: "NAME=VALUE" for the crash hook; that run aborts, so no core file is wanted.
CmdResult train(const std::string& args, const std::string& env = "") {
  CmdResult r = run_cmd((env.empty() ? "" : "ulimit -c 0; " + env + " ") + train_cmd(args));
  INFO("train " << args << "\n" << r.out);
  return r;
}

// The log read back, without the timing fields (which differ between runs).
std::vector<std::string> history(const fs::path& log) {
  std::vector<std::string> h;
  for (const ul::LogRecord& r : ul::read_run_log(log.string())) {
    std::string line;
    for (auto& [k, v] : r)
      if (k != "ms" && k != "tok_per_s") line += k + "=" + v + " ";
    h.push_back(line);
  }
  return h;
}

std::string bytes_of(const fs::path& p) { return ul::read_whole_file(p.string()); }

// A rank file as written before it carried its own checksum (the last field, "crc32").
std::string strip_crc(std::string j) {
  const size_t at = j.rfind(",\"crc32\":");
  REQUIRE(at != std::string::npos);
  return j.substr(0, at) + "}\n";
}

// A rank file without its save_id (rank 0) or save_of (the others) and own checksum (what a save
// draws anew); other files as they are.
std::string unsaved(std::string j) {
  size_t at = j.find(",\"save_id\":\"");
  if (at == std::string::npos) at = j.find(",\"save_of\":\"");
  if (at == std::string::npos) return j;
  j.erase(at, j.find('"', at + 12) + 1 - at);
  return strip_crc(j);
}

// The log without the records that start with `head` (a stop signal's skipped eval, say).
void drop_log_records(const fs::path& log, const std::string& head) {
  std::istringstream in(ul::read_whole_file(log.string()));
  {
    std::ofstream out(log.string() + ".new");
    for (std::string line; std::getline(in, line);)
      if (line.rfind(head, 0) != 0) out << line << "\n";
  }
  fs::rename(log.string() + ".new", log);
}

void expect_refused(const std::string& args, const std::string& needle) {
  CmdResult r = run_cmd(train_cmd(args));
  INFO("train " << args << "\n" << r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("train: error: ") != std::string::npos);
  CHECK(r.out.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("a resumed run is bit-identical to an uninterrupted one", "[checkpoint]") {
  const std::vector<std::pair<std::string, std::string>> setups = {
      {"gpt2", "--model gpt2"},
      {"gpt2_sp2", "--model gpt2 --ranks 2 --sp 2"},
      {"llama", "--model llama --kv-heads 1"},
      {"llama_sp2", "--model llama --kv-heads 1 --ranks 2 --sp 2"},
  };
  for (auto& [name, model] : setups) {
    DYNAMIC_SECTION(name) {
      fs::path d = fresh_dir("resume_" + name);
      const std::string args = kArgs + " " + model + " --save-every 3 --save-dir ";
      REQUIRE(train(args + (d / "full").string()).code == 0);
      // The interrupted run: it saves step 3, trains on, and dies while saving step 6.
      CHECK(train(args + (d / "part").string(), "ULYSSES_TEST_CRASH_IN_SAVE=2").code != 0);
      CHECK(ul::complete_steps((d / "part").string()) == std::vector<int>{3});
      CmdResult r = train(args + (d / "part").string() + " --resume");
      REQUIRE(r.code == 0);
      // Losses, gradient norms, learning rates, val losses: the same to the last bit.
      std::vector<std::string> full = history(d / "full" / "log.jsonl"), part = history(d / "part" / "log.jsonl");
      CHECK(full.size() == 9);
      CHECK(part == full);
      // And so is everything the run ends with: parameters, AdamW state, rank metadata (but the
      // number each save draws to tell itself apart, and the rank file's checksum over it).
      for (const auto& f : fs::directory_iterator(d / "full" / "step_00000006")) {
        INFO(f.path().filename());
        CHECK(unsaved(bytes_of(f.path())) == unsaved(bytes_of(d / "part" / "step_00000006" / f.path().filename())));
      }
      fs::remove_all(d);
    }
  }
}

TEST_CASE("an eval the stopped run skipped at its last step runs when it resumes", "[checkpoint]") {
  // A stop signal saves before its step's eval and skips it: here the log of a run that ended at
  // step 4 with its eval at 4 removed. The resume runs that eval first, so the val history is the
  // uninterrupted run's; with the eval in the log it runs none twice.
  fs::path d = fresh_dir("eval_at_resume");
  const std::string args = kArgs + " --schedule constant --save-dir ";  // the same lr at any --steps
  REQUIRE(train(args + (d / "full").string()).code == 0);
  auto evals = [](const fs::path& log) {
    std::vector<std::string> v;
    for (const ul::LogRecord& r : ul::read_run_log(log.string()))
      if (r.at("type") == "eval") v.push_back(r.at("step") + " " + r.at("val_loss"));
    return v;
  };
  for (bool drop : {true, false}) {
    INFO((drop ? "eval 4 dropped from the log" : "eval 4 in the log"));
    const fs::path part = d / (drop ? "dropped" : "kept");
    REQUIRE(train(args + part.string() + " --steps 4").code == 0);
    if (drop) {
      std::string log = bytes_of(part / "log.jsonl");
      const size_t at = log.find("{\"type\":\"eval\",\"step\":4,");
      REQUIRE(at != std::string::npos);
      log.erase(at, log.find('\n', at) + 1 - at);
      std::ofstream(part / "log.jsonl", std::ios::trunc) << log;
      REQUIRE(evals(part / "log.jsonl").size() == 1);
    }
    REQUIRE(train(args + part.string() + " --resume").code == 0);
    CHECK(evals(part / "log.jsonl") == evals(d / "full" / "log.jsonl"));
  }
  // The last step's eval, due whatever --eval-every says: a run killed during it saved step 6 and
  // has no step left, but that eval is still made (it was not: "nothing to do").
  const fs::path last = d / "last";
  fs::create_directories(last);
  fs::copy(d / "full", last, fs::copy_options::recursive);
  std::string log = bytes_of(last / "log.jsonl");
  const size_t at = log.find("{\"type\":\"eval\",\"step\":6,");
  REQUIRE(at != std::string::npos);
  log.erase(at);  // the eval's record and whatever followed it
  std::ofstream(last / "log.jsonl", std::ios::trunc) << log;
  const CmdResult r = train(args + last.string() + " --resume");
  REQUIRE(r.code == 0);
  CHECK(evals(last / "log.jsonl") == evals(d / "full" / "log.jsonl"));
  CHECK(r.out.find("done | no step left, its missing eval made: the checkpoint is at step 6 and --steps is 6") !=
        std::string::npos);
  const CmdResult again = train(args + last.string() + " --resume");  // with it in the log: none twice
  REQUIRE(again.code == 0);
  CHECK(again.out.find("done | nothing to do: the checkpoint is at step 6 and --steps is 6") != std::string::npos);
  CHECK(evals(last / "log.jsonl") == evals(d / "full" / "log.jsonl"));
  fs::remove_all(d);
}

// A resume on another layout (engine/checkpoint_files.h: RunLayout): the same sequences a step, so
// the run goes on as the one never stopped, within float rounding (the sums change order).
TEST_CASE("a resume on another layout follows the run never stopped", "[checkpoint]") {
  // The checkpoint: dp 2, batch 2 (4 sequences a step), saved at step 3 of 6; with and without ZeRO.
  // An eval reads --eval-batches x dp x batch sequences: with half the batch, two evals' worth.
  const std::string base = "--dim 32 --heads 2 --layers 1 --seq 16 --steps 6 --eval-every 0 --eval-batches 1 "
                           "--threads 1 --model llama --kv-heads 2";
  const std::vector<std::pair<std::string, std::vector<std::string>>> saved_resumed = {
      {"--ranks 2 --batch 2", {"--ranks 1 --batch 4", "--ranks 2 --sp 2 --batch 4", "--ranks 1 --batch 2 --grad-accum 2 --eval-batches 2",
                               "--ranks 2 --batch 2 --zero 1 --mlp-chunks 2"}},  // the same spread, other sums
      {"--ranks 2 --batch 2 --zero 1", {"--ranks 4 --sp 2 --batch 2 --zero 1", "--ranks 1 --batch 4"}},
  };
  fs::path d = fresh_dir("layout");
  int n = 0;
  for (auto& [saved, resumes] : saved_resumed) {
    const fs::path full = d / ("full" + std::to_string(n));
    REQUIRE(train(base + " " + saved + " --save-dir " + full.string()).code == 0);
    std::vector<float> want;
    ul::read_model_file((full / "step_00000006" / "model.bin").string(), want);
    const std::vector<ul::LogRecord> full_log = ul::read_run_log((full / "log.jsonl").string());
    for (const std::string& resumed : resumes) {
      const fs::path part = d / ("part" + std::to_string(n++));
      INFO(saved << " -> " << resumed);
      REQUIRE(train(base + " " + saved + " --steps 3 --save-dir " + part.string()).code == 0);
      CmdResult r = train(base + " " + resumed + " --resume --save-dir " + part.string());
      REQUIRE(r.code == 0);
      const std::string zero = saved.find("--zero") != std::string::npos ? ", --zero 1" : "";
      CHECK(r.out.find("resume  | another layout: saved at dp 2 x sp 1, batch 2, grad-accum 1" + zero + "; now ") !=
            std::string::npos);
      // dp x --batch 2 instead of 4: an eval's val set needs twice the --eval-batches (which this one gives).
      const bool halved = resumed.find("--ranks 1 --batch 2") != std::string::npos;
      CHECK((r.out.find("dp x --batch was 4 and is now 2, so the val set of the evals before takes 2 x the earlier "
                        "run's --eval-batches") != std::string::npos) == halved);
      // Each step's record and the last eval's (the part run also evaluated at its step 3).
      std::map<std::string, ul::LogRecord> by_step;
      for (const ul::LogRecord& rec : ul::read_run_log((part / "log.jsonl").string()))
        by_step[rec.at("type") + rec.at("step")] = rec;
      for (const ul::LogRecord& rec : full_log) {
        const std::string key = rec.at("type") + rec.at("step");
        REQUIRE(by_step.count(key));
        for (const char* field : {"loss", "grad_norm", "val_loss"}) {
          if (!rec.count(field)) continue;
          const double a = std::stod(rec.at(field)), b = std::stod(by_step[key].at(field));
          INFO(key << " " << field << ": " << a << " vs " << b);
          CHECK(std::abs(a - b) <= 1e-5 * std::abs(a));
        }
      }
      // The weights after three more AdamW steps: its m and v were restored on the new layout too.
      std::vector<float> got;
      ul::read_model_file((part / "step_00000006" / "model.bin").string(), got);
      REQUIRE(got.size() == want.size());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < got.size(); i++) diff = ul_test::max_err(diff, double(std::abs(got[i] - want[i]))),
                                              scale = std::max(scale, double(std::abs(want[i])));
      CHECK(diff <= 1e-5 * scale);
      // And on from there at its own layout: the checkpoint it saved resumes (each rank's own file checked).
      REQUIRE(train(base + " " + resumed + " --steps 7 --resume --save-dir " + part.string()).code == 0);
    }
  }
  // Another number of sequences a step is another run: refused, with a --batch that would keep it.
  expect_refused(base + " --ranks 1 --batch 2 --steps 7 --resume --save-dir " + (d / "part0").string(),
                 "rank_0.json: the checkpoint's steps train on 4 sequences each (dp 1 x sp 1, batch 4, grad-accum 1) but "
                 "this run's on 2 (dp 1 x sp 1, batch 2, grad-accum 1): another layout resumes when --batch x "
                 "--grad-accum x dp stays 4, e.g. --batch 4");
  // --zero and --mlp-chunks are said too: they keep the sequences but not the order of the sums.
  CmdResult sums = train(base + " --ranks 2 --batch 2 --zero 1 --mlp-chunks 2 --steps 8 --resume --save-dir " +
                         (d / "full0").string());
  REQUIRE(sums.code == 0);
  CHECK(sums.out.find("another layout: saved at dp 2 x sp 1, batch 2, grad-accum 1; now dp 2 x sp 1, batch 2, "
                      "grad-accum 1, --zero 1, --mlp-chunks 2: the same 4 sequences a step") != std::string::npos);
  // --zero alone changes no sum on the local communicator (the norm is summed shard by shard either
  // way): a resume that turns it off says nothing and ends on the bits of the run never stopped.
  const fs::path z = d / "zero";
  REQUIRE(train(base + " --ranks 2 --batch 2 --zero 1 --steps 3 --save-dir " + z.string()).code == 0);
  CmdResult off = train(base + " --ranks 2 --batch 2 --resume --save-dir " + z.string());
  REQUIRE(off.code == 0);
  CHECK(off.out.find("another layout") == std::string::npos);
  CHECK(bytes_of(z / "step_00000006" / "model.bin") == bytes_of(d / "full0" / "step_00000006" / "model.bin"));
  fs::remove_all(d);
}

TEST_CASE("which layout changes keep a resume's sums: --zero and --comm matter on 3+ ranks of MPI or NCCL", "[checkpoint]") {
  // {batch, grad_accum, dp, sp, zero, mlp_chunks, seq, device, steps, comm}
  auto at = [](int dp, int zero, const std::string& comm) { return ul::RunLayout{2, 1, dp, 1, zero, 1, 64, "cpu", 8, comm}; };
  // At most 2 ranks every backend adds alike (a + b = b + a): --zero and --comm change nothing.
  CHECK(at(2, 1, "mpi").same_sums(at(2, 0, "local")));
  CHECK(at(2, 0, "nccl").same_sums(at(2, 1, "mpi")));
  // On 3+ the local communicator adds in rank order either way: --zero changes nothing there.
  CHECK(at(3, 1, "local").same_sums(at(3, 0, "local")));
  // MPI's reduce-scatter and all-reduce may add in other orders than each other, and than local's.
  CHECK_FALSE(at(3, 1, "mpi").same_sums(at(3, 0, "mpi")));
  CHECK_FALSE(at(3, 1, "mpi").same_sums(at(3, 0, "local")));
  CHECK_FALSE(at(3, 0, "local").same_sums(at(3, 1, "mpi")));
  CHECK_FALSE(at(4, 0, "mpi").same_sums(at(4, 0, "local")));
  CHECK_FALSE(at(4, 0, "nccl").same_sums(at(4, 0, "mpi")));
  CHECK(at(4, 1, "mpi").same_sums(at(4, 1, "mpi")));
  // A checkpoint from before --comm was recorded is taken as this run's backend.
  CHECK(at(3, 0, "").same_sums(at(3, 0, "mpi")));
  CHECK(at(3, 1, "").same_sums(at(3, 0, "local")));
  CHECK_FALSE(at(3, 1, "").same_sums(at(3, 0, "mpi")));
  CHECK(at(3, 0, "mpi").str() == "dp 3 x sp 1, batch 2, grad-accum 1, --comm mpi");
  CHECK(at(3, 0, "local").str() == "dp 3 x sp 1, batch 2, grad-accum 1");
}

TEST_CASE("a crash in the middle of a save leaves the previous checkpoint loadable", "[checkpoint]") {
  fs::path d = fresh_dir("crash"), dir = d / "run";
  const std::string args = kArgs + " --save-every 3 --save-dir " + dir.string();
  CmdResult crashed = train(args, "ULYSSES_TEST_CRASH_IN_SAVE=2");
  CHECK(crashed.code != 0);
  CHECK(crashed.out.find("ULYSSES_TEST_CRASH_IN_SAVE") != std::string::npos);
  // The torn save: half a temporary model file, no COMPLETE, so not a checkpoint.
  CHECK(fs::exists(dir / "step_00000006" / "model.bin.tmp"));
  CHECK(fs::file_size(dir / "step_00000006" / "model.bin.tmp") < fs::file_size(dir / "step_00000003" / "model.bin"));
  CHECK_FALSE(fs::exists(dir / "step_00000006" / "COMPLETE"));
  CHECK(ul::complete_steps(dir.string()) == std::vector<int>{3});

  CmdResult resumed = train(args + " --resume");
  REQUIRE(resumed.code == 0);
  CHECK(resumed.out.find("done | train loss") != std::string::npos);
  CHECK(resumed.out.find("resume  | " + (dir / "step_00000006").string() +
                         ": removed, it has no COMPLETE (a save that did not finish)") != std::string::npos);
  CHECK(ul::complete_steps(dir.string()) == std::vector<int>{3, 6});
  CHECK_FALSE(fs::exists(dir / "step_00000006" / "model.bin.tmp"));
  // The log holds both attempts; read back, it is one run of six steps.
  std::vector<std::string> h = history(dir / "log.jsonl");
  REQUIRE(h.size() == 9);
  CHECK(h.back().find("step=6") != std::string::npos);
  // A crash in the very first save leaves nothing to resume: refused, not started fresh.
  fs::path first = d / "first";
  CHECK(train(kArgs + " --save-every 3 --save-dir " + first.string(), "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
  expect_refused(kArgs + " --save-dir " + first.string() + " --resume", "no complete checkpoint to resume from");
  fs::remove_all(d);
}

TEST_CASE("a rank file of another run in a checkpoint is named as such, not as this run's flag to change", "[checkpoint]") {
  fs::path d = fresh_dir("mixed_ranks");
  const std::string args = kArgs + " --ranks 2 --steps 2 --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  // rank_1.json as another run's (seed 7), its checksum made right: only rank 0's file says 1337.
  const fs::path r1 = d / "step_00000002" / "rank_1.json";
  std::string text = ul::read_whole_file(r1.string());
  const size_t seed = text.find("\"seed\":1337,"), crc = text.rfind(",\"crc32\":");
  REQUIRE((seed != std::string::npos && crc != std::string::npos));
  std::string body = text.substr(0, crc).replace(seed, 12, "\"seed\":7,");
  std::ofstream(r1) << body << ",\"crc32\":" << ul::crc32(0, body.data(), body.size()) << "}\n";
  CmdResult r = train(kArgs + " --ranks 2 --steps 4 --save-every 2 --resume --save-dir " + d.string());
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("rank_1.json: seed is 7 but " + (d / "step_00000002" / "rank_0.json").string() +
                   " says 1337: the checkpoint's rank files come from different runs") != std::string::npos);
  CHECK(r.out.find("(--seed)") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a ZeRO shard and its rank file from another run are refused at any layout, even one differing only in --lr",
          "[checkpoint]") {
  // Resumed at another world size, a rank's file is read only for its optimizer shard: it must
  // still be this save's, every field but the writer's own as rank_0.json has it.
  fs::path d = fresh_dir("mixed_zero");
  const std::string args = kArgs + " --ranks 2 --zero 1 --steps 2 --save-every 2 --save-dir ";
  REQUIRE(train(args + (d / "a").string()).code == 0);
  REQUIRE(train(args + (d / "b").string() + " --lr 0.01").code == 0);
  for (const char* name : {"rank_1.json", "optim_rank_1.bin"})
    fs::copy_file(d / "b" / "step_00000002" / name, d / "a" / "step_00000002" / name, fs::copy_options::overwrite_existing);
  for (const std::string layout : {" --batch 4", " --ranks 2"}) {
    CAPTURE(layout);
    CmdResult r = train(kArgs + layout + " --zero 1 --steps 4 --resume --save-dir " + (d / "a").string());
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find("rank_1.json: save_of is ") != std::string::npos);
    CHECK(r.out.find(" but " + (d / "a" / "step_00000002" / "rank_0.json").string() + "'s save_id is ") !=
          std::string::npos);
    CHECK(r.out.find(": the checkpoint's rank files come from different runs or saves") != std::string::npos);
  }
  fs::remove_all(d);
}

TEST_CASE("a ZeRO checkpoint reads the optimizer files its rank_0.json recorded, and names a stranger rank file first",
          "[checkpoint]") {
  fs::path d = fresh_dir("stray_optim");
  const std::string zero = kArgs + " --ranks 3 --zero 1 --save-every 2 --save-dir ";
  const fs::path at4 = fs::path("step_00000004");
  REQUIRE(train(zero + (d / "whole").string()).code == 0);  // the run never stopped
  REQUIRE(train(zero + (d / "a").string() + " --stop-after 4").code == 0);
  REQUIRE(train(kArgs + " --save-every 2 --stop-after 4 --save-dir " + (d / "plain").string()).code == 0);
  fs::copy(d / "a", d / "b", fs::copy_options::recursive);
  fs::copy(d / "a", d / "c", fs::copy_options::recursive);
  // A copy that merged another run's step directory in: an optim.bin of the same step (the same
  // AdamW t) beside ZeRO's shards. It was read in their place, and the run went on from the wrong state.
  fs::copy_file(d / "plain" / at4 / "optim.bin", d / "a" / at4 / "optim.bin");
  REQUIRE(train(zero + (d / "a").string() + " --resume").code == 0);
  CHECK(bytes_of(d / "a" / "step_00000006" / "model.bin") == bytes_of(d / "whole" / "step_00000006" / "model.bin"));
  // The shard gone, the stray file is not taken for it.
  fs::remove(d / "b" / at4 / "optim_rank_0.bin");
  fs::copy_file(d / "plain" / at4 / "optim.bin", d / "b" / at4 / "optim.bin");
  expect_refused(zero + (d / "b").string() + " --resume",
                 "rank_0.json records the optimizer state in optim_rank_0.bin, which is not there (optim.bin is, from "
                 "another save)");
  // Another save's rank_1.json alone, resumed at another layout: the rank file is the stranger, not
  // the shard beside it (its crc was checked against the stranger's record first).
  fs::copy_file(d / "c" / "step_00000002" / "rank_1.json", d / "c" / at4 / "rank_1.json",
                fs::copy_options::overwrite_existing);
  CmdResult r = train(kArgs + " --batch 6 --save-every 2 --resume --save-dir " + (d / "c").string());
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("rank_1.json: save_of is ") != std::string::npos);
  CHECK(r.out.find("optim_rank_1.bin: its crc32") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("keep K: exactly the K newest complete checkpoints remain", "[checkpoint]") {
  fs::path d = fresh_dir("keep");
  REQUIRE(train(kArgs + " --save-every 1 --keep 2 --save-dir " + d.string()).code == 0);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{5, 6});
  int dirs = 0;
  for (const auto& e : fs::directory_iterator(d)) dirs += e.is_directory();
  CHECK(dirs == 2);
  // Resuming and saving more keeps the count; what an earlier run moved aside (undeletable then)
  // is tried again and goes.
  fs::create_directories(d / "step_00000003.stale.77.1700000000000" / "sub");
  REQUIRE(train(kArgs + " --steps 8 --save-every 1 --keep 2 --resume --save-dir " + d.string()).code == 0);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{7, 8});
  CHECK_FALSE(fs::exists(d / "step_00000003.stale.77.1700000000000"));
  // Another run's checkpoint linked in to branch from: pruned past --keep, the link goes, and its
  // target keeps every file, COMPLETE too (it once went through the link: that run's next start
  // removed its own checkpoint as a crashed save).
  fs::path branch = fresh_dir("keep_branch");
  fs::create_directory_symlink(d / "step_00000008", branch / "step_00000008");
  REQUIRE(train(kArgs + " --steps 11 --save-every 1 --keep 2 --resume --save-dir " + branch.string()).code == 0);
  CHECK(ul::complete_steps(branch.string()) == std::vector<int>{10, 11});
  CHECK_FALSE(fs::exists(fs::symlink_status(branch / "step_00000008")));
  CHECK(fs::exists(d / "step_00000008" / "COMPLETE"));
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{7, 8});
  fs::remove_all(branch);
  fs::remove_all(d);
}

TEST_CASE("step directories up to 2^31 - 1 are checkpoints and other names are not", "[checkpoint]") {
  CHECK(ul::parse_step_dir("step_00000004") == 4);
  CHECK(ul::parse_step_dir("step_1000000000") == 1000000000);  // 10 digits from 10^9 on
  CHECK(ul::parse_step_dir("step_2147483647") == 2147483647);
  CHECK(ul::parse_step_dir("step_2147483648") == -1);
  CHECK(ul::parse_step_dir("step_4") == -1);  // not the canonical name
  CHECK(ul::parse_step_dir("step_00000004.stale.7") == -1);
  CHECK(ul::parse_step_dir("step_99999999999") == -1);
}

TEST_CASE("damaged or mismatched checkpoints are refused with the file named", "[checkpoint]") {
  fs::path d = fresh_dir("corrupt"), good = d / "good";
  REQUIRE(train(kArgs + " --steps 3 --save-dir " + good.string()).code == 0);
  auto damaged = [&](const std::string& name, const std::function<void(const fs::path& step_dir)>& harm) {
    fs::path dir = d / name;
    fs::copy(good, dir, fs::copy_options::recursive);
    harm(dir / "step_00000003");
    return dir;
  };
  auto poke = [](const fs::path& file, size_t at, char c) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(at));
    f.put(c);
  };
  const std::string resume = kArgs + " --resume --save-dir ";

  fs::path t = damaged("truncated", [](const fs::path& s) { fs::resize_file(s / "model.bin", fs::file_size(s / "model.bin") / 2); });
  expect_refused(resume + t.string(), "model.bin: truncated");
  fs::path flip = damaged("flipped", [&](const fs::path& s) { poke(s / "model.bin", 1000, 'x'); });
  expect_refused(resume + flip.string(), "model.bin: checksum mismatch");
  fs::path magic = damaged("magic", [&](const fs::path& s) { poke(s / "model.bin", 0, 'X'); });
  expect_refused(resume + magic.string(), "model.bin: bad magic 'XLYSMODL'");
  // A header that promises more than the file holds is refused before anything that large is
  // allocated (fuzz_model_file / fuzz_optim_file found both readers sizing their buffers first).
  auto poke_u64 = [](const fs::path& file, size_t at, uint64_t v) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(at));
    f.write(reinterpret_cast<const char*>(&v), 8);
  };
  fs::path big_model = damaged("big_model", [&](const fs::path& s) { poke_u64(s / "model.bin", 72, uint64_t(1) << 60); });
  expect_refused(resume + big_model.string(), "model.bin: truncated");
  fs::path big_optim = damaged("big_optim", [&](const fs::path& s) {
    poke_u64(s / "optim.bin", 24, uint64_t(1) << 40);  // numel and count: a consistent header, 8 TB of payload
    poke_u64(s / "optim.bin", 40, uint64_t(1) << 40);
  });
  CHECK_THROWS_WITH(ul::read_optim_file((big_optim / "step_00000003" / "optim.bin").string()),
                    Catch::Contains("optim.bin: truncated"));
  fs::path opt = damaged("optim", [&](const fs::path& s) { poke(s / "optim.bin", 500, 'x'); });
  expect_refused(resume + opt.string(), "optim.bin: checksum mismatch");
  fs::path no_optim = damaged("no_optim", [](const fs::path& s) { fs::remove(s / "optim.bin"); });
  expect_refused(resume + no_optim.string(), "no optimizer state: neither optim.bin nor (--zero 1) optim_rank_0.bin");
  // Files of another run or step in this checkpoint's place: each rank file records the crc32 of
  // the files its rank wrote, and AdamW's step count is the checkpoint's step.
  const fs::path other = d / "other", two = d / "two";
  REQUIRE(train(kArgs + " --steps 3 --seed 7 --save-dir " + other.string()).code == 0);
  REQUIRE(train(kArgs + " --steps 2 --save-dir " + two.string()).code == 0);
  fs::path swapped = damaged("swapped", [&](const fs::path& s) {
    fs::copy_file(other / "step_00000003" / "model.bin", s / "model.bin", fs::copy_options::overwrite_existing);
  });
  expect_refused(resume + swapped.string(), "a file of another checkpoint or run");
  expect_refused(resume + swapped.string(), "model.bin: its crc32 is ");
  fs::path swapped_opt = damaged("swapped_opt", [&](const fs::path& s) {
    fs::copy_file(other / "step_00000003" / "optim.bin", s / "optim.bin", fs::copy_options::overwrite_existing);
  });
  expect_refused(resume + swapped_opt.string(), "optim.bin: its crc32 is ");
  fs::path earlier = damaged("earlier", [&](const fs::path& s) {
    fs::copy_file(two / "step_00000002" / "optim.bin", s / "optim.bin", fs::copy_options::overwrite_existing);
  });
  expect_refused(resume + earlier.string(), "optim.bin: AdamW step count t = 2 but the checkpoint is step 3");
  // rank_0.json of another run (seed 7): named as that, with the way on, not as a --seed to give
  // (which would then have blamed this checkpoint's own model.bin).
  fs::path swapped_rank = damaged("swapped_rank", [&](const fs::path& s) {
    fs::copy_file(other / "step_00000003" / "rank_0.json", s / "rank_0.json", fs::copy_options::overwrite_existing);
  });
  expect_refused(resume + swapped_rank.string(), "rank_0.json: the crc32s it recorded are not those of model.bin and "
                                                 "optim.bin beside it: either this rank file or both of those files "
                                                 "come from another checkpoint or run");
  // A directory named otherwise than a save names it (step_3, not step_00000003) is no checkpoint.
  fs::path odd = damaged("odd", [&](const fs::path& s) { fs::rename(s, s.parent_path() / "step_3"); });
  expect_refused(resume + odd.string(), "no complete checkpoint to resume from");
  // A rank file checks its own text: a damaged key (a field then read as absent, so unchecked) is
  // refused like a damaged value. Without the checksum (as files from before it), a newer version
  // is refused by its number.
  fs::path key = damaged("key", [&](const fs::path& s) {
    std::string j = ul::read_whole_file((s / "rank_0.json").string());
    const size_t at = j.find("\"warmup\"");
    REQUIRE(at != std::string::npos);
    j[at + 1] = 'W';
    std::ofstream(s / "rank_0.json") << j;
  });
  expect_refused(resume + key.string(), "rank_0.json: checksum mismatch");
  fs::path version = damaged("version", [&](const fs::path& s) {
    std::string j = strip_crc(ul::read_whole_file((s / "rank_0.json").string()));
    const size_t at = j.find("\"version\":1");
    REQUIRE(at != std::string::npos);
    j.replace(at, 11, "\"version\":7");
    std::ofstream(s / "rank_0.json") << j;
  });
  expect_refused(resume + version.string(), "rank_0.json: version 7 (this build reads version 1)");
  fs::path json = damaged("json", [](const fs::path& s) { std::ofstream(s / "rank_0.json") << "{\"step\": 3,"; });
  expect_refused(resume + json.string(), "rank_0.json");
  expect_refused(resume + good.string() + " --seq 32", "rank_0.json: seq is 16 in the checkpoint but 32 in this run (--seq)");
  expect_refused(resume + good.string() + " --dim 64", "rank_0.json: dim is 32 in the checkpoint but 64 in this run (--dim)");
  expect_refused(resume + good.string() + " --model llama", "arch is gpt2 in the checkpoint but llama in this run (--model)");
  // Other data is named as such, not as the --vocab it brings (the vocabulary defaults to the data's).
  expect_refused(resume + good.string() + " --data recall", "data is passkey in the checkpoint but recall in this run (--data)");
  // The schedule and AdamW's settings shape every later update: only --steps and --lr may change.
  expect_refused(resume + good.string() + " --warmup 5", "warmup is 20 in the checkpoint but 5 in this run (--warmup)");
  expect_refused(resume + good.string() + " --beta2 0.99", "beta2 is 0.95 in the checkpoint but 0.99 in this run (--beta2)");
  expect_refused(resume + good.string() + " --schedule wsd", "schedule is cosine in the checkpoint but wsd in this run (--schedule)");
  expect_refused(resume + good.string() + " --steps 0", "--resume with --steps 0 trains nothing");
  expect_refused(kArgs + " --save-dir " + good.string(), "already holds checkpoints");
  expect_refused(kArgs + " --save-dir " + good.string(), "(--auto-resume in a job script that also starts it)");
  expect_refused(resume + (d / "empty").string(), "no complete checkpoint to resume from");
  expect_refused(resume + (d / "empty").string(), "(--auto-resume does either, as it finds the directory)");
  expect_refused(kArgs + " --resume", "--resume needs --save-dir");

  // Packing is part of the run: a checkpoint made with --doc-mask resumes only with it (and the
  // same --eot); one written before these fields existed counts as made without.
  {
    const fs::path text = d / "docs.txt";
    std::ofstream(text) << std::string(2000, 'a') + "\n" + std::string(3000, 'b') + "\n";
    const std::string packed = "--model gpt2 --layers 1 --dim 32 --heads 2 --seq 16 --batch 2 --eval-every 0 "
                               "--eval-batches 1 --threads 1 --quiet --data text:" + text.string();
    const fs::path pd = d / "packed";
    REQUIRE(train(packed + " --steps 2 --doc-mask --eot 10 --save-dir " + pd.string()).code == 0);
    expect_refused(packed + " --steps 3 --resume --save-dir " + pd.string(),
                   "doc_mask is true in the checkpoint but false in this run (--doc-mask)");
    expect_refused(packed + " --steps 3 --doc-mask --eot 98 --resume --save-dir " + pd.string(),
                   "eot is 10 in the checkpoint but 98 in this run (--eot)");
    REQUIRE(train(packed + " --steps 3 --doc-mask --eot 10 --resume --save-dir " + pd.string()).code == 0);
    // The same file named otherwise: still refused (the spec is compared as written), saying that the
    // files match and which spelling to give; another file's content gets no such hint.
    const std::string respelled = "--data text:" + (d / "." / "docs.txt").string();
    expect_refused(packed + " " + respelled + " --steps 4 --doc-mask --eot 10 --resume --save-dir " + pd.string(),
                   "its files match the checkpoint's record of them, named otherwise; give --data text:" + text.string());
    const fs::path other_text = d / "other_docs.txt";
    std::ofstream(other_text) << std::string(2000, 'c') + "\n" + std::string(3000, 'b') + "\n";
    const CmdResult other = run_cmd(train_cmd(packed + " --data text:" + other_text.string() +
                                                       " --steps 4 --doc-mask --eot 10 --resume --save-dir " + pd.string()));
    CHECK(other.code == 1);
    CHECK(other.out.find("data is text:") != std::string::npos);
    CHECK(other.out.find("its files match") == std::string::npos);
    const fs::path old = d / "old";
    REQUIRE(train(packed + " --steps 2 --save-dir " + old.string()).code == 0);
    const fs::path rank = old / "step_00000002" / "rank_0.json";
    std::string j = strip_crc(ul::read_whole_file(rank.string()));  // as a file from before it was added
    // The data's text changed since the save (the same spec, other bytes): the shuffle and the
    // held-out cut moved, so the resume is refused, naming what changed.
    const std::string saved_text = ul::read_whole_file(text.string());
    std::ofstream(text, std::ios::app) << std::string(500, 'c');
    expect_refused(packed + " --steps 4 --doc-mask --eot 10 --resume --save-dir " + pd.string(),
                   "data_files is 5002 bytes, crc32 ");
    expect_refused(packed + " --steps 4 --doc-mask --eot 10 --resume --save-dir " + pd.string(),
                   "in this run (--data: its files changed since the save): restore them as they were to resume, or "
                   "train on them as they are now in a new run from this checkpoint's weights (--checkpoint ");
    std::ofstream(text) << saved_text;
    REQUIRE(train(packed + " --steps 4 --doc-mask --eot 10 --resume --save-dir " + pd.string()).code == 0);
    for (const char* field : {",\"doc_mask\":false", ",\"eot\":-1", ",\"warmup\":20", ",\"grad_clip\":\"1\"",
                              ",\"schedule\":\"cosine\"", ",\"decay_frac\":\"0.2\""}) {
      const size_t at = j.find(field);
      REQUIRE(at != std::string::npos);
      j.erase(at, std::strlen(field));
    }
    const size_t files = j.find(",\"data_files\":\"");  // its value too, up to the closing quote
    REQUIRE(files != std::string::npos);
    j.erase(files, j.find('"', files + 15) + 1 - files);
    std::ofstream(rank) << j;
    // Fields a checkpoint predates are not checked (the schedule's), or take the value it implies.
    REQUIRE(train(packed + " --steps 3 --warmup 7 --resume --save-dir " + old.string()).code == 0);
  }
  // The EOT the data names (prepare's shards: 256) and --eot naming that same id are one run: each
  // resumes the other, and a checkpoint from before the effective id was recorded (-1 for the data's
  // own) resumes with --eot written out too; another id is refused, by number.
  {
    std::ofstream(d / "s.txt") << std::string(3000, 'x') + "\n" + std::string(2000, 'y') + "\n";
    REQUIRE(train("prepare --out " + (d / "sh").string() + " " + (d / "s.txt").string()).code == 0);
    const std::string sh = "--model gpt2 --layers 1 --dim 32 --heads 2 --seq 16 --batch 2 --eval-every 0 "
                           "--eval-batches 1 --threads 1 --quiet --doc-mask --data shards:" +
                           (d / "sh").string() + "/text_*.bin";
    const fs::path a = d / "eot_a", b = d / "eot_b";
    REQUIRE(train(sh + " --steps 2 --save-dir " + a.string()).code == 0);
    REQUIRE(train(sh + " --steps 3 --eot 256 --resume --save-dir " + a.string()).code == 0);
    REQUIRE(train(sh + " --steps 2 --eot 256 --save-dir " + b.string()).code == 0);
    REQUIRE(train(sh + " --steps 3 --resume --save-dir " + b.string()).code == 0);
    expect_refused(sh + " --steps 4 --eot 7 --resume --save-dir " + b.string(),
                   "eot is 256 in the checkpoint but 7 in this run (--eot)");
    const fs::path rank = b / "step_00000003" / "rank_0.json";
    std::string j = strip_crc(ul::read_whole_file(rank.string()));
    const size_t at = j.find(",\"eot\":256");
    REQUIRE(at != std::string::npos);
    j.replace(at, 10, ",\"eot\":-1");
    std::ofstream(rank) << j;
    REQUIRE(train(sh + " --steps 4 --eot 256 --resume --save-dir " + b.string()).code == 0);
  }

  // Refusing touched nothing: the good checkpoint and its log are as they were.
  CHECK(ul::complete_steps(good.string()) == std::vector<int>{3});
  CHECK(history(good / "log.jsonl").size() == 5);  // 3 steps, evals at 2 and 3
  REQUIRE(train(resume + good.string()).code == 0);
  fs::remove_all(d);
}

TEST_CASE("a llama's --ffn written out at its derived width resumes as the same model, another is refused",
          "[checkpoint]") {
  fs::path d = fresh_dir("ffn");
  // dim 32: the derived SwiGLU width is round_up(8 x 32 / 3, 64) = 128.
  const std::string args = "--model llama --layers 1 --dim 32 --heads 2 --seq 16 --batch 2 --eval-every 0 "
                           "--eval-batches 1 --threads 1 --quiet --data passkey";
  for (const char* saved : {"", " --ffn 128"}) {
    INFO("saved with '" << saved << "'");
    const fs::path run = d / (*saved ? "given" : "derived");
    REQUIRE(train(args + saved + " --steps 2 --save-dir " + run.string()).code == 0);
    for (const char* resumed : {"", " --ffn 128"}) {
      const fs::path copy = run.string() + (*resumed ? "_given" : "_derived");
      fs::copy(run, copy, fs::copy_options::recursive);
      const CmdResult r = train(args + resumed + " --steps 3 --resume --save-dir " + copy.string());
      INFO("resumed with '" << resumed << "': " << r.out);
      CHECK(r.code == 0);
    }
    expect_refused(args + " --ffn 192 --steps 3 --resume --save-dir " + run.string(),
                   "ffn is 128 in the checkpoint but 192 in this run (--ffn)");
  }
  // A checkpoint from before the width was written held 0 for a derived one.
  const fs::path old = d / "old";
  REQUIRE(train(args + " --steps 2 --save-dir " + old.string()).code == 0);
  const fs::path rank = old / "step_00000002" / "rank_0.json";
  std::string j = strip_crc(ul::read_whole_file(rank.string()));
  const size_t at = j.find("\"ffn\":128");
  REQUIRE(at != std::string::npos);
  j.replace(at, 9, "\"ffn\":0");
  std::ofstream(rank) << j;
  CHECK(train(args + " --ffn 128 --steps 3 --resume --save-dir " + old.string()).code == 0);
  fs::remove_all(d);  // (each run of this test once left its 4 MB behind in the temp directory)
}

TEST_CASE("a damaged newest checkpoint: the refusal says how to resume from the one before", "[checkpoint]") {
  fs::path d = fresh_dir("older");
  REQUIRE(train(kArgs + " --steps 3 --save-every 1 --save-dir " + d.string()).code == 0);
  {
    std::fstream f(d / "step_00000003" / "model.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('x');
  }
  const std::string newest = (d / "step_00000003").string();
  expect_refused(kArgs + " --steps 4 --resume --save-dir " + d.string(),
                 "model.bin: checksum mismatch");
  expect_refused(kArgs + " --steps 4 --resume --save-dir " + d.string(),
                 "(if " + newest + " is damaged, move it aside: mv " + newest + " " + newest +
                     ".bad, and --resume continues from step_00000002)");
  // Doing so works: the run goes on from step 2, and the name aside is no checkpoint.
  fs::rename(newest, newest + ".bad");
  const ul_test::CmdResult r = train(kArgs + " --steps 4 --resume --save-dir " + d.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(ul::read_whole_file((d / "log.jsonl").string()).find("{\"type\":\"resume\",\"step\":2}") != std::string::npos);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{1, 2, 4});
  fs::remove_all(d);
}

TEST_CASE("a rollback with --resume-step: the older checkpoint goes on bit-exactly, the newer ones are moved aside",
          "[checkpoint][rollback]") {
  fs::path d = fresh_dir("rollback");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  const std::vector<std::string> first = history(d / "log.jsonl");
  const std::string model6 = bytes_of(d / "step_00000006" / "model.bin");
  CmdResult r = train(args + " --resume-step 2");
  REQUIRE(r.code == 0);
  // The same steps again from step 2: the same bits (the data follows the data place step 2 saved,
  // the learning rate the step),
  // and the log read back is one history, the records after step 2 of the first attempt dropped.
  CHECK(history(d / "log.jsonl") == first);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6});
  CHECK(bytes_of(d / "step_00000006" / "model.bin") == model6);
  // The first attempt's steps 4 and 6 are kept under names that are no checkpoint.
  std::vector<std::string> aside;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().find(".rolled-back.") != std::string::npos) {
      aside.push_back(e.path().filename().string().substr(0, 13));
      CHECK(fs::exists(e.path() / "COMPLETE"));
    }
  std::sort(aside.begin(), aside.end());
  CHECK(aside == std::vector<std::string>{"step_00000004", "step_00000006"});
  // A checkpoint at its step's own data place also has the field older builds read.
  CHECK(bytes_of(d / "step_00000006" / "rank_0.json").find("\"data_sequence\":12,\"data_position\":6,") !=
        std::string::npos);
  // The same command again (a requeued job script) goes on from this run's newest checkpoint, as
  // --resume would, instead of moving its checkpoints aside too; another skip for that step is refused.
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --save-every 2 --save-dir " + d.string();
  r = train(loud + " --resume-step 2 --steps 8");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --resume-step 2 was done before (" + (d / "rollback.json").string() +
                   ") and its run has saved since: going on from its newest checkpoint") != std::string::npos);
  CHECK(r.out.find("continuing after step 6 of 8") != std::string::npos);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6, 8});
  expect_refused(args + " --resume-step 2 --skip-batches 1 --steps 10",
                 "a rollback to step 2 with --skip-batches 0 at 2 sequences a step (" + (d / "rollback.json").string() +
                 ") was done, and the run has saved up to step_00000008 since; this command asks for --skip-batches 1 "
                 "at 2: continue the run with --resume, or remove");
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6, 8});
  // A rollback with nothing to train (--steps at or below its step) is refused before it moves anything.
  expect_refused(args + " --resume-step 4 --steps 4", "--resume-step 4: nothing to train, --steps is 4");
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6, 8});
  // --resume-step of the newest moves nothing.
  REQUIRE(train(args + " --resume-step 8 --steps 9").code == 0);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6, 8, 9});
  fs::remove_all(d);
}

TEST_CASE("a rollback that dies before its first save: a plain resume keeps its skip and its G", "[checkpoint][rollback]") {
  // The rollback's run crashes in its first save (step 4): step 2 is the newest again, and its
  // files still hold the data's place of the history the rollback replaced. The record in
  // DIR/rollback.json stands in for them: the resume trains on the skipped run's data, the same
  // bits as the rollback never interrupted.
  // Also at sp 2: rank 0 reads the record, every rank takes it.
  for (const std::string layout : {"", " --ranks 2 --sp 2"}) DYNAMIC_SECTION("layout '" << layout << "'") {
    fs::path d = fresh_dir("rollback_crash");
    for (const std::string name : {"whole", "crashed"}) {
      const std::string args = kArgs + layout + " --save-every 2 --save-dir " + (d / name).string();
      REQUIRE(train(args).code == 0);
      const std::string roll = args + " --resume-step 2 --skip-batches 2 --batch 4 --change-global-batch";
      if (name == "whole") {
        REQUIRE(train(roll).code == 0);
        continue;
      }
      CHECK(train(roll, "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
      CHECK(ul::complete_steps((d / name).string()) == std::vector<int>{2});
      // G = 4 is the rollback's: without it (the old --batch 2) the resume is refused, naming the record.
      expect_refused(args + " --resume", "rollback.json: the rollback to step 2 trains on 4 sequences a step but this "
                                         "run on 2");
      const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet"));
      CmdResult r = train(loud + layout + " --save-every 2 --save-dir " + (d / name).string() + " --resume --batch 4");
      REQUIRE(r.code == 0);
      CHECK(r.out.find("(" + (d / name / "rollback.json").string() + "): step 3 trains on sequences from 12, 4 a step") !=
            std::string::npos);
    }
    CHECK(history(d / "crashed" / "log.jsonl") == history(d / "whole" / "log.jsonl"));
    CHECK(bytes_of(d / "crashed" / "step_00000006" / "model.bin") == bytes_of(d / "whole" / "step_00000006" / "model.bin"));
    fs::remove_all(d);
  }
}

TEST_CASE("a rollback interrupted among its moves: the next start finishes them from its record",
          "[checkpoint][rollback]") {
  // The record is written before the renames. Here the rollback's run dies in its first save, and
  // its two moved checkpoints are put back by hand under their step names: the state of a crash
  // right after the record. A plain --resume moves them aside again and goes on as the rollback would.
  fs::path d = fresh_dir("rollback_moves");
  const std::string whole = kArgs + " --save-every 2 --save-dir " + (d / "whole").string();
  const std::string cut = kArgs + " --save-every 2 --save-dir " + (d / "cut").string();
  REQUIRE(train(whole).code == 0);
  REQUIRE(train(cut).code == 0);
  REQUIRE(train(whole + " --resume-step 2 --skip-batches 1").code == 0);
  CHECK(train(cut + " --resume-step 2 --skip-batches 1", "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
  fs::remove_all(d / "cut" / "step_00000004");  // the crashed save's leftover
  for (const auto& e : fs::directory_iterator(d / "cut")) {
    const std::string name = e.path().filename().string();
    if (name.find(".rolled-back.") != std::string::npos) fs::rename(e.path(), d / "cut" / name.substr(0, 13));
  }
  REQUIRE(ul::complete_steps((d / "cut").string()) == std::vector<int>{2, 4, 6});
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --save-every 2 --save-dir " + (d / "cut").string();
  CmdResult r = train(loud + " --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | " + (d / "cut" / "step_00000006").string() + ".rolled-back.") != std::string::npos);
  CHECK(r.out.find(": moved aside now, finishing the rollback to step 2 that " + (d / "cut" / "rollback.json").string() +
                   " lists") != std::string::npos);
  CHECK(r.out.find("continuing after step 2 of 6") != std::string::npos);
  CHECK(history(d / "cut" / "log.jsonl") == history(d / "whole" / "log.jsonl"));
  fs::remove_all(d);
}

TEST_CASE("the same rollback command again goes on even after --keep pruned the step it rolled back to",
          "[checkpoint][rollback]") {
  fs::path d = fresh_dir("rollback_keep");
  const std::string args = kArgs + " --save-every 2 --keep 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  REQUIRE(train(args + " --resume-step 4 --skip-batches 1 --steps 8").code == 0);
  REQUIRE(ul::complete_steps(d.string()) == std::vector<int>{6, 8});  // step 4 pruned
  REQUIRE(train(args + " --resume-step 4 --skip-batches 1 --steps 10").code == 0);
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{8, 10});
  // Its data place went on from the rollback's: 4 x 2 + 1 x 2 + 6 steps x 2.
  CHECK(bytes_of(d / "step_00000010" / "rank_0.json").find("\"data_sequence\":22,") != std::string::npos);
  expect_refused(args + " --resume-step 4 --steps 12", "(step_00000004 itself is gone: roll back to a step still there)");
  fs::remove_all(d);
}

TEST_CASE("the rollback record holds in a copy of the directory, and remembers earlier rollbacks",
          "[checkpoint][rollback]") {
  fs::path d = fresh_dir("rollback_copy");
  const std::string args = kArgs + " --save-every 2 --save-dir ";
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --save-every 2 --save-dir ";
  // A rollback that dies before its first save, its directory then copied (new inodes and times):
  // the record names checkpoints by the save_id their rank files carry, so it still applies.
  REQUIRE(train(args + (d / "a").string()).code == 0);
  CHECK(train(args + (d / "a").string() + " --resume-step 2 --skip-batches 1", "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
  fs::copy(d / "a", d / "b", fs::copy_options::recursive);
  CmdResult r = train(loud + (d / "b").string() + " --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("step 3 trains on sequences from 6, 2 a step") != std::string::npos);
  // Two rollbacks, then the first one's job script again: it goes on, moving nothing.
  REQUIRE(train(args + (d / "b").string() + " --resume-step 4 --skip-batches 2 --steps 8").code == 0);
  REQUIRE(ul::complete_steps((d / "b").string()) == std::vector<int>{2, 4, 6, 8});
  r = train(loud + (d / "b").string() + " --resume-step 2 --skip-batches 1 --steps 10");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--resume-step 2 was done before") != std::string::npos);
  CHECK(ul::complete_steps((d / "b").string()) == std::vector<int>{2, 4, 6, 8, 10});
  fs::remove_all(d);
}

TEST_CASE("an earlier rollback's command, requeued when the later history has saved just its step, goes on",
          "[checkpoint][rollback]") {
  // A rollback to 6, then one to 2 (which moves that step_6 aside); the run from 2 saves a new
  // step_6 and stops. The first job script again (--resume-step 6 --skip-batches 1) must go on from
  // it as --resume would, not skip another step's data from the later history's step 6.
  fs::path d = fresh_dir("rollback_earlier");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args + " --steps 8").code == 0);
  REQUIRE(train(args + " --steps 8 --resume-step 6 --skip-batches 1").code == 0);
  REQUIRE(train(args + " --steps 4 --resume-step 2 --skip-batches 1").code == 0);
  REQUIRE(train(args + " --steps 6 --resume").code == 0);
  REQUIRE(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6});
  CHECK(bytes_of(d / "step_00000006" / "rank_0.json").find("\"data_sequence\":14,") != std::string::npos);
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --save-every 2 --save-dir " + d.string();
  CmdResult r = train(loud + " --steps 8 --resume-step 6 --skip-batches 1");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--resume-step 6 was done before") != std::string::npos);
  CHECK(r.out.find("skipping") == std::string::npos);
  CHECK(bytes_of(d / "step_00000008" / "rank_0.json").find("\"data_sequence\":18,") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("an earlier rollback's command, requeued after a later rollback died before its first save, keeps the "
          "later one's skip", "[checkpoint][rollback]") {
  // Rollback A to 2 saves 4, 6, 8; rollback B to 4 (--skip-batches 2) dies in its first save: step 4
  // is the newest again, its files at the data's place of A's history, B's record the place after
  // its skip. A's job script again goes on from step 4 as --resume would: with B's skip, not
  // training on the data B skipped (it once loaded step 4's files alone).
  fs::path d = fresh_dir("rollback_pending");
  const std::string args = kArgs + " --steps 8 --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  REQUIRE(train(args + " --resume-step 2 --skip-batches 1").code == 0);
  CHECK(train(args + " --resume-step 4 --skip-batches 2", "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
  REQUIRE(ul::complete_steps(d.string()) == std::vector<int>{2, 4});
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --steps 8 --save-every 2 --save-dir " + d.string();
  CmdResult r = train(loud + " --resume-step 2 --skip-batches 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--resume-step 2 was done before") != std::string::npos);
  CHECK(r.out.find("step 5 trains on sequences from 14, 2 a step") != std::string::npos);
  // 2 steps x 2 + 1 x 2 skipped + 2 x 2 (to step 4) + 2 x 2 skipped by B + 4 x 2.
  CHECK(bytes_of(d / "step_00000008" / "rank_0.json").find("\"data_sequence\":22,") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a fresh run removes a rollback record its directory kept from a deleted history", "[checkpoint][rollback]") {
  fs::path d = fresh_dir("rollback_stale");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  REQUIRE(train(args + " --resume-step 4 --skip-batches 3").code == 0);
  REQUIRE(fs::exists(d / "rollback.json"));
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().rfind("step_", 0) == 0) fs::remove_all(e.path());
  // A new run from step 0: its step 4 is not the one rolled back to, and its data is its own.
  REQUIRE(train(kArgs + " --steps 4 --save-every 2 --save-dir " + d.string()).code == 0);
  CHECK_FALSE(fs::exists(d / "rollback.json"));
  REQUIRE(train(args + " --resume").code == 0);
  CHECK(bytes_of(d / "step_00000006" / "rank_0.json").find("\"data_sequence\":12,") != std::string::npos);
  // And its first rollback to step 4 is a rollback, not a repeat of the deleted history's.
  REQUIRE(train(args + " --resume-step 4 --skip-batches 1").code == 0);
  CHECK(bytes_of(d / "step_00000006" / "rank_0.json").find("\"data_sequence\":14,") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("skipping batches moves the data ahead, and checkpoints keep the skip", "[checkpoint][rollback]") {
  // A step after a skip of K trains on the sequences of the step K later: its loss (taken before
  // the update) is the loss of a run at that step's position on the same weights.
  const ul::Options o = ul_test::options("--dim 32 --heads 2 --layers 1 --seq 16 --batch 2 --threads 1");
  // One trainer at a time: each installs its context on the thread.
  auto first_loss = [&](const std::function<void(ul::Trainer&)>& place) {
    double loss = 0;
    ul::run_local(1, [&](ul::Comm& world) {
      ul::Trainer tr(o, world);
      place(tr);
      const int64_t at = tr.next_sequence();
      loss = tr.step().loss;
      CHECK(tr.next_sequence() == at + 2);  // G = batch 2
    });
    return loss;
  };
  const double skipped = first_loss([](ul::Trainer& tr) {
    tr.skip_batches(3);
    CHECK(tr.next_sequence() == 6);
    CHECK(tr.steps_done() == 0);
  });
  const double later = first_loss([](ul::Trainer& tr) { tr.set_steps_done(3, 6); });
  const double plain = first_loss([](ul::Trainer&) {});
  CHECK(skipped == later);
  CHECK(skipped != plain);

  // Through train: roll back to step 2 skipping 2 steps' data; the checkpoints after it record
  // the data's place (sequence 4 G on from step 2's), the log's resume record too, and a resume from one of them goes on
  // with the skip: the same bits as the run that skipped, which differs from the first attempt.
  fs::path d = fresh_dir("skip");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  const std::vector<std::string> first = history(d / "log.jsonl");
  REQUIRE(train(args + " --resume-step 2 --skip-batches 2").code == 0);
  const std::vector<std::string> skipping = history(d / "log.jsonl");
  REQUIRE(skipping.size() == first.size());
  CHECK(std::equal(first.begin(), first.begin() + 3, skipping.begin()));  // steps 1, 2 and the eval at 2
  CHECK(skipping.back() != first.back());
  CHECK(ul::read_whole_file((d / "log.jsonl").string()).find("{\"type\":\"resume\",\"step\":2,\"data_sequence\":8}") !=
        std::string::npos);
  CHECK(bytes_of(d / "step_00000004" / "rank_0.json").find("\"step\":4,") != std::string::npos);
  CHECK(bytes_of(d / "step_00000004" / "rank_0.json").find("\"data_sequence\":12,") != std::string::npos);
  REQUIRE(train(args + " --resume-step 4").code == 0);
  CHECK(history(d / "log.jsonl") == skipping);
  fs::remove_all(d);
}

TEST_CASE("a resume may change the global batch with --change-global-batch, going on from its sequence",
          "[checkpoint][rollback]") {
  // The data's place is a sequence, not a step: a step of batch 4 from sequence 2 trains on what
  // two micro-batches of 2 from there do (2, 3 then 4, 5), within rounding.
  auto first_loss = [](const std::string& layout, int64_t from) {
    const ul::Options o = ul_test::options("--dim 32 --heads 2 --layers 1 --seq 16 --threads 1 " + layout);
    double loss = 0;
    ul::run_local(1, [&](ul::Comm& world) {
      ul::Trainer tr(o, world);
      tr.set_steps_done(0, from);
      loss = tr.step().loss;
    });
    return loss;
  };
  const double one = first_loss("--batch 4", 2), two = first_loss("--batch 2 --grad-accum 2", 2);
  CHECK(one == Approx(two).epsilon(1e-6));
  CHECK(std::abs(one - first_loss("--batch 4", 0)) > 1e-4);

  fs::path d = fresh_dir("new_g");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();  // --batch 2: G = 2
  REQUIRE(train(args).code == 0);
  expect_refused(args + " --resume-step 2 --batch 4",
                 "(or, to train on 4 a step from here on, --change-global-batch)");
  // A refusal for this run's flags does not suggest the checkpoint might be damaged.
  CHECK(run_cmd(train_cmd(args + " --resume-step 2 --batch 4")).out.find("is damaged") == std::string::npos);
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet"));  // the resume lines are wanted
  CmdResult r = train(loud + " --save-every 2 --save-dir " + d.string() + " --resume-step 2 --batch 4 --change-global-batch");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | another global batch: saved at 2 sequences a step (dp 1 x sp 1, batch 2, grad-accum 1), "
                   "now 4 (dp 1 x sp 1, batch 4, grad-accum 1): the data goes on from sequence 4") != std::string::npos);
  CHECK(ul::read_whole_file((d / "log.jsonl").string()).find("{\"type\":\"resume\",\"step\":2,\"data_sequence\":4}") !=
        std::string::npos);
  CHECK(bytes_of(d / "step_00000004" / "rank_0.json").find("\"data_sequence\":12,") != std::string::npos);
  CHECK(bytes_of(d / "step_00000006" / "rank_0.json").find("\"data_sequence\":20,") != std::string::npos);
  // From then on G = 4 is the checkpoints' own: a resume keeps it without the flag.
  REQUIRE(train(args + " --resume --batch 4 --steps 7").code == 0);
  CHECK(bytes_of(d / "step_00000007" / "rank_0.json").find("\"data_sequence\":24,") != std::string::npos);
  expect_refused(kArgs + " --change-global-batch", "--change-global-batch lets a resume change batch x grad-accum x dp: "
                                                   "it needs --resume or --resume-step");
  fs::remove_all(d);
}

TEST_CASE("a resume at another length (--change-seq) keeps AdamW's state and the schedule, the data where its epoch stood",
          "[checkpoint][change-seq]") {
  fs::path d = fresh_dir("change_seq");
  {
    std::ofstream f(d / "t.txt", std::ios::binary);
    for (int k = 0; k < 6000; k++) f.put(char('a' + (k * 7 + k / 13) % 26));
  }
  const std::string data = "--batch 2 --eval-every 0 --threads 1 --data text:" + (d / "t.txt").string();
  const std::string base = "--dim 32 --heads 2 --layers 1 " + data;
  const std::string args = base + " --save-every 2 --save-dir " + (d / "run").string();
  REQUIRE(train(args + " --seq 16 --steps 4 --quiet").code == 0);  // steps 1-4: sequences [0, 8) of 16 bytes
  expect_refused(args + " --seq 32 --steps 6 --resume",
                 "seq is 16 in the checkpoint but 32 in this run (--seq) (or, to go on at --seq 32 with the "
                 "checkpoint's AdamW state and schedule, --change-seq)");
  CmdResult r = train(args + " --seq 32 --steps 6 --resume --change-seq");
  REQUIRE(r.code == 0);
  // 8 x 16 bytes read: at 32, sequence 4 is the next unread text.
  CHECK(r.out.find("resume  | another sequence length: saved at --seq 16, now 32: step 5 trains on sequences from 4 "
                   "at 32 (where the data's epoch stood, at the new length); AdamW's state and the schedule go on") !=
        std::string::npos);
  CHECK(ul::read_whole_file((d / "run" / "log.jsonl").string()).find("{\"type\":\"resume\",\"step\":4,"
                                                                      "\"data_sequence\":4,\"seq\":32}") != std::string::npos);
  const std::string six = bytes_of(d / "run" / "step_00000006" / "rank_0.json");
  CHECK(six.find("\"data_sequence\":8,") != std::string::npos);
  CHECK(six.find("\"seq\":32,") != std::string::npos);
  // Step 5's loss is that of step 4's weights on sequences 4 and 5 at length 32 (the forward does
  // not read the optimizer), its learning rate the schedule's at step 5 (an uninterrupted run's).
  const std::vector<ul::LogRecord> log = ul::read_run_log((d / "run" / "log.jsonl").string());
  const auto at = [&](const std::vector<ul::LogRecord>& l, int step) {
    for (const ul::LogRecord& x : l)
      if (x.at("type") == "step" && x.at("step") == std::to_string(step)) return x;
    FAIL("no step " << step << " in the log");
    return ul::LogRecord{};
  };
  double fresh = 0;
  const ul::Options o = ul_test::options(data + " --seq 32 --checkpoint " +
                                         (d / "run" / "step_00000004" / "model.bin").string());
  ul::run_local(1, [&](ul::Comm& world) {
    ul::Trainer tr(o, world);
    tr.set_steps_done(0, 4);
    fresh = tr.step().loss;
  });
  CHECK(std::stod(at(log, 5).at("loss")) == fresh);
  REQUIRE(train(base + " --seq 16 --steps 6 --quiet --log " + (d / "straight.jsonl").string()).code == 0);
  CHECK(at(log, 5).at("lr") == at(ul::read_run_log((d / "straight.jsonl").string()), 5).at("lr"));
  // AdamW's count went on: step 6's optimizer file is taken as step 6's (else refused) by the next
  // resume, which needs no flag now the checkpoints are at 32; with it, a note; back down to 16 on
  // two ranks at sp 2 from step 7: 10 x 32 bytes read, so sequence 20 at 16, and step 8's [20, 22).
  r = train(args + " --seq 32 --steps 7 --resume --change-seq");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --change-seq: this resume keeps the checkpoint's --seq 32") != std::string::npos);
  CHECK(bytes_of(d / "run" / "step_00000007" / "rank_0.json").find("\"data_sequence\":10,") != std::string::npos);
  REQUIRE(train(args + " --seq 16 --steps 8 --resume --change-seq --ranks 2 --sp 2 --quiet").code == 0);
  CHECK(bytes_of(d / "run" / "step_00000008" / "rank_1.json").find("\"data_sequence\":22,") != std::string::npos);
  // A rollback (at its checkpoint's length) that died in its first save is taken up by a plain
  // resume at another length: the rollback's place (step 2's 4 sequences of 16, one step of 2
  // skipped: 6) at 32 is 3, and steps 3 and 4 train on [3, 7).
  fs::remove_all(d / "run");
  REQUIRE(train(args + " --seq 16 --steps 6 --quiet").code == 0);
  CHECK(train(args + " --seq 16 --steps 6 --quiet --resume-step 2 --skip-batches 1", "ULYSSES_TEST_CRASH_IN_SAVE=1").code != 0);
  r = train(args + " --seq 32 --steps 6 --resume --change-seq");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("step 3 trains on sequences from 6, 2 a step (at --seq 16)\n") != std::string::npos);
  CHECK(r.out.find("saved at --seq 16, now 32: step 3 trains on sequences from 3 at 32") != std::string::npos);
  CHECK(bytes_of(d / "run" / "step_00000004" / "rank_0.json").find("\"data_sequence\":7,") != std::string::npos);
  // The rollback's job script, requeued now that the run has saved at 32, goes on from the newest
  // checkpoint as --resume would: at its length, which the refusal names (not --change-seq).
  expect_refused(args + " --seq 16 --steps 6 --resume-step 2 --skip-batches 1",
                 "seq is 32 in the checkpoint but 16 in this run (--seq) (a rollback keeps its checkpoint's length: "
                 "--seq 32)");
  REQUIRE(train(args + " --seq 32 --steps 6 --resume-step 2 --skip-batches 1 --quiet").code == 0);
  expect_refused(args + " --steps 9 --resume --change-seq", "--change-seq needs --seq: the length this resume goes on at");
  expect_refused(args + " --seq 16 --steps 9 --change-seq", "--change-seq lets a resume change --seq: it needs --resume");
  expect_refused(args + " --seq 32 --steps 9 --resume-step 8 --change-seq",
                 "--change-seq with --resume-step: roll back at the checkpoint's --seq");
  // The eval a stop skipped at the saved step is not run at the new length (it would be logged as
  // the old stage's): here the log lost step 4's eval, as a stop before it would leave it.
  fs::remove_all(d / "run");
  REQUIRE(train(args + " --seq 16 --steps 4 --eval-every 2 --eval-batches 1 --quiet").code == 0);
  drop_log_records(d / "run" / "log.jsonl", "{\"type\":\"eval\",\"step\":4,");
  fs::copy(d / "run", d / "same", fs::copy_options::recursive);
  const std::string evals = base + " --save-every 2 --eval-every 2 --eval-batches 1 --steps 6 --resume --save-dir ";
  r = train(evals + (d / "same").string() + " --seq 16");  // the same length: the missing eval runs first
  REQUIRE(r.code == 0);
  CHECK(r.out.find("eval      4 |") != std::string::npos);
  r = train(evals + (d / "run").string() + " --seq 32 --change-seq");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("eval      4 |") == std::string::npos);
  CHECK(r.out.find("eval      6 |") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a llama's trained length (max_seq) grows with --change-seq, never shrinks unasked, and a gpt2's is its shape",
          "[checkpoint][change-seq]") {
  fs::path d = fresh_dir("change_seq_llama");
  const std::string args = kArgs + " --model llama --kv-heads 1 --max-seq 16 --save-dir " + d.string();
  REQUIRE(train(args + " --seq 16 --steps 2").code == 0);
  expect_refused(args + " --seq 32 --steps 4 --resume", "(or, to go on at --seq 32");
  REQUIRE(train(args + " --seq 32 --steps 4 --resume --change-seq").code == 0);
  // model.bin's header (read back through its config) and the rank file say 32 now.
  std::vector<float> w;
  CHECK(ul::read_model_file((d / "step_00000004" / "model.bin").string(), w).max_seq == 32);
  CHECK(bytes_of(d / "step_00000004" / "rank_0.json").find("\"max_seq\":32,") != std::string::npos);
  expect_refused(args + " --seq 16 --steps 6 --resume --change-seq",
                 "max_seq is 32 in the checkpoint but 16 in this run (--max-seq)");
  REQUIRE(train(kArgs + " --model llama --kv-heads 1 --max-seq 32 --save-dir " + d.string() +
                " --seq 16 --steps 6 --resume --change-seq").code == 0);
  // From a --checkpoint (the shape is the file's): --max-seq beside it is a llama's trained length.
  const fs::path from = d / "step_00000006" / "model.bin", run = d / "from_checkpoint";
  const std::string plain = "--batch 2 --eval-every 0 --threads 1 --quiet --checkpoint " + from.string() +
                            " --save-dir " + run.string();
  REQUIRE(train(plain + " --seq 64 --steps 2").code == 0);  // past the file's 32: 64 from here on
  expect_refused(plain + " --seq 16 --steps 4 --resume --change-seq",
                 "max_seq is 64 in the checkpoint but 32 in this run (--max-seq): the longest length it trained at, "
                 "which --max-seq 64 keeps");
  REQUIRE(train(plain + " --seq 16 --steps 4 --resume --change-seq --max-seq 64").code == 0);
  CHECK(ul::read_model_file((run / "step_00000004" / "model.bin").string(), w).max_seq == 64);
  // A gpt2's learned positions: a length past them is another model (passkey: any length's data).
  fs::remove_all(d);
  REQUIRE(train(kArgs + " --save-dir " + d.string() + " --seq 16 --steps 2").code == 0);
  expect_refused(kArgs + " --save-dir " + d.string() + " --seq 2048 --steps 4 --resume --change-seq",
                 "max_seq is 1024 in the checkpoint but 2048 in this run (--max-seq): gpt2 learns one position "
                 "embedding per place, and the checkpoint's end at 1024: --seq 2048 is another model");
  // Sized past 1024 by its --seq, a gpt2's positions are kept at a shorter one by --max-seq.
  fs::remove_all(d);
  const std::string g = kArgs + " --batch 1 --save-dir " + d.string();
  REQUIRE(train(g + " --seq 1040 --steps 2").code == 0);
  expect_refused(g + " --seq 16 --steps 4 --resume --change-seq", "max_seq is 1040 in the checkpoint but 1024 in this "
                 "run (--max-seq): a gpt2's positions are its shape: --max-seq 1040 keeps them");
  REQUIRE(train(g + " --seq 16 --steps 4 --resume --change-seq --max-seq 1040").code == 0);
  expect_refused("--steps 0 --threads 1 --max-seq 2048 --checkpoint " + (d / "step_00000004" / "model.bin").string(),
                 "--max-seq: a gpt2's positions are its shape, which comes from --checkpoint");
  fs::remove_all(d);
}

TEST_CASE("a resume may change a llama's RoPE with --change-rope: the weights go on under the new rotation",
          "[checkpoint][change-rope]") {
  fs::path d = fresh_dir("change_rope");
  const std::string loud = kArgs.substr(0, kArgs.rfind(" --quiet")) + " --model llama --kv-heads 1";
  const std::string args = loud + " --save-dir " + d.string();
  REQUIRE(train(args + " --steps 2").code == 0);
  expect_refused(args + " --steps 4 --resume --rope-theta 40000",
                 "rope_theta is 10000 in the checkpoint but 40000 in this run (--rope-theta) (or, to go on with this "
                 "RoPE from the checkpoint's weights and AdamW state, --change-rope)");
  // Step 2's eval missing from the log (a stop cut it): a resume under another RoPE does not make
  // it up, as that would be another model's eval logged as step 2's.
  drop_log_records(d / "log.jsonl", "{\"type\":\"eval\",\"step\":2,");
  CmdResult r = train(args + " --steps 4 --resume --rope-theta 40000 --change-rope");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | another RoPE: saved with theta 10000, now theta 40000: the weights and AdamW's state go "
                   "on under the new rotation") != std::string::npos);
  CHECK(r.out.find("eval      2 |") == std::string::npos);
  CHECK(r.out.find("eval      4 |") != std::string::npos);
  CHECK(ul::read_whole_file((d / "log.jsonl").string()).find("{\"type\":\"resume\",\"step\":2,\"rope\":\"theta 40000\"}") !=
        std::string::npos);
  std::vector<float> w;
  CHECK(ul::read_model_file((d / "step_00000004" / "model.bin").string(), w).rope_theta == 40000.0f);
  // Step 3's loss is step 2's weights' under the new rotation, on step 3's sequences [4, 6).
  auto first_loss = [&](const std::string& theta) {
    const ul::Options o = ul_test::options("--seq 16 --batch 2 --threads 1 --rope-theta " + theta + " --checkpoint " +
                                           (d / "step_00000002" / "model.bin").string());
    double loss = 0;
    ul::run_local(1, [&](ul::Comm& world) {
      ul::Trainer tr(o, world);
      tr.set_steps_done(0, 4);
      loss = tr.step().loss;
    });
    return loss;
  };
  double logged = 0;
  for (const ul::LogRecord& x : ul::read_run_log((d / "log.jsonl").string()))
    if (x.at("type") == "step" && x.at("step") == "3") logged = std::stod(x.at("loss"));
  CHECK(logged == first_loss("40000"));
  CHECK(logged != first_loss("10000"));
  // A scaling too; then the checkpoints hold it, and a resume without the flag keeps it.
  r = train(args + " --steps 6 --resume --rope-theta 40000 --rope-scaling linear:factor=2 --change-rope");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("saved with theta 40000, now theta 40000, scaling linear:factor=2:") != std::string::npos);
  r = train(args + " --steps 7 --resume --rope-theta 40000 --rope-scaling linear:factor=2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("RoPE") == std::string::npos);
  r = train(args + " --steps 8 --resume --rope-theta 40000 --rope-scaling linear:factor=2 --change-rope");
  CHECK(r.out.find("note    | --change-rope: this resume keeps the checkpoint's RoPE (theta 40000, scaling "
                   "linear:factor=2)") != std::string::npos);
  // The RoPE flags dropped from a later stage's command: refused, naming the checkpoint's (the
  // preset's default would be a change nobody asked for, so --change-rope needs them written out).
  expect_refused(args + " --steps 9 --resume", "rope_theta is 40000 in the checkpoint but 10000 in this run "
                                               "(--rope-theta) (to go on with the checkpoint's, give --rope-theta 40000)");
  expect_refused(args + " --steps 9 --resume --change-rope", "--change-rope needs --rope-theta or --rope-scaling: the "
                                                             "RoPE this resume goes on with");
  // One of the two dropped: --change-rope changes only what its flags say, so the other's refusal
  // names the checkpoint's value (the preset's would be a change nobody asked for).
  for (const char* change : {"", " --change-rope"})
    expect_refused(args + " --steps 9 --resume --rope-theta 40000" + change,
                   "rope_scaling is linear:factor=2 in the checkpoint but none in this run (--rope-scaling) (to go on "
                   "with the checkpoint's, give --rope-scaling linear:factor=2)");
  expect_refused(loud + " --steps 4 --change-rope --rope-theta 40000",
                 "--change-rope lets a resume change --rope-theta and --rope-scaling: it needs --resume or --resume-step");
  fs::remove_all(d);
  REQUIRE(train(kArgs + " --save-dir " + d.string() + " --steps 2").code == 0);
  expect_refused(kArgs + " --save-dir " + d.string() + " --steps 4 --resume --change-rope --rope-theta 40000",
                 "--rope-theta: gpt2 has learned positions, not RoPE (--model llama)");
  fs::remove_all(d);
}

TEST_CASE("a run paused by --stop-after keeps the whole run's schedule, and --resume finishes it bit-exactly",
          "[checkpoint][stop-after]") {
  fs::path d = fresh_dir("stop_after");
  // wsd with its decay in the last half: a run of --steps 3 would decay at once.
  const std::string args = kArgs + " --schedule wsd --warmup 1 --decay-frac 0.5";
  REQUIRE(train(args + " --log " + (d / "straight.jsonl").string()).code == 0);
  const std::string run = args + " --save-dir " + (d / "run").string() + " --export-safetensors " +
                          (d / "m.safetensors").string();
  CmdResult r = train(run + " --stop-after 3");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("paused  | train loss ") != std::string::npos);
  CHECK(r.out.find(" | after step 3 of 6 (--stop-after) | checkpoint " + (d / "run").string() +
                   "/step_00000003: continue with --resume\n") != std::string::npos);
  CHECK(r.out.find("done |") == std::string::npos);
  CHECK(fs::exists(d / "run" / "step_00000003" / "COMPLETE"));
  CHECK_FALSE(fs::exists(d / "m.safetensors"));  // the run's end is still to come
  auto evals_at_3 = [&] {
    int n = 0;
    for (const ul::LogRecord& x : ul::read_run_log((d / "run" / "log.jsonl").string()))
      n += x.at("type") == "eval" && x.at("step") == "3";
    return n;
  };
  CHECK(evals_at_3() == 1);  // the stage ends with an eval, as a run does
  // The stage's job requeued: nothing left of it, but the pause's eval, when the log lacks it (a
  // stop signal at that step saves and skips it), made up at its length.
  drop_log_records(d / "run" / "log.jsonl", "{\"type\":\"eval\",\"step\":3,");
  r = train(run + " --stop-after 3 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | no step left, its missing eval made: the checkpoint is at step 3 and --stop-after is 3") !=
        std::string::npos);
  CHECK(evals_at_3() == 1);
  std::string loud = run;  // (--quiet keeps back the resume line)
  loud.erase(loud.find(" --quiet"), 8);
  r = train(loud + " --stop-after 3 --resume");  // now it is there: not again
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | nothing to do: the checkpoint is at step 3 and --stop-after is 3") != std::string::npos);
  // and it does not say it continues ("continuing after step 3 of 6" it once said)
  CHECK(r.out.find("/step_00000003: the checkpoint is at step 3, --stop-after 3: no step left") != std::string::npos);
  CHECK(r.out.find("continuing") == std::string::npos);
  CHECK(evals_at_3() == 1);
  // A rollback to the pause or past it has nothing to train before it: refused before any move.
  expect_refused(run + " --stop-after 3 --resume-step 3", "--resume-step 3: nothing to train before --stop-after 3");
  r = train(run + " --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | train loss ") != std::string::npos);
  CHECK(r.out.find(" (steps 4-6) | val loss ") != std::string::npos);  // this run's first loss, not the whole run's
  CHECK(fs::exists(d / "m.safetensors"));
  // Every step's loss and rate are the run's never paused, to the bit (the decay at steps 4-6).
  auto steps = [](const fs::path& log) {
    std::vector<std::string> v;
    for (const ul::LogRecord& x : ul::read_run_log(log.string()))
      if (x.at("type") == "step") v.push_back(x.at("step") + " " + x.at("loss") + " " + x.at("lr"));
    return v;
  };
  CHECK(steps(d / "run" / "log.jsonl") == steps(d / "straight.jsonl"));
  CHECK(steps(d / "straight.jsonl").size() == 6);
  // A job script's stages as parameters: 0 and --steps are the run's own end.
  REQUIRE(train(kArgs + " --stop-after 0").code == 0);
  REQUIRE(train(kArgs + " --stop-after 6").code == 0);
  expect_refused(run + " --stop-after 7", "--stop-after 7 is past the last step (--steps 6)");
  expect_refused(kArgs + " --stop-after 3", "--stop-after needs --save-dir");
  expect_refused(run + " --stop-after -1", "--stop-after must be >= 0, got -1");
  fs::remove_all(d);

  // Stage 1's job requeued after stage 2 (another length) saved past its pause: nothing to do,
  // nothing loaded (its --seq is not the checkpoint's any more), nothing logged.
  const std::string stage = kArgs + " --save-dir " + d.string();
  REQUIRE(train(stage + " --stop-after 3").code == 0);
  REQUIRE(train(stage + " --seq 32 --resume --change-seq --stop-after 5").code == 0);
  const std::string log = bytes_of(d / "log.jsonl");
  r = train(stage + " --stop-after 3 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | nothing to do: the checkpoint is at step 5 and --stop-after is 3") != std::string::npos);
  CHECK(bytes_of(d / "log.jsonl") == log);
  r = train(stage + " --seq 32 --resume --stop-after 5");  // stage 2's requeue: its own pause, loaded
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | nothing to do: the checkpoint is at step 5 and --stop-after is 5") != std::string::npos);
  REQUIRE(train(stage + " --seq 32 --resume").code == 0);
  CHECK(fs::exists(d / "step_00000006" / "COMPLETE"));
  fs::remove_all(d);
}

TEST_CASE("train --auto-resume: one command starts fresh, then resumes each requeue, bit for bit a plain run's",
          "[checkpoint]") {
  fs::path d = fresh_dir("auto_resume");
  std::string loud = kArgs + " --eval-every 0";
  loud.erase(loud.find(" --quiet"), 8);
  const std::string job = loud + " --save-dir " + (d / "a").string() + " --auto-resume";  // (kArgs: --steps 6)
  // The first start finds no checkpoint (no directory yet): fresh, and said.
  CmdResult r = train(job + " --stop-after 3");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --auto-resume: " + (d / "a").string() + " holds no complete checkpoint: starting a "
                   "fresh run") != std::string::npos);
  // The same command requeued: nothing to do; the next stage's goes on from step 3.
  r = train(job + " --stop-after 3");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done | nothing to do: the checkpoint is at step 3 and --stop-after is 3") != std::string::npos);
  r = train(job);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("continuing after step 3 of 6") != std::string::npos);
  CHECK(r.out.find("--auto-resume:") == std::string::npos);
  // The same six steps as one plain run: the same weights and AdamW state.
  REQUIRE(train(kArgs + " --eval-every 0 --save-dir " + (d / "b").string()).code == 0);
  for (const char* f : {"model.bin", "optim.bin"})
    CHECK(bytes_of(d / "a" / "step_00000006" / f) == bytes_of(d / "b" / "step_00000006" / f));
  // Refused: with --resume or --resume-step, without --save-dir, a resume's change on a fresh start.
  CHECK(train(kArgs + " --save-dir " + (d / "a").string() + " --auto-resume --resume").out.find(
            "--auto-resume with --resume: give one") != std::string::npos);
  CHECK(train(kArgs + " --auto-resume").out.find("--auto-resume needs --save-dir") != std::string::npos);
  r = train(kArgs + " --save-dir " + (d / "c").string() + " --auto-resume --change-seq");
  CHECK(r.code != 0);
  CHECK(r.out.find("--auto-resume: " + (d / "c").string() + " holds no complete checkpoint, so this run starts fresh, "
                   "and --change-seq (a resume's change) has nothing to change") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "c"));
  // On several ranks (rank 0's reading of the directory decides, broadcast): fresh, then resumed.
  const std::string two = loud + " --ranks 2 --save-dir " + (d / "two").string() + " --auto-resume";
  r = train(two + " --stop-after 2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--auto-resume: " + (d / "two").string() + " holds no complete checkpoint") != std::string::npos);
  r = train(two);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("continuing after step 2 of 6") != std::string::npos);
  // A --save-dir rank 0 cannot list: its reason on every rank (the local communicator reports the
  // first rank to throw, which was rank 1's reason-less one).
  { std::ofstream(d / "afile") << "x"; }
  r = train(kArgs + " --ranks 2 --save-dir " + (d / "afile").string() + " --auto-resume");
  CHECK(r.code != 0);
  CHECK(r.out.find("--auto-resume: " + (d / "afile").string() + ": cannot list the save directory") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a resume with another --steps says where the next step's rate moves, and a lengthened wsd run before "
          "its decay goes on unsaid", "[checkpoint][optimizer]") {
  fs::path d = fresh_dir("steps_changed");
  std::string loud = kArgs + " --schedule wsd --warmup 0 --decay-frac 0.5 --eval-every 0";  // (--quiet keeps it back)
  loud.erase(loud.find(" --quiet"), 8);
  const std::string run = loud + " --save-dir " + d.string();
  // Saved at step 2 of 12, before the decay (steps 7-12): lengthened to 16, no rate changes yet.
  REQUIRE(train(run + " --steps 12 --stop-after 2").code == 0);
  CmdResult r = train(run + " --steps 16 --stop-after 3 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("continuing after step 2 of 16") != std::string::npos);
  CHECK(r.out.find("where the checkpoint's run had") == std::string::npos);
  // Shortened to 6 (its decay: steps 4-6): step 4's rate falls at once, which is said.
  r = train(run + " --steps 6 --stop-after 4 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --steps 6 where the checkpoint's run had 16: the wsd schedule is one of 6 steps from "
                   "here (step 4's rate 0.0021, 0.003 under --steps 16)") != std::string::npos);
  // Lengthened again inside that decay: the rate climbs back to --lr.
  r = train(run + " --steps 12 --stop-after 5 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --steps 12 where the checkpoint's run had 6: the wsd schedule is one of 12 steps from "
                   "here (step 5's rate 0.003, 0.0012 under --steps 6)") != std::string::npos);
  // Shortened from 12 to 10 at step 5: step 6 keeps its rate, the decay (now steps 6-10 of 10, was
  // 7-12) begins a step sooner: said, at the step where it moves.
  REQUIRE(train(run + " --steps 12 --stop-after 5 --resume").code == 0);
  r = train(run + " --steps 10 --stop-after 6 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --steps 10 where the checkpoint's run had 12: the wsd schedule is one of 10 steps from "
                   "here (step 6's rate ") != std::string::npos);
  // A resume with no step left makes no claim about rates.
  r = train(run + " --steps 4 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("the checkpoint is at step 6, --steps 4: no step left") != std::string::npos);
  CHECK(r.out.find("where the checkpoint's run had") == std::string::npos);
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string warm = kArgs + " --warmup 4 --eval-every 0 --save-dir " + d.string();
  std::string warm_loud = warm;
  warm_loud.erase(warm_loud.find(" --quiet"), 8);
  REQUIRE(train(warm + " --steps 3").code == 0);
  r = train(warm_loud + " --steps 2 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("no step left") != std::string::npos);
  CHECK(r.out.find("ends inside the warmup") == std::string::npos);  // it said so once: the run is past it
  // A cosine run lengthened inside its warmup: the next steps keep their rates (the warmup does not
  // depend on --steps), the first after it does not: said, naming that step.
  fs::remove_all(d);
  fs::create_directories(d);
  std::string cos = kArgs + " --warmup 4 --eval-every 0 --save-dir " + d.string();
  cos.erase(cos.find(" --quiet"), 8);
  REQUIRE(train(cos + " --steps 40 --stop-after 2").code == 0);
  r = train(cos + " --steps 80 --stop-after 3 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --steps 80 where the checkpoint's run had 40: the cosine schedule is one of 80 steps "
                   "from here (step 6's rate ") != std::string::npos);  // (step 5: the peak in both)
  CHECK(r.out.find(" (step 3) | val loss") != std::string::npos);  // a one-step stage's done line names its step
  // A finished cosine run lengthened: its next step is past the old schedule's end (the floor
  // there), and the new curve's rate there is higher: said.
  fs::remove_all(d);
  fs::create_directories(d);
  REQUIRE(train(cos + " --steps 6").code == 0);
  r = train(cos + " --steps 12 --resume");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resume  | --steps 12 where the checkpoint's run had 6: the cosine schedule is one of 12 steps "
                   "from here (step 7's rate ") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a --save-dir without room for a checkpoint is said at start-up, naming the step that would fail",
          "[checkpoint]") {
  fs::path d = fresh_dir("no_room");
  std::string loud = kArgs + " --save-every 2 --save-dir " + (d / "run").string();
  loud.erase(loud.find(" --quiet"), 8);
  // (ULYSSES_TEST_FREE_BYTES: the free space the run reads, in place of the filesystem's)
  CmdResult r = train(loud + " --steps 1", "ULYSSES_TEST_FREE_BYTES=1000");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --save-dir " + (d / "run").string() + ": its filesystem has 0.0 MiB free, a checkpoint "
                   "of this model needs about ") != std::string::npos);
  CHECK(r.out.find("the save at step 1 fails unless space is freed first") != std::string::npos);
  r = train(loud + " --steps 3 --resume");  // the real filesystem's room: nothing said
  REQUIRE(r.code == 0);
  CHECK(r.out.find("its filesystem has") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a --checkpoint used without --data is told which data its run trained on", "[checkpoint]") {
  fs::path d = fresh_dir("ckpt_data");
  std::ofstream(d / "t.txt") << std::string(4000, 'x');
  const std::string loud = "--eval-batches 1 --threads 1 --seq 16";  // (the shape is the file's)
  const std::string data = "text:" + (d / "t.txt").string();
  REQUIRE(train(kArgs + " --steps 2 --data " + data + " --save-dir " + (d / "run").string()).code == 0);
  const std::string model = (d / "run" / "step_00000002" / "model.bin").string();
  CmdResult r = train(loud + " --steps 0 --checkpoint " + model);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | " + model + " was trained on --data " + data + " (its rank_0.json); this run reads "
                   "--data passkey, the default") != std::string::npos);
  r = train(loud + " --steps 0 --checkpoint " + model + " --data " + data);  // given: nothing to say
  REQUIRE(r.code == 0);
  CHECK(r.out.find("was trained on --data") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("the loss plot is drawn during the run, at its first eval, not only at its end", "[log]") {
  fs::path d = fresh_dir("live_plot");
  // Held at step 3 (ULYSSES_TEST_HOLD) after evals at steps 1-3: the plot is there, the run not done.
  const std::string run = "ULYSSES_TEST_HOLD='step 3' " +
                          ul_test::train_cmd(kArgs + " --eval-every 1 --save-dir " + (d / "run").string());
  const CmdResult r = ul_test::run_cmd(
      "cd " + d.string() + " && { " + run + " > out.txt 2>&1 & p=$!; for i in $(seq 600); do "
      "grep -q 'test hold | step 3' out.txt && break; sleep 0.1; done; "
      "test -f run/log.svg && echo 'plot there'; grep -c '^done' out.txt; kill -TERM $p; wait $p; }");
  INFO(r.out);
  CHECK(r.out.find("plot there") != std::string::npos);
  CHECK(r.out.find("\n0\n") != std::string::npos);  // no done line yet: drawn mid-run
  fs::remove_all(d);
}

TEST_CASE("rollback flags: a missing step names the ones there, and bad values are refused", "[checkpoint][rollback][cli]") {
  fs::path d = fresh_dir("rollback_flags");
  const std::string args = kArgs + " --save-every 2 --save-dir " + d.string();
  REQUIRE(train(args).code == 0);
  expect_refused(args + " --resume-step 3", "step_00000003: no such complete checkpoint (--resume-step 3); the newest "
                                           "is step_00000006, the newest before step 3 is step_00000002");
  expect_refused(args + " --resume-step 1", "the newest is step_00000006");
  expect_refused(args + " --resume-step 0", "--resume-step must be >= 1, got 0");
  expect_refused(args + " --resume --skip-batches 2", "--skip-batches moves a resumed run's data ahead: it needs "
                                                      "--resume-step N");
  expect_refused(args + " --resume-step 6 --skip-batches -1", "--skip-batches must be >= 0, got -1");
  expect_refused(kArgs + " --resume-step 2", "--resume-step needs --save-dir");
  expect_refused(args + " --resume-step 2 --steps 0", "--resume-step with --steps 0 trains nothing");
  // A model.bin of another run's shape put in a checkpoint is another run's file (its CRC is not the
  // one the rank file recorded), not a flag to change: the hint to roll back further comes with it.
  const fs::path model4 = d / "step_00000004" / "model.bin", kept = d.string() + "_model4.bin";
  fs::copy_file(model4, kept);
  {
    const fs::path other = d.string() + "_other";
    REQUIRE(train(kArgs + " --dim 64 --steps 2 --save-dir " + other.string()).code == 0);
    fs::copy_file(other / "step_00000002" / "model.bin", model4, fs::copy_options::overwrite_existing);
    fs::remove_all(other);
  }
  expect_refused(args + " --resume-step 4", "model.bin: its crc32 is ");
  expect_refused(args + " --resume-step 4", "--resume-step 2 continues from step_00000002)");
  // A damaged checkpoint chosen by step (its own model.bin back, one byte flipped): the refusal
  // names the damage and the one before to roll back to.
  fs::copy_file(kept, model4, fs::copy_options::overwrite_existing);
  fs::remove(kept);
  {
    std::fstream f(model4, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    const char c = char(f.get());
    f.seekp(1000);
    f.put(char(c ^ 0x5a));
  }
  expect_refused(args + " --resume-step 4", "step_00000004/model.bin: checksum mismatch");
  expect_refused(args + " --resume-step 4", "--resume-step 2 continues from step_00000002)");
  // Nothing was moved by the refused runs.
  CHECK(ul::complete_steps(d.string()) == std::vector<int>{2, 4, 6});
  // A rank file from before data_sequence has data_position, the step: it resumes at step x G;
  // one that says another step is refused, and so is a negative sequence.
  const fs::path rank = d / "step_00000006" / "rank_0.json";
  const std::string now = strip_crc(bytes_of(rank));
  auto with = [&](const std::string& field) {
    std::string j = now;
    const std::string place = "\"data_sequence\":12,\"data_position\":6,";
    const size_t at = j.find(place);
    REQUIRE(at != std::string::npos);
    std::ofstream(rank) << j.replace(at, place.size(), field + ",");
  };
  with("\"data_position\":5");
  expect_refused(args + " --resume --steps 7", "rank_0.json: data_position is 5 but the directory's step is 6");
  with("\"data_sequence\":-1");
  expect_refused(args + " --resume --steps 7", "rank_0.json: data_sequence is '-1'");
  with("\"data_position\":6");
  REQUIRE(train(args + " --resume --steps 7").code == 0);
  CHECK(bytes_of(d / "step_00000007" / "rank_0.json").find("\"data_sequence\":14,") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("a second run into a --save-dir in use is refused, and touches nothing there", "[checkpoint]") {
  fs::path d = fresh_dir("lock"), dir = d / "run";
  REQUIRE(train(kArgs + " --steps 2 --save-dir " + dir.string()).code == 0);
  const std::string before = bytes_of(dir / "log.jsonl");
  {
    // Held as a running train holds it (a requeued job whose first instance still runs).
    ul::SaveDirLock held(dir.string());
    expect_refused(kArgs + " --steps 4 --resume --save-dir " + dir.string(),
                   "another run is using this --save-dir (pid " + std::to_string(::getpid()) + " on ");
    CHECK(bytes_of(dir / "log.jsonl") == before);
    CHECK(ul::complete_steps(dir.string()) == std::vector<int>{2});
  }
  // The lock goes with its holder, however it ends: the same resume now runs.
  REQUIRE(train(kArgs + " --steps 4 --resume --save-dir " + dir.string()).code == 0);
  CHECK(ul::complete_steps(dir.string()) == std::vector<int>{2, 4});
  fs::remove_all(d);
}

TEST_CASE("a saved model.bin starts a new run from its weights (--checkpoint)", "[checkpoint]") {
  fs::path d = fresh_dir("from_model");
  const std::string rest = " --seq 16 --batch 2 --eval-every 0 --eval-batches 1 --threads 1 --quiet";
  const fs::path a = d / "a" / "model.safetensors", b = d / "b" / "model.safetensors";
  CmdResult first = train("--dim 32 --heads 2 --layers 1" + rest + " --steps 3 --save-dir " + (d / "run").string() +
                          " --export-safetensors " + a.string());
  REQUIRE(first.code == 0);
  const std::string model = (d / "run" / "step_00000003" / "model.bin").string();
  // The shape comes from the file; --steps 0 exports the weights as loaded: the run's own export,
  // and evaluates them once: the run's last eval, to the printed digit.
  CmdResult zero = train(rest + " --steps 0 --checkpoint " + model + " --export-safetensors " + b.string());
  REQUIRE(zero.code == 0);
  CHECK(bytes_of(a) == bytes_of(b));
  auto val = [](const std::string& out) { return out.substr(out.find("| val loss")); };
  CHECK(zero.out.find("done | no training (--steps 0) | val loss") != std::string::npos);
  CHECK(val(zero.out) == val(first.out));
  // An export or a sample without --eval-batches given: no eval (a conversion spends no time on one).
  CmdResult convert = train("--quiet --steps 0 --checkpoint " + model + " --export-safetensors " + (d / "c" / "model.safetensors").string());
  REQUIRE(convert.code == 0);
  CHECK(convert.out.find("val loss") == std::string::npos);
  CHECK(bytes_of(a.parent_path() / "config.json") == bytes_of(b.parent_path() / "config.json"));
  // A new run from them: a fresh optimizer and step counter, its own --save-dir.
  CmdResult r = train(rest + " --steps 2 --checkpoint " + model + " --save-dir " + (d / "next").string());
  REQUIRE(r.code == 0);
  CHECK(ul::complete_steps((d / "next").string()) == std::vector<int>{2});
  // Its resume with another file of another shape: the file is named, not a shape flag it refuses.
  REQUIRE(train("--dim 64 --heads 2 --layers 1" + rest + " --steps 1 --save-dir " + (d / "wide").string()).code == 0);
  const std::string wide = (d / "wide" / "step_00000001" / "model.bin").string();
  expect_refused(rest + " --steps 4 --resume --checkpoint " + wide + " --save-dir " + (d / "next").string(),
                 "dim is 32 in the checkpoint but 64 in this run (--checkpoint " + wide + ", whose shape this run has)");
  // --plan plans the checkpoint's model (dim 32), not the default one (dim 64).
  CmdResult plan = train(rest + " --plan --checkpoint " + model);
  CHECK(plan.code == 0);
  CHECK(plan.out.find("plan | gpt2 layers=1 dim=32 heads=2 ") != std::string::npos);
  // Its weights are read once the run's checks pass: a flag's mistake is said first, before a
  // large file is read (a payload damaged past the header shows which came first).
  {
    std::string bytes = bytes_of(model);
    bytes[bytes.size() - 5] ^= 0x40;
    const std::string damaged = (d / "damaged.bin").string();
    std::ofstream(damaged, std::ios::binary) << bytes;
    expect_refused(rest + " --steps 1 --checkpoint " + damaged + " --seq 2048",
                   "--seq 2048 exceeds the model's max sequence 1024");
    expect_refused(rest + " --steps 1 --checkpoint " + damaged, damaged + ": checksum mismatch");
  }
  // A shape flag beside it would be ignored, so it is refused; a directory is not a checkpoint file.
  expect_refused(rest + " --steps 1 --checkpoint " + model + " --dim 64",
                 "--dim: the model's shape comes from --checkpoint " + model);
  expect_refused(rest + " --steps 1 --checkpoint " + (d / "run").string(), "is a directory; give a file");
  // A header whose weight count is 0 (it once started the run from random weights, silently), and
  // a model.bin that is not there (it was read as an llm.c checkpoint, and said so).
  std::vector<float> values;
  const ul::ModelConfig cfg = ul::read_model_file(model, values);
  // --plan's read: the shape, every check made, no weights kept (an 8B model.bin held 32 GB to plan).
  {
    std::vector<float> none;
    CHECK(ul::checkpoint_model_config(model, none, false).describe() == cfg.describe());
    CHECK(none.empty());
    const std::string flipped = (d / "flipped_model.bin").string();
    fs::copy_file(model, flipped);
    {
      std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-4, std::ios::end);
      f.write("\x7f\x7f\x7f\x7f", 4);
    }
    // The shape alone (--plan) reads the header, not the weights (a 32 GB file was read through
    // for it): a damaged payload is the run's to refuse, which reads them all.
    CHECK(ul::checkpoint_model_config(flipped, none, false).describe() == cfg.describe());
    std::vector<float> all;
    CHECK_THROWS_WITH(ul::checkpoint_model_config(flipped, all, true), Catch::Contains("checksum mismatch"));
    // ... but its size must still be what the header promises.
    fs::resize_file(flipped, fs::file_size(flipped) - 4);
    CHECK_THROWS_WITH(ul::checkpoint_model_config(flipped, none, false), Catch::Contains("truncated"));
  }
  const std::string empty = (d / "empty_model.bin").string();
  ul::write_model_file(empty, cfg, values.data(), 0);
  expect_refused(rest + " --steps 0 --checkpoint " + empty, empty + ": 0 weights, but the model its header describes has " +
                                                               std::to_string(values.size()));
  expect_refused(rest + " --steps 0 --checkpoint " + (d / "gone" / "model.bin").string(),
                 "--checkpoint " + (d / "gone" / "model.bin").string() + ": no such file");
  // Its vocabulary bounds the data's: the recall task needs 64 tokens, the model has 32 (passkey's).
  expect_refused(rest + " --steps 1 --data recall --checkpoint " + model, "recall: the task's vocab 64 exceeds the model vocab 32");
  // A run that packed documents: its checkpoint used without --doc-mask is said to attend across
  // them (its rank_0.json); with the flags, or from a run that did not pack, nothing is said.
  const std::string text = (d / "t.txt").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; i++) f << "line " << i << "\n";
  }
  const std::string on_text = " --seq 16 --batch 2 --eval-every 0 --eval-batches 1 --threads 1 --data text:" + text;
  REQUIRE(train("--dim 32 --heads 2 --layers 1 --quiet --steps 1 --doc-mask --eot 10 --save-dir " + (d / "packed").string() +
                on_text).code == 0);
  const std::string packed = (d / "packed" / "step_00000001" / "model.bin").string();
  CmdResult unmasked = train("--steps 0 --checkpoint " + packed + on_text);
  CHECK(unmasked.code == 0);
  CHECK(unmasked.out.find("note    | " + packed + "'s run trained with --doc-mask --eot 10 (its rank_0.json): without it "
                          "this run attends across documents, as the model never did (give --doc-mask --eot 10)\n") !=
        std::string::npos);
  // A run that only samples, on the default data: the note gives the run's --data too (--doc-mask
  // alone is refused on the passkey task), and what it gives is accepted, the sample masked.
  CmdResult sampled = train("--steps 0 --threads 1 --sample 8 --prompt ab --checkpoint " + packed);
  CHECK(sampled.code == 0);
  const std::string give = "--doc-mask --eot 10 --data text:" + text;
  CHECK(sampled.out.find("as the model never did (give " + give + ")\n") != std::string::npos);
  CHECK(train("--steps 0 --threads 1 --sample 8 --prompt ab --checkpoint " + packed + " " + give).code == 0);
  CmdResult masked = train("--steps 0 --doc-mask --eot 10 --checkpoint " + packed + on_text);
  CHECK(masked.code == 0);
  CHECK(masked.out.find("run trained with --doc-mask") == std::string::npos);
  REQUIRE(train("--dim 32 --heads 2 --layers 1 --quiet --steps 1 --save-dir " + (d / "plain").string() + on_text).code == 0);
  CmdResult plain = train("--steps 0 --checkpoint " + (d / "plain" / "step_00000001" / "model.bin").string() + on_text);
  CHECK(plain.code == 0);
  CHECK(plain.out.find("run trained with --doc-mask") == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("on finite data each step record and the done line say the data's place in epochs, on across a resume",
          "[log]") {
  fs::path d = fresh_dir("epochs");
  const std::string text = (d / "t.txt").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 20; i++) f << "line " << i << " of a small text\n";
  }
  const int64_t n = ul::open_dataset("text:" + text, ul::Split::train, 1, 0)->num_sequences(16);
  REQUIRE((n > 24 && n < 40));
  // G = 2 x 2 x dp 2 = 8 sequences a step; 5 steps pass the split's end (the epoch wraps).
  const std::string args = "--data text:" + text + " --dim 32 --heads 2 --layers 1 --seq 16 --batch 2 --grad-accum 2 "
                           "--ranks 2 --eval-every 0 --eval-batches 1 --threads 1 --save-dir " + (d / "run").string();
  CmdResult first = train(args + " --steps 5 --stop-after 3");
  REQUIRE(first.code == 0);
  CmdResult rest = train(args + " --steps 5 --resume");
  REQUIRE(rest.code == 0);
  char want[64];
  std::snprintf(want, sizeof want, "| epoch %.2f", 40.0 / double(n));
  CHECK(rest.out.find(want) != std::string::npos);
  std::snprintf(want, sizeof want, "| epoch %.2f", 24.0 / double(n));
  CHECK(first.out.find(want) != std::string::npos);  // the pause's line too
  int steps = 0;
  for (const ul::LogRecord& r : ul::read_run_log((d / "run" / "log.jsonl").string())) {
    std::map<std::string, std::string> m(r.begin(), r.end());
    if (m["type"] != "step") continue;
    steps++;
    REQUIRE(m.count("epoch") == 1);
    CHECK(std::stod(m["epoch"]) == Approx(8.0 * std::stoi(m["step"]) / double(n)).epsilon(1e-5));
  }
  CHECK(steps == 5);
  fs::remove_all(d);
}

TEST_CASE("the run log has a record per step and eval, the plot has both series", "[log]") {
  fs::path d = fresh_dir("log");
  REQUIRE(train(kArgs + " --log " + (d / "run.jsonl").string()).code == 0);
  std::ifstream f(d / "run.jsonl");
  int steps = 0, evals = 0;
  for (std::string line; std::getline(f, line);) {
    auto r = ul::parse_flat_json(line, "run.jsonl");
    if (r["type"] == "step") {
      steps++;
      CHECK(r["step"] == std::to_string(steps));
      for (const char* k : {"loss", "grad_norm", "lr", "ms", "tok_per_s", "act_mib", "a2a_mib", "ar_mib"})
        CHECK(r.count(k) == 1);
    } else {
      REQUIRE(r["type"] == "eval");
      evals++;
      CHECK(r["step"] == std::to_string(2 * evals));
      CHECK(r.count("val_loss") == 1);
      CHECK(r.count("accuracy") == 1);
      // The last eval of a passkey run carries its probes: the accuracy at each needle depth.
      for (const char* k : {"acc_depth_0", "acc_depth_0.25", "acc_depth_0.5", "acc_depth_0.75", "acc_depth_1"})
        CHECK(r.count(k) == (evals == 3 ? 1u : 0u));
    }
    CHECK(r.count("epoch") == 0);  // synthetic data has no epochs
  }
  CHECK(steps == 6);
  CHECK(evals == 3);
  std::string svg = bytes_of(d / "run.svg");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("<polyline id=\"train-loss\"") != std::string::npos);
  CHECK(svg.find("<polyline id=\"val-loss\"") != std::string::npos);
  CHECK(svg.find(">step</text>") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("<g id=\"val-markers\"") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "run.svg.tmp"));
  // An eval at every one of 100000 steps: both series thinned to a few thousand points, no markers.
  {
    std::vector<ul::LogRecord> many;
    for (int s = 1; s <= 100000; s++) {
      const std::map<std::string, std::string> st = {{"type", "step"}, {"step", std::to_string(s)}, {"loss", "3"}};
      const std::map<std::string, std::string> ev = {{"type", "eval"}, {"step", std::to_string(s)}, {"val_loss", "2.5"}};
      many.emplace_back(st.begin(), st.end());
      many.emplace_back(ev.begin(), ev.end());
    }
    const std::string big = ul::loss_plot_svg(many);
    CHECK(big.size() < 200000);
    CHECK(big.find("<polyline id=\"val-loss\"") != std::string::npos);
    CHECK(big.find("<g id=\"val-markers\"") == std::string::npos);
    CHECK(big.find("train-point") == std::string::npos);
  }
  // A one-step run: its one train loss is a point (a polyline of one point draws nothing).
  {
    const std::map<std::string, std::string> st = {{"type", "step"}, {"step", "1"}, {"loss", "3"}};
    const std::string one = ul::loss_plot_svg({ul::LogRecord(st.begin(), st.end())});
    CHECK(one.find("<circle id=\"train-point\"") != std::string::npos);
  }
  // Losses from 1e-3 to 1e3: the axis stops at 0 (it once went down to -200), its top above 1e3.
  {
    std::vector<ul::LogRecord> wide;
    for (const char* loss : {"1000", "1", "0.001"}) {
      const std::map<std::string, std::string> st = {{"type", "step"}, {"step", std::to_string(wide.size() + 1)},
                                                     {"loss", loss}};
      wide.emplace_back(st.begin(), st.end());
    }
    const std::string axis = ul::loss_plot_svg(wide);
    CHECK(axis.find(">-") == std::string::npos);  // no negative tick label
    CHECK(axis.find(">0<") != std::string::npos);
  }
  // The end of a run draws both plots, and a failure there (the log gone, a full disk) is reported,
  // not thrown: the run's exports and sample come after it.
  {
    std::string failed;
    CHECK(ul::write_run_plots((d / "run.jsonl").string(), failed) == std::vector<std::string>{(d / "run.svg").string()});
    CHECK(failed.empty());
    const std::string gone = (d / "gone.jsonl").string();
    CHECK(ul::write_run_plots(gone, failed).empty());
    CHECK(failed.find("gone.jsonl") != std::string::npos);
  }
  fs::remove_all(d);
}

TEST_CASE("AtomicFile: sync keeps NAME.tmp, commit renames it, an uncommitted file leaves nothing", "[checkpoint]") {
  const fs::path d = fresh_dir("atomic");
  const std::string a = (d / "a.bin").string(), b = (d / "b.bin").string();
  {
    ul::AtomicFile fa(a), fb(b);
    fa.write("aa", 2);
    fb.write("bb", 2);
    fa.sync();
    fb.sync();  // both durable, neither in place yet
    CHECK(fs::exists(a + ".tmp"));
    CHECK_FALSE(fs::exists(a));
    fa.commit();
    CHECK(fs::exists(a));
    CHECK_FALSE(fs::exists(a + ".tmp"));
    // fb is never committed: its temporary goes with it.
  }
  CHECK(ul::read_whole_file(a) == "aa");
  CHECK_FALSE(fs::exists(b));
  CHECK_FALSE(fs::exists(b + ".tmp"));
  fs::remove_all(d);
}

TEST_CASE("an optimizer file read through a window keeps just that range", "[checkpoint]") {
  // 2.5M elements: m and v span two 16 MiB pieces of the reader, the first holding all of m and
  // part of v; the shard sits at [1000, 1000 + count) of a larger buffer.
  ul::OptimShard w;
  w.t = 7, w.numel = 3'000'000, w.offset = 1000, w.count = 2'500'000, w.shard = 1, w.shards = 3;
  w.m.resize(w.count), w.v.resize(w.count);
  for (size_t i = 0; i < w.count; i++) w.m[i] = float(i), w.v[i] = -float(i) - 0.5f;
  const fs::path d = fresh_dir("optim_window");
  const std::string path = (d / "optim_rank_1.bin").string();
  ul::write_optim_file(path, w);
  const std::vector<std::pair<uint64_t, uint64_t>> windows = {
      {0, UINT64_MAX}, {0, 500}, {2'600'000, 3'000'000}, {0, 1500}, {2'400'000, 2'600'000}, {1'234'567, 1'234'568},
      {4'194'000, 4'195'000}};  // ... the last past the shard's end
  for (auto [lo, hi] : windows) {
    INFO("window [" << lo << ", " << hi << ")");
    const ul::OptimShard r = ul::read_optim_file(path, lo, hi);
    CHECK((r.t == w.t && r.numel == w.numel && r.offset == w.offset && r.count == w.count && r.shard == 1));
    const uint64_t a = std::clamp<uint64_t>(lo, w.offset, w.offset + w.count);
    const uint64_t b = std::clamp<uint64_t>(hi, a, w.offset + w.count);
    REQUIRE(r.kept == a);
    REQUIRE(r.m.size() == b - a);
    REQUIRE(r.v.size() == b - a);
    size_t wrong = 0;
    for (uint64_t e = a; e < b; e++) wrong += r.m[e - a] != w.m[e - w.offset] || r.v[e - a] != w.v[e - w.offset];
    CHECK(wrong == 0);
  }
  // A window does not skip the checks: a flipped byte in v's last piece is still found.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('x');
  }
  CHECK_THROWS_WITH(ul::read_optim_file(path, 0, 500), Catch::Contains("checksum mismatch"));
  // skip_disjoint (a resume's rank): a window the shard lies outside reads the header alone; one
  // it meets by a single element reads the payload and finds the flipped byte.
  const uint64_t before = ul::io_bytes_read();
  const ul::OptimShard outside = ul::read_optim_file(path, 0, 1000, nullptr, nullptr, true);
  CHECK(ul::io_bytes_read() - before < 4096);  // not the file's 20 MB
  CHECK((outside.t == w.t && outside.shard == 1 && outside.shards == 3 && outside.offset == w.offset));
  CHECK((outside.kept_count == 0 && !outside.payload_checked));
  CHECK_THROWS_WITH(ul::read_optim_file(path, 0, 1001, nullptr, nullptr, true), Catch::Contains("checksum mismatch"));
  // Its size is still checked: a truncated shard is refused by every rank.
  fs::resize_file(path, fs::file_size(path) - 4);
  CHECK_THROWS_WITH(ul::read_optim_file(path, 0, 1000, nullptr, nullptr, true), Catch::Contains("truncated"));
  fs::remove_all(d);
}

TEST_CASE("a ZeRO shard damaged inside is found at every layout, by the ranks that read it", "[checkpoint]") {
  // Each rank reads the payload of only the shards its range meets: the union must still be all of
  // them, at the layout the checkpoint was saved at and at others.
  fs::path d = fresh_dir("damaged_shard");
  REQUIRE(train(kArgs + " --ranks 3 --zero 1 --steps 2 --save-dir " + (d / "run").string()).code == 0);
  const fs::path shard = d / "run" / "step_00000002" / "optim_rank_2.bin";
  ul_test::flip_byte_from_end(shard.string(), 7);  // in v's last elements: rank 2's range alone at 3 ranks
  for (const std::string layout : {" --ranks 3 --zero 1", " --ranks 2 --batch 3 --zero 1", " --ranks 6 --zero 1 --batch 1",
                                   " --batch 6"}) {
    CAPTURE(layout);
    expect_refused(kArgs + layout + " --steps 4 --resume --save-dir " + (d / "run").string(),
                   "optim_rank_2.bin: checksum mismatch");
  }
  fs::remove_all(d);
}

TEST_CASE("a ZeRO resume reads a shard's payload once at its layout, under twice at another, not once a rank", "[checkpoint]") {
  fs::path d = fresh_dir("shard_reads");
  const std::string args = kArgs + " --ranks 4 --zero 1 --batch 1 --steps 2 --save-dir " + (d / "run").string();
  REQUIRE(train(args).code == 0);
  const fs::path dir = d / "run" / "step_00000002";
  uint64_t optim = 0;
  for (int r = 0; r < 4; r++) optim += fs::file_size(dir / ("optim_rank_" + std::to_string(r) + ".bin"));
  const uint64_t model = fs::file_size(dir / "model.bin");
  // At 4 ranks and at 3 (ranges that cut across the shards): every rank reads model.bin whole, and
  // the shards its range meets.
  for (int ranks : {4, 3}) {
    CAPTURE(ranks);
    const ul::Options o = ul_test::options(args + " --resume --ranks " + std::to_string(ranks) +
                                           (ranks == 3 ? " --change-global-batch" : ""));
    const uint64_t before = ul::io_bytes_read();
    ul::run_local(ranks, [&](ul::Comm& world) {
      ul::Trainer tr(o, world);
      ul::load_checkpoint(tr, (d / "run").string(), 2);
      CHECK(tr.steps_done() == 2);
    });
    const uint64_t read = ul::io_bytes_read() - before;
    // At the saved layout a rank reads its own shard; at 3, rank 1's range [n/3, 2n/3) meets shards
    // 1 and 2, which ranks 0 and 2 read too: 1.5x. Every rank read every shard before: 4x, 3x.
    CHECK(read >= uint64_t(ranks) * model + optim);
    // (and the rank files, under 1 KB each here, read a few dozen times: 64 KiB a rank)
    CHECK(read <= uint64_t(ranks) * model + (ranks == 4 ? optim : optim * 3 / 2) + uint64_t(ranks) * 65536);
  }
  fs::remove_all(d);
}

TEST_CASE("file helpers: crc32, flat JSON, torn and resumed logs", "[log]") {
  // parse_decimal: the whole text an integer in range, nothing else.
  CHECK(ul::parse_decimal("12", 0, 20) == int64_t(12));
  CHECK(ul::parse_decimal("-1", -1, 5) == int64_t(-1));
  CHECK(ul::parse_decimal("4294967295", 0, 0xffffffffll) == int64_t(4294967295ll));
  for (const char* bad : {"", "-", "+3", " 3", "3 ", "3x", "1e3", "21", "-2", "99999999999999999999"})
    CHECK_FALSE(ul::parse_decimal(bad, -1, 20).has_value());
  CHECK(ul::crc32(0, "123456789", 9) == 0xCBF43926u);
  CHECK(ul::crc32(ul::crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u);
  {  // eight bytes a step: every length and alignment against the bit-by-bit definition
    std::vector<unsigned char> buf(300);
    for (size_t i = 0; i < buf.size(); i++) buf[i] = (unsigned char)(i * 131 + 7);
    auto bitwise = [](const unsigned char* p, size_t n) {
      uint32_t c = 0xFFFFFFFFu;
      for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      }
      return ~c;
    };
    int wrong = 0;
    for (size_t at = 0; at < 9; at++)
      for (size_t n = 0; at + n <= buf.size(); n += 7) {
        wrong += ul::crc32(0, buf.data() + at, n) != bitwise(buf.data() + at, n);
        wrong += ul::crc32(ul::crc32(0, buf.data() + at, n / 3), buf.data() + at + n / 3, n - n / 3) != bitwise(buf.data() + at, n);
      }
    CHECK(wrong == 0);
  }
  const double x = 0.1 + 0.2;
  std::string line = ul::JsonLine().add("s", "a\"b\\c\n").add("x", x).add("n", int64_t(-7)).str();
  auto r = ul::parse_flat_json(line, "line");
  CHECK(r["s"] == "a\"b\\c\n");
  CHECK(std::strtod(r["x"].c_str(), nullptr) == x);
  CHECK(r["n"] == "-7");
  for (const char* bad : {"", "{", "{\"a\"}", "{\"a\":1,}", "{\"a\":[1]}", "{\"a\":1} x"})
    CHECK_THROWS_WITH(ul::parse_flat_json(bad, "where"), Catch::Contains("where"));
  // UTF-8 as is; each byte that is not (a Latin-1 path, a cut or overlong sequence, an encoded
  // surrogate) as \udcXX: still JSON (Python reads it, and surrogateescape gives back the byte).
  const std::string mixed = "caf\xc3\xa9 \xf0\x9f\x93\x96 \xff \xc0\xaf \xed\xa0\x80 \xe2\x82 x\xc3";
  CHECK(ul::json_quote(mixed) ==
        "\"caf\xc3\xa9 \xf0\x9f\x93\x96 \\udcff \\udcc0\\udcaf \\udced\\udca0\\udc80 \\udce2\\udc82 x\\udcc3\"");
  CHECK(ul::parse_flat_json(ul::JsonLine().add("path", mixed).str(), "line")["path"] == mixed);
  CHECK_THROWS_WITH(ul::parse_flat_json("{\"a\":\"\\u00e9\"}", "where"), Catch::Contains("unsupported \\u escape"));

  fs::path d = fresh_dir("torn");
  const std::string log = (d / "log.jsonl").string();
  std::ofstream(log) << "{\"type\":\"step\",\"step\":1,\"loss\":2}\n{\"type\":\"step\",\"step\":2,\"loss\":1}\n"
                     << "{\"type\":\"step\",\"step\":3,\"lo";
  {
    ul::RunLog resumed(log, 1);  // the torn line is cut off, then: resume at 1
  }
  int skipped = 0;
  auto recs = ul::read_run_log(log, &skipped);
  CHECK(skipped == 0);  // every line JSON again
  CHECK(bytes_of(d / "log.jsonl") == "{\"type\":\"step\",\"step\":1,\"loss\":2}\n{\"type\":\"step\",\"step\":2,\"loss\":1}\n"
                                     "{\"type\":\"resume\",\"step\":1}\n");
  REQUIRE(recs.size() == 1);
  CHECK(recs[0]["step"] == "1");
  CHECK(ul::plot_path_for_log(log) == (d / "log.svg").string());
  CHECK(ul::plot_path_for_log("run.txt") == "run.txt.svg");

  // Many resumes (each voids what its attempt logged after its step), a filter by type and field,
  // and a log out of step order (edited by hand), which still drops every record after a resume.
  const std::string many = (d / "many.jsonl").string();
  {
    std::ofstream f(many);
    int step = 0;
    for (int attempt = 0; attempt < 300; attempt++) {
      for (int k = 0; k < 5; k++, step++) {
        f << "{\"type\":\"step\",\"step\":" << step << ",\"loss\":" << step << ",\"ms\":1}\n";
        if (step % 4 == 0) f << "{\"type\":\"eval\",\"step\":" << step << ",\"val_loss\":0.5}\n";
      }
      step -= 2;  // died two steps after its last save: the next attempt resumes there
      f << "{\"type\":\"resume\",\"step\":" << step - 1 << "}\n";
    }
  }
  const auto all = ul::read_run_log(many);
  REQUIRE(all.size() > 0);
  long last = -1;
  size_t steps = 0;
  for (const auto& r : all) {
    const long s = std::atol(r.at("step").c_str());
    CHECK(s >= last);  // each step once, in order: the voided attempts' tails are gone
    if (r.at("type") == "step") {
      CHECK(s != last);
      steps++;
    }
    last = s;
  }
  CHECK(steps == 300 * 3);  // each attempt logs 5 steps and its resume keeps the first 3
  const auto evals = ul::read_run_log(many, nullptr, {{"eval"}, {"step"}});
  for (const auto& r : evals) CHECK((r.at("type") == "eval" && r.size() == 2));
  CHECK(evals.size() == size_t(std::count_if(all.begin(), all.end(), [](const ul::LogRecord& r) { return r.at("type") == "eval"; })));
  const std::string unordered = (d / "unordered.jsonl").string();
  std::ofstream(unordered) << "{\"type\":\"step\",\"step\":5,\"loss\":1}\n{\"type\":\"step\",\"step\":2,\"loss\":1}\n"
                           << "{\"type\":\"resume\",\"step\":3}\n";
  const auto kept = ul::read_run_log(unordered);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].at("step") == "2");
  // ... and more of it: a record stays when no later resume went on from an earlier step.
  std::ofstream(unordered, std::ios::app) << "{\"type\":\"step\",\"step\":7,\"loss\":1}\n{\"type\":\"step\",\"step\":1,\"loss\":1}\n"
                                         << "{\"type\":\"resume\",\"step\":4}\n{\"type\":\"step\",\"step\":9,\"loss\":1}\n";
  std::vector<std::string> order;
  for (const auto& r : ul::read_run_log(unordered)) order.push_back(r.at("step"));
  CHECK(order == std::vector<std::string>{"2", "1", "9"});
  fs::remove_all(d);
}

TEST_CASE("checkpoint and log flags: listed in --help, bad values refused", "[checkpoint][cli]") {
  CmdResult help = run_cmd(train_cmd("--help"));
  CHECK(help.code == 0);
  for (const char* f : {"--save-dir", "--save-every", "--keep", "--resume", "--resume-step", "--skip-batches", "--log"})
    CHECK(help.out.find(f) != std::string::npos);
  expect_refused("--save-every 2", "--save-every needs --save-dir");
  expect_refused("--keep 2", "--keep needs --save-dir");
  expect_refused("--save-dir x --keep -1", "--keep must be >= 0");
  expect_refused("--save-dir x --save-every y", "--save-every: expected an integer");
}
