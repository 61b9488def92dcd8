// The model configuration side of Hugging Face interop (engine/hf_format.h): our __metadata__ keys,
// the config.json that AutoModelForCausalLM reads, and reading either back into a ModelConfig.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/hf_format.h"
#include "engine/json.h"

namespace ul {

std::string hf_dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::map<std::string, std::string> hf_metadata(const ModelConfig& c) {
  char theta[32];
  std::snprintf(theta, sizeof theta, "%.9g", double(c.rope_theta));  // 9 digits: any float exactly
  return {{"format", "pt"},
          {"arch", c.arch},
          {"layers", std::to_string(c.layers)},
          {"dim", std::to_string(c.dim)},
          {"heads", std::to_string(c.heads)},
          {"kv_heads", std::to_string(c.kv_heads)},
          {"vocab", std::to_string(c.vocab)},
          {"max_seq", std::to_string(c.max_seq)},
          {"ffn", std::to_string(c.ffn_dim())},
          {"rope_theta", theta},
          {"rope_scaling", rope_scaling_str(c.rope_scaling)},
          {"tie_embeddings", c.tie_embeddings ? "true" : "false"},
          {"qkv_bias", c.qkv_bias ? "true" : "false"},
          {"norm_eps", float_text(c.norm_eps)},
          {"sliding_window", std::to_string(c.sliding_window)},
          {"full_attention_every", std::to_string(c.full_every)},
          {"full_attention_first", std::to_string(c.full_first)}};
}

namespace {

// HF's rope scaling keys (rope_scaling in transformers 4.x, rope_parameters in 5.x: the same
// names, plus rope_theta in the latter).
JsonLine hf_rope_json(const ModelConfig& c, bool with_theta) {
  JsonLine r;
  const RopeScaling& s = c.rope_scaling;
  const char* type = s.kind == RopeScaling::kLinear   ? "linear"
                     : s.kind == RopeScaling::kLlama3 ? "llama3"
                     : s.kind == RopeScaling::kYarn   ? "yarn"
                                                      : "default";
  r.add("rope_type", type);
  if (with_theta) r.add("rope_theta", double(c.rope_theta), 9);
  if (s.kind != RopeScaling::kNone) r.add("factor", double(s.factor), 9);
  if (s.kind == RopeScaling::kLlama3)
    r.add("low_freq_factor", double(s.low_freq_factor), 9)
        .add("high_freq_factor", double(s.high_freq_factor), 9)
        .add("original_max_position_embeddings", s.original_max_pos);
  if (s.kind == RopeScaling::kYarn)
    r.add("original_max_position_embeddings", s.original_max_pos)
        .add("beta_fast", double(s.beta_fast), 9)
        .add("beta_slow", double(s.beta_slow), 9)
        .add("attention_factor", double(s.attention_factor), 9)
        .add_raw("truncate", s.truncate ? "true" : "false");
  return r;
}

// The window and which layers have it, as Ministral's and Qwen 2's configs say it: sliding_window
// and one layer_types entry per layer.
void add_layer_windows(JsonLine& j, const ModelConfig& c) {
  std::string types = "[";
  for (int l = 0; l < c.layers; l++)
    types += std::string(l ? "," : "") + (c.full_layer(l) ? "\"full_attention\"" : "\"sliding_attention\"");
  j.add("sliding_window", c.sliding_window).add_raw("layer_types", types + "]");
}

}  // namespace

int hf_max_position_embeddings(const ModelConfig& c) {
  // A YaRN model's is factor x its original context, as DeepSeek-V3's config has it: transformers
  // 4.51 to 4.55 take the factor from that ratio whenever original_max_position_embeddings is
  // given, whatever factor the file says (a Llama's max_seq changes nothing it computes, so the
  // model runs the same). Past an int (no real model's), max_seq: a file readers can take.
  const RopeScaling& rs = c.rope_scaling;
  if (!c.is_llama() || rs.kind != RopeScaling::kYarn) return c.max_seq;
  const double scaled = std::round(double(rs.factor) * double(rs.original_max_pos));
  return scaled >= 1 && scaled < 2147483648.0 ? int(scaled) : c.max_seq;
}

std::string hf_config_json(const ModelConfig& c, const std::string& torch_dtype) {
  JsonLine j;
  if (!c.is_llama()) {
    j.add_raw("architectures", "[\"GPT2LMHeadModel\"]").add("model_type", "gpt2").add("vocab_size", c.vocab);
    j.add("n_positions", c.max_seq).add("n_ctx", c.max_seq).add("n_embd", c.dim).add("n_layer", c.layers);
    j.add("n_head", c.heads).add_raw("n_inner", "null").add("activation_function", "gelu_new");  // tanh GELU
    j.add_raw("layer_norm_epsilon", "1e-05").add_raw("tie_word_embeddings", "true");
    for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j.add_raw(p, "0.0");
    // HF's defaults (50256) name GPT-2's <|endoftext|>: right only for GPT-2's own vocabulary.
    if (c.vocab != 50257) j.add_raw("bos_token_id", "null").add_raw("eos_token_id", "null");
  } else {
    // A q/k/v bias is Qwen 2's attention (Llama's attention_bias would also put one on o_proj); a
    // window without one is Mistral's (Llama's names and layout, one window for every layer), or
    // with some layers left out of it Ministral's (the same, with layer_types).
    if (c.qkv_bias) {
      j.add_raw("architectures", "[\"Qwen2ForCausalLM\"]").add("model_type", "qwen2");
      j.add_raw("use_sliding_window", c.sliding_window ? "true" : "false");
      // transformers 5.24 follows layer_types; 4.x slides the layers from max_window_layers on,
      // which is every layer when none is left out.
      if (c.sliding_window) add_layer_windows(j, c), j.add("max_window_layers", 0);
    } else if (c.sliding_window && c.full_every) {
      j.add_raw("architectures", "[\"MinistralForCausalLM\"]").add("model_type", "ministral");
      add_layer_windows(j, c);
    } else if (c.sliding_window) {
      j.add_raw("architectures", "[\"MistralForCausalLM\"]").add("model_type", "mistral");
      j.add("sliding_window", c.sliding_window);
    } else {
      j.add_raw("architectures", "[\"LlamaForCausalLM\"]").add("model_type", "llama");
    }
    j.add("vocab_size", c.vocab);
    j.add("hidden_size", c.dim).add("intermediate_size", c.ffn_dim()).add("num_hidden_layers", c.layers);
    j.add("num_attention_heads", c.heads).add("num_key_value_heads", c.kv_heads).add("head_dim", c.head_dim());
    j.add("hidden_act", "silu").add("max_position_embeddings", int64_t(hf_max_position_embeddings(c)));
    j.add_raw("rms_norm_eps", float_text(c.norm_eps));
    // rope_theta for transformers 4.x, rope_parameters for 5.x (each ignores the other's key)
    j.add("rope_theta", double(c.rope_theta), 9);
    j.add_raw("rope_scaling", c.rope_scaling.kind == RopeScaling::kNone ? "null" : hf_rope_json(c, false).str());
    j.add_raw("rope_parameters", hf_rope_json(c, true).str());
    if (!c.qkv_bias && !c.sliding_window) j.add_raw("attention_bias", "false").add_raw("mlp_bias", "false");
    j.add_raw("tie_word_embeddings", c.tie_embeddings ? "true" : "false");
    // Said, not left to transformers' defaults (Llama's and Mistral's: 1 and 2, which in Llama 3's
    // vocabulary is "#": generate() would stop there). The model file does not know its tokenizer's
    // ids; a generation_config.json beside the export (the original model's) gives them.
    j.add_raw("bos_token_id", "null").add_raw("eos_token_id", "null");
  }
  j.add("torch_dtype", torch_dtype);
  return j.str() + "\n";
}

JsonValue hf_sibling_config(const std::string& path, const std::string& why) {
  const std::string cfg_path = hf_dir_of(path) + "/config.json";
  std::string text;
  try {
    text = read_whole_file(cfg_path);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": no model config: " + why + " and " + e.what());
  }
  // (a config holds a value in 4 bytes or more: "0": "a", ...; a quarter bounds a hostile file)
  JsonValue v = parse_json(text, cfg_path, text.size() / 4 + 4096);
  if (!v.is(JsonValue::Kind::object)) throw std::runtime_error(cfg_path + ": not a JSON object");
  return v;
}

