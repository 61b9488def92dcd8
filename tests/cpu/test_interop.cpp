// Hugging Face interop: the name / shape / transposition mapping for gpt2 and llama, export ->
// import round trips, HF's own file variants and the refusals (Mistral's and Qwen 2's sliding
// windows among them), and the train flags that write and read these files (llm.c and
// safetensors). The file format itself: test_safetensors.cpp.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/context.h"
#include "engine/device.h"
#include "engine/file_io.h"
#include "engine/hf_format.h"
#include "engine/json.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "layers/transformer.h"
#include "run_cmd.h"
#include "temp_dir.h"

using namespace ul;
namespace fs = std::filesystem;

namespace {

using ul_test::TempDir;

// "llama3": llama shaped like Llama 3.2: Llama 3.1's RoPE scaling and tied embeddings. "qwen2":
// llama with Qwen 2.5's settings: q/k/v bias, RMSNorm eps 1e-6, YaRN, tied embeddings. "mistral":
// llama with a sliding window (of 6 keys) and Mistral's eps 1e-6; "ministral": the same with layer 1
// outside the window.
ModelConfig small(std::string arch) {
  ModelConfig c;
  if (arch == "mistral" || arch == "ministral") {
    c.sliding_window = 6, c.norm_eps = 1e-6f;
    if (arch == "ministral") c.full_every = 2, c.full_first = 1;  // layer 1 without the window
    arch = "llama";
  } else if (arch == "llama3") {
    c.rope_scaling = parse_rope_scaling("llama3:factor=8,low=1,high=4,orig=64"), arch = "llama";
    c.tie_embeddings = true;
  } else if (arch == "qwen2") {
    c.rope_scaling = parse_rope_scaling("yarn:factor=4,orig=8"), arch = "llama";
    c.tie_embeddings = c.qkv_bias = true, c.norm_eps = 1e-6f;
  }
  c.arch = arch, c.layers = 2, c.dim = 32, c.heads = 4, c.kv_heads = arch == "llama" ? 2 : 4;
  c.vocab = 50, c.padded_vocab = 128, c.max_seq = 16, c.ffn = arch == "llama" ? 48 : 0, c.rope_theta = 5000.0f;
  if (c.rope_scaling.kind == RopeScaling::kYarn) c.max_seq = 32;  // factor x orig: what its config.json says
  return c;
}

// Every parameter random (biases and norms too, so each mapping is visible); pad rows zero.
std::vector<float> random_params(const Transformer& m, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> h(m.params.numel());
  for (float& v : h) v = float(rng.normal());
  for (const ParamSpec& s : m.params.specs())
    if (s.name == "wte" || s.name == "lm_head")
      std::fill(h.begin() + long(s.offset) + long(m.cfg.vocab) * m.cfg.dim, h.begin() + long(s.offset + s.shape.numel()), 0.0f);
  return h;
}

const float* at(const Transformer& m, const std::vector<float>& h, const std::string& name, int l) {
  const ParamSpec& s = m.params.spec(name);
  return h.data() + s.offset + (s.stacked ? size_t(l) * size_t(s.shape.numel() / s.shape[0]) : 0);
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

TEST_CASE("gpt2 exports with Hugging Face names, Conv1D transposes and an unpadded vocab", "[interop]") {
  Context ctx;
  ContextGuard g(ctx);
  Transformer m(small("gpt2"));
  const std::vector<float> h = random_params(m, 1);
  TempDir d;
  export_safetensors(d / "model.safetensors", m.cfg, m.params.specs(), h.data(), "F32");
  SafetensorsFile f(d / "model.safetensors");
  const int C = 32, V = 50;
  CHECK(f.tensors().size() == 2 + 12 * 2 + 2);
  CHECK(!f.find("lm_head.weight"));  // tied to wte, as save_pretrained leaves it
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("arch") == "gpt2");
  auto T = [&](const std::string& n) { REQUIRE(f.find(n)); return f.to_f32(*f.find(n)); };
  auto shape = [&](const std::string& n) { return f.find(n)->shape; };
  CHECK(shape("transformer.wte.weight") == std::vector<int64_t>{V, C});
  CHECK(T("transformer.wte.weight") == std::vector<float>(h.begin(), h.begin() + V * C));
  CHECK(shape("transformer.wpe.weight") == std::vector<int64_t>{16, C});
  for (int l = 0; l < 2; l++) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    struct { const char* hf; const char* ours; int64_t rows, cols; } mats[] = {
        {"attn.c_attn.weight", "qkvw", 3 * C, C}, {"attn.c_proj.weight", "attprojw", C, C},
        {"mlp.c_fc.weight", "fcw", 4 * C, C},     {"mlp.c_proj.weight", "fcprojw", C, 4 * C}};
    for (auto& mm : mats) {  // HF Conv1D weight[i][j] == our weight[j][i]
      CAPTURE(mm.hf, l);
      CHECK(shape(p + mm.hf) == std::vector<int64_t>{mm.cols, mm.rows});
      const std::vector<float> w = T(p + mm.hf);
      const float* ours = at(m, h, mm.ours, l);
      for (int64_t i = 0; i < mm.cols; i++)
        for (int64_t j = 0; j < mm.rows; j++) REQUIRE(w[size_t(i * mm.rows + j)] == ours[j * mm.cols + i]);
    }
    const std::pair<const char*, const char*> vecs[] = {{"ln_1.weight", "ln1w"}, {"ln_1.bias", "ln1b"}, {"attn.c_attn.bias", "qkvb"},
                                                        {"attn.c_proj.bias", "attprojb"}, {"ln_2.weight", "ln2w"},
                                                        {"ln_2.bias", "ln2b"}, {"mlp.c_fc.bias", "fcb"}, {"mlp.c_proj.bias", "fcprojb"}};
    for (auto& [hf, ours] : vecs) {
      const std::vector<float> v = T(p + hf);
      CHECK(v == std::vector<float>(at(m, h, ours, l), at(m, h, ours, l) + v.size()));
    }
  }
  CHECK(T("transformer.ln_f.bias") == std::vector<float>(at(m, h, "lnfb", -1), at(m, h, "lnfb", -1) + C));
  const JsonValue cfg = parse_json(read_whole_file(d / "config.json"), "config.json");
  CHECK(cfg.find("model_type")->text == "gpt2");
  CHECK(cfg.find("n_embd")->as_int("") == C);
  CHECK(cfg.find("vocab_size")->as_int("") == V);
  CHECK(cfg.find("activation_function")->text == "gelu_new");
}

