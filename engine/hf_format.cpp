#include "engine/hf_format.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/json.h"

namespace ul {

namespace {

// One HF tensor = rows [r0, r1) of layer `layer` of our parameter `ours`, viewed as a matrix
// (rows, cols) — or a vector when the per-layer slice is 1-D — and transposed for HF's Conv1D.
struct Map {
  std::string hf, ours;
  int layer;  // -1: not stacked
  int64_t r0, r1;
  bool transpose;
};

std::vector<Map> hf_map(const ModelConfig& c) {
  const int64_t C = c.dim, V = c.vocab, F = c.ffn_dim(), D = c.head_dim();
  const int64_t HD = c.heads * D, KD = c.kv_heads * D;
  std::vector<Map> m;
  if (!c.is_llama()) {
    m.push_back({"transformer.wte.weight", "wte", -1, 0, V, false});
    m.push_back({"transformer.wpe.weight", "wpe", -1, 0, c.max_seq, false});
    for (int l = 0; l < c.layers; l++) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      m.push_back({p + "ln_1.weight", "ln1w", l, 0, C, false});
      m.push_back({p + "ln_1.bias", "ln1b", l, 0, C, false});
      m.push_back({p + "attn.c_attn.weight", "qkvw", l, 0, 3 * C, true});
      m.push_back({p + "attn.c_attn.bias", "qkvb", l, 0, 3 * C, false});
      m.push_back({p + "attn.c_proj.weight", "attprojw", l, 0, C, true});
      m.push_back({p + "attn.c_proj.bias", "attprojb", l, 0, C, false});
      m.push_back({p + "ln_2.weight", "ln2w", l, 0, C, false});
      m.push_back({p + "ln_2.bias", "ln2b", l, 0, C, false});
      m.push_back({p + "mlp.c_fc.weight", "fcw", l, 0, F, true});
      m.push_back({p + "mlp.c_fc.bias", "fcb", l, 0, F, false});
      m.push_back({p + "mlp.c_proj.weight", "fcprojw", l, 0, C, true});
      m.push_back({p + "mlp.c_proj.bias", "fcprojb", l, 0, C, false});
    }
    m.push_back({"transformer.ln_f.weight", "lnfw", -1, 0, C, false});
    m.push_back({"transformer.ln_f.bias", "lnfb", -1, 0, C, false});
    return m;
  }
  m.push_back({"model.embed_tokens.weight", "wte", -1, 0, V, false});
  for (int l = 0; l < c.layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.push_back({p + "input_layernorm.weight", "ln1w", l, 0, C, false});
    m.push_back({p + "self_attn.q_proj.weight", "qkvw", l, 0, HD, false});
    m.push_back({p + "self_attn.k_proj.weight", "qkvw", l, HD, HD + KD, false});
    m.push_back({p + "self_attn.v_proj.weight", "qkvw", l, HD + KD, HD + 2 * KD, false});
    if (c.qkv_bias) {  // Qwen 2's
      m.push_back({p + "self_attn.q_proj.bias", "qkvb", l, 0, HD, false});
      m.push_back({p + "self_attn.k_proj.bias", "qkvb", l, HD, HD + KD, false});
      m.push_back({p + "self_attn.v_proj.bias", "qkvb", l, HD + KD, HD + 2 * KD, false});
    }
    m.push_back({p + "self_attn.o_proj.weight", "attprojw", l, 0, C, false});
    m.push_back({p + "post_attention_layernorm.weight", "ln2w", l, 0, C, false});
    m.push_back({p + "mlp.gate_proj.weight", "fcw", l, 0, F, false});
    m.push_back({p + "mlp.up_proj.weight", "fcw", l, F, 2 * F, false});
    m.push_back({p + "mlp.down_proj.weight", "fcprojw", l, 0, C, false});
  }
  m.push_back({"model.norm.weight", "lnfw", -1, 0, C, false});
  if (c.has_lm_head()) m.push_back({"lm_head.weight", "lm_head", -1, 0, V, false});
  return m;
}

// Where the mapped slice lives in our buffer, and its HF shape.
struct Slice {
  size_t base;   // element offset of row r0 of the per-layer matrix (row 0 when transposed)
  int64_t rows, cols;
  bool vector;
};

Slice locate(const Map& m, const std::vector<ParamSpec>& specs) {
  for (const ParamSpec& s : specs) {
    if (s.name != m.ours) continue;
    const int first = s.stacked ? 1 : 0;
    const bool vector = s.shape.ndim - first == 1;
    const int64_t cols = vector ? 1 : s.shape.numel() / (s.stacked ? s.shape[0] : 1) / s.shape[first];
    const size_t layer = s.stacked ? size_t(s.shape.numel() / s.shape[0]) * size_t(m.layer) : 0;
    return {s.offset + layer, m.r1 - m.r0, cols, vector};
  }
  throw std::runtime_error("interop: the model has no parameter '" + m.ours + "'");
}

// Every weight of the model has a Hugging Face name (but the vocabulary's padding rows): a parameter
// added to the model without its hf_map entry was left out of exports, and an import left it 0.
void check_covered(const ModelConfig& cfg, const std::vector<Map>& maps, const std::vector<ParamSpec>& specs) {
  for (const ParamSpec& s : specs) {
    int64_t mapped = 0;
    for (const Map& m : maps)
      if (m.ours == s.name) {
        const Slice sl = locate(m, specs);
        mapped += sl.rows * sl.cols;
      }
    const bool padded = s.name == "wte" || s.name == "lm_head";
    const int64_t want = s.shape.numel() - (padded ? int64_t(cfg.padded_vocab - cfg.vocab) * cfg.dim : 0);
    if (mapped != want)
      throw std::logic_error("interop: hf_map (engine/hf_format.cpp) names " + std::to_string(mapped) + " of the " +
                             std::to_string(want) + " weights of parameter '" + s.name + "': a parameter needs its "
                             "Hugging Face names there");
  }
}

std::vector<int64_t> hf_shape(const Slice& s, bool transpose) {
  if (s.vector) return {s.rows};
  return transpose ? std::vector<int64_t>{s.cols, s.rows} : std::vector<int64_t>{s.rows, s.cols};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

bool skippable(const std::string& name) {  // HF buffers that some checkpoints carry: not weights
  for (const char* end : {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"}) {
    const std::string e = end;
    if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

// b (cols, rows) = a (rows, cols) transposed, in 64 x 64 tiles: element by element, every read (or
// write) of a column strode a whole row (a gpt2-350M import 4.64 s, now 4.40 s).
void transpose(const float* a, int64_t rows, int64_t cols, float* b) {
  constexpr int64_t kTile = 64;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++) b[j * rows + i] = a[i * cols + j];
    }
}

// One HF tensor's values, from our buffer: its rows of the per-layer matrix, transposed for Conv1D.
void fill_hf(const Map& m, const Slice& s, const float* data, float* out) {
  const float* src = data + s.base + size_t(m.r0 * s.cols);
  if (m.transpose) transpose(src, s.rows, s.cols, out);  // out: (cols, rows)
  else std::copy(src, src + s.rows * s.cols, out);
}

}  // namespace

std::vector<SafeTensorOut> hf_tensors(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* data) {
  std::vector<SafeTensorOut> out;
  const std::vector<Map> maps = hf_map(cfg);
  check_covered(cfg, maps, specs);
  for (const Map& m : maps) {
    const Slice s = locate(m, specs);
    SafeTensorOut t{m.hf, hf_shape(s, m.transpose), std::vector<float>(size_t(s.rows * s.cols))};
    fill_hf(m, s, data, t.data.data());
    out.push_back(std::move(t));
  }
  return out;
}

void export_safetensors(const std::string& path, const ModelConfig& cfg, const std::vector<ParamSpec>& specs,
                        const float* data, const std::string& dtype) {
  // config.json is on disk (as config.json.tmp) before the weights are written, and renamed right
  // after them: a failure on the way (a full disk under the large file) leaves the old pair as it
  // was, never new weights beside an old config.json. The old config.json goes once the new weights
  // are durable, just before they take the old ones' place: a kill -9 between the renames leaves
  // weights without a config.json (which no loader takes for a model), never a mismatched pair.
  const std::string dir = hf_dir_of(path), config_path = dir + "/config.json";
  AtomicFile config(config_path);
  const std::string json = hf_config_json(cfg, dtype == "BF16" ? "bfloat16" : "float32");
  config.write(json.data(), json.size());
  config.sync();
  // Tensor by tensor from `data`: no second copy of the model in memory.
  const std::vector<Map> maps = hf_map(cfg);
  check_covered(cfg, maps, specs);
  std::vector<Slice> slices;
  std::vector<SafeTensorOut> layout;  // names and shapes; the values come from fill_hf
  for (const Map& m : maps) {
    slices.push_back(locate(m, specs));
    layout.push_back({m.hf, hf_shape(slices.back(), m.transpose), {}});
  }
  auto fill = [&](size_t i, float* out) { fill_hf(maps[i], slices[i], data, out); };
  write_safetensors_streamed(path, layout, hf_metadata(cfg), dtype, fill, [&] {
    if (::unlink(config_path.c_str()) != 0 && errno != ENOENT)
      throw std::runtime_error(config_path + ": cannot replace it: " + std::strerror(errno));
    fsync_dir(dir);
  });
  config.commit();
}

namespace {

// Places HF tensors into our buffer as they arrive, file by file (the one file, or the shards of a
// checkpoint one at a time), then checks that everything came.
class Importer {
 public:
  Importer(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, float* data)
      : cfg_(cfg), specs_(specs), data_(data), maps_(hf_map(cfg)), done_(maps_.size(), false) {
    check_covered(cfg, maps_, specs);
    size_t total = 0;
    for (const ParamSpec& s : specs) total = std::max(total, s.offset + size_t(s.shape.numel()));
    std::fill(data, data + total, 0.0f);  // the vocabulary pad rows stay zero
    for (size_t i = 0; i < maps_.size(); i++) {
      by_name_[maps_[i].hf] = i;
      // HF's own gpt2 files name the base model's tensors bare ("h.0.ln_1.weight").
      if (maps_[i].hf.rfind("transformer.", 0) == 0) by_name_[maps_[i].hf.substr(12)] = i;
    }
  }

  // Every tensor of f: placed, skipped (HF's buffers), kept for finish (a tied model's lm_head), or refused.
  void add(const SafetensorsFile& f) {
    for (const SafeTensorInfo& t : f.tensors()) {
      const auto it = by_name_.find(t.name);
      if (it != by_name_.end()) {
        place(f, t, it->second);
        continue;
      }
      if (skippable(t.name)) continue;
      if (!cfg_.has_lm_head() && t.name == "lm_head.weight") {  // a tied model: accept only a copy of wte
        tied_head_ = f.to_f32(t), tied_head_shape_ = t.shape, tied_head_file_ = f.path();
        continue;
      }
      throw std::runtime_error(f.path() + ": unexpected tensor '" + t.name + "' for a " + cfg_.arch + " model");
    }
  }

  // Every expected tensor came; a tied model's lm_head (if the files had one) equals the embedding.
  void finish(const std::string& what) const {
    for (size_t i = 0; i < maps_.size(); i++)
      if (!done_[i]) throw std::runtime_error(what + ": missing tensor '" + maps_[i].hf + "'");
    if (tied_head_file_.empty()) return;
    const Slice wte = locate(maps_[0], specs_);  // the embedding is the first tensor of either layout
    if (tied_head_shape_ != hf_shape(wte, false) ||
        !std::equal(tied_head_.begin(), tied_head_.end(), data_ + wte.base))
      throw std::runtime_error(tied_head_file_ + ": lm_head.weight differs from the embedding (the model ties them; "
                               "an untied head cannot load)");
  }

 private:
  void place(const SafetensorsFile& f, const SafeTensorInfo& t, size_t i) {
    const Map& m = maps_[i];
    if (done_[i]) throw std::runtime_error(f.path() + ": tensor '" + m.hf + "' given twice (as '" + t.name + "')");
    done_[i] = true;
    const Slice s = locate(m, specs_);
    const std::vector<int64_t> want = hf_shape(s, m.transpose);
    if (t.shape != want)
      throw std::runtime_error(f.path() + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", expected " +
                               shape_str(want) + " for this config");
    const std::vector<float> v = f.to_f32(t);
    // Named as the file names it (the stacked tensor of ours it lands in means nothing to its author).
    for (size_t k = 0; k < v.size(); k++)
      if (!std::isfinite(v[k]))
        throw std::runtime_error(f.path() + ": tensor '" + t.name + "' holds a non-finite value (" + std::to_string(v[k]) +
                                 " at element " + std::to_string(k) + "): the weights are damaged, not trainable");
    float* dst = data_ + s.base + size_t(m.r0 * s.cols);
    if (m.transpose) transpose(v.data(), s.cols, s.rows, dst);  // v: (cols, rows), HF's Conv1D
    else std::copy(v.begin(), v.end(), dst);
  }

  const ModelConfig& cfg_;
  const std::vector<ParamSpec>& specs_;
  float* data_;
  std::vector<Map> maps_;
  std::vector<bool> done_;
  std::map<std::string, size_t> by_name_;  // HF name (and gpt2's bare alias) -> maps_ index
  std::vector<float> tied_head_;
  std::vector<int64_t> tied_head_shape_;
  std::string tied_head_file_;
};

}  // namespace

void hf_import(const SafetensorsFile& f, const ModelConfig& cfg, const std::vector<ParamSpec>& specs, float* data) {
  Importer im(cfg, specs, data);
  im.add(f);
  im.finish(f.path());
}

void hf_import(const SafetensorsIndex& idx, const ModelConfig& cfg, const std::vector<ParamSpec>& specs, float* data,
               const std::function<void(size_t, size_t, const std::string&)>& progress) {
  Importer im(cfg, specs, data);
  std::vector<size_t> expected(idx.files.size(), 0);
  for (const auto& [name, file] : idx.file_of) expected[file]++;
  for (size_t i = 0; i < idx.files.size(); i++) {
    if (progress) progress(i, idx.files.size(), idx.files[i]);
    const SafetensorsFile f(idx.files[i]);
    size_t listed = 0;
    for (const SafeTensorInfo& t : f.tensors()) {
      const auto it = idx.file_of.find(t.name);
      if (it == idx.file_of.end() || it->second != i)
        throw std::runtime_error(f.path() + ": tensor '" + t.name + "' is not in " + idx.path +
                                 "'s weight_map for this file");
      listed++;
    }
    if (listed != expected[i])
      for (const auto& [name, file] : idx.file_of)
        if (file == i && !f.find(name))
          throw std::runtime_error(idx.path + ": weight_map puts '" + name + "' in " + f.path() + ", which does not hold it");
    im.add(f);
  }
  im.finish(idx.path);
}

}  // namespace ul