namespace {

// A file's layer count, capped (kMaxLayers) before any per-layer work: Qwen 2's and Ministral's
// window lists, and the metadata's comparison text, are one entry a layer.
int layer_count(int n, const std::string& where) {
  if (n > kMaxLayers)
    throw std::runtime_error(where + ": " + std::to_string(n) + " layers: at most " + std::to_string(kMaxLayers));
  return n;
}

// j's key when it is present and not null (transformers reads `get(key) or default` for several).
const JsonValue* non_null(const JsonValue& j, const char* key) {
  const JsonValue* v = j.find(key);
  return v && !v->is(JsonValue::Kind::null) ? v : nullptr;
}

// rope_scaling (4.x) or rope_parameters (5.x): default, linear, llama3 or yarn; other rules
// (dynamic, longrope, ...) are refused. top: the whole config, where yarn finds what its entry
// leaves out, as transformers does: original_max_position_embeddings (top level first, as Phi-3
// keeps it, else max_position_embeddings) and a missing factor (max_position_embeddings / that).
RopeScaling hf_rope_scaling(const JsonValue& o, const JsonValue& top, const std::string& where) {
  if (!o.is(JsonValue::Kind::object)) throw std::runtime_error(where + ": not a JSON object");
  const JsonValue* type = o.find("rope_type");
  if (!type) type = o.find("type");  // older files
  const std::string t = type ? type->as_string(where + ": rope type") : "default";
  if (t != "default" && t != "linear" && t != "llama3" && t != "yarn")
    throw std::runtime_error(where + ": rope scaling '" + t +
                             "' (ulysses runs default, linear, llama3 and yarn; it cannot run this model exactly)");
  // transformers 5.x also takes one entry per layer type ({"full_attention": {...},
  // "sliding_attention": {...}}); read as one entry it was plain RoPE at theta 10000, silently.
  static const char* const kKnown[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                       "high_freq_factor", "original_max_position_embeddings", "beta_fast",
                                       "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim",
                                       "partial_rotary_factor",
                                       "finetuned"};  // (YaRN Llama 2's: transformers ignores it too)
  for (const auto& field : o.fields) {
    const std::string& key = field.first;  // (a name, not a structured binding: lambdas below take it)
    if (field.second.is(JsonValue::Kind::object))
      throw std::runtime_error(where + ": \"" + key + "\" holds its own RoPE (one entry per layer type): ulysses "
                               "runs one RoPE in every layer, and cannot run this model exactly");
    if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; }))
      throw std::runtime_error(where + ": \"" + key + "\" is not a RoPE setting ulysses reads (a misspelt one would "
                               "be left out and the model run otherwise)");
  }
  RopeScaling s;
  auto need = [&](const char* key) -> const JsonValue& {
    const JsonValue* v = o.find(key);
    if (!v) throw std::runtime_error(where + ": rope " + t + " scaling without \"" + key + "\"");
    return *v;
  };
  auto num = [&](const char* key) { return need(key).as_double(where + ": " + key); };
  auto given = [&](const char* key) { return non_null(o, key); };
  // A position count: an integer in [1, 2^31) (a larger one would not fit the int the model keeps).
  auto positions = [&](const JsonValue& v, const char* key) {
    const int64_t n = v.as_int(where + ": " + key);
    if (n < 1 || n > INT32_MAX)
      throw std::runtime_error(where + ": " + key + " " + std::to_string(n) + " is not in [1, 2^31)");
    return int32_t(n);
  };
  // original_max_position_embeddings: in the entry, or at the top level as Phi-3 keeps it. 4.x's
  // llama3 reads only the entry's, 5.x the top level's first: where both are given they must agree.
  const char* orig_key = "original_max_position_embeddings";
  const JsonValue* orig = non_null(top, orig_key);
  if (const JsonValue* in_entry = given(orig_key); in_entry && orig && (t == "llama3" || t == "yarn")) {
    const int32_t a = positions(*orig, orig_key), b = positions(*in_entry, orig_key);
    if (a != b)
      throw std::runtime_error(where + ": original_max_position_embeddings is " + std::to_string(a) +
                               " at the top level and " + std::to_string(b) +
                               " in the rope entry (transformers 4 and 5 would each read another)");
  }
  if (!orig) orig = given(orig_key);
  if (const JsonValue* p = given("partial_rotary_factor"); p && p->as_double(where + ": partial_rotary_factor") != 1)
    throw std::runtime_error(where + ": partial_rotary_factor != 1 (ulysses rotates every pair of a head)");
  if (t == "default") return s;
  if (t == "linear") {
    s.kind = RopeScaling::kLinear;
    s.factor = float(num("factor"));
  } else if (t == "llama3") {
    s.kind = RopeScaling::kLlama3;
    s.factor = float(num("factor")), s.low_freq_factor = float(num("low_freq_factor"));
    s.high_freq_factor = float(num("high_freq_factor"));
    if (!orig) throw std::runtime_error(where + ": rope llama3 scaling without \"original_max_position_embeddings\"");
    s.original_max_pos = positions(*orig, orig_key);
  } else if (t == "yarn") {
    s.kind = RopeScaling::kYarn;
    const JsonValue* max_pos = top.find("max_position_embeddings");
    // 4.x's yarn reads the entry's original_max_position_embeddings or max_position_embeddings,
    // never the top level's, which 5.x reads first: only given in the entry, or equal, is one model.
    if (orig && !given(orig_key) && max_pos && positions(*orig, orig_key) != positions(*max_pos, "max_position_embeddings"))
      throw std::runtime_error(where + ": yarn's original_max_position_embeddings is given at the top level only (" +
                               std::to_string(positions(*orig, orig_key)) + "), where transformers 4 reads "
                               "max_position_embeddings (" + std::to_string(positions(*max_pos, "max_position_embeddings")) +
                               ") instead: give it in the rope entry");
    if (!orig) orig = max_pos, orig_key = "max_position_embeddings";
    if (!orig) throw std::runtime_error(where + ": yarn scaling without original_max_position_embeddings");
    s.original_max_pos = positions(*orig, orig_key);
    if (given("factor")) s.factor = float(num("factor"));
    else if (max_pos) s.factor = float(double(positions(*max_pos, "max_position_embeddings")) / s.original_max_pos);
    else throw std::runtime_error(where + ": yarn scaling without \"factor\"");
    if (given("beta_fast")) s.beta_fast = float(num("beta_fast"));
    if (given("beta_slow")) s.beta_slow = float(num("beta_slow"));
    if (s.beta_fast == 0) s.beta_fast = 32;  // transformers: `beta_fast or 32`, `beta_slow or 1`
    if (s.beta_slow == 0) s.beta_slow = 1;
    // A null truncate is false, as 5.x's `if truncate:` reads get("truncate", True)'s None.
    if (const JsonValue* tr = o.find("truncate")) {
      if (!tr->is(JsonValue::Kind::boolean) && !tr->is(JsonValue::Kind::null))
        throw std::runtime_error(where + ": yarn truncate is not true, false or null");
      s.truncate = tr->is(JsonValue::Kind::boolean) && tr->b;
    }
    // The attention factor: given; or DeepSeek's mscale / mscale_all_dim ratio; or from factor.
    const JsonValue *m = given("mscale"), *m_all = given("mscale_all_dim");
    if (given("attention_factor")) s.attention_factor = float(num("attention_factor"));
    else if (m && m_all && num("mscale") != 0 && num("mscale_all_dim") != 0)
      s.attention_factor = float(yarn_attention_factor(s.factor, num("mscale")) /
                                 yarn_attention_factor(s.factor, num("mscale_all_dim")));
    else s.attention_factor = float(yarn_attention_factor(s.factor));
  } else {
    throw std::runtime_error(where + ": rope scaling '" + t +
                             "' (ulysses runs default, linear, llama3 and yarn; it cannot run this model exactly)");
  }
  check_rope_scaling(s, where);
  return s;
}

