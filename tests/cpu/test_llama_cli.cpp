// llama's model flags through train. --rope-theta / --rope-scaling: the run's model line, model.bin
// (version 2 when scaled) and resume, the override of a checkpoint's RoPE (context extension), the
// refusals. --tie-embeddings: one parameter fewer, kept by model.bin and the safetensors export.
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

TEST_CASE("tied llama embeddings: trained, saved, reloaded tied, refused where meaningless", "[cli]") {
  TempDir d;
  const std::string base = "--model llama --seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 2 ";
  auto r = run_cmd(train_cmd(base + "--tie-embeddings --save-dir " + (d / "run") + " --export-safetensors " +
                             (d / "hf/model.safetensors")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find(" tied vocab=32") != std::string::npos);
  const std::string untied = run_cmd(train_cmd(base)).out;
  // The parameter count drops by the head's 128 x 64 (padded vocab x dim).
  auto params = [](const std::string& out) {
    const size_t at = out.find(" parameters");
    return std::stod(out.substr(out.rfind("| ", at) + 2, at - out.rfind("| ", at) - 2));
  };
  CHECK(params(untied) - params(r.out) == Approx(128 * 64 / 1e6).margin(0.006));
  std::vector<float> w;
  CHECK(ul::read_model_file(d / "run/step_00000002/model.bin", w).tie_embeddings);
  for (const std::string& ckpt : {d / "run/step_00000002/model.bin", d / "hf/model.safetensors"}) {
    r = run_cmd(train_cmd("--seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 1 --checkpoint " + ckpt));
    CHECK(r.code == 0);
    CHECK(r.out.find(" tied vocab=32") != std::string::npos);
  }
  r = run_cmd(train_cmd(base + "--save-dir " + (d / "run") + " --steps 3 --resume"));  // resumed untied
  CHECK(r.code != 0);
  CHECK(r.out.find("--tie-embeddings") != std::string::npos);
  r = run_cmd(train_cmd("--model gpt2 --tie-embeddings --steps 1"));
  CHECK(r.out.find("gpt2 always ties its embeddings") != std::string::npos);
  r = run_cmd(train_cmd("--tie-embeddings --steps 1 --checkpoint " + (d / "run/step_00000002/model.bin")));
  CHECK(r.out.find("--tie-embeddings: the model's shape comes from --checkpoint") != std::string::npos);
}
