// Refusals a sweep of bad command lines found missing: each exits 1 at once with a message naming
// the flag or the file, and leaves nothing behind (before: a hang, a silent success, a crash, or a
// refusal only after the training).
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_cmd.h"
#include "temp_dir.h"

namespace fs = std::filesystem;

namespace {

// The files under `dir`, as relative paths.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("train refuses pipes, empty paths, unwritable outputs and over-large flags at once", "[cli]") {
  ul_test::TempDir dir;
  const fs::path d = dir.path;
  REQUIRE(::mkfifo((d / "pipe.bin").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d / "pipe.safetensors.index.json").c_str(), 0600) == 0);
  // 254 bytes: a file name the system takes, but not with ".tmp" added (at most 255).
  const std::string long_name = (d / (std::string(250, 'b') + ".bin")).string();
  struct Case { std::string args, said, env = ""; };
  const std::vector<Case> cases = {
      // A pipe would block the open or the format's magic read forever.
      {"--steps 0 --checkpoint " + (d / "pipe.bin").string(), "pipe.bin: not a regular file (a pipe)"},
      {"--steps 0 --checkpoint " + (d / "pipe.safetensors.index.json").string(), "not a regular file (a pipe)"},
      {"--steps 1 --sample 4 --tokenizer " + (d / "pipe.bin").string(), "pipe.bin: not a regular file (a pipe)"},
      // An empty path was read as "no checkpoint": a random model evaluated and exported.
      {"--steps 0 --checkpoint ''", "--checkpoint: empty path"},
      {"--check-state ''", "--check-state: empty path"},
      {"--val-data ''", "--val-data: empty"},
      // A value that rounds to 0 or infinity in float met a range check it seemed to pass.
      {"--lr 1e-50", "--lr: 1e-50 is outside the range of a float"},
      {"--top-p 1e-60 --sample 2", "--top-p: 1e-60 is outside the range of a float"},
      {"--rope-theta 1e39 --model llama", "--rope-theta: 1e39 is outside the range of a float"},
      // The planner would walk 2^31 layers before refusing; OpenMP died creating 128 x 1024 threads.
      {"--layers 2147483647", "--layers 2147483647: at most 100000"},
      {"--ranks 128 --threads 1024", "--ranks 128 x --threads 1024: more than 1024 threads in one process"},
      // Outputs found bad only after the training, which then lost them.
      // (as root: "cannot create a file there"; as another user: "is not writable")
      {"--steps 1 --export-llmc /proc/ulysses_x.bin", "--export-llmc: /proc/ulysses_x.bin: "},
      {"--steps 1 --export-llmc " + long_name, "cannot create a file there (File name too long)"},
      {"--steps 1 --export-llmc " + (d / "newdir").string() + "/", "newdir/ names a directory; give a file path"},
      {"--steps 1 --log " + (d / "logdir").string() + "/", "--log: " + (d / "logdir").string() + "/ names a directory"},
      // A save dir that takes no checkpoint (read-only; /proc for root too) failed only at the first
      // save, after the training: the lock takes such a directory, for runs that only evaluate.
      {"--steps 20 --save-every 5 --save-dir /proc --log " + (d / "p.jsonl").string(),
       "--save-dir /proc: cannot create a checkpoint there (No such file or directory); this run would save at step 5"},
      // Under mpirun without --comm mpi each process ran the whole job (--comm local), N copies
      // writing the same log. (The variables of an mpirun that started 2 processes; not torchrun's
      // RANK and WORLD_SIZE alone, which a pod may leave behind.)
      {"--steps 1 --log " + (d / "twice.jsonl").string(),
       "--comm local: Open MPI started this process as one of 2 (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, "
       "OMPI_COMM_WORLD_LOCAL_RANK), but --comm local runs the whole world (--ranks 1) inside one process",
       "env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 "},
      // The save dir's lock: the next run into it would empty the export.
      {"--steps 1 --save-dir " + (d / "sd").string() + " --export-llmc " + (d / "sd/.lock").string(),
       "is --save-dir's lock file; write it elsewhere"},
      // A synthetic task's --seq too short for it was refused only at the first step, its log made.
      {"--steps 2 --seq 11 --log " + (d / "e.jsonl").string(),
       "--data: passkey: sequence length 11 is too short for 5 digits (need T >= 12)"},
      {"--steps 2 --data recall --seq 4 --log " + (d / "e.jsonl").string(), "--data: recall: sequence length 4 is too short"},
      {"--steps 0 --data recall --seq 4 --export-safetensors " + (d / "ex/model.safetensors").string(),
       "--data: recall: sequence length 4 is too short"},
  };
  const std::vector<std::string> before = listing(d);
  for (const Case& k : cases) {
    CAPTURE(k.args);
    const std::string threads = k.args.find("--threads") == std::string::npos ? " --threads 1" : "";
    const ul_test::CmdResult r = ul_test::run_cmd("timeout 60 " + k.env + ul_test::train_cmd(k.args + " --quiet" + threads));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(k.said) != std::string::npos);
    CHECK(r.out.find("done |") == std::string::npos);  // refused before it trained (--quiet hides the steps)
    CHECK(listing(d) == before);  // nothing made: no save dir, no log dir, no export
  }
  // A refused --resume into a directory it had to make takes the directory (and its lock) away.
  const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd("--steps 1 --quiet --save-dir " + (d / "never").string() + " --resume"));
  CHECK(r.code == 1);
  CHECK(r.out.find("no complete checkpoint to resume from") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "never"));
  // All the directories it made, given with a trailing slash too (its parent was once its own).
  CHECK(ul_test::run_cmd(ul_test::train_cmd("--steps 1 --quiet --save-dir " + (d / "never/a").string() + "/ --resume")).code == 1);
  CHECK_FALSE(fs::exists(d / "never"));
  // ... but not one that was there before.
  fs::create_directory(d / "there");
  CHECK(ul_test::run_cmd(ul_test::train_cmd("--steps 1 --quiet --save-dir " + (d / "there").string() + " --resume")).code == 1);
  CHECK(fs::exists(d / "there"));
}