// A window size from the config's sliding_window: absent is transformers' default (4096 for both
// Mistral and Qwen 2), null is none (0).
int hf_window_size(const JsonValue& j, const std::string& where) {
  const JsonValue* w = j.find("sliding_window");
  if (!w) return 4096;
  if (w->is(JsonValue::Kind::null)) return 0;
  const int64_t n = w->as_int(where + ": sliding_window");
  if (n < 1 || n > INT32_MAX)  // 0 would leave a query no key at all (transformers' mask: kv > q - 0)
    throw std::runtime_error(where + ": sliding_window " + std::to_string(n) + " is not a positive int or null");
  return int(n);
}

// layer_types (one "full_attention" or "sliding_attention" per layer) as a flag per layer
// (true: it slides); nothing when the config has none.
std::vector<bool> hf_layer_types(const JsonValue& j, int layers, const std::string& where) {
  const JsonValue* types = non_null(j, "layer_types");
  if (!types) return {};
  if (!types->is(JsonValue::Kind::array) || int(types->items.size()) != layers)
    throw std::runtime_error(where + ": layer_types is not a list of num_hidden_layers (" + std::to_string(layers) +
                             ") layer types");
  std::vector<bool> sliding;
  for (const JsonValue& t : types->items) {
    const std::string& name = t.as_string(where + ": layer_types");
    if (name != "full_attention" && name != "attention" && name != "sliding_attention")  // "attention": the old name
      throw std::runtime_error(where + ": layer_types holds '" + name +
                               "' (ulysses runs full_attention and sliding_attention)");
    sliding.push_back(name == "sliding_attention");
  }
  return sliding;
}

