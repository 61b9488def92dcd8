// llama's model flags through train. --rope-theta / --rope-scaling: the run's model line, model.bin
// (version 2 when scaled, 3 for YaRN) and resume, the override of a checkpoint's RoPE (context extension), the
// refusals. --tie-embeddings: one parameter fewer, kept by model.bin and the safetensors export.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/checkpoint_files.h"
#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::run_cmd;
using ul_test::TempDir;
using ul_test::train_cmd;
namespace fs = std::filesystem;

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
  CHECK(r.out.find("replaces") == std::string::npos);
  r = run_cmd(train_cmd(from + " " + scaled));  // its own again: nothing replaced
  CHECK(r.code == 0);
  CHECK(r.out.find("replaces") == std::string::npos);
  r = run_cmd(train_cmd(from + " --rope-theta 500000 --rope-scaling linear:factor=4"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("rope_theta=500000 rope_scaling=linear:factor=4") != std::string::npos);
  // Said, as a model trained with llama3 scaling (Llama 3.1, 3.2) loses it.
  CHECK(r.out.find("note    | --rope-scaling linear:factor=4 replaces " + model +
                   "'s own llama3:factor=8,low=1,high=4,orig=16") != std::string::npos);
  r = run_cmd(train_cmd(from + " --rope-scaling none"));
  CHECK(r.out.find("rope_theta=10000 vocab=") != std::string::npos);
  CHECK(r.out.find("note    | --rope-scaling none replaces " + model + "'s own llama3") != std::string::npos);
  r = run_cmd(train_cmd(from + " --plan --rope-scaling linear:factor=4"));  // the plan shows what train would run
  CHECK(r.out.find("plan | llama") != std::string::npos);
  CHECK(r.out.find("rope_scaling=linear:factor=4") != std::string::npos);

  // Refusals: gpt2 (learned positions), a malformed spec.
  r = run_cmd(train_cmd("--model gpt2 --rope-scaling linear:factor=2 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--rope-scaling: gpt2 has learned positions") != std::string::npos);
  r = run_cmd(train_cmd("--model llama --rope-scaling dynamic:factor=2 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--rope-scaling 'dynamic:factor=2': unknown kind 'dynamic'") != std::string::npos);
}