TEST_CASE("llama exports q/k/v and gate/up as row slices, lm_head unpadded, nothing permuted", "[interop]") {
  Context ctx;
  ContextGuard g(ctx);
  Transformer m(small("llama"));
  const std::vector<float> h = random_params(m, 2);
  TempDir d;
  export_safetensors(d / "model.safetensors", m.cfg, m.params.specs(), h.data(), "F32");
  SafetensorsFile f(d / "model.safetensors");
  const int C = 32, D = 8, H = 4, KV = 2, F = 48, V = 50;
  CHECK(f.tensors().size() == 1 + 9 * 2 + 2);
  auto rows = [&](const std::string& n, const float* src, int64_t r, int64_t c) {
    CAPTURE(n);
    REQUIRE(f.find(n));
    CHECK(f.find(n)->shape == std::vector<int64_t>{r, c});
    CHECK(f.to_f32(*f.find(n)) == std::vector<float>(src, src + r * c));
  };
  rows("model.embed_tokens.weight", at(m, h, "wte", -1), V, C);
  rows("lm_head.weight", at(m, h, "lm_head", -1), V, C);
  for (int l = 0; l < 2; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const float* qkv = at(m, h, "qkvw", l);
    rows(p + "self_attn.q_proj.weight", qkv, H * D, C);
    rows(p + "self_attn.k_proj.weight", qkv + H * D * C, KV * D, C);
    rows(p + "self_attn.v_proj.weight", qkv + (H + KV) * D * C, KV * D, C);
    rows(p + "self_attn.o_proj.weight", at(m, h, "attprojw", l), C, C);
    rows(p + "mlp.gate_proj.weight", at(m, h, "fcw", l), F, C);
    rows(p + "mlp.up_proj.weight", at(m, h, "fcw", l) + F * C, F, C);
    rows(p + "mlp.down_proj.weight", at(m, h, "fcprojw", l), C, F);
    CHECK(f.to_f32(*f.find(p + "input_layernorm.weight")) == std::vector<float>(at(m, h, "ln1w", l), at(m, h, "ln1w", l) + C));
    CHECK(f.to_f32(*f.find(p + "post_attention_layernorm.weight")) == std::vector<float>(at(m, h, "ln2w", l), at(m, h, "ln2w", l) + C));
  }
  const JsonValue cfg = parse_json(read_whole_file(d / "config.json"), "config.json");
  CHECK(cfg.find("model_type")->text == "llama");
  CHECK(cfg.find("num_key_value_heads")->as_int("") == KV);
  CHECK(cfg.find("intermediate_size")->as_int("") == F);
  CHECK(cfg.find("rope_theta")->as_double("") == 5000.0);
  CHECK(!cfg.find("tie_word_embeddings")->b);
}

TEST_CASE("an export that cannot replace config.json leaves the old pair, and none of its temporaries", "[interop]") {
  Context ctx;
  ContextGuard g(ctx);
  Transformer m(small("llama"));
  const std::vector<float> h = random_params(m, 3);
  TempDir d;
  // The old pair: weights, and a config.json that cannot be unlinked (a directory here; the same
  // path a read-only or immutable file takes). The new weights are written but never take the old
  // ones' place: the old config.json goes just before they would.
  std::ofstream(d / "model.safetensors") << "old weights";
  fs::create_directories(fs::path(d / "config.json") / "x");
  CHECK_THROWS_WITH(export_safetensors(d / "model.safetensors", m.cfg, m.params.specs(), h.data(), "F32"),
                    Catch::Contains("config.json: cannot replace it"));
  CHECK(read_whole_file(d / "model.safetensors") == "old weights");
  CHECK(fs::is_directory(fs::path(d / "config.json") / "x"));
  CHECK_FALSE(fs::exists(d / "model.safetensors.tmp"));
  CHECK_FALSE(fs::exists(d / "config.json.tmp"));
}

TEST_CASE("export then import round-trips bit-exactly, config from metadata or config.json", "[interop]") {
  for (const std::string arch : {"gpt2", "llama", "llama3", "qwen2", "mistral", "ministral"}) {
    CAPTURE(arch);
    Context ctx;
    ContextGuard g(ctx);
    Transformer m(small(arch));
    const std::vector<float> h = random_params(m, 3);
    TempDir d;
    export_safetensors(d / "model.safetensors", m.cfg, m.params.specs(), h.data(), "F32");
    {  // a parameter with no Hugging Face name (a fork's new weight not in hf_map): refused, not dropped
      std::vector<ParamSpec> more = m.params.specs();
      more.push_back({"gate_scale", Shape{m.cfg.dim}, false, false, size_t(m.params.numel())});
      std::vector<float> hm = h;
      hm.resize(h.size() + size_t(m.cfg.dim), 1.f);
      CHECK_THROWS_WITH(hf_tensors(m.cfg, more, hm.data()),
                        Catch::Contains("names 0 of the " + std::to_string(m.cfg.dim) + " weights of parameter 'gate_scale'"));
    }
    if (arch == "qwen2") {  // Qwen2ForCausalLM (llama's attention_bias would mean an o_proj bias too)
      const std::string json = read_whole_file(d / "config.json");
      CHECK(json.find("\"model_type\":\"qwen2\"") != std::string::npos);
      CHECK(json.find("attention_bias") == std::string::npos);
      CHECK(SafetensorsFile(d / "model.safetensors").find("model.layers.1.self_attn.v_proj.bias"));
    }
    for (bool with_meta : {true, false}) {
      CAPTURE(with_meta);
      if (!with_meta)  // an HF-written file: only format=pt; the config comes from config.json
        write_safetensors(d / "model.safetensors", hf_tensors(m.cfg, m.params.specs(), h.data()), {{"format", "pt"}}, "F32");
      SafetensorsFile f(d / "model.safetensors");
      const ModelConfig c = hf_read_config(f);
      CHECK(c.describe() == m.cfg.describe());
      if (arch != "gpt2") CHECK(c.rope_theta == m.cfg.rope_theta);
      CHECK(rope_scaling_str(c.rope_scaling) == rope_scaling_str(m.cfg.rope_scaling));
      Transformer back(c);
      std::vector<float> got(back.params.numel(), 42.0f);
      hf_import(f, c, back.params.specs(), got.data());
      REQUIRE(got.size() == h.size());
      CHECK(std::memcmp(got.data(), h.data(), h.size() * 4) == 0);
    }
    export_safetensors(d / "model.safetensors", m.cfg, m.params.specs(), h.data(), "BF16");
    SafetensorsFile f(d / "model.safetensors");
    std::vector<float> got(h.size());
    hf_import(f, m.cfg, m.params.specs(), got.data());
    bool all_rounded = true;
    for (size_t i = 0; i < h.size(); i++) all_rounded &= got[i] == f32_from_bf16(bf16_from_f32(h[i]));
    CHECK(all_rounded);
  }
}

// A random model of cfg exported to a temporary directory (model.safetensors with our metadata,
// config.json); then, as Hugging Face would have written it, re-read through config.json alone.
struct HfExport {
  Context ctx;
  ContextGuard guard{ctx};
  ModelConfig cfg;
  Transformer m;
  std::vector<float> h;
  TempDir d;
  std::string json;  // the config.json the export wrote

  HfExport(const ModelConfig& c, uint64_t seed) : cfg(c), m(c), h(random_params(m, seed)) {
    export_safetensors(d / "model.safetensors", cfg, m.params.specs(), h.data(), "F32");
    json = read_whole_file(d / "config.json");
  }
  ModelConfig read() const { return hf_read_config(SafetensorsFile(d / "model.safetensors")); }
  void drop_metadata() const {  // only format=pt left: the config now comes from config.json
    write_safetensors(d / "model.safetensors", hf_tensors(cfg, m.params.specs(), h.data()), {{"format", "pt"}}, "F32");
  }
  ModelConfig read_with(const std::string& config) const {
    write_bytes(d / "config.json", config);
    return read();
  }
  // json with the first `from` replaced by `to`, read through config.json.
  ModelConfig read_replaced(const std::string& from, const std::string& to) const {
    std::string c = json;
    const size_t at = c.find(from);
    REQUIRE(at != std::string::npos);
    return read_with(c.replace(at, from.size(), to));
  }
};