// c's window and the layers without it from a window and which layers slide. ulysses holds every
// layer sliding, or all but full_first, full_first + full_every, ...: any other pattern is refused.
void set_layer_windows(ModelConfig& c, int window, const std::vector<bool>& sliding, const std::string& where) {
  std::vector<int> full;
  for (int l = 0; l < int(sliding.size()); l++)
    if (!sliding[l]) full.push_back(l);
  c.sliding_window = c.full_every = c.full_first = 0;
  if (!window || full.size() == sliding.size()) return;  // no layer slides
  c.sliding_window = window;
  if (full.empty()) return;
  c.full_first = full[0];
  // One full layer: a period longer than what follows it (and than its offset).
  c.full_every = full.size() > 1 ? full[1] - full[0] : std::max(c.layers - full[0], full[0] + 1);
  bool same = c.full_first < c.full_every;
  for (int l = 0; l < int(sliding.size()) && same; l++) same = c.full_layer(l) == !sliding[l];
  if (!same)
    throw std::runtime_error(where + ": layer_types puts full attention on layers " + std::to_string(full[0]) +
                             (full.size() > 1 ? ", " + std::to_string(full[1]) + ", ..." : std::string()) +
                             " (ulysses runs every layer sliding or all but layers K, K + N, K + 2N, ... with K < N;"
                             " ulysses cannot run this model exactly)");
}