TEST_CASE("yarn rope scaling: trains, saves model.bin version 3, resumes, and a cut tail is refused", "[rope][cli]") {
  TempDir d;
  const std::string base = "--model llama --seq 32 --batch 2 --eval-batches 1 --threads 1 ";
  const std::string yarn = "yarn:factor=4,orig=8,beta_fast=8,beta_slow=1,attn=1.25,truncate=0";
  auto r = run_cmd(train_cmd(base + "--rope-scaling " + yarn + " --steps 2 --save-dir " + (d / "run")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rope_scaling=" + yarn) != std::string::npos);
  const std::string model = d / "run/step_00000002/model.bin";
  std::vector<float> params;
  CHECK(ul::rope_scaling_str(ul::read_model_file(model, params).rope_scaling) == yarn);
  uint32_t version = 0;
  std::ifstream(model, std::ios::binary).seekg(8).read(reinterpret_cast<char*>(&version), 4);
  CHECK(version == 3);
  r = run_cmd(train_cmd(base + "--rope-scaling " + yarn + " --steps 3 --resume --save-dir " + (d / "run")));
  CHECK(r.code == 0);
  // The loaded checkpoint keeps every yarn setting (the attention factor too).
  r = run_cmd(train_cmd("--seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 1 --checkpoint " + model));
  CHECK(r.out.find("rope_scaling=" + yarn) != std::string::npos);
  // The file cut inside the version 3 tail (80-byte header, 40-byte tail): refused, naming it.
  fs::copy_file(model, d / "cut.bin");
  fs::resize_file(d / "cut.bin", 100);
  r = run_cmd(train_cmd("--steps 1 --checkpoint " + (d / "cut.bin")));
  CHECK(r.code != 0);
  CHECK(r.out.find("cut.bin: truncated: 100 bytes, shorter than the 120-byte header") != std::string::npos);
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

namespace {

// The chain a user follows to fine-tune a pretrained model on their own text, end to end on a tiny
// model: prepare with a tokenizer.json layout, each document opened by the EOT, --doc-mask, the
// model's RoPE and settings, safetensors out and back (same eval), a text prompt.
struct Workflow {
  const char* tokenizer;     // under tests/data
  std::string model_flags;   // the shape's settings
  std::string vocab, eot;    // what the run reports: "vocab=N", the EOT id
  std::string described;     // in the reloaded model's line
  std::string sampled;       // the start of the sampled line
};

void run_workflow(const Workflow& w) {
  TempDir d;
  std::string book;
  for (int i = 0; i < 400; i++) book += "the word " + std::to_string(i % 50) + " don't stop.\n";
  std::ofstream(d / "book.txt", std::ios::binary) << book;
  std::ofstream(d / "notes.txt", std::ios::binary) << book.substr(0, 3000);
  const std::string json = ul_test::source_path(std::string("tests/data/") + w.tokenizer);
  auto r = run_cmd(train_cmd("prepare --tokenizer " + json + " --out " + (d / "s") + " " + (d / "book.txt") + " " +
                             (d / "notes.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string data = " --data 'shards:" + (d / "s") + "/text_*.bin' --threads 1";
  r = run_cmd(train_cmd("--model llama " + w.model_flags + data + " --doc-mask --seq 64 --batch 2 --steps 3 " +
                        "--eval-batches 1 --export-safetensors " + (d / "hf/model.safetensors")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find(w.vocab) != std::string::npos);
  CHECK(r.out.find("--doc-mask: documents start at token " + w.eot) != std::string::npos);
  const std::string last_eval = r.out.substr(r.out.rfind("val loss "), 15);
  // The export evaluates the same on the same data, and samples from a text prompt.
  r = run_cmd(train_cmd("--checkpoint " + (d / "hf/model.safetensors") + data +
                        " --doc-mask --seq 64 --batch 2 --steps 0 --eval-batches 1"));
  CHECK(r.code == 0);
  CHECK(r.out.find(last_eval) != std::string::npos);
  CHECK(r.out.find(w.described) != std::string::npos);
  r = run_cmd(train_cmd("--checkpoint " + (d / "hf/model.safetensors") + data +
                        " --steps 0 --sample 5 --temperature 0 --prompt 'the word' --tokenizer " + json));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\n" + w.sampled) != std::string::npos);
}

}  // namespace

TEST_CASE("a Llama-3.2-shaped workflow: prepare with tokenizer.json, train packed, export, reload, sample", "[cli]") {
  // Llama 3's tokenizer layout, <|begin_of_text|> (576) opening each document and the prompt,
  // Llama 3.1's RoPE scaling, tied embeddings.
  run_workflow({"bpe_tiny_llama3.json", "--tie-embeddings --rope-theta 500000 --rope-scaling llama3:factor=8,low=1,high=4,orig=32",
                "vocab=577", "576", "rope_scaling=llama3:factor=8,low=1,high=4,orig=32 tied", "<|begin_of_text|>the word"});
}

TEST_CASE("a Qwen-2.5-shaped workflow: NFC + Qwen 2's split, q/k/v bias, eps 1e-6, YaRN, export as qwen2", "[cli]") {
  // Qwen 2's tokenizer layout (added tokens not special among its 586), <|endoftext|> (576) opening
  // each document but not the prompt.
  run_workflow({"bpe_tiny_qwen2.json", "--tie-embeddings --qkv-bias --norm-eps 1e-6 --rope-theta 1000000 "
                "--rope-scaling yarn:factor=4,orig=32",
                "vocab=586", "576", "rope_scaling=yarn:factor=4,orig=32,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1 "
                "tied qkv_bias norm_eps=1e-06", "the word"});
}

TEST_CASE("qwen 2's settings: --qkv-bias and --norm-eps train, save, resume only unchanged, export as qwen2", "[cli]") {
  TempDir d;
  const std::string base = "--model llama --seq 32 --batch 2 --eval-batches 1 --threads 1 ";
  const std::string qwen = "--qkv-bias --norm-eps 1e-6 --max-seq 16 ";
  auto r = run_cmd(train_cmd(base + qwen + "--steps 2 --save-dir " + (d / "run") + " --export-safetensors " +
                             (d / "hf/model.safetensors")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("qkv_bias norm_eps=1e-06") != std::string::npos);
  std::vector<float> params;
  const ul::ModelConfig c = ul::read_model_file(d / "run/step_00000002/model.bin", params);
  CHECK(c.qkv_bias);
  CHECK(c.norm_eps == 1e-6f);
  // Biases are trained: after two steps they are no longer their zero init.
  bool moved = false;
  ul::SafetensorsFile f(d / "hf/model.safetensors");
  REQUIRE(f.find("model.layers.1.self_attn.k_proj.bias"));
  REQUIRE(f.find("model.layers.0.self_attn.q_proj.bias"));
  for (float v : f.to_f32(*f.find("model.layers.0.self_attn.q_proj.bias"))) moved = moved || v != 0;
  CHECK(moved);
  const std::string json = ul::read_whole_file(d / "hf/config.json");
  CHECK(json.find("\"model_type\":\"qwen2\"") != std::string::npos);
  CHECK(json.find("\"rms_norm_eps\":1e-06") != std::string::npos);
  // Trained past its max_seq (16), a llama's max_position_embeddings is the trained length; the plan
  // says so too.
  CHECK(json.find("\"max_position_embeddings\":32") != std::string::npos);
  r = run_cmd(train_cmd(base + qwen + "--plan"));
  CHECK(r.out.find("max_seq=32") != std::string::npos);
  // Resume with another setting: refused, naming the flag.
  r = run_cmd(train_cmd(base + "--norm-eps 1e-6 --max-seq 16 --steps 3 --resume --save-dir " + (d / "run")));
  CHECK(r.code != 0);
  CHECK(r.out.find("qkv_bias is true in the checkpoint but false in this run (--qkv-bias)") != std::string::npos);
  r = run_cmd(train_cmd(base + qwen + "--steps 3 --resume --save-dir " + (d / "run")));
  CHECK(r.code == 0);
  // Refusals: gpt2, an eps out of range, a shape flag beside --checkpoint.
  r = run_cmd(train_cmd("--model gpt2 --qkv-bias --steps 1"));
  CHECK(r.out.find("--qkv-bias: gpt2 has every bias already") != std::string::npos);
  r = run_cmd(train_cmd("--model llama --norm-eps 0 --steps 1"));
  CHECK(r.out.find("--norm-eps must be in (0, 1)") != std::string::npos);
  r = run_cmd(train_cmd("--checkpoint " + (d / "run/step_00000002/model.bin") + " --norm-eps 1e-5 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--norm-eps: the model's shape comes from --checkpoint") != std::string::npos);
}

TEST_CASE("a model sampled past the --seq it trained at, or a llama past its max_seq, is told what the sample past it is",
          "[sample][cli]") {
  // The llama preset's max_seq is 1M: compared with it alone, the note never came for a model
  // trained at 32 and sampled at 63 positions.
  TempDir d;
  const std::string base = "--model llama --layers 1 --dim 32 --heads 2 --seq 32 --batch 2 --eval-batches 1 "
                           "--threads 1 --prompt ids:1,2,3 ";
  auto r = run_cmd(train_cmd(base + "--steps 2 --sample 60 --save-dir " + (d / "run")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --sample: the prompt and 60 new tokens run the model at 62 positions, past the --seq 32 it "
                   "trained at: the sample past it tests extrapolation") != std::string::npos);
  const std::string model = d / "run/step_00000002/model.bin";
  const std::string from = "--threads 1 --prompt ids:1,2,3 --steps 0 --checkpoint " + model;  // its shape
  r = run_cmd(train_cmd(from + " --sample 60"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("past the --seq 32 it trained at (" + model + "'s rank_0.json)") != std::string::npos);
  r = run_cmd(train_cmd(from + " --sample 20"));  // 22 positions: within
  REQUIRE(r.code == 0);
  CHECK(r.out.find("tests extrapolation") == std::string::npos);
  r = run_cmd(train_cmd(base + "--steps 1 --max-seq 40 --sample 60"));  // past max_seq: that is named
  REQUIRE(r.code == 0);
  CHECK(r.out.find("past the model's max_seq 40") != std::string::npos);
  // A gpt2's max_seq (1024 by default) is not what it trained at: past its --seq, the position
  // rows it reads never had a gradient (it said nothing).
  r = run_cmd(train_cmd("--model gpt2 --layers 1 --dim 32 --heads 2 --seq 32 --batch 2 --eval-batches 1 --threads 1 "
                        "--prompt ids:1,2,3 --steps 1 --sample 60"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --sample: the prompt and 60 new tokens run the model at 62 positions, past the --seq 32 it "
                   "trained at: its learned positions past it had no gradient in that run (unless an earlier run "
                   "trained them), so the sample past it may be noise") !=
        std::string::npos);
}