TEST_CASE("HF rope scaling: llama3 and linear in either transformers layout, other rules refused", "[interop]") {
  HfExport x(small("llama3"), 5);
  const std::string& json = x.json;
  // Tied, as Llama 3.2: no lm_head.weight, tie_word_embeddings true.
  CHECK(json.find("\"tie_word_embeddings\":true") != std::string::npos);
  CHECK(!SafetensorsFile(x.d / "model.safetensors").find("lm_head.weight"));
  // Both layouts are written: rope_scaling (transformers 4.x) and rope_parameters (5.x).
  CHECK(json.find("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                  "\"high_freq_factor\":4,\"original_max_position_embeddings\":64}") != std::string::npos);
  CHECK(json.find("\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":5000,\"factor\":8") != std::string::npos);
  // Read through config.json (a file without our metadata), in each layout.
  x.drop_metadata();
  auto read_with = [&](const std::string& config) { return x.read_with(config); };
  const size_t params_at = json.find(",\"rope_parameters\"");
  const size_t params_end = json.find('}', params_at) + 1;
  const std::string only_4x = json.substr(0, params_at) + json.substr(params_end);
  CHECK(rope_scaling_str(read_with(json).rope_scaling) == "llama3:factor=8,low=1,high=4,orig=64");
  CHECK(read_with(json).tie_embeddings);
  CHECK(rope_scaling_str(read_with(only_4x).rope_scaling) == "llama3:factor=8,low=1,high=4,orig=64");
  // An older file's "type" key, and the linear rule.
  std::string linear = only_4x;
  const size_t sc = linear.find("\"rope_scaling\":");
  linear.replace(sc, linear.find('}', sc) + 1 - sc, "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.5}");
  CHECK(rope_scaling_str(read_with(linear).rope_scaling) == "linear:factor=2.5");
  std::string dynamic = json;
  dynamic.replace(dynamic.find("\"llama3\"", params_at), 8, "\"dynamic\"");
  CHECK_THROWS_WITH(read_with(dynamic), Catch::Contains("rope scaling 'dynamic'") && Catch::Contains("config.json"));
}

TEST_CASE("HF rope scaling: yarn written and read, with transformers' defaults and DeepSeek's mscale", "[interop]") {
  ModelConfig cfg = small("llama");
  cfg.max_seq = 256;
  cfg.rope_scaling = parse_rope_scaling("yarn:factor=4,orig=64,beta_fast=16,beta_slow=2,truncate=0");
  HfExport x(cfg, 6);
  CHECK(x.json.find("\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":5000,\"factor\":4,"
                  "\"original_max_position_embeddings\":64,\"beta_fast\":16,\"beta_slow\":2,"
                  "\"attention_factor\":1.13862944,\"truncate\":false}") != std::string::npos);
  CHECK(rope_scaling_str(x.read().rope_scaling) == rope_scaling_str(cfg.rope_scaling));
  // max_position_embeddings is factor x orig whatever the model's max_seq: transformers 4.51 to
  // 4.55 take YaRN's factor from that ratio. The metadata keeps max_seq, and a config.json that
  // differs from it only there is the same model (no llama computes with max_seq).
  {
    ModelConfig longer = cfg;
    longer.max_seq = 1000;
    HfExport y(longer, 6);
    CHECK(y.json.find("\"max_position_embeddings\":256,") != std::string::npos);
    CHECK(y.read().max_seq == 1000);
    y.drop_metadata();
    const ModelConfig from_json = y.read();
    CHECK(from_json.max_seq == 256);
    CHECK(rope_scaling_str(from_json.rope_scaling) == rope_scaling_str(cfg.rope_scaling));
  }
  // Through config.json alone, each key left out in turn: transformers' defaults fill it.
  x.drop_metadata();
  auto read_with = [&](const std::string& rope) {  // a 5.x config: rope_parameters alone
    std::string c = x.json;
    const size_t old = c.find("\"rope_scaling\":");
    c.erase(old, c.find('}', old) + 2 - old);  // with its comma
    const size_t at = c.find("\"rope_parameters\":");
    c.replace(at, c.find('}', at) + 1 - at, "\"rope_parameters\":" + rope);
    return rope_scaling_str(x.read_with(c).rope_scaling);
  };
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64}") ==
        "yarn:factor=4,orig=64,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1");
  // No original context: max_position_embeddings (256); no factor: max_position_embeddings / original.
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":2}") ==
        "yarn:factor=2,orig=256,beta_fast=32,beta_slow=1,attn=1.0693147,truncate=1");
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":null,\"original_max_position_embeddings\":32}") ==
        "yarn:factor=8,orig=32,beta_fast=32,beta_slow=1,attn=1.2079442,truncate=1");
  // DeepSeek's: attention factor (0.1 ln 40 + 1) / (0.05 ln 40 + 1) = 1.155722 (transformers 5.24 too).
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":40,\"original_max_position_embeddings\":64,"
                  "\"mscale\":1,\"mscale_all_dim\":0.5,\"beta_fast\":null}") ==
        "yarn:factor=40,orig=64,beta_fast=32,beta_slow=1,attn=1.155722,truncate=1");
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,"
                  "\"attention_factor\":0.5}") == "yarn:factor=4,orig=64,beta_fast=32,beta_slow=1,attn=0.5,truncate=1");
  // A null truncate is false, as transformers 5.x reads it (4.x has no such key); other values refused.
  CHECK(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,\"truncate\":null}") ==
        "yarn:factor=4,orig=64,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=0");
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,\"truncate\":1}"),
                    Catch::Contains("yarn truncate is not true, false or null"));
  // original_max_position_embeddings at the top level (Phi-3's place): read for llama3 as for yarn;
  // where the entry gives another, refused (4.x's llama3 reads the entry's, 5.x the top level's).
  auto with_top_orig = [&](const std::string& rope) {
    std::string c = x.json;
    const size_t old = c.find("\"rope_scaling\":");
    c.erase(old, c.find('}', old) + 2 - old);
    const size_t at = c.find("\"rope_parameters\":");
    c.replace(at, c.find('}', at) + 1 - at, "\"rope_parameters\":" + rope);
    c.insert(c.find('{') + 1, "\"original_max_position_embeddings\":32,");
    return rope_scaling_str(x.read_with(c).rope_scaling);
  };
  const std::string llama3 = "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4";
  CHECK(with_top_orig(llama3 + "}") == "llama3:factor=8,low=1,high=4,orig=32");
  CHECK(with_top_orig(llama3 + ",\"original_max_position_embeddings\":32}") == "llama3:factor=8,low=1,high=4,orig=32");
  CHECK_THROWS_WITH(with_top_orig(llama3 + ",\"original_max_position_embeddings\":64}"),
                    Catch::Contains("original_max_position_embeddings is 32 at the top level and 64 in the rope entry"));
  CHECK_THROWS_WITH(with_top_orig("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64}"),
                    Catch::Contains("original_max_position_embeddings is 32 at the top level and 64 in the rope entry"));
  // yarn's at the top level alone: 4.x reads max_position_embeddings (256) instead, 5.x that 32.
  CHECK_THROWS_WITH(with_top_orig("{\"rope_type\":\"yarn\",\"factor\":4}"),
                    Catch::Contains("given at the top level only (32), where transformers 4 reads "
                                    "max_position_embeddings (256) instead"));
  // One entry per layer type (5.x takes them), or a key no rule has: refused, not read as plain
  // RoPE at theta 10000 or with the misspelt setting left out.
  CHECK_THROWS_WITH(read_with("{\"full_attention\":{\"rope_type\":\"yarn\",\"rope_theta\":1000000,\"factor\":4}}"),
                    Catch::Contains("\"full_attention\" holds its own RoPE (one entry per layer type)"));
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"linear\",\"factor\":2,\"factr\":4}"),
                    Catch::Contains("\"factr\" is not a RoPE setting ulysses reads"));
  // A rule it cannot run is named as that, whatever keys it has; YaRN Llama 2's "finetuned" is read
  // past, as transformers does.
  CHECK_THROWS_WITH(read_with("{\"type\":\"longrope\",\"long_factor\":[1,2],\"short_factor\":[1,2]}"),
                    Catch::Contains("rope scaling 'longrope' (ulysses runs default, linear, llama3 and yarn"));
  CHECK(read_with("{\"type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,\"finetuned\":true}") ==
        "yarn:factor=4,orig=64,beta_fast=32,beta_slow=1,attn=1.1386294,truncate=1");
  CHECK_THROWS_WITH(read_with(llama3 + "}"), Catch::Contains("llama3 scaling without \"original_max_position_embeddings\""));
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":64,"
                              "\"beta_fast\":1,\"beta_slow\":2}"),
                    Catch::Contains("config.json") && Catch::Contains("0 < beta_slow < beta_fast"));
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}"),
                    Catch::Contains("partial_rotary_factor"));
  // transformers 4.x keeps it at the top level: refused there too; 1 (every pair) is read.
  for (const char* factor : {"0.5", "1"}) {
    std::string c = x.json;
    c.insert(c.find('{') + 1, std::string("\"partial_rotary_factor\":") + factor + ",");
    if (std::string(factor) == "1") CHECK_NOTHROW(x.read_with(c));
    else CHECK_THROWS_WITH(x.read_with(c), Catch::Contains("config.json") && Catch::Contains("partial_rotary_factor is not 1"));
  }
  // Position counts past an int are refused, not converted (found by fuzz_hf_config: UB in a cast).
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":5.5e92}"),
                    Catch::Contains("original_max_position_embeddings: expected an integer"));
  CHECK_THROWS_WITH(read_with("{\"rope_type\":\"yarn\",\"factor\":4,\"original_max_position_embeddings\":4294967360}"),
                    Catch::Contains("original_max_position_embeddings 4294967360 is not in [1, 2^31)"));
  // A layer count no model has (2^30 of width 2 stays under 2^50 parameters): refused at once, as
  // --layers is, not after minutes of per-layer planning.
  const size_t layers_at = x.json.find("\"num_hidden_layers\":");
  REQUIRE(layers_at != std::string::npos);
  const std::string layers_field = x.json.substr(layers_at, x.json.find(',', layers_at) + 1 - layers_at);
  CHECK_THROWS_WITH(x.read_replaced(layers_field, "\"num_hidden_layers\":1073741824,"),
                    Catch::Contains("config.json: 1073741824 layers: at most 100000"));
  CHECK_THROWS_WITH(x.read_replaced("\"vocab_size\":50,", "\"vocab_size\":4294967346,"),
                    Catch::Contains("vocab_size 4294967346 is out of range"));
}