// Qwen 2, by transformers 5.24's rule (configuration_qwen2.py, modeling_qwen2.py): the window is
// sliding_window when use_sliding_window, else none; layer i slides when layer_types[i] is
// "sliding_attention", or, without layer_types, when there is a window and i >= max_window_layers
// (default 28).
void qwen2_windows(const JsonValue& j, ModelConfig& c, const std::string& where) {
  const JsonValue* use = non_null(j, "use_sliding_window");
  if (use && !use->is(JsonValue::Kind::boolean))
    throw std::runtime_error(where + ": use_sliding_window is not true or false");
  const int window = use && use->b ? hf_window_size(j, where) : 0;
  std::vector<bool> sliding = hf_layer_types(j, c.layers, where);
  if (!sliding.empty() && !window && std::count(sliding.begin(), sliding.end(), true))  // transformers fails too
    throw std::runtime_error(where + ": layer_types has sliding_attention layers but no window (use_sliding_window "
                             "false or sliding_window null; ulysses cannot run this model exactly)");
  if (sliding.empty()) {
    const JsonValue* m = non_null(j, "max_window_layers");
    const int64_t first = m ? m->as_int(where + ": max_window_layers") : 28;
    for (int l = 0; l < c.layers; l++) sliding.push_back(window && l >= first);
  }
  set_layer_windows(c, window, sliding, where);
}

