// Hugging Face transformers interop: our parameters <-> the tensor names and layouts of
// GPT2LMHeadModel and LlamaForCausalLM, in a safetensors file with a config.json beside it.
// Qwen2ForCausalLM (a q/k/v bias), MistralForCausalLM (a sliding window) and MinistralForCausalLM
// (a window some layers leave out) are llama's names and layout: a llama is written as qwen2 when
// it has the bias, else as mistral when every layer has a window, ministral when some do not.
//
// gpt2 (tied head: no lm_head.weight is written, as save_pretrained does for tied models; HF ties it):
//   transformer.wte.weight (V,C)  rows [0, V) of wte      transformer.wpe.weight (maxT,C)
//   transformer.h.{l}.ln_1.weight / .bias                 transformer.h.{l}.ln_2.weight / .bias
//   transformer.h.{l}.attn.c_attn.weight (C,3C) = qkvw^T  .attn.c_attn.bias (3C)
//   transformer.h.{l}.attn.c_proj.weight (C,C) = attprojw^T, .attn.c_proj.bias
//   transformer.h.{l}.mlp.c_fc.weight (C,4C) = fcw^T, .bias   .mlp.c_proj.weight (4C,C) = fcprojw^T, .bias
//   transformer.ln_f.weight / .bias
//   (HF's Conv1D computes x W + b, so its weights are our x W^T matrices transposed.)
// llama (HF's rotary embedding is rotate-half on q/k as stored — ours — so nothing is permuted):
//   model.embed_tokens.weight (V,C)          model.layers.{l}.input_layernorm.weight
//   model.layers.{l}.self_attn.q_proj / k_proj / v_proj.weight = qkvw rows [q | k | v]
//   model.layers.{l}.self_attn.o_proj.weight = attprojw
//   model.layers.{l}.post_attention_layernorm.weight
//   model.layers.{l}.mlp.gate_proj / up_proj.weight = fcw rows [gate | up], mlp.down_proj.weight = fcprojw
//   model.norm.weight                        lm_head.weight (V,C) rows [0, V) of lm_head
//
// The file's __metadata__ holds format=pt (transformers requires it) and our config (arch, layers,
// dim, heads, kv_heads, vocab, max_seq, ffn, rope_theta, norm_eps, sliding_window, ...), so the
// file alone reloads here.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/hf_index.h"
#include "engine/json.h"
#include "engine/params.h"
#include "engine/safetensors.h"
#include "layers/transformer.h"

namespace ul {

inline bool is_safetensors_path(const std::string& p) {
  const std::string ext = ".safetensors";
  return p.size() >= ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0;
}

// The HF tensors of a model whose parameters (our layout, `specs` offsets) are in host memory.
std::vector<SafeTensorOut> hf_tensors(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* data);
std::map<std::string, std::string> hf_metadata(const ModelConfig& cfg);
// config.json text for AutoModelForCausalLM; torch_dtype "float32" or "bfloat16".
std::string hf_config_json(const ModelConfig& cfg, const std::string& torch_dtype);
// The max_position_embeddings it writes for a llama: max_seq, or with YaRN factor x the original
// context (transformers 4.51 to 4.55 take YaRN's factor from that ratio) where that is below 2^31.
// Read back, the model's max_seq is this.
int hf_max_position_embeddings(const ModelConfig& cfg);

// Writes `path` (dtype "F32" or "BF16") and config.json in the same directory, both atomically.
// Name the file DIR/model.safetensors so that from_pretrained(DIR) finds it.
void export_safetensors(const std::string& path, const ModelConfig& cfg, const std::vector<ParamSpec>& specs,
                        const float* data, const std::string& dtype);

// The model configuration of a safetensors file: from our __metadata__, else from the config.json
// beside it (HF keys, model_type gpt2, llama, mistral, ministral or qwen2). Throws naming the file and the
// field on anything we cannot run exactly (Qwen 2's window on some layers only, say).
ModelConfig hf_read_config(const SafetensorsFile& f);
// A sharded checkpoint's configuration: the config.json beside its index.
ModelConfig hf_read_config(const SafetensorsIndex& idx);
// The model a config.json describes (HF keys, as above), checked as a checkpoint's is; throws
// naming `where` and the field. hf_config_json's output reads back as the model it was written for.
ModelConfig hf_config_from_json(const JsonValue& j, const std::string& where);
// Fills `data` (our layout; vocabulary pad rows zeroed) from the HF tensors of `f`. Every expected
// tensor must be there once with the expected shape; an unexpected tensor is an error (HF's
// buffers attn.bias / attn.masked_bias / rotary_emb.inv_freq are skipped; a tied model's
// lm_head.weight must equal the embedding).
void hf_import(const SafetensorsFile& f, const ModelConfig& cfg, const std::vector<ParamSpec>& specs, float* data);
// The same from the shards of an index, opened one at a time (so one shard is in memory beside
// `data`); each shard must hold exactly the tensors the index's weight_map gives it.
// `progress(i, n, file)` is called before shard i of n is read.
void hf_import(const SafetensorsIndex& idx, const ModelConfig& cfg, const std::vector<ParamSpec>& specs, float* data,
               const std::function<void(size_t, size_t, const std::string&)>& progress = nullptr);

// The parsed config.json beside `path` (throws naming both when it is missing or malformed; `why`
// says why it was needed).
JsonValue hf_sibling_config(const std::string& path, const std::string& why);
std::string hf_dir_of(const std::string& path);  // "." for a bare file name

}  // namespace ul