TEST_CASE("HF configs: qwen2 read as llama with a q/k/v bias, what ulysses would run differently refused", "[interop]") {
  HfExport x(small("qwen2"), 7);
  x.drop_metadata();
  {  // its window list is one entry a layer: a count past the cap refused before it (gigabytes at 2^31)
    const size_t at = x.json.find("\"num_hidden_layers\":");
    REQUIRE(at != std::string::npos);
    CHECK_THROWS_WITH(x.read_replaced(x.json.substr(at, x.json.find(',', at) + 1 - at), "\"num_hidden_layers\":2147483647,"),
                      Catch::Contains("2147483647 layers: at most 100000"));
  }
  auto read_with = [&](const std::string& from, const std::string& to) { return x.read_replaced(from, to); };
  CHECK(x.read_with(x.json).describe() == x.cfg.describe());  // qkv_bias, norm_eps=1e-06, yarn, tied
  // transformers 5.24 slides Qwen 2's layers from max_window_layers (28 when absent) on: none of these 2.
  CHECK(read_with("\"use_sliding_window\":false", "\"use_sliding_window\":true").sliding_window == 0);
  CHECK_THROWS_WITH(read_with("\"rms_norm_eps\":1e-06", "\"rms_norm_eps\":0"), Catch::Contains("rms_norm_eps"));
  // What the file leaves out takes Qwen2Config's defaults (and LlamaConfig's eps is 1e-6 too).
  CHECK(read_with("\"rms_norm_eps\":1e-06,", "").norm_eps == 1e-6f);
  CHECK(read_with("\"max_position_embeddings\":32,", "").max_seq == 32768);
  // A theta past float's range would read as inf (found by fuzz_hf_config): refused, not NaN angles.
  std::string huge = x.json;  // both places transformers reads it from (4.x: top level; 5.x: rope_parameters)
  for (size_t at; (at = huge.find("\"rope_theta\":5000")) != std::string::npos;) huge.replace(at, 17, "\"rope_theta\":1e50");
  CHECK_THROWS_WITH(x.read_with(huge), Catch::Contains("--rope-theta"));
  // The two differing: transformers 4.x and 5.x would load different models.
  CHECK_THROWS_WITH(read_with("\"rope_theta\":5000,\"factor\"", "\"rope_theta\":6000,\"factor\""),
                    Catch::Contains("rope_theta and rope_parameters.rope_theta differ"));
  // rope_scaling and rope_parameters disagreeing (4.x reads one, 5.x the other): refused too.
  CHECK_THROWS_WITH(read_with("\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":",
                              "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":9"),
                    Catch::Contains("rope_scaling and rope_parameters differ"));
  CHECK_THROWS_WITH(read_with("\"model_type\":\"qwen2\"", "\"model_type\":\"qwen3\""),
                    Catch::Contains("model_type 'qwen3'"));
  // As llama, the biases are not expected: the file's q/k/v biases are refused as unknown tensors.
  CHECK_THROWS(read_with("\"model_type\":\"qwen2\"", "\"model_type\":\"llama\",\"attention_bias\":true"));
  // A flag that is not true or false (Python's NaN parses as a number) is refused, not read as false.
  CHECK_THROWS_WITH(read_with("\"model_type\":\"qwen2\"", "\"model_type\":\"llama\",\"attention_bias\":NaN"),
                    Catch::Contains("attention_bias: expected true or false"));
  CHECK_THROWS_WITH(read_with("\"tie_word_embeddings\":true", "\"tie_word_embeddings\":1"),
                    Catch::Contains("tie_word_embeddings: expected true or false"));
}

TEST_CASE("HF configs: a llama with a window is written as mistral, and mistral read as transformers reads it",
          "[interop][window]") {
  HfExport x(small("mistral"), 9);
  CHECK(x.json.find("\"architectures\":[\"MistralForCausalLM\"],\"model_type\":\"mistral\",\"sliding_window\":6,") !=
        std::string::npos);
  CHECK(x.json.find("attention_bias") == std::string::npos);  // not one of MistralConfig's fields
  CHECK(x.json.find("\"head_dim\":8") != std::string::npos);
  CHECK(SafetensorsFile(x.d / "model.safetensors").metadata().at("sliding_window") == "6");
  CHECK(x.read().describe() == x.cfg.describe());  // from our __metadata__
  // Without a window a llama is still written as llama (and its metadata says 0).
  HfExport plain(small("llama"), 9);
  CHECK(plain.json.find("\"model_type\":\"llama\"") != std::string::npos);
  CHECK(plain.json.find("sliding_window") == std::string::npos);
  CHECK(SafetensorsFile(plain.d / "model.safetensors").metadata().at("sliding_window") == "0");

  // Our metadata and a config.json beside it must agree: one edited to another model is refused
  // (the metadata would win without a word), and so is one ulysses could not run.
  CHECK_THROWS_WITH(x.read_replaced("\"sliding_window\":6,", "\"sliding_window\":7,"),
                    Catch::Contains("its __metadata__ and the config.json beside it describe different models"));
  CHECK_THROWS_WITH(x.read_replaced("\"hidden_act\":\"silu\"", "\"hidden_act\":\"gelu\""), Catch::Contains("hidden_act"));
  // A theta 4e-7 apart (in the 7th digit) is another model too: the comparison once printed 6.
  {
    const size_t at = x.json.find("\"rope_theta\":") + 13, end = x.json.find(',', at);
    const std::string theta = x.json.substr(at, end - at);
    char moved[32];
    std::snprintf(moved, sizeof moved, "%.9g", std::stod(theta) * (1 + 4e-7));
    std::string edited = x.json;  // both places: rope_theta and rope_parameters' (5.x)
    const std::string from = "\"rope_theta\":" + theta, to = "\"rope_theta\":" + std::string(moved);
    for (size_t p = edited.find(from); p != std::string::npos; p = edited.find(from, p + to.size()))
      edited.replace(p, from.size(), to);
    CHECK_THROWS_WITH(x.read_with(edited), Catch::Contains("describe different models"));
  }
  CHECK(x.read_with(x.json).describe() == x.cfg.describe());
  // A metadata integer past int's range is refused, not narrowed (2^32 + 2 layers read as 2).
  {
    const SafetensorsFile ours(x.d / "model.safetensors");
    std::map<std::string, std::string> meta = ours.metadata();
    meta["layers"] = "4294967298";
    write_safetensors(x.d / "model.safetensors", hf_tensors(x.cfg, x.m.params.specs(), x.h.data()), meta, "F32");
    CHECK_THROWS_WITH(x.read(), Catch::Contains("__metadata__ layers 4294967298 is out of range"));
    meta["layers"] = std::to_string(x.cfg.layers);
    write_safetensors(x.d / "model.safetensors", hf_tensors(x.cfg, x.m.params.specs(), x.h.data()), meta, "F32");
    CHECK(x.read().describe() == x.cfg.describe());
  }

  // Through config.json alone: what the file leaves out takes MistralConfig's defaults.
  x.drop_metadata();
  auto read_with = [&](const std::string& from, const std::string& to) { return x.read_replaced(from, to); };
  CHECK(x.read_with(x.json).describe() == x.cfg.describe());
  CHECK(read_with("\"sliding_window\":6,", "\"sliding_window\":null,").sliding_window == 0);  // plain llama
  CHECK(read_with("\"sliding_window\":6,", "").sliding_window == 4096);
  CHECK(read_with("\"head_dim\":8,", "\"head_dim\":null,").describe() == x.cfg.describe());
  CHECK(read_with("\"rms_norm_eps\":1e-06,", "").norm_eps == 1e-6f);
  CHECK(read_with("\"max_position_embeddings\":16,", "").max_seq == 131072);
  // With layer_types, AutoConfig reads a mistral config as Ministral's, which follows them (5.24;
  // MistralModel alone would build one mask for every layer): here no layer slides.
  CHECK(read_with("\"sliding_window\":6,", "\"sliding_window\":6,\"layer_types\":[\"full_attention\",\"full_attention\"],")
            .sliding_window == 0);
  // What ulysses would run differently (or transformers could not run) is refused, naming the field.
  CHECK_THROWS_WITH(read_with("\"sliding_window\":6,", "\"sliding_window\":0,"),
                    Catch::Contains("config.json") && Catch::Contains("sliding_window 0 is not a positive int or null"));
  CHECK_THROWS_WITH(read_with("\"sliding_window\":6,", "\"sliding_window\":-2,"), Catch::Contains("sliding_window -2"));
  CHECK_THROWS_WITH(read_with("\"sliding_window\":6,", "\"sliding_window\":2.5,"), Catch::Contains("sliding_window"));
  CHECK_THROWS_WITH(read_with("\"head_dim\":8,", "\"head_dim\":16,"),
                    Catch::Contains("head_dim is not hidden_size / num_attention_heads"));
  CHECK_THROWS_WITH(read_with("\"hidden_act\":\"silu\"", "\"hidden_act\":\"gelu\""), Catch::Contains("hidden_act"));
  // transformers' other name for SiLU is the same model.
  CHECK(read_with("\"hidden_act\":\"silu\"", "\"hidden_act\":\"swish\"").describe() == x.cfg.describe());
}

TEST_CASE("HF configs without num_key_value_heads (or with null): each config class's default, as transformers reads them", "[interop]") {
  // LlamaConfig: the query heads; MistralConfig and MinistralConfig: 8; Qwen2Config: 32.
  // Given as null: the query heads in all three (each __init__ replaces None so).
  auto kv_of = [](const std::string& type, int heads, const std::string& kv = "") {
    const std::string text = "{\"model_type\":\"" + type + "\",\"hidden_size\":" + std::to_string(8 * heads) +
                             ",\"num_hidden_layers\":1,\"num_attention_heads\":" + std::to_string(heads) +
                             ",\"intermediate_size\":64,\"vocab_size\":100" +
                             (kv.empty() ? "" : ",\"num_key_value_heads\":" + kv) + "}";
    return hf_config_from_json(parse_json(text, "config.json"), "config.json").kv_heads;
  };
  CHECK(kv_of("llama", 16) == 16);
  CHECK(kv_of("mistral", 16) == 8);
  CHECK(kv_of("ministral", 16) == 8);
  CHECK(kv_of("qwen2", 32) == 32);
  CHECK(kv_of("qwen2", 64) == 32);
  for (const char* type : {"llama", "mistral", "ministral", "qwen2"}) {
    CAPTURE(type);
    CHECK(kv_of(type, 16, "null") == 16);
    CHECK(kv_of(type, 16, "4") == 4);
  }
}

TEST_CASE("HF configs: a llama with layers outside its window is written as ministral, and read back", "[interop][window]") {
  HfExport x(small("ministral"), 12);
  CHECK(x.json.find("\"architectures\":[\"MinistralForCausalLM\"],\"model_type\":\"ministral\",\"sliding_window\":6,"
                    "\"layer_types\":[\"sliding_attention\",\"full_attention\"],") != std::string::npos);
  CHECK(x.read().describe() == x.cfg.describe());  // from our __metadata__
  x.drop_metadata();
  CHECK(x.read_with(x.json).describe() == x.cfg.describe());  // from config.json
  // One exempt layer has several "every N from K" spellings (every 4 from 1 and every 2 from 1,
  // on 2 layers): our metadata and the config.json beside it still agree.
  ModelConfig four = small("ministral");
  four.full_every = 4;
  HfExport y(four, 12);
  CHECK(y.read().describe() == four.describe());
  // MinistralConfig: without layer_types every layer slides.
  const ModelConfig all = x.read_replaced("\"layer_types\":[\"sliding_attention\",\"full_attention\"],", "");
  CHECK((all.sliding_window == 6 && all.full_every == 0));
  // model_type mistral with layer_types (Ministral-8B's files): AutoConfig makes it Ministral's, so
  // layer 1 goes without the window; with layer_types null every layer slides.
  const std::string named = "\"architectures\":[\"MinistralForCausalLM\"],\"model_type\":\"ministral\"";
  const std::string as_mistral = "\"architectures\":[\"MistralForCausalLM\"],\"model_type\":\"mistral\"";
  CHECK(x.read_replaced(named, as_mistral).describe() == x.cfg.describe());
  const ModelConfig nulled = x.read_with([&] {
    std::string t = x.json;
    t.replace(t.find(named), named.size(), as_mistral);
    const std::string types = "\"layer_types\":[\"sliding_attention\",\"full_attention\"]";
    t.replace(t.find(types), types.size(), "\"layer_types\":null");
    return t;
  }());
  CHECK((nulled.sliding_window == 6 && nulled.full_every == 0));
}

TEST_CASE("HF configs: qwen2's window by transformers 5.24's rule, the layers without it, what ulysses cannot hold refused",
          "[interop][window]") {
  ModelConfig cfg = small("qwen2");
  cfg.sliding_window = 6;
  HfExport x(cfg, 10);
  // Written so that every layer slides under either rule: layer_types, and max_window_layers 0.
  const std::string window = "\"use_sliding_window\":true,\"sliding_window\":6,"
                             "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"],\"max_window_layers\":0";
  CHECK(x.json.find("\"model_type\":\"qwen2\"," + window + ",") != std::string::npos);
  CHECK(x.read().describe() == x.cfg.describe());
  // Without a window, qwen2's config is as before.
  HfExport plain(small("qwen2"), 10);
  CHECK(plain.json.find("\"use_sliding_window\":false,\"vocab_size\"") != std::string::npos);

  x.drop_metadata();
  CHECK(x.read_with(x.json).describe() == x.cfg.describe());
  auto window_of = [&](const std::string& keys) { return x.read_replaced(window, keys).sliding_window; };
  auto refused = [&](const std::string& keys, const std::string& field) {
    CAPTURE(keys);
    CHECK_THROWS_WITH(x.read_replaced(window, keys), Catch::Contains("config.json") && Catch::Contains(field));
  };
  // Each case's layer_types and sliding_window checked against transformers 5.24's Qwen2Config.
  CHECK(window_of("\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":0") == 6);
  CHECK(window_of("\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":-1") == 6);
  CHECK(window_of("\"use_sliding_window\":true") == 0);  // 4096 from layer 28 on: no layer here
  CHECK(window_of("\"use_sliding_window\":true,\"sliding_window\":null,\"max_window_layers\":0") == 0);
  CHECK(window_of("\"use_sliding_window\":false,\"sliding_window\":6,\"max_window_layers\":0") == 0);
  CHECK(window_of("\"use_sliding_window\":false,\"sliding_window\":32768,\"max_window_layers\":21") == 0);  // Qwen 2.5's
  CHECK(window_of("\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":0,"
                  "\"layer_types\":[\"full_attention\",\"attention\"]") == 0);  // layer_types decide
  CHECK(window_of("\"sliding_window\":6,\"use_sliding_window\":true,\"max_window_layers\":2,"
                  "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]") == 6);
  // Some layers without the window: layer 0 full, layer 1 sliding, either way it is said.
  for (const char* keys : {"\"use_sliding_window\":true,\"sliding_window\":6,\"max_window_layers\":1",
                           "\"use_sliding_window\":true,\"sliding_window\":6,\"layer_types\":[\"full_attention\","
                           "\"sliding_attention\"]"}) {
    const ModelConfig h = x.read_replaced(window, keys);
    CHECK(h.sliding_window == 6);
    CHECK(h.full_layer(0));
    CHECK_FALSE(h.full_layer(1));
  }
  const ModelConfig last = x.read_replaced(
      window, "\"use_sliding_window\":true,\"sliding_window\":6,\"layer_types\":[\"sliding_attention\",\"full_attention\"]");
  CHECK((last.window_of(0) == 6 && last.window_of(1) == 0));
  // With 3 layers, full attention on layers 0 and 1 only is no pattern ulysses holds.
  ModelConfig three = small("qwen2");
  three.layers = 3, three.sliding_window = 6;
  HfExport y(three, 11);
  y.drop_metadata();
  CHECK_THROWS_WITH(y.read_replaced("\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attention\"]",
                                    "\"layer_types\":[\"full_attention\",\"full_attention\",\"sliding_attention\"]"),
                    Catch::Contains("config.json") && Catch::Contains("layer_types puts full attention on layers 0, 1"));
  refused("\"use_sliding_window\":false,\"sliding_window\":6,\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]",
          "layer_types has sliding_attention layers but no window");
  refused("\"use_sliding_window\":true,\"sliding_window\":6,\"layer_types\":[\"sliding_attention\",\"chunked_attention\"]",
          "layer_types holds 'chunked_attention'");
  refused("\"use_sliding_window\":true,\"sliding_window\":6,\"layer_types\":[\"sliding_attention\"]",
          "layer_types is not a list of num_hidden_layers (2)");
  refused("\"use_sliding_window\":true,\"sliding_window\":0,\"max_window_layers\":0", "sliding_window 0");
  refused("\"use_sliding_window\":\"yes\"", "use_sliding_window is not true or false");
}

TEST_CASE("a sharded checkpoint (model.safetensors.index.json) imports bit-exactly, shard by shard", "[interop]") {
  HfExport x(small("qwen2"), 8);  // tied: HF may still store lm_head.weight, here in another shard than wte
  std::vector<SafeTensorOut> all = hf_tensors(x.cfg, x.m.params.specs(), x.h.data());
  all.push_back({"lm_head.weight", all[0].shape, all[0].data});
  // Three shards: the tensors dealt out in turn, and an index naming each one's file.
  std::vector<std::vector<SafeTensorOut>> shards(3);
  std::string map;
  for (size_t i = 0; i < all.size(); i++) {
    const std::string file = "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors";
    shards[i % 3].push_back(all[i]);
    map += std::string(map.empty() ? "" : ",") + "\"" + all[i].name + "\":\"" + file + "\"";
  }
  auto write_shards = [&] {
    for (size_t k = 0; k < 3; k++)
      write_safetensors(x.d / ("model-0000" + std::to_string(k + 1) + "-of-00003.safetensors"), shards[k],
                        {{"format", "pt"}}, "F32");
  };
  write_shards();
  const std::string index = x.d / "model.safetensors.index.json";
  auto write_index = [&](const std::string& m) { write_bytes(index, "{\"metadata\":{},\"weight_map\":{" + m + "}}"); };
  write_index(map);
  const SafetensorsIndex idx = read_safetensors_index(index);
  REQUIRE(idx.files.size() == 3);
  const ModelConfig c = hf_read_config(idx);  // from config.json
  CHECK(c.describe() == x.cfg.describe());
  std::vector<float> got(x.h.size(), 42.0f);
  std::vector<size_t> seen;
  hf_import(idx, c, x.m.params.specs(), got.data(), [&](size_t i, size_t n, const std::string&) {
    CHECK(n == 3);
    seen.push_back(i);
  });
  CHECK(seen == std::vector<size_t>{0, 1, 2});
  CHECK(std::memcmp(got.data(), x.h.data(), x.h.size() * 4) == 0);

  auto refused = [&](const std::string& why) {
    CAPTURE(why);
    CHECK_THROWS_WITH(hf_import(read_safetensors_index(index), c, x.m.params.specs(), got.data()), Catch::Contains(why));
  };
  // The index puts a tensor in a shard that does not hold it (and that shard's tensor is unlisted).
  std::string moved = map;
  const std::string e = "\"" + all[0].name + "\":\"model-00001";  // the embedding, dealt to shard 1
  REQUIRE(moved.find(e) != std::string::npos);
  write_index(moved.replace(moved.find(e), e.size(), "\"" + all[0].name + "\":\"model-00002"));
  refused("is not in " + index + "'s weight_map for this file");
  // A shard missing: named as the index is read, before the first shard is (it was found only when
  // the loader reached it, after every shard before it).
  write_index(map);
  std::filesystem::remove(x.d / "model-00003-of-00003.safetensors");
  CHECK_THROWS_WITH(read_safetensors_index(index), Catch::Contains("model-00003-of-00003.safetensors, which is not there"));
  // A tied head that is not the embedding, in its own shard.
  shards[2].back().data[0] += 1.0f;  // lm_head.weight was dealt last: i % 3 == 2 for this model's count
  REQUIRE(shards[2].back().name == "lm_head.weight");
  write_shards();
  refused("lm_head.weight differs from the embedding");
  // Malformed indexes.
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"{\"metadata\":{}}", "no \"weight_map\" object"},
           {"{\"weight_map\":{}}", "names no tensor"},
           {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "is not a .safetensors file name"},
           {"{\"weight_map\":{\"a\":7}}", "is not a string"},
           {"[1]", "not a JSON object"}}) {
    write_bytes(index, text);
    CAPTURE(text);
    CHECK_THROWS_WITH(read_safetensors_index(index), Catch::Contains(index) && Catch::Contains(why));
  }
}

TEST_CASE("import accepts HF's gpt2 variants and refuses mismatched files", "[interop]") {
  Context ctx;
  ContextGuard g(ctx);
  Transformer m(small("gpt2"));
  const std::vector<float> h = random_params(m, 4);
  std::vector<SafeTensorOut> ts = hf_tensors(m.cfg, m.params.specs(), h.data());
  TempDir d;
  const std::string p = d / "model.safetensors";
  const std::map<std::string, std::string> meta = hf_metadata(m.cfg);
  std::vector<float> got(h.size());
  auto import = [&](const std::vector<SafeTensorOut>& t) {
    write_safetensors(p, t, meta, "F32");
    SafetensorsFile f(p);
    hf_import(f, m.cfg, m.params.specs(), got.data());
  };
  // Bare names (HF's own gpt2 files), the causal-mask buffers, and a tied lm_head copy all load.
  std::vector<SafeTensorOut> bare = ts;
  for (SafeTensorOut& t : bare) t.name = t.name.substr(12);
  bare.push_back({"h.0.attn.bias", {1, 1, 4, 4}, std::vector<float>(16, 1.0f)});
  bare.push_back({"lm_head.weight", ts[0].shape, ts[0].data});
  import(bare);
  CHECK(got == h);
  std::vector<SafeTensorOut> bad = ts;
  bad.push_back({"lm_head.weight", ts[0].shape, std::vector<float>(ts[0].data.size(), 0.5f)});
  CHECK_THROWS_WITH(import(bad), Catch::Contains(p) && Catch::Contains("differs from the embedding"));
  bad = ts;
  bad.push_back({"transformer.h.9.mlp.c_fc.weight", {1}, {0}});
  CHECK_THROWS_WITH(import(bad), Catch::Contains("unexpected tensor 'transformer.h.9.mlp.c_fc.weight'"));
  bad = ts;
  bad.erase(bad.begin() + 5);
  CHECK_THROWS_WITH(import(bad), Catch::Contains("missing tensor '" + ts[5].name + "'"));
  bad = ts;
  std::swap(bad[4].shape[0], bad[4].shape[1]);  // c_attn.weight stored untransposed
  CHECK_THROWS_WITH(import(bad), Catch::Contains("'" + ts[4].name + "' has shape (96, 32), expected (32, 96)"));
  // No metadata and no config.json: the error says where the config should have come from.
  write_safetensors(p, ts, {{"format", "pt"}}, "F32");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains(p) && Catch::Contains("config.json"));
  write_bytes(d / "config.json", R"({"model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"n_positions":16,"vocab_size":50,"activation_function":"relu"})");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains("activation_function"));
  // gelu_fast: transformers' FastGELU, the tanh formula written another way, is the model's GELU.
  for (const char* act : {"gelu_new", "gelu_fast", "gelu_pytorch_tanh"}) {
    CAPTURE(act);
    write_bytes(d / "config.json", R"({"model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"n_positions":16,"vocab_size":50,"activation_function":")" +
                                       std::string(act) + "\"}");
    CHECK(hf_read_config(SafetensorsFile(p)).dim == 32);
  }
  // Attention scaled otherwise (Stanford CRFM's GPT-2s also divide by the layer's index): refused.
  const std::string gpt2 = R"({"model_type":"gpt2","n_embd":32,"n_layer":2,"n_head":4,"n_positions":16,"vocab_size":50)";
  write_bytes(d / "config.json", gpt2 + R"(,"scale_attn_by_inverse_layer_idx":true})");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains("scale_attn_by_inverse_layer_idx is true"));
  write_bytes(d / "config.json", gpt2 + R"(,"scale_attn_weights":false})");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains("scale_attn_weights is false"));
  write_bytes(d / "config.json", gpt2 + R"(,"tie_word_embeddings":false})");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains("tie_word_embeddings is false"));
  write_bytes(d / "config.json", gpt2 + R"(,"scale_attn_weights":true,"scale_attn_by_inverse_layer_idx":false})");
  CHECK(hf_read_config(SafetensorsFile(p)).dim == 32);  // transformers' defaults, written out
  write_bytes(d / "config.json", R"({"model_type":"bert"})");
  CHECK_THROWS_WITH(hf_read_config(SafetensorsFile(p)), Catch::Contains("model_type 'bert'"));
}