ModelConfig config_from_hf_json(const JsonValue& j, const std::string& where) {
  auto get = [&](const char* key) -> const JsonValue& {
    const JsonValue* v = j.find(key);
    if (!v) throw std::runtime_error(where + ": missing \"" + key + "\"");
    return *v;
  };
  auto num = [&](const char* key) {  // an int: a larger value refused, not wrapped
    const int64_t v = get(key).as_int(where + ": " + key);
    if (v < INT32_MIN || v > INT32_MAX)
      throw std::runtime_error(where + ": " + key + " " + std::to_string(v) + " is out of range");
    return int(v);
  };
  auto refuse_unless = [&](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(where + ": " + what + " (ulysses cannot run this model exactly)");
  };
  auto eps_ok = [&](const char* key) {
    const JsonValue* v = j.find(key);
    refuse_unless(!v || std::fabs(v->as_double(where + ": " + key) - 1e-5) < 1e-12, std::string(key) + " is not 1e-5");
  };
  std::string type = get("model_type").as_string(where + ": model_type");
  // transformers' AutoConfig loads a mistral config that has the key layer_types (null included)
  // as Ministral's, which follows it (configuration_auto.py, 5.24): Ministral-8B's files say
  // "mistral" and list their layers. MistralForCausalLM itself would ignore the list.
  if (type == "mistral" && j.find("layer_types")) type = "ministral";
  ModelConfig c;
  if (type == "gpt2") {
    c.arch = "gpt2";
    c.dim = num("n_embd"), c.layers = layer_count(num("n_layer"), where), c.heads = c.kv_heads = num("n_head");
    c.max_seq = num("n_positions"), c.vocab = num("vocab_size");
    const JsonValue* act = j.find("activation_function");
    // (transformers' names for the one tanh formula: gelu_fast writes it as x (c + c 0.044715 x^2))
    refuse_unless(!act || act->text == "gelu_new" || act->text == "gelu_pytorch_tanh" || act->text == "gelu_fast",
                  "activation_function is not tanh GELU");
    const JsonValue* inner = j.find("n_inner");
    refuse_unless(!inner || inner->is(JsonValue::Kind::null) || inner->as_int(where) == 4 * c.dim, "n_inner is not 4 * n_embd");
    eps_ok("layer_norm_epsilon");
    // Attention scaled otherwise than by 1/sqrt(head dim) (Stanford CRFM's GPT-2s scale by the
    // layer's index too): another model.
    auto flag = [&](const char* key, bool want) {
      const JsonValue* v = j.find(key);
      if (v && !v->is(JsonValue::Kind::null) && !v->is(JsonValue::Kind::boolean))
        throw std::runtime_error(where + ": " + key + " is not true or false");
      refuse_unless(!v || v->is(JsonValue::Kind::null) || v->b == want, std::string(key) + " is " + (want ? "false" : "true"));
    };
    flag("scale_attn_weights", true);
    flag("scale_attn_by_inverse_layer_idx", false);
    // Our GPT-2's head is its embedding: an untied one (transformers reads lm_head.weight, or
    // leaves it random where the file has none) is another model.
    flag("tie_word_embeddings", true);
  } else if (type == "llama" || type == "qwen2" || type == "mistral" || type == "ministral") {
    // Qwen 2: llama with a q/k/v bias; Mistral: llama with a sliding window (or none: null);
    // Ministral: Mistral with layer_types (the layers without the window).
    const bool mistral = type == "mistral" || type == "ministral";
    c.arch = "llama";
    c.qkv_bias = type == "qwen2";
    c.dim = num("hidden_size"), c.layers = layer_count(num("num_hidden_layers"), where),
    c.heads = num("num_attention_heads");
    // A file without num_key_value_heads gets its config class's default, as transformers loads it:
    // LlamaConfig's is the query heads, MistralConfig's (and Ministral's) 8, Qwen2Config's 32.
    // One given as null is the query heads in all three (their __init__ replaces None so).
    const JsonValue* kv = j.find("num_key_value_heads");
    c.kv_heads = kv && !kv->is(JsonValue::Kind::null) ? num("num_key_value_heads")
                 : kv                                  ? c.heads
                 : mistral                             ? 8
                 : c.qkv_bias                          ? 32
                                                       : c.heads;
    c.ffn = num("intermediate_size"), c.vocab = num("vocab_size");
    // transformers' defaults for what the file leaves out (LlamaConfig's, Qwen2Config's, MistralConfig's).
    c.max_seq = j.find("max_position_embeddings") ? num("max_position_embeddings")
                : mistral                           ? 4096 * 32
                : c.qkv_bias                        ? 32768
                                                    : 2048;
    c.norm_eps = 1e-6f;  // all three configs' default rms_norm_eps
    // Mistral (no layer_types: above): one window for every layer; Ministral: layer_types, every
    // layer sliding when it is absent or null and there is a window (MinistralConfig's default).
    if (type == "mistral") c.sliding_window = hf_window_size(j, where);
    if (type == "ministral") {
      const int window = hf_window_size(j, where);
      std::vector<bool> sliding = hf_layer_types(j, c.layers, where);
      if (sliding.empty()) sliding.assign(size_t(c.layers), true);
      set_layer_windows(c, window, sliding, where);
    }
    if (c.qkv_bias) qwen2_windows(j, c, where);
    if (const JsonValue* t = j.find("rope_theta")) c.rope_theta = float(t->as_double(where + ": rope_theta"));
    const JsonValue *act = j.find("hidden_act"), *sc = j.find("rope_scaling"), *hd = j.find("head_dim");
    if (const JsonValue* rp = j.find("rope_parameters"); rp && !rp->is(JsonValue::Kind::null)) {  // transformers 5.x
      if (const JsonValue* t = rp->find("rope_theta")) {
        const float theta = float(t->as_double(where + ": rope_parameters.rope_theta"));
        refuse_unless(!j.find("rope_theta") || theta == c.rope_theta, "rope_theta and rope_parameters.rope_theta differ");
        c.rope_theta = theta;
      }
      c.rope_scaling = hf_rope_scaling(*rp, j, where + ": rope_parameters");
      // Versions of transformers differ in which of the two they read when both are there (4.x:
      // rope_scaling only): a file where they disagree has no one meaning.
      if (sc && !sc->is(JsonValue::Kind::null))
        refuse_unless(rope_scaling_str(hf_rope_scaling(*sc, j, where + ": rope_scaling")) == rope_scaling_str(c.rope_scaling),
                      "rope_scaling and rope_parameters differ");
    } else if (sc && !sc->is(JsonValue::Kind::null)) {
      c.rope_scaling = hf_rope_scaling(*sc, j, where + ": rope_scaling");
    }
    // transformers 4.x reads the factor at the top level (5.x inside rope_parameters, above).
    if (const JsonValue* p = non_null(j, "partial_rotary_factor"))
      refuse_unless(p->as_double(where + ": partial_rotary_factor") == 1,
                    "partial_rotary_factor is not 1");
    refuse_unless(!act || act->text == "silu" || act->text == "swish", "hidden_act is not silu");  // (one function)
    if (const JsonValue* tie = j.find("tie_word_embeddings"))  // LlamaConfig's default: false
      c.tie_embeddings = tie->as_bool(where + ": tie_word_embeddings");
    refuse_unless(!hd || hd->is(JsonValue::Kind::null) || (c.heads > 0 && hd->as_int(where) == c.dim / c.heads),
                  "head_dim is not hidden_size / num_attention_heads");
    if (!mistral)  // MistralForCausalLM has no biases whatever the config says
      for (const char* b : {"attention_bias", "mlp_bias"})
        refuse_unless(!j.find(b) || !j.find(b)->as_bool(where + ": " + b), std::string(b) + " is true");
    if (const JsonValue* e = j.find("rms_norm_eps")) c.norm_eps = float(e->as_double(where + ": rms_norm_eps"));
    refuse_unless(c.norm_eps > 0 && c.norm_eps < 1, "rms_norm_eps is not in (0, 1)");
  } else {
    throw std::runtime_error(where + ": model_type '" + type + "' (ulysses runs gpt2, llama, mistral, ministral and qwen2)");
  }
  return c;
}

