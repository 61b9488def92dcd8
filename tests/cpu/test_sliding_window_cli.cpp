// --sliding-window (Mistral's attention: query t sees keys t - W < t' <= t) around the op: the flag
// and its refusals, the model line, model.bin version 4 and resume, the override of a checkpoint's
// window, --plan, and training runs with it (sp 1 and 2). The op itself: test_attention.cpp; the
// Hugging Face side: test_interop.cpp; the KV-cache decoder: test_sample.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/checkpoint_files.h"
#include "engine/file_io.h"
#include "expect_error.h"
#include "options_from.h"
#include "run_cmd.h"
#include "temp_dir.h"

using ul_test::options;
using ul_test::require_error;
using ul_test::run_cmd;
using ul_test::TempDir;
using ul_test::train_cmd;

namespace {

ul::ModelConfig tiny_llama(int window) {
  ul::ModelConfig c;
  c.arch = "llama", c.layers = 1, c.dim = 8, c.heads = 2, c.kv_heads = 1, c.vocab = 5, c.padded_vocab = 8;
  c.sliding_window = window;
  return c;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

uint32_t file_version(const std::string& model_bin) {
  uint32_t v = 0;
  std::memcpy(&v, read_bytes(model_bin).data() + 8, 4);
  return v;
}

// Overwrites 4 bytes at `at` and recomputes the crc32 (over the file with its crc field zero), so
// that the reader gets past the checksum to the field itself.
void poke_u32(const std::string& path, size_t at, uint32_t v) {
  std::string b = read_bytes(path);
  std::memcpy(&b[at], &v, 4);
  std::memset(&b[12], 0, 4);
  const uint32_t crc = ul::crc32(0, b.data(), b.size());
  std::memcpy(&b[12], &crc, 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
}

// The step losses a run logged, in order.
std::vector<double> step_losses(const std::string& log) {
  std::ifstream f(log);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);) {
    auto j = ul::parse_flat_json(line, log);
    if (j["type"] == "step") out.push_back(std::stod(j["loss"]));
  }
  return out;
}

const std::string kBase = "--model llama --seq 32 --batch 2 --eval-batches 1 --threads 1 ";

}  // namespace