TEST_CASE("train exports llm.c and safetensors files that load back to the same model", "[interop][cli]") {
  using namespace ul_test;
  TempDir d;
  write_bytes(d / "t.txt", std::string(4000, 'a') + "the quick brown fox jumps over the lazy dog. " + std::string(2000, 'b'));
  const std::string common = " --data text:" + d / "t.txt" + " --seq 32 --batch 2 --threads 1 --eval-batches 1";
  const std::string sample = " --sample 12 --prompt 'the q' --temperature 0";
  for (const std::string arch : {"gpt2", "llama"}) {
    CAPTURE(arch);
    const std::string st = d / (arch + "/model.safetensors"), llmc = d / (arch + ".bin");
    CmdResult r = run_cmd(train_cmd("--model " + arch + common + " --steps 2 --export-safetensors " + st + sample +
                                    (arch == "gpt2" ? " --export-llmc " + llmc + " --export-llmc-version 3" : "")));
    REQUIRE(r.code == 0);
    const std::string text = r.out.substr(r.out.rfind("\n", r.out.size() - 2) + 1);  // the sampled line
    CHECK(text.rfind("the q", 0) == 0);
    CHECK(fs::exists(d / (arch + "/config.json")));
    std::vector<std::string> ckpts = {st};
    if (arch == "gpt2") ckpts.push_back(llmc);
    if (arch == "llama") {  // the same weights as a sharded checkpoint: two shards and an index, beside config.json
      const SafetensorsFile f(st);
      std::vector<SafeTensorOut> part[2];
      std::string map;
      for (size_t i = 0; i < f.tensors().size(); i++) {
        const SafeTensorInfo& t = f.tensors()[i];
        part[i % 2].push_back({t.name, t.shape, f.to_f32(t)});
        map += std::string(i ? "," : "") + "\"" + t.name + "\":\"part" + std::to_string(i % 2) + ".safetensors\"";
      }
      for (int k = 0; k < 2; k++) write_safetensors(d / ("llama/part" + std::to_string(k) + ".safetensors"), part[k], {}, "F32");
      write_bytes(d / "llama/model.safetensors.index.json", "{\"weight_map\":{" + map + "}}");
      ckpts.push_back(d / "llama/model.safetensors.index.json");
    }
    for (const std::string& ck : ckpts) {
      CmdResult again = run_cmd(train_cmd(common + " --steps 0 --checkpoint " + ck + sample));
      REQUIRE(again.code == 0);
      if (ck.find("index") != std::string::npos) CHECK(again.out.find("load    | shard 2/2: ") != std::string::npos);
      CHECK(again.out.substr(again.out.rfind("\n", again.out.size() - 2) + 1) == text);  // same weights, same greedy text
    }
    // --export-dtype bf16 through the command line: every tensor BF16, each the f32 export's value
    // rounded (the flag was tested only in a refusal; the writer only when called directly).
    const std::string half = d / (arch + "_bf16/model.safetensors");
    REQUIRE(run_cmd(train_cmd(common + " --steps 0 --checkpoint " + st + " --export-safetensors " + half +
                              " --export-dtype bf16")).code == 0);
    const SafetensorsFile full(st), bf(half);
    REQUIRE(bf.tensors().size() == full.tensors().size());
    for (size_t i = 0; i < bf.tensors().size(); i++) {
      CAPTURE(bf.tensors()[i].name);
      CHECK(bf.tensors()[i].dtype == "BF16");
      const std::vector<float> a = full.to_f32(full.tensors()[i]), b = bf.to_f32(bf.tensors()[i]);
      REQUIRE(a.size() == b.size());
      for (size_t k = 0; k < a.size(); k += 97) CHECK(std::fabs(b[k] - a[k]) <= std::fabs(a[k]) * (1.0 / 256));
    }
  }
  // Refused before any step: llama has no llm.c format; bad version, name or dependent flags.
  for (const std::string& bad : std::vector<std::string>{"--model llama --export-llmc " + d / "x.bin", "--export-llmc x.bin --export-llmc-version 4",
                                "--export-safetensors " + d / "x.bin", "--prompt hi", "--export-dtype bf16",
                                "--sample 4 --prompt 'caf\xc3\xa9' --vocab 128"}) {
    CAPTURE(bad);
    CmdResult r = run_cmd(train_cmd(common + " --steps 1 " + bad));
    CHECK(r.code != 0);
    CHECK(r.out.find("step ") == std::string::npos);
  }
}

