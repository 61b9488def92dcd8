// Writes small valid inputs of every parsed format into DIR/TARGET/ — the seed corpora of the fuzz
// targets (run.sh). Seeds come from the project's own writers where one exists, so the fuzzer
// starts from files the readers accept and mutates its way into the corners. DIR/regressions/
// TARGET/ holds inputs of bugs found before, each run once by run.sh (too big or too rare to seed).
//   make_seeds DIR
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/shards.h"
#include "engine/checkpoint_files.h"
#include "engine/file_io.h"
#include "engine/hf_format.h"
#include "engine/llmc_format.h"
#include "engine/safetensors.h"
#include "fuzz_util.h"

namespace fs = std::filesystem;

namespace {

std::string root;

std::string seed(const std::string& target, const std::string& name) {
  fs::create_directories(fs::path(root) / target);
  return (fs::path(root) / target / name).string();
}
std::string regression(const std::string& target, const std::string& name) { return seed("regressions/" + target, name); }

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <class T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string header(std::vector<int32_t> words) {
  words.resize(256, 0);
  return std::string(reinterpret_cast<const char*>(words.data()), 1024);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  root = argv[1];
  const ul::LlmcConfig c = fuzz::tiny_llmc_config();
  const size_t n = ul::llmc_gpt2_num_params(c);
  std::vector<float> params(n);
  for (size_t i = 0; i < n; i++) params[i] = 0.01f * float(i % 17) - 0.05f;

  // llm.c checkpoints: version 3 (fp32) and 5 (bf16).
  ul::write_llmc_checkpoint(seed("llmc_checkpoint", "v3.bin"), c, params.data(), 3);
  ul::write_llmc_checkpoint(seed("llmc_checkpoint", "v5.bin"), c, params.data(), 5);
  // Regression: L = 2^30, C = 8937 * 2^17, Vp = 1789089121 made the size_t parameter count wrap
  // around 2^64 to 2^19, which this 1 MiB file matched: the reader accepted a model of ~2^66 weights.
  std::string wrap = header({20240326, 5, 1, 1, 1 << 30, 1, 8937 << 17, 1789089121});
  wrap.resize(wrap.size() + (size_t(1) << 20));
  write(regression("llmc_checkpoint", "count_wraps.bin"), wrap);

  // llm.c debug state for the same model: B = 1, T = 2.
  const int B = 1, T = 2;
  std::string st = header({20240327, 2, B, T});
  for (int32_t x : {1, 2}) put(st, x);
  for (int32_t y : {2, -1}) put(st, y);
  for (int i = 0; i < B * T * c.vocab; i++) put(st, 0.1f * float(i));
  put(st, 1.5f);
  for (float p : params) put(st, p);
  write(seed("llmc_state", "state.bin"), st);

  // Token shards: uint16 GPT-2 and uint32 llama-3.
  std::string s16 = header({20240520, 1, 9}), s32 = header({20240801, 7, 9});
  for (uint32_t t : {50256u, 1u, 2u, 3u, 50256u, 4u, 5u, 6u, 7u}) put(s16, uint16_t(t)), put(s32, t + 70000u);
  write(seed("shards", "gpt2.bin"), s16);
  write(seed("shards", "llama3.bin"), s32);
  // train prepare's: the header names vocab 257 and end-of-text 256 (data/shards.h).
  std::string named = header({20240520, 1, 9, ul::kShardTag, 257, 256});
  for (uint32_t t : {256u, 1u, 2u, 3u, 256u, 4u, 5u, 6u, 7u}) put(named, uint16_t(t));
  write(seed("shards", "prepared.bin"), named);

  // Our checkpoint files.
  ul::ModelConfig mc;
  mc.arch = "llama", mc.layers = 1, mc.dim = 8, mc.heads = 2, mc.kv_heads = 1, mc.vocab = 5, mc.padded_vocab = 8;
  ul::write_model_file(seed("model_file", "model.bin"), mc, params.data(), 12);
  mc.rope_scaling = ul::parse_rope_scaling("llama3:factor=8,low=1,high=4,orig=64");  // version 2
  ul::write_model_file(seed("model_file", "model_v2.bin"), mc, params.data(), 12);
  mc.rope_scaling = ul::parse_rope_scaling("yarn:factor=4,orig=64");  // version 3
  mc.qkv_bias = true, mc.norm_eps = 1e-6f;
  ul::write_model_file(seed("model_file", "model_v3.bin"), mc, params.data(), 12);
  mc.sliding_window = 3;  // version 4
  ul::write_model_file(seed("model_file", "model_v4.bin"), mc, params.data(), 12);
  // Hugging Face config.json files, as ulysses writes them: llama (YaRN, biased: qwen2 with every
  // layer sliding), mistral, ministral, plain llama, gpt2.
  write(seed("hf_config", "qwen2_window.json"), ul::hf_config_json(mc, "float32"));
  mc.qkv_bias = false;
  write(seed("hf_config", "mistral.json"), ul::hf_config_json(mc, "bfloat16"));
  {
    ul::ModelConfig hybrid = mc;  // two layers, the second without the window: ministral
    hybrid.layers = 2, hybrid.full_every = 2, hybrid.full_first = 1;
    write(seed("hf_config", "ministral.json"), ul::hf_config_json(hybrid, "float32"));
  }
  mc.sliding_window = 0, mc.rope_scaling = ul::RopeScaling{};
  write(seed("hf_config", "llama.json"), ul::hf_config_json(mc, "float32"));
  // Found by fuzzing: a theta past float's range read as inf, accepted, then written as "inf".
  write(regression("hf_config", "theta_past_float.json"),
        R"({"model_type":"llama","vocab_size":5,"hidden_size":8,"intermediate_size":64,"num_hidden_layers":1,)"
        R"("num_attention_heads":2,"rope_parameters":{"rope_type":"default","rope_theta":8.8e49}})");
  // Found by fuzzing: a yarn original context past an int, cast from a double (undefined behaviour).
  write(regression("hf_config", "yarn_orig_past_int.json"),
        R"({"model_type":"llama","vocab_size":5,"hidden_size":8,"intermediate_size":64,"num_hidden_layers":1,)"
        R"("num_attention_heads":2,"rope_parameters":{"rope_type":"yarn","factor":4,)"
        R"("original_max_position_embeddings":5.5e92}})");
  ul::ModelConfig g;
  g.vocab = 50257, g.padded_vocab = 50304;
  write(seed("hf_config", "gpt2.json"), ul::hf_config_json(g, "float32"));
  ul::OptimShard os;
  os.t = 3, os.numel = 10, os.offset = 4, os.count = 3, os.shard = 1, os.shards = 2;
  os.m = {0.1f, 0.2f, 0.3f}, os.v = {1e-3f, 2e-3f, 3e-3f};
  ul::write_optim_file(seed("optim_file", "optim_rank_1.bin"), os);
  // Regression: offset 2^64 - 1 made offset + count wrap to 2, and the reader accepted the header.
  os.offset = ~uint64_t(0);
  ul::write_optim_file(regression("optim_file", "offset_wraps.bin"), os);
  ul::JsonLine j;
  j.add("format", "ulysses-rank").add("version", 1).add("step", 20).add("data", "shards:a \"b\"\\c\n");
  j.add("rope_theta", 10000.0).add_raw("seed", "18446744073709551615");
  write(seed("rank_json", "rank_0.json"), j.str() + "\n");

  // Command lines, NUL-separated.
  auto cli = [](std::vector<std::string> words) {
    std::string s;
    for (size_t i = 0; i < words.size(); i++) s += (i ? std::string(1, '\0') : "") + words[i];
    return s;
  };
  write(seed("cli", "train.txt"), cli({"--model", "llama", "--seq", "128", "--sp", "2", "--data", "text:a.txt",
                                       "--doc-mask", "--eot=10", "--memory", "24G", "--plan", "--lr", "1e-3",
                                       "--sliding-window", "64"}));
  write(seed("cli", "sample.txt"), cli({"--probe-lengths", "64,128,256", "--sample", "8", "--top-p", "0.9",
                                        "--sample-every", "5", "--prompt-file", "p.txt", "--top-k", "3"}));
  write(seed("cli", "prepare.txt"), cli({"--out", "dir", "--val-frac", "0.1", "--shard-tokens", "1000", "--eot", "0",
                                         "a.txt", "b.txt"}));

  // llm.c tokenizer, version 2: tokens "a", "bc", "<|e|>" (the EOT, id 2).
  std::string tok = header({20240328, 2, 3, 2});
  for (std::string t : {"a", "bc", "<|e|>"}) tok += char(t.size()) + t;
  write(seed("tokenizer", "tokenizer.bin"), tok);
  // A Hugging Face tokenizer.json of GPT-2's layout: tokens "a", "b", "ab", the merge a + b, an EOT.
  // Qwen 2's layout (NFC, its Split, added tokens that are not special): the committed test fixture.
  write(seed("tokenizer", "qwen2.json"), ul::read_whole_file("tests/data/bpe_tiny_qwen2.json"));
  // A sharded checkpoint's index.
  write(seed("hf_index", "model.safetensors.index.json"),
        R"({"metadata":{"total_size":24},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
        R"("model.norm.weight":"model-00002-of-00002.safetensors"}})");
  write(seed("tokenizer", "tokenizer.json"),
        R"({"added_tokens":[{"id":3,"content":"<|endoftext|>","special":true}],"normalizer":null,)"
        R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
        R"("model":{"type":"BPE","dropout":null,"ignore_merges":false,"vocab":{"a":0,"b":1,"ab":2},)"
        R"("merges":[["a","b"]]}})");
  // JSON Lines for prepare: escapes, a surrogate pair, a blank line, CRLF, another field, a BOM.
  write(seed("jsonl", "docs.jsonl"), "\xef\xbb\xbf{\"text\": \"a\\nb \\u00e9\\ud83d\\ude00\", \"id\": 1}\n\n"
                                     "{\"meta\": {\"x\": [1, NaN]}, \"text\": \"\"}\r\n{\"text\":\"c\"}");
  // A JSON array of documents (read as docs.json too): braces and escapes in strings, nesting.
  write(seed("jsonl", "array.json"), "\xef\xbb\xbf [\n {\"text\": \"a { b \\\" ] \\\\\"},\n {\"m\": [{}, []], \"text\": \"\"}\n]\n");
  // Texts for the BPE encoder: words, contractions, runs of white space, non-ASCII classes.
  write(seed("bpe", "words.txt"), "the thing's in  the\n\n  ring, don't 123 4.5!\t\t<|endoftext|>");
  write(seed("bpe", "unicode.txt"), "café é! Москва 東京 🙂 ½Ⅻ a\u00a0b\u3000c e\u0301 \x1c");

  // safetensors: F32 and BF16, with metadata.
  std::vector<ul::SafeTensorOut> ts = {{"w", {2, 2}, {1, 2, 3, 4}}, {"b", {3}, {0.5f, -1, 2}}};
  ul::write_safetensors(seed("safetensors", "f32.safetensors"), ts, {{"format", "pt"}}, "F32");
  ul::write_safetensors(seed("safetensors", "bf16.safetensors"), ts, {}, "BF16");
  return 0;
}