int meta_int(const SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw std::runtime_error(f.path() + ": __metadata__ has no '" + key + "'");
  const auto v = parse_json(it->second, f.path() + ": __metadata__ " + key).as_int(f.path() + ": __metadata__ " + key);
  if (v < INT32_MIN || v > INT32_MAX)  // narrowed, 2^32 + 2 layers read as 2
    throw std::runtime_error(f.path() + ": __metadata__ " + key + " " + std::to_string(v) + " is out of range");
  return int(v);
}

// The padded vocabulary and the checks every config read from a file gets, naming `where`.
ModelConfig checked_config(ModelConfig c, const std::string& where) {
  if (c.vocab < 1 || c.vocab > kMaxVocab)
    throw std::runtime_error(where + ": vocab " + std::to_string(c.vocab) + " (must be in [1, " +
                             std::to_string(kMaxVocab) + "])");
  c.padded_vocab = round_up(c.vocab, 128);  // as model_config pads: GEMM-friendly, pad rows never scored
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": model config: " + e.what());
  }
  if (!c.is_llama() && c.ffn > 0 && c.ffn != 4 * c.dim)
    throw std::runtime_error(where + ": gpt2 ffn " + std::to_string(c.ffn) + " is not 4 * dim");
  return c;
}

}  // namespace