TEST_CASE("train prepare refuses a pipe as input instead of blocking on it", "[cli][prepare]") {
  ul_test::TempDir dir;
  const fs::path d = dir.path;
  REQUIRE(::mkfifo((d / "in.txt").c_str(), 0600) == 0);
  const ul_test::CmdResult r = ul_test::run_cmd("timeout 60 " + ul_test::train_cmd("prepare --out " + (d / "o").string() + " " + (d / "in.txt").string()));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("in.txt: not a regular file (a pipe)") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "o"));
  // An input named like a temporary of a stopped prepare, inside --out: refused, not removed.
  fs::create_directory(d / "o2");
  const fs::path in = d / "o2/text_train_000000.bin.tmp";
  std::ofstream(in) << "some text to encode\n";
  const ul_test::CmdResult t = ul_test::run_cmd(ul_test::train_cmd("prepare --out " + (d / "o2").string() + " " + in.string()));
  INFO(t.out);
  CHECK(t.code == 1);
  CHECK(t.out.find("an input file named like one of prepare's temporaries") != std::string::npos);
  CHECK(fs::exists(in));
}

TEST_CASE("a --steps 0 run that only exports or samples is not held to the default --seq", "[cli]") {
  // The tiny reference model has 16 learned positions; the default --seq is 256. Given, it is checked.
  ul_test::TempDir dir;
  const std::string model = " --steps 0 --quiet --checkpoint " + ul_test::source_path("tests/data/gpt2_tiny_model.bin");
  const std::string out = (dir.path / "conv/model.safetensors").string();
  ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(model + " --export-safetensors " + out));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(fs::exists(out));
  r = ul_test::run_cmd(ul_test::train_cmd(model + " --sample 5 --prompt ids:1,2"));
  CHECK(r.code == 0);
  r = ul_test::run_cmd(ul_test::train_cmd(model + " --sample 5 --prompt ids:1,2 --seq 256"));
  CHECK(r.code == 1);
  CHECK(r.out.find("--seq 256 exceeds the model's max sequence 16") != std::string::npos);
}

TEST_CASE("a run of several ranks refused after making its export directory takes it back", "[cli]") {
  // Every rank once made the directory and only rank 0 could take it back: when another rank made
  // it first (most runs of 4 ranks), a refused run left it behind. Several tries: that was a race.
  ul_test::TempDir dir;
  const fs::path d = dir.path;
  for (int i = 0; i < 6; i++) {
    const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(
        "--model llama --ranks 4 --threads 1 --steps 2 --quiet --export-llmc " + (d / "deep/er/x.bin").string()));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find("--export-llmc: llm.c's checkpoint format holds gpt2 models only") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "deep"));
  }
}
