// --rope-theta / --rope-scaling through train: the run's model line, model.bin (version 2 when
// scaled) and resume, the override of a checkpoint's RoPE (context extension), the refusals.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>

#include "engine/checkpoint_files.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::run_cmd;
using ul_test::TempDir;
using ul_test::train_cmd;

TEST_CASE("rope scaling flag: trains, saves, resumes only unchanged, and overrides a checkpoint's RoPE", "[rope][cli]") {
  TempDir d;
  const std::string base = "--model llama --seq 32 --batch 2 --eval-batches 1 --threads 1 ";
  const std::string scaled = "--rope-scaling llama3:factor=8,low=1,high=4,orig=16";
  auto r = run_cmd(train_cmd(base + scaled + " --steps 2 --save-dir " + (d / "run")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rope_theta=10000 rope_scaling=llama3:factor=8,low=1,high=4,orig=16") != std::string::npos);
  const std::string model = d / "run/step_00000002/model.bin";
  std::vector<float> params;
  const ul::ModelConfig c = ul::read_model_file(model, params);
  CHECK(ul::rope_scaling_str(c.rope_scaling) == "llama3:factor=8,low=1,high=4,orig=16");
  uint32_t version = 0;
  std::ifstream(model, std::ios::binary).seekg(8).read(reinterpret_cast<char*>(&version), 4);
  CHECK(version == 2);

  // Resume: the same scaling continues; another is refused naming the flag.
  r = run_cmd(train_cmd(base + scaled + " --steps 3 --resume --save-dir " + (d / "run")));
  CHECK(r.code == 0);
  r = run_cmd(train_cmd(base + "--rope-scaling linear:factor=2 --steps 4 --resume --save-dir " + (d / "run")));
  CHECK(r.code != 0);
  CHECK(r.out.find("rope_scaling") != std::string::npos);
  CHECK(r.out.find("--rope-scaling") != std::string::npos);

  // A new run from the weights keeps the checkpoint's RoPE, or takes the flags' (a longer context).
  const std::string from = "--seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 1 --checkpoint " + model;
  r = run_cmd(train_cmd(from));
  CHECK(r.out.find("rope_scaling=llama3:factor=8,low=1,high=4,orig=16") != std::string::npos);
  r = run_cmd(train_cmd(from + " --rope-theta 500000 --rope-scaling linear:factor=4"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("rope_theta=500000 rope_scaling=linear:factor=4") != std::string::npos);
  r = run_cmd(train_cmd(from + " --rope-scaling none"));
  CHECK(r.out.find("rope_theta=10000 vocab=") != std::string::npos);

  // Refusals: gpt2 (learned positions), a malformed spec.
  r = run_cmd(train_cmd("--model gpt2 --rope-scaling linear:factor=2 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--rope-scaling: gpt2 has learned positions") != std::string::npos);
  r = run_cmd(train_cmd("--model llama --rope-scaling dynamic:factor=2 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--rope-scaling 'dynamic:factor=2': unknown kind 'dynamic'") != std::string::npos);
}