namespace {

// The model as it runs: shape, RoPE, eps, and each layer's window. (A pattern "every N from K"
// is not unique: with one exempt layer, several N describe the same model.)
std::string as_run(const ModelConfig& c) {
  ModelConfig flat = c;
  flat.full_every = flat.full_first = 0;
  if (flat.is_llama()) flat.max_seq = 0;  // no weight or result depends on it (a YaRN export's differs)
  std::string s = flat.describe() + " | windows";
  for (int l = 0; l < c.layers; l++) s += " " + std::to_string(c.window_of(l));
  return s;
}

}  // namespace

ModelConfig hf_read_config(const SafetensorsFile& f) {
  ModelConfig c;
  auto arch = f.metadata().find("arch");
  if (arch != f.metadata().end()) {
    c.arch = arch->second;
    c.layers = layer_count(meta_int(f, "layers"), f.path() + ": __metadata__"), c.dim = meta_int(f, "dim");
    c.heads = meta_int(f, "heads");
    c.kv_heads = meta_int(f, "kv_heads"), c.vocab = meta_int(f, "vocab"), c.max_seq = meta_int(f, "max_seq");
    c.ffn = meta_int(f, "ffn");
    auto t = f.metadata().find("rope_theta");
    if (t != f.metadata().end()) c.rope_theta = float(parse_json(t->second, f.path()).as_double(f.path() + ": rope_theta"));
    auto tie = f.metadata().find("tie_embeddings");  // absent in files written before it existed: untied
    c.tie_embeddings = tie != f.metadata().end() && tie->second == "true" && c.arch == "llama";
    auto qb = f.metadata().find("qkv_bias");  // absent in files written before it existed: none
    c.qkv_bias = qb != f.metadata().end() && qb->second == "true" && c.arch == "llama";
    auto eps = f.metadata().find("norm_eps");
    if (eps != f.metadata().end() && c.arch == "llama")
      c.norm_eps = float(parse_json(eps->second, f.path()).as_double(f.path() + ": __metadata__ norm_eps"));
    if (f.metadata().count("sliding_window"))  // absent in files written before it existed: none
      c.sliding_window = meta_int(f, "sliding_window");
    if (f.metadata().count("full_attention_every"))
      c.full_every = meta_int(f, "full_attention_every"), c.full_first = meta_int(f, "full_attention_first");
    auto sc = f.metadata().find("rope_scaling");  // absent in files written before it existed: none
    if (sc != f.metadata().end()) {
      c.rope_scaling = parse_rope_scaling(sc->second, f.path() + ": __metadata__ rope_scaling");
    }
    // A config.json beside it must describe the same model: the metadata wins otherwise, and a
    // config.json edited to another model (or one ulysses cannot run) would go unnoticed.
    const std::string beside = hf_dir_of(f.path()) + "/config.json";
    if (std::filesystem::is_regular_file(beside)) {
      const ModelConfig meta = checked_config(c, f.path());
      const ModelConfig json = checked_config(config_from_hf_json(hf_sibling_config(f.path(), ""), beside), beside);
      if (as_run(meta) != as_run(json))
        throw std::runtime_error(f.path() + ": its __metadata__ and the config.json beside it describe different models (" +
                                 meta.describe() + " against " + json.describe() + "): correct or remove one");
    }
  } else {
    c = config_from_hf_json(hf_sibling_config(f.path(), "the file has no ulysses __metadata__"),
                            hf_dir_of(f.path()) + "/config.json");
  }
  return checked_config(c, f.path());
}

ModelConfig hf_read_config(const SafetensorsIndex& idx) {
  const JsonValue j = hf_sibling_config(idx.path, "a sharded checkpoint's config is its config.json");
  return checked_config(config_from_hf_json(j, hf_dir_of(idx.path) + "/config.json"), idx.path);
}

ModelConfig hf_config_from_json(const JsonValue& j, const std::string& where) {
  return checked_config(config_from_hf_json(j, where), where);
}

}  // namespace ul