TEST_CASE("a YaRN export whose factor x orig is not whole says which factor transformers 4.51-4.55 will read",
          "[interop][cli]") {
  using namespace ul_test;
  TempDir d;
  const std::string base = "--model llama --layers 1 --dim 32 --heads 2 --steps 0 --threads 1 --seq 32 ";
  CmdResult r = run_cmd(train_cmd(base + "--rope-scaling yarn:factor=2.5,orig=13 --export-safetensors " + d / "a/m.safetensors"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | config.json's max_position_embeddings 33 is yarn's factor x orig (2.5 x 13) rounded: "
                   "transformers 4.51 to 4.55 take the factor from it, 2.53846, not 2.5") != std::string::npos);
  CHECK(read_whole_file(d / "a/config.json").find("\"max_position_embeddings\":33") != std::string::npos);
  // Whole, nothing to say: 32; and 1.1 x 1000, 1100 though 1.1 is not exact as a float.
  int k = 0;
  for (const char* spec : {"yarn:factor=2,orig=16", "yarn:factor=1.1,orig=1000"}) {
    CAPTURE(spec);
    r = run_cmd(train_cmd(base + "--rope-scaling " + spec + " --export-safetensors " + d / ("b" + std::to_string(k++)) +
                          "/m.safetensors"));
    REQUIRE(r.code == 0);
    CHECK(r.out.find("max_position_embeddings") == std::string::npos);
    CHECK(r.out.find("yarn truncate=0") == std::string::npos);
  }
  // truncate=0 (gpt-oss's ramp): transformers that predate the key would round the ramp anyway.
  r = run_cmd(train_cmd(base + "--rope-scaling yarn:factor=2,orig=16,truncate=0 --export-safetensors " + d / "c/m.safetensors"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | yarn truncate=0 is written as \"truncate\": false; transformers versions that predate the "
                   "key") != std::string::npos);
}

TEST_CASE("an export beside a sharded checkpoint's index says the config.json it writes does not describe those shards",
          "[interop][cli]") {
  // A run that imported DIR's shards and exports to DIR/model.safetensors replaces DIR/config.json:
  // --checkpoint DIR/model.safetensors.index.json would then read the old shards with the new config.
  using namespace ul_test;
  TempDir d;
  const std::string base = "--model llama --layers 1 --dim 32 --heads 2 --steps 0 --threads 1 --seq 32 ";
  fs::create_directories(d / "a");
  write_bytes(d / "a/model.safetensors.index.json", "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\"}}");
  CmdResult r = run_cmd(train_cmd(base + "--export-safetensors " + d / "a/model.safetensors"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("note    | --export-safetensors " + d / "a/model.safetensors" + ": " + d / "a/model.safetensors.index.json" +
                   " beside it lists a sharded checkpoint's files") != std::string::npos);
  // Alone in its directory: nothing to say.
  r = run_cmd(train_cmd(base + "--export-safetensors " + d / "b/model.safetensors"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sharded checkpoint") == std::string::npos);
}