TEST_CASE("the sliding-window flag: parsed, set on presets, described, refused when negative, not an integer or on gpt2",
          "[window][cli]") {
  ul::Options o = options("--model llama --sliding-window 8");
  CHECK(o.sliding_window == 8);
  ul::ModelConfig c = ul::model_config(o, 32);
  CHECK(c.sliding_window == 8);
  CHECK(c.describe().find("rope_theta=10000 sliding_window=8 vocab=32") != std::string::npos);
  CHECK(ul::model_config(options("--model llama"), 32).describe().find("sliding_window") == std::string::npos);
  CHECK(ul::model_config(options("--model llama"), 32).sliding_window == 0);
  // A preset takes it too (Qwen 2.5's shape with a window), and the inline form parses.
  CHECK(ul::model_config(options("--model qwen2.5-0.5B --sliding-window=4096"), 32).sliding_window == 4096);
  // 0 written out is "none", accepted on gpt2 too.
  CHECK(ul::model_config(options("--model gpt2 --sliding-window 0"), 32).sliding_window == 0);

  require_error([] { ul::model_config(options("--model llama --sliding-window -1"), 32); },
                {"--sliding-window must be >= 0", "-1"});
  require_error([] { options("--model llama --sliding-window 2.5"); }, {"--sliding-window: expected an integer", "2.5"});
  require_error([] { options("--model llama --sliding-window eight"); }, {"--sliding-window: expected an integer"});
  require_error([] { options("--model llama --sliding-window 4294967304"); }, {"--sliding-window", "out of range"});
  require_error([] { options("--model llama --sliding-window"); }, {"--sliding-window: missing value"});
  require_error([] { ul::model_config(options("--model gpt2 --sliding-window 8"), 32); },
                {"--sliding-window: gpt2 attends to every earlier token"});
  // The config's own check, which every file reader goes through.
  ul::ModelConfig bad = tiny_llama(-3);
  require_error([&] { bad.validate(); }, {"--sliding-window must be >= 0", "-3"});
  bad = tiny_llama(4);
  bad.arch = "gpt2", bad.kv_heads = bad.heads;
  require_error([&] { bad.validate(); }, {"--sliding-window: gpt2"});

  // Through the binary: refused before any work, non-zero exit.
  auto r = run_cmd(train_cmd("--model gpt2 --sliding-window 8 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("\nstep ") == std::string::npos);
  CHECK(r.out.find("--sliding-window: gpt2 attends to every earlier token") != std::string::npos);
  r = run_cmd(train_cmd("--model llama --sliding-window -4 --steps 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--sliding-window must be >= 0") != std::string::npos);
  CHECK(run_cmd(train_cmd("--help")).out.find("--sliding-window N  llama: attend only to the last N tokens") !=
        std::string::npos);
}

TEST_CASE("model.bin version 4 holds the window, files without one keep their version, a bad one is refused",
          "[window][checkpoint]") {
  TempDir d;
  const std::vector<float> params(12, 0.5f);
  const std::string v4 = d / "v4.bin", v1 = d / "v1.bin", v3 = d / "v3.bin";
  ul::write_model_file(v4, tiny_llama(6), params.data(), params.size());
  ul::write_model_file(v1, tiny_llama(0), params.data(), params.size());
  ul::ModelConfig qwen = tiny_llama(0);
  qwen.qkv_bias = true, qwen.norm_eps = 1e-6f;
  ul::write_model_file(v3, qwen, params.data(), params.size());
  CHECK(file_version(v4) == 4);
  CHECK(file_version(v1) == 1);
  CHECK(file_version(v3) == 3);
  CHECK(std::filesystem::file_size(v4) == 80 + 20 + 20 + 12 + 12 * 4);  // header, v2 tail, v3 tail, window
  std::vector<float> got;
  const ul::ModelConfig c = ul::read_model_file(v4, got);
  CHECK(c.sliding_window == 6);
  CHECK(c.describe() == tiny_llama(6).describe());
  CHECK(got == params);
  CHECK(ul::read_model_file(v1, got).sliding_window == 0);
  // Version 4 keeps everything version 3 held.
  qwen.sliding_window = 9;
  qwen.rope_scaling = ul::parse_rope_scaling("yarn:factor=4,orig=16");
  qwen.tie_embeddings = true;
  ul::write_model_file(v3, qwen, params.data(), params.size());
  CHECK(file_version(v3) == 4);
  CHECK(ul::read_model_file(v3, got).describe() == qwen.describe());
  CHECK(ul::rope_scaling_str(ul::read_model_file(v3, got).rope_scaling) == ul::rope_scaling_str(qwen.rope_scaling));
  // And the layers without the window (hybrid local/global attention).
  qwen.full_every = 3, qwen.full_first = 1;
  ul::write_model_file(v3, qwen, params.data(), params.size());
  const ul::ModelConfig hybrid = ul::read_model_file(v3, got);
  CHECK(hybrid.full_every == 3);
  CHECK(hybrid.full_first == 1);
  ul::ModelConfig other = qwen;
  other.full_first = 2;
  require_error([&] { ul::check_model_config(v3, hybrid, other); },
                {"full_attention_first is 1 in the checkpoint but 2 in this run (--full-attention-first)"});
  poke_u32(v3, 128, 3);  // full_first 3 of every 3: no such layer pattern
  require_error([&] { ul::read_model_file(v3, got); }, {"full attention every 3 from 3", "corrupt"});

  // Resume compares the model too: another window is refused naming the flag.
  require_error([&] { ul::check_model_config(v4, ul::read_model_file(v4, got), tiny_llama(0)); },
                {"v4.bin", "sliding_window is 6 in the checkpoint but 0 in this run (--sliding-window)"});
  ul::check_model_config(v4, ul::read_model_file(v4, got), tiny_llama(6));

  // A window of 0 (or less) in a version 4 file is a corrupt header, as is a version past 4.
  poke_u32(v4, 120, 0);
  require_error([&] { ul::read_model_file(v4, got); }, {"v4.bin", "version 4 with sliding window 0", "corrupt"});
  poke_u32(v4, 120, uint32_t(-2));
  require_error([&] { ul::read_model_file(v4, got); }, {"v4.bin", "sliding window -2"});
  poke_u32(v4, 8, 5);
  require_error([&] { ul::read_model_file(v4, got); }, {"v4.bin", "unsupported version 5 (expected 1 to 4)"});
  // A version 4 file cut inside its window field.
  ul::write_model_file(v4, tiny_llama(6), params.data(), 0);
  std::filesystem::resize_file(v4, 130);
  require_error([&] { ul::read_model_file(v4, got); }, {"v4.bin", "truncated"});
}

TEST_CASE("a llama with a sliding window trains, saves model.bin version 4, resumes only unchanged, overrides a checkpoint's",
          "[window][cli]") {
  TempDir d;
  const std::string run = d / "run";
  auto r = run_cmd(train_cmd(kBase + "--sliding-window 8 --steps 2 --save-dir " + run));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rope_theta=10000 sliding_window=8 vocab=") != std::string::npos);
  const std::string model = d / "run/step_00000002/model.bin";
  CHECK(file_version(model) == 4);
  std::vector<float> params;
  CHECK(ul::read_model_file(model, params).sliding_window == 8);
  const std::string rank0 = ul::read_whole_file(d / "run/step_00000002/rank_0.json");
  CHECK(rank0.find("\"sliding_window\":8") != std::string::npos);

  // Resume: the same window continues; none, or another, is refused naming the flag.
  r = run_cmd(train_cmd(kBase + "--steps 3 --resume --save-dir " + run));
  CHECK(r.code != 0);
  CHECK(r.out.find("sliding_window is 8 in the checkpoint but 0 in this run (--sliding-window)") != std::string::npos);
  r = run_cmd(train_cmd(kBase + "--sliding-window 16 --steps 3 --resume --save-dir " + run));
  CHECK(r.code != 0);
  CHECK(r.out.find("sliding_window is 8 in the checkpoint but 16 in this run (--sliding-window)") != std::string::npos);
  r = run_cmd(train_cmd(kBase + "--sliding-window 8 --steps 3 --resume --save-dir " + run));
  CHECK(r.code == 0);

  // A new run from the weights keeps the checkpoint's window, or takes the flag's (0: none).
  const std::string from = "--seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 1 --checkpoint " + model;
  r = run_cmd(train_cmd(from));
  CHECK(r.code == 0);
  CHECK(r.out.find("sliding_window=8 vocab=") != std::string::npos);
  r = run_cmd(train_cmd(from + " --sliding-window 16"));
  CHECK(r.code == 0);
  CHECK(r.out.find("sliding_window=16 vocab=") != std::string::npos);
  r = run_cmd(train_cmd(from + " --sliding-window 0"));
  CHECK(r.code == 0);
  CHECK(r.out.find("rope_theta=10000 vocab=") != std::string::npos);
  // --plan shows the window train would run, from a checkpoint or from the flags.
  r = run_cmd(train_cmd(from + " --plan --sliding-window 24"));
  CHECK(r.code == 0);
  CHECK(r.out.find("plan | llama") != std::string::npos);
  CHECK(r.out.find("sliding_window=24") != std::string::npos);
  r = run_cmd(train_cmd(kBase + "--plan --sliding-window 4"));
  CHECK(r.out.find("sliding_window=4 vocab=") != std::string::npos);
  // Exported to Hugging Face as Mistral, and read back (config.json) with the window.
  r = run_cmd(train_cmd(from + " --steps 0 --export-safetensors " + (d / "hf/model.safetensors")));
  CHECK(r.code == 0);
  CHECK(ul::read_whole_file(d / "hf/config.json").find("\"model_type\":\"mistral\",\"sliding_window\":8,") !=
        std::string::npos);
  r = run_cmd(train_cmd("--seq 32 --batch 2 --eval-batches 1 --threads 1 --steps 1 --checkpoint " + (d / "hf/model.safetensors")));
  CHECK(r.code == 0);
  CHECK(r.out.find("sliding_window=8 vocab=") != std::string::npos);
  // Still not a shape flag's refusal: the other model flags stay refused beside --checkpoint.
  r = run_cmd(train_cmd(from + " --sliding-window 4 --norm-eps 1e-6"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--norm-eps: the model's shape comes from --checkpoint") != std::string::npos);
}

TEST_CASE("a sliding window changes training unless it spans the sequence, and sp 2 trains as sp 1",
          "[window][cli]") {
  TempDir d;
  auto losses = [&](const std::string& name, const std::string& flags) {
    const std::string log = d / (name + ".jsonl");
    auto r = run_cmd(train_cmd(kBase + "--steps 3 --lr 1e-2 --adam-eps 1e-4 --log " + log + " " + flags));
    INFO(r.out);
    REQUIRE(r.code == 0);
    const std::vector<double> l = step_losses(log);
    REQUIRE(l.size() == 3);
    return l;
  };
  const std::vector<double> full = losses("full", ""), w8 = losses("w8", "--sliding-window 8"),
                            w32 = losses("w32", "--sliding-window 32"),
                            w8_sp2 = losses("w8_sp2", "--sliding-window 8 --ranks 2 --sp 2");
  // Hybrid: the window on layer 0 only (full attention every 2 layers from layer 1), and sp 2.
  const std::vector<double> hybrid = losses("hybrid", "--layers 2 --sliding-window 8 --full-attention-every 2"),
                            hybrid_sp2 = losses("hybrid_sp2", "--layers 2 --sliding-window 8 --full-attention-every 2 "
                                                              "--ranks 2 --sp 2"),
                            all2 = losses("all2", "--layers 2 --sliding-window 8"), none2 = losses("none2", "--layers 2"),
                            // the other layer without the window: layer 0 full, layer 1 windowed
                            swapped = losses("swapped", "--layers 2 --sliding-window 8 --full-attention-every 2 "
                                                        "--full-attention-first 0");
  bool differs = false;
  for (size_t i = 0; i < full.size(); i++) {
    CAPTURE(i, full[i], w8[i], w32[i], w8_sp2[i]);
    CHECK(std::isfinite(w8[i]));
    // A window of T keys at T = 32 is plain causal attention: query t's keys t - 32 < t' <= t are all of t' <= t.
    CHECK(std::fabs(w32[i] - full[i]) <= 1e-6 * std::fabs(full[i]));
    // Under Ulysses the op sees the whole sequence for its heads: the same losses up to rounding.
    CHECK(std::fabs(w8_sp2[i] - w8[i]) <= 1e-5 * std::fabs(w8[i]));
    differs = differs || std::fabs(w8[i] - full[i]) > 1e-5 * std::fabs(full[i]);
  }
  CHECK(differs);  // 8 keys of up to 32: the first step's loss already differs
  for (size_t i = 0; i < hybrid.size(); i++) {
    CAPTURE(i, hybrid[i], hybrid_sp2[i], all2[i], none2[i]);
    CHECK(std::fabs(hybrid_sp2[i] - hybrid[i]) <= 1e-5 * std::fabs(hybrid[i]));
    CHECK(std::fabs(hybrid[i] - all2[i]) > 1e-6 * std::fabs(all2[i]));    // layer 1 is not windowed
    CHECK(std::fabs(hybrid[i] - none2[i]) > 1e-6 * std::fabs(none2[i]));  // layer 0 is
    CHECK(std::fabs(hybrid[i] - swapped[i]) > 1e-6 * std::fabs(swapped[i]));  // and the right one
  }
}

TEST_CASE("the layers without the window: flags, defaults, refusals, the model line", "[window][cli]") {
  ul::ModelConfig c = ul::model_config(options("--model llama --layers 12 --sliding-window 8 --full-attention-every 6"), 32);
  CHECK((c.full_every == 6 && c.full_first == 5));  // Gemma 3's: the last layer of each group of 6
  for (int l = 0; l < 12; l++) CHECK(c.window_of(l) == (l == 5 || l == 11 ? 0 : 8));
  CHECK(c.describe().find("sliding_window=8 full_attention=every 6 from 5") != std::string::npos);
  c = ul::model_config(options("--model llama --layers 8 --sliding-window 8 --full-attention-every 4 "
                               "--full-attention-first 0"), 32);
  for (int l = 0; l < 8; l++) CHECK(c.full_layer(l) == (l % 4 == 0));  // Ministral 8B's
  // Removing a checkpoint's window removes its exemptions; without a window they mean nothing and are refused.
  ul::apply_window_flag(options("--model llama --sliding-window 0"), c);
  CHECK((c.sliding_window == 0 && c.full_every == 0 && c.full_first == 0));
  c.validate();
  require_error([] { ul::model_config(options("--model llama --full-attention-every 2"), 32); },
                {"--full-attention-every", "needs --sliding-window"});
  require_error([] { ul::model_config(options("--model llama --sliding-window 8 --full-attention-every 2 "
                                              "--full-attention-first 2"), 32); },
                {"--full-attention-first must be in [0, --full-attention-every)", "2"});
  require_error([] { ul::model_config(options("--model llama --sliding-window 8 --full-attention-every -1"), 32); },
                {"--full-attention-every must be >= 0"});
}
