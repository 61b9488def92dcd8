#include "engine/checkpoint_files.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>

#include "engine/file_io.h"
#include "parallel/grid.h"

namespace ul {

namespace {

// Fixed little-endian layouts with no padding (static_asserts below): the file is the struct.
struct ModelHeader {
  char magic[8];
  uint32_t version, crc;
  char arch[16];
  int32_t layers, dim, heads, kv_heads, vocab, padded_vocab, max_seq, ffn;
  float rope_theta;
  int32_t rope_scaling;  // RopeScaling::Kind; 0 (none) in version 1, where it was reserved
  uint64_t numel;
};
static_assert(sizeof(ModelHeader) == 80, "model.bin header layout");
// Version 2 (written only for a scaled RoPE or tied llama embeddings, so other files stay version
// 1): the scaling's numbers and the flags follow the header, covered by the checksum. Versions 3
// and 4 write it too, before their own tails.
struct ModelHeaderTail {
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int32_t rope_original_max_pos;
  uint32_t flags;  // kTiedEmbeddings; kQkvBias (version 3 and later)
};
static_assert(sizeof(ModelHeaderTail) == 20, "model.bin version 2 tail layout");
constexpr uint32_t kTiedEmbeddings = 1, kQkvBias = 2;  // kQkvBias: version 3 only
// Version 3 (written only for YaRN, a q/k/v bias or an RMSNorm eps other than 1e-5, the settings
// Qwen 2 brought): the version 2 tail, then these.
struct TailV3 {
  float beta_fast, beta_slow, attention_factor;  // YaRN's (their defaults for other scalings)
  uint32_t truncate;                             // YaRN's, 0 or 1
  float norm_eps;
};
static_assert(sizeof(TailV3) == 20, "model.bin version 3 tail layout");
// Version 4 (written only for a sliding window, Mistral's): the version 3 tail, then these.
struct TailV4 {
  int32_t sliding_window;  // > 0: each query sees the last sliding_window positions, itself included
  int32_t full_every, full_first;  // the layers without the window (ModelConfig::full_layer); 0, 0: none
};
static_assert(sizeof(TailV4) == 12, "model.bin version 4 tail layout");

size_t model_tail_bytes(uint32_t version) {
  const size_t v2 = sizeof(ModelHeaderTail), v3 = v2 + sizeof(TailV3);
  return version == 1 ? 0 : version == 2 ? v2 : version == 3 ? v3 : v3 + sizeof(TailV4);
}

// The lowest version that holds c, so a file without the newer settings stays readable by older builds.
uint32_t model_version(const ModelConfig& c) {
  if (c.sliding_window) return 4;
  if (c.rope_scaling.kind == RopeScaling::kYarn || c.qkv_bias || c.norm_eps != 1e-5f) return 3;
  return c.rope_scaling.kind == RopeScaling::kNone && !c.tie_embeddings ? 1 : 2;
}

struct OptimHeader {
  char magic[8];
  uint32_t version, crc;
  int64_t t;
  uint64_t numel, offset, count;
  int32_t shard, shards;
};
static_assert(sizeof(OptimHeader) == 56, "optimizer file header layout");

constexpr char kModelMagic[8] = {'U', 'L', 'Y', 'S', 'M', 'O', 'D', 'L'};
constexpr char kOptimMagic[8] = {'U', 'L', 'Y', 'S', 'O', 'P', 'T', 'M'};
constexpr uint32_t kVersion = 1;

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

// The same for a sound file made for other flags than this run's.
RunMismatch mismatch(const std::string& path, const std::string& what) { return RunMismatch(path + ": " + what); }

template <class H>
uint32_t checksum(H h, const std::string& tail, const float* payload, uint64_t n) {
  h.crc = 0;
  return crc32(crc32(crc32(0, &h, sizeof h), tail.data(), tail.size()), payload, n * sizeof(float));
}

// Reads header, its version's tail and payload, checking (in this order) size >= header, magic,
// version (1 to max_version), exact size and checksum. tail_of(header) is the number of bytes
// after the header that belong to it; floats_of(header) the payload length the header promises
// (it may throw on a header that cannot be right). The payload goes to sink(first, x, k) in pieces
// (floats [first, first + k) of it), so a reader that wants a part holds only that part; the
// checksum is known only at the end, so a caller keeps nothing it was given when this throws.
// header_only: the header, its tail and the file's size are checked, the payload is not read (nor
// its checksum): a shape for --plan, not the weights.
template <class H, class T, class F, class S>
H read_checked_stream(const std::string& path, const char* kind, const char (&magic)[8], uint32_t max_version,
                      std::string& tail, T tail_of, F floats_of, S sink, bool header_only = false) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw file_error(path, std::string("cannot open ") + kind + ": " + std::strerror(errno));
  f.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(f.tellg());
  f.seekg(0);
  if (size < sizeof(H))
    throw file_error(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                               std::to_string(sizeof(H)) + "-byte header of " + kind);
  H h;
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  if (std::memcmp(h.magic, magic, 8) != 0) {
    std::string got(h.magic, 8);
    for (char& c : got)
      if (c < 32 || c > 126) c = '?';
    throw file_error(path, "bad magic '" + got + "' (expected '" + std::string(magic, 8) + "', " + kind + ")");
  }
  if (h.version < 1 || h.version > max_version)
    throw file_error(path, "unsupported version " + std::to_string(h.version) + " (expected " +
                               (max_version == 1 ? "1" : "1 to " + std::to_string(max_version)) + ")");
  tail.assign(tail_of(h), '\0');
  if (size - sizeof(H) < tail.size())
    throw file_error(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                               std::to_string(sizeof(H) + tail.size()) + "-byte header of " + kind);
  f.read(&tail[0], std::streamsize(tail.size()));
  const uint64_t n = floats_of(h), body = size - sizeof(H) - tail.size();
  if (n > body / sizeof(float) || body != n * sizeof(float))
    throw file_error(path, std::string(n > body / sizeof(float) ? "truncated" : "trailing bytes") + ": " +
                               std::to_string(size) + " bytes, but its header promises " + std::to_string(n) +
                               " floats after the " + std::to_string(sizeof(H) + tail.size()) + "-byte header");
  if (header_only) return h;
  uint32_t crc = checksum(h, tail, nullptr, 0);  // the header (crc zeroed) and its tail; the payload follows
  std::vector<float> piece(std::min<uint64_t>(n, uint64_t(1) << 22));  // 16 MiB at a time
  for (uint64_t first = 0; first < n;) {
    const size_t k = size_t(std::min<uint64_t>(piece.size(), n - first));
    f.read(reinterpret_cast<char*>(piece.data()), std::streamsize(k * sizeof(float)));
    if (!f) throw file_error(path, "read failed");
    count_io_read(k * sizeof(float));
    crc = crc32(crc, piece.data(), k * sizeof(float));
    sink(first, piece.data(), k);
    first += k;
  }
  if (crc != h.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored %08x, computed %08x): the file is corrupt", h.crc, crc);
    throw file_error(path, buf);
  }
  return h;
}

// The same, the whole payload into `payload`.
template <class H, class T, class F>
H read_checked(const std::string& path, const char* kind, const char (&magic)[8], uint32_t max_version,
               std::string& tail, std::vector<float>& payload, T tail_of, F floats_of) {
  uint64_t n = 0;
  payload.clear();
  return read_checked_stream<H>(path, kind, magic, max_version, tail, tail_of,
                                [&](const H& h) { return n = floats_of(h); },
                                [&](uint64_t first, const float* x, size_t k) {
                                  // Sized at the first piece: only after the header's promise met the file's size.
                                  if (first == 0) payload.resize(n);
                                  std::memcpy(payload.data() + first, x, k * sizeof(float));
                                });
}

// The header and (versions 2 to 4) its tail for cfg.
ModelHeader model_header(const ModelConfig& cfg, const float* params, uint64_t numel, std::string& tail) {
  ModelHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kModelMagic, 8);
  const RopeScaling& r = cfg.rope_scaling;
  h.version = model_version(cfg);
  h.rope_scaling = r.kind;
  tail.clear();
  if (h.version >= 2) {
    const ModelHeaderTail t = {r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_pos,
                               (cfg.tie_embeddings ? kTiedEmbeddings : 0u) | (cfg.qkv_bias ? kQkvBias : 0u)};
    tail.assign(reinterpret_cast<const char*>(&t), sizeof t);
  }
  if (h.version >= 3) {
    const TailV3 y = {r.beta_fast, r.beta_slow, r.attention_factor, r.truncate ? 1u : 0u, cfg.norm_eps};
    tail.append(reinterpret_cast<const char*>(&y), sizeof y);
  }
  if (h.version == 4) {
    const TailV4 w = {cfg.sliding_window, cfg.full_every, cfg.full_first};
    tail.append(reinterpret_cast<const char*>(&w), sizeof w);
  }
  std::strncpy(h.arch, cfg.arch.c_str(), sizeof h.arch - 1);
  h.layers = cfg.layers, h.dim = cfg.dim, h.heads = cfg.heads, h.kv_heads = cfg.kv_heads;
  h.vocab = cfg.vocab, h.padded_vocab = cfg.padded_vocab, h.max_seq = cfg.max_seq, h.ffn = cfg.ffn;
  h.rope_theta = cfg.rope_theta;
  h.numel = numel;
  h.crc = checksum(h, tail, params, numel);
  return h;
}

std::string json_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // 9 digits: every float survives the round trip
  return buf;
}

}  // namespace

uint32_t write_model_file(const std::string& path, const ModelConfig& cfg, const float* params, uint64_t numel) {
  std::string tail;
  ModelHeader h = model_header(cfg, params, numel, tail);
  AtomicFile f(path);
  f.write(&h, sizeof h);
  f.write(tail.data(), tail.size());
  f.write(params, numel * sizeof(float));
  f.commit();
  return h.crc;
}

void write_model_file_and_crash(const std::string& path, const ModelConfig& cfg, const float* params, uint64_t numel) {
  std::string tail;
  ModelHeader h = model_header(cfg, params, numel, tail);
  AtomicFile f(path);
  f.write(&h, sizeof h);
  f.write(tail.data(), tail.size());
  f.write(params, numel * sizeof(float) / 2);
  std::fprintf(stderr, "ULYSSES_TEST_CRASH_IN_SAVE: aborting halfway through %s.tmp\n", path.c_str());
  std::abort();
}

ModelConfig read_model_file(const std::string& path, std::vector<float>& params, uint32_t* crc, uint64_t* numel_only) {
  std::string tail;
  auto tail_of = [](const ModelHeader& x) { return model_tail_bytes(x.version); };
  auto numel = [](const ModelHeader& x) { return x.numel; };
  params.clear();
  ModelHeader h = numel_only ? read_checked_stream<ModelHeader>(path, "a ulysses model file", kModelMagic, 4, tail, tail_of,
                                                                numel, [](uint64_t, const float*, size_t) {}, true)
                             : read_checked<ModelHeader>(path, "a ulysses model file", kModelMagic, 4, tail, params,
                                                         tail_of, numel);
  if (numel_only) *numel_only = h.numel;
  if (crc) *crc = h.crc;  // read_checked verified it
  ModelConfig c;
  c.arch = std::string(h.arch, strnlen(h.arch, sizeof h.arch));
  c.layers = h.layers, c.dim = h.dim, c.heads = h.heads, c.kv_heads = h.kv_heads;
  c.vocab = h.vocab, c.padded_vocab = h.padded_vocab, c.max_seq = h.max_seq, c.ffn = h.ffn;
  c.rope_theta = h.rope_theta;
  if (h.version == 1 && h.rope_scaling != 0) throw file_error(path, "version 1 with a rope scaling set: corrupt header");
  c.rope_scaling.kind = h.rope_scaling;
  if (h.version >= 2 && c.arch != "llama")
    throw file_error(path, "version " + std::to_string(h.version) + " (RoPE, tied llama head) for a " + c.arch);
  if (h.version < 3 && h.rope_scaling == RopeScaling::kYarn)
    throw file_error(path, "version " + std::to_string(h.version) + " with YaRN: corrupt header (YaRN is version 3)");
  if (h.version >= 2) {
    ModelHeaderTail t;
    std::memcpy(&t, tail.data(), sizeof t);
    c.rope_scaling.factor = t.rope_factor, c.rope_scaling.low_freq_factor = t.rope_low_freq_factor;
    c.rope_scaling.high_freq_factor = t.rope_high_freq_factor, c.rope_scaling.original_max_pos = t.rope_original_max_pos;
    if (t.flags & ~(h.version >= 3 ? kTiedEmbeddings | kQkvBias : kTiedEmbeddings))
      throw file_error(path, "unknown flags " + std::to_string(t.flags) + " in the header");
    c.tie_embeddings = t.flags & kTiedEmbeddings;
    c.qkv_bias = t.flags & kQkvBias;
  }
  if (h.version >= 3) {
    TailV3 y;
    std::memcpy(&y, tail.data() + sizeof(ModelHeaderTail), sizeof y);
    if (y.truncate > 1) throw file_error(path, "yarn truncate " + std::to_string(y.truncate) + " (expected 0 or 1)");
    if (c.rope_scaling.kind == RopeScaling::kYarn) {
      c.rope_scaling.beta_fast = y.beta_fast, c.rope_scaling.beta_slow = y.beta_slow;
      c.rope_scaling.attention_factor = y.attention_factor, c.rope_scaling.truncate = y.truncate == 1;
    }
    c.norm_eps = y.norm_eps;
  }
  if (h.version == 4) {
    TailV4 w;
    std::memcpy(&w, tail.data() + sizeof(ModelHeaderTail) + sizeof(TailV3), sizeof w);
    if (w.sliding_window < 1)  // version 4 is written only for a window
      throw file_error(path, "version 4 with sliding window " + std::to_string(w.sliding_window) +
                                 ": corrupt header (expected >= 1)");
    if (w.full_every < 0 || w.full_first < 0 || w.full_first >= std::max(1, w.full_every))
      throw file_error(path, "version 4 with full attention every " + std::to_string(w.full_every) + " from " +
                                 std::to_string(w.full_first) + ": corrupt header");
    c.sliding_window = w.sliding_window, c.full_every = w.full_every, c.full_first = w.full_first;
  }
  check_rope_scaling(c.rope_scaling, path);
  return c;
}

bool is_model_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, sizeof magic) && std::memcmp(magic, kModelMagic, sizeof magic) == 0;
}

void check_model_config(const std::string& path, const ModelConfig& a, const ModelConfig& b) {
  auto differ = [&](const char* field, const std::string& x, const std::string& y, const char* flag) {
    if (x != y)
      throw mismatch(path, std::string(field) + " is " + x + " in the checkpoint but " + y + " in this run (" + flag + ")");
  };
  auto s = [](int v) { return std::to_string(v); };
  differ("arch", a.arch, b.arch, "--model");
  differ("layers", s(a.layers), s(b.layers), "--layers");
  differ("dim", s(a.dim), s(b.dim), "--dim");
  differ("heads", s(a.heads), s(b.heads), "--heads");
  differ("kv_heads", s(a.kv_heads), s(b.kv_heads), "--kv-heads");
  differ("vocab", s(a.vocab), s(b.vocab), "--vocab");
  differ("padded_vocab", s(a.padded_vocab), s(b.padded_vocab), "--vocab");
  differ("max_seq", s(a.max_seq), s(b.max_seq), "--max-seq");
  differ("ffn", s(a.ffn_dim()), s(b.ffn_dim()), "--ffn");  // the width: 0 ("derived") and --ffn at it are one model
  differ("rope_theta", json_number(a.rope_theta), json_number(b.rope_theta), "--rope-theta");
  differ("rope_scaling", rope_scaling_str(a.rope_scaling), rope_scaling_str(b.rope_scaling), "--rope-scaling");
  differ("tie_embeddings", a.tie_embeddings ? "true" : "false", b.tie_embeddings ? "true" : "false", "--tie-embeddings");
  differ("qkv_bias", a.qkv_bias ? "true" : "false", b.qkv_bias ? "true" : "false", "--qkv-bias");
  differ("norm_eps", float_text(a.norm_eps), float_text(b.norm_eps), "--norm-eps");
  differ("sliding_window", s(a.sliding_window), s(b.sliding_window), "--sliding-window");
  differ("full_attention_every", s(a.full_every), s(b.full_every), "--full-attention-every");
  differ("full_attention_first", s(a.full_first), s(b.full_first), "--full-attention-first");
}

std::string rope_text(const ModelConfig& c) {
  const std::string scaling = rope_scaling_str(c.rope_scaling);
  return "theta " + json_number(c.rope_theta) + (scaling == "none" ? "" : ", scaling " + scaling);
}

std::string optim_file_name(int shard, int shards) {
  return shards == 1 ? "optim.bin" : "optim_rank_" + std::to_string(shard) + ".bin";
}

uint32_t write_optim_file(const std::string& path, const OptimShard& s) {
  if (s.m.size() != s.count || s.v.size() != s.count)
    throw std::logic_error("write_optim_file: m and v must hold count elements each");
  return write_optim_file(path, s, s.m.data(), s.v.data());
}

uint32_t write_optim_file(const std::string& path, const OptimShard& s, const float* m, const float* v) {
  OptimHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kOptimMagic, 8);
  h.version = kVersion;
  h.t = s.t, h.numel = s.numel, h.offset = s.offset, h.count = s.count, h.shard = s.shard, h.shards = s.shards;
  h.crc = crc32(crc32(crc32(0, &h, sizeof h), m, s.count * 4), v, s.count * 4);
  AtomicFile f(path);
  f.write(&h, sizeof h);
  f.write(m, s.count * sizeof(float));
  f.write(v, s.count * sizeof(float));
  f.commit();
  return h.crc;
}

OptimShard read_optim_file(const std::string& path, uint64_t lo, uint64_t hi, float* m_out, float* v_out,
                           bool skip_disjoint) {
  if (!m_out != !v_out) throw std::logic_error("read_optim_file: give both m_out and v_out, or neither");
  std::string tail;
  OptimShard s;
  uint64_t kept_end = 0;
  auto read = [&](bool header_only) {
    return read_checked_stream<OptimHeader>(
        path, "a ulysses optimizer file", kOptimMagic, 1, tail, [](const OptimHeader&) { return size_t(0); },
        [&](const OptimHeader& x) {
          if (x.count > (uint64_t(1) << 61)) throw file_error(path, "count " + std::to_string(x.count) + " is absurd");
          // offset > numel first: offset + count could wrap around past 2^64 and look small.
          if (x.shards < 1 || x.shard < 0 || x.shard >= x.shards || x.offset > x.numel || x.count > x.numel - x.offset ||
              x.t < 0)
            throw file_error(path, "inconsistent header: shard " + std::to_string(x.shard) + " of " +
                                       std::to_string(x.shards) + ", elements [" + std::to_string(x.offset) + ", " +
                                       std::to_string(x.offset + x.count) + ") of " + std::to_string(x.numel) + ", t " +
                                       std::to_string(x.t));
          s.t = x.t, s.numel = x.numel, s.offset = x.offset, s.count = x.count, s.shard = x.shard, s.shards = x.shards;
          s.crc = x.crc;  // the stream's check compares it with the bytes before returning
          // The buffer elements kept: this shard's within [lo, hi).
          s.kept = std::min(std::max(lo, x.offset), x.offset + x.count);
          kept_end = std::max(s.kept, std::min(hi, x.offset + x.count));
          s.kept_count = kept_end - s.kept;
          return 2 * x.count;
        },
        [&](uint64_t first, const float* x, size_t k) {
          // Sized at the first piece: only after the header's promise met the file's size.
          if (first == 0 && !m_out) s.m.resize(s.kept_count), s.v.resize(s.kept_count);
          if (s.kept_count == 0) return;  // (then s.kept may lie below lo)
          float* m = m_out ? m_out + (s.kept - lo) : s.m.data();  // element s.kept's place
          float* v = v_out ? v_out + (s.kept - lo) : s.v.data();
          // Payload floats [0, count) are m, [count, 2 count) are v, each of elements [offset, offset + count).
          auto keep = [&](float* dst, uint64_t part) {  // part: where this half starts in the payload
            const uint64_t from = std::max(first, part + (s.kept - s.offset));
            const uint64_t to = std::min<uint64_t>(first + k, part + (s.kept - s.offset) + s.kept_count);
            if (from < to) std::memcpy(dst + (from - part - (s.kept - s.offset)), x + (from - first), (to - from) * 4);
          };
          keep(m, 0);
          keep(v, s.count);
        }, header_only);
  };
  if (skip_disjoint) {
    read(true);  // the header and the file's size: where the shard lies
    // An empty shard is read whole (no payload to skip): no rank's range meets it, yet its header's
    // checksum is checked somewhere.
    if (s.kept_count == 0 && s.count > 0) {
      s.payload_checked = false;
      return s;
    }
  }
  read(false);
  return s;
}

std::vector<RunField> run_fields(const Options& o, const ModelConfig& c, const std::string& data, int data_eot) {
  auto n = [](int64_t v) { return std::to_string(v); };
  // The EOT --doc-mask splits documents at, whether --eot names it or the data does (-1: no mask);
  // checkpoints written before recorded --eot as given, -1 for the data's own.
  const int64_t eot = !o.doc_mask ? -1 : o.eot >= 0 ? o.eot : data_eot;
  ModelConfig derived = c;
  derived.ffn = 0;
  const int derived_ffn = derived.ffn_dim();
  std::vector<RunField> fields = {{"arch", json_quote(c.arch), "--model"},
          {"layers", n(c.layers), "--layers"},
          {"dim", n(c.dim), "--dim"},
          {"heads", n(c.heads), "--heads"},
          {"kv_heads", n(c.kv_heads), "--kv-heads"},
          {"vocab", n(c.vocab), "--vocab"},
          {"padded_vocab", n(c.padded_vocab), "--vocab"},
          {"max_seq", n(c.max_seq), "--max-seq"},
          // The MLP's width, whether derived from dim or given as --ffn at that value; checkpoints
          // written before held 0 for a derived width.
          {"ffn", n(c.ffn_dim()), "--ffn", "", derived_ffn == c.ffn_dim() ? "0" : ""},
          {"rope_theta", json_number(c.rope_theta), "--rope-theta"},
          {"rope_scaling", json_quote(rope_scaling_str(c.rope_scaling)), "--rope-scaling", "none"},
          {"tie_embeddings", c.tie_embeddings ? "true" : "false", "--tie-embeddings", "false"},
          {"qkv_bias", c.qkv_bias ? "true" : "false", "--qkv-bias", "false"},
          {"norm_eps", json_quote(float_text(c.norm_eps)), "--norm-eps", "1e-05"},
          {"sliding_window", n(c.sliding_window), "--sliding-window", "0"},
          {"full_attention_every", n(c.full_every), "--full-attention-every", "0"},
          {"full_attention_first", n(c.full_first), "--full-attention-first", "0"},
          {"seq", n(o.seq), "--seq"},
          // bf16 and fp32 runs differ in every step's arithmetic (a CUDA run is bf16 unless told)
          {"precision", json_quote(o.precision), "--precision", kUnchecked},
          {"data", json_quote(o.data), "--data"},
          // the same spec over other files (one added, rewritten, cut) shuffles and cuts otherwise
          // (checkpoints written before this field are not checked for it)
          {"data_files", json_quote(data), "--data: its files changed since the save", kUnchecked},
          {"seed", std::to_string(o.seed), "--seed"},
          // packing changes what every step trains on (added after the first checkpoints: a
          // checkpoint without them was written without --doc-mask)
          {"doc_mask", o.doc_mask ? "true" : "false", "--doc-mask", "false"},
          {"eot", n(eot), "--eot", "-1", o.doc_mask && eot == data_eot ? "-1" : ""},
          // the schedule and AdamW's settings shape every later update (only --steps and --lr may
          // change on a resume; checkpoints written before these fields are not checked for them)
          {"warmup", n(o.warmup), "--warmup", kUnchecked},
          {"final_lr_frac", json_quote(float_text(o.final_lr_frac)), "--final-lr-frac", kUnchecked},
          {"schedule", json_quote(o.schedule), "--schedule", "cosine"},
          {"decay_frac", json_quote(float_text(float(o.decay_frac))), "--decay-frac", kUnchecked},
          {"weight_decay", json_quote(float_text(o.weight_decay)), "--weight-decay", kUnchecked},
          {"beta1", json_quote(float_text(o.beta1)), "--beta1", kUnchecked},
          {"beta2", json_quote(float_text(o.beta2)), "--beta2", kUnchecked},
          {"adam_eps", json_quote(float_text(o.adam_eps)), "--adam-eps", kUnchecked},
          {"grad_clip", json_quote(float_text(o.grad_clip)), "--grad-clip", kUnchecked}};
  // Beside --checkpoint the model's shape is the file's (its shape flags are refused): a resume of
  // a run started from another file names the file, not a flag the user cannot give.
  if (!o.checkpoint.empty())
    for (RunField& f : fields)
      for (const char* shape : {"arch", "layers", "dim", "heads", "kv_heads", "vocab", "padded_vocab", "ffn",
                                "tie_embeddings", "qkv_bias", "norm_eps", "sliding_window", "full_attention_every",
                                "full_attention_first"})
        if (f.key == shape) f.flag = "--checkpoint " + o.checkpoint + ", whose shape this run has";
  return fields;
}

std::string rank_file_name(int rank) { return "rank_" + std::to_string(rank) + ".json"; }

std::string RunLayout::str() const {
  return "dp " + std::to_string(dp) + " x sp " + std::to_string(sp) + ", batch " + std::to_string(batch) +
         ", grad-accum " + std::to_string(grad_accum) + (zero > 0 ? ", --zero " + std::to_string(zero) : "") +
         (mlp_chunks > 1 ? ", --mlp-chunks " + std::to_string(mlp_chunks) : "") +
         (!device.empty() && device != "cpu" ? ", --device " + device : "") +
         (!comm.empty() && comm != "local" ? ", --comm " + comm : "");
}

RunLayout run_layout(const Options& o, const Grid& g) {
  return {o.batch, o.grad_accum, g.dp, g.sp, o.zero, o.mlp_chunks, o.seq, o.device, o.steps, o.comm};
}

void write_rank_file(const std::string& path, int step, int64_t next_sequence, int rank, const Grid& g,
                     const RunLayout& layout,
                     const std::vector<RunField>& fields, const std::vector<std::pair<std::string, uint32_t>>& crcs,
                     const std::string& save_id) {
  JsonLine j;
  j.add("format", "ulysses-rank").add("version", int(kVersion)).add("step", step).add("rank", rank);
  j.add("world", g.world.size()).add("dp_rank", g.dp_rank).add("sp_rank", g.sp_rank);
  // Every dataset is random access, so where the data stands is one number: the first sequence the
  // next step trains on (step x G, unless a rollback skipped data or G or --seq changed on a resume). A build
  // from before it, finding no data_position, refuses the file rather than resume in the wrong place.
  j.add("data_sequence", next_sequence);
  // Where it is the step's own place, the field an older build reads too (it then resumes it).
  if (next_sequence == int64_t(step) * layout.sequences_per_step()) j.add("data_position", step);
  j.add("batch", layout.batch).add("grad_accum", layout.grad_accum).add("dp", layout.dp).add("sp", layout.sp);
  j.add("zero", layout.zero).add("mlp_chunks", layout.mlp_chunks).add("device", layout.device).add("comm", layout.comm);
  j.add("steps", layout.steps);
  // A number this save draws, to tell it from another save of the same step with the same bytes
  // (a rollback without a skip): DIR/rollback.json names checkpoints by it (engine/rollback_record.h).
  // The other ranks' files name it too: a rank file of another save put beside it is told apart
  // (files from before save_of lack it: unchecked).
  j.add(rank == 0 ? "save_id" : "save_of", save_id);
  for (const RunField& f : fields) j.add_raw(f.key, f.json);
  for (const auto& [name, crc] : crcs) j.add_raw("crc " + name, std::to_string(crc));
  // Last, its own checksum: the CRC-32 of the text before it (from "{" to the comma), so that a
  // damaged key (a field then read as absent, and so unchecked) is refused like a damaged value.
  std::string text = j.str();
  text.pop_back();  // the closing "}"
  text += ",\"crc32\":" + std::to_string(crc32(0, text.data(), text.size())) + "}\n";
  write_file_atomic(path, text);
}

namespace {

// A rank file's fields, after its own crc32 (when it has one: files from before it did not) was
// checked against its text.
std::map<std::string, std::string> read_rank_fields(const std::string& path) {
  const std::string text = read_whole_file(path);
  const size_t at = text.rfind(",\"crc32\":");
  if (at != std::string::npos) {
    char* end = nullptr;
    const unsigned long long stored = std::strtoull(text.c_str() + at + 9, &end, 10);
    const uint32_t computed = crc32(0, text.data(), at);
    if (*end != '}' || stored != computed) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checksum mismatch (stored %llu, computed %u): the file is corrupt", stored,
                    unsigned(computed));
      throw file_error(path, buf);
    }
  }
  return parse_flat_json(text, path);
}

}  // namespace

int64_t recorded_crc(const std::string& path, const std::string& name) {
  const auto have = read_rank_fields(path);
  const auto it = have.find("crc " + name);
  if (it == have.end()) return -1;
  const std::optional<int64_t> v = parse_decimal(it->second, 0, 0xffffffffll);
  if (!v) throw file_error(path, "'crc " + name + "' is '" + it->second + "', not a crc32");
  return *v;
}

std::string new_save_id() {
  std::random_device rd;
  char id[24];
  std::snprintf(id, sizeof id, "%08x%08x", unsigned(rd()), unsigned(rd()));
  return id;
}

void check_rank_file_matches_rank0(const std::string& path) {
  const std::string rank0 = (std::filesystem::path(path).parent_path() / rank_file_name(0)).string();
  const std::map<std::string, std::string> have = read_rank_fields(path), first = read_rank_fields(rank0);
  auto own = [](const std::string& key) {
    return key == "rank" || key == "dp_rank" || key == "sp_rank" || key == "save_id" || key == "save_of" ||
           key == "crc32" || key.rfind("crc ", 0) == 0;
  };
  const auto of = have.find("save_of"), id = first.find("save_id");
  if (of != have.end() && (id == first.end() || id->second != of->second))
    throw file_error(path, "save_of is " + of->second + " but " + rank0 + "'s save_id is " +
                               (id == first.end() ? std::string("missing") : id->second) +
                               ": the checkpoint's rank files come from different runs or saves");
  for (const auto& [key, value] : first) {
    if (own(key)) continue;
    const auto it = have.find(key);
    if (it == have.end() || it->second != value)
      throw file_error(path, key + " is " + (it == have.end() ? std::string("missing") : it->second) + " but " + rank0 +
                                 " says " + value + ": the checkpoint's rank files come from different runs or saves");
  }
  for (const auto& [key, value] : have)
    if (!own(key) && !first.count(key))
      throw file_error(path, "has " + key + " (" + value + "), which " + rank0 +
                                 " lacks: the checkpoint's rank files come from different runs or saves");
}

int64_t stored_crc(const std::string& path) {
  char head[16];  // magic[8] | u32 version | u32 crc32, both formats
  std::ifstream f(path, std::ios::binary);
  if (!f.read(head, sizeof head)) return -1;
  if (std::memcmp(head, kModelMagic, 8) != 0 && std::memcmp(head, kOptimMagic, 8) != 0) return -1;
  uint32_t crc;
  std::memcpy(&crc, head + 12, 4);
  return crc;
}

namespace {

// The fields of the rank_0.json beside a checkpoint's model.bin; none when there is no such file
// (an llm.c file, a model.bin copied out alone) or it does not read: what its callers say is a note.
std::map<std::string, std::string> fields_beside(const std::string& model_path) {
  const std::filesystem::path p(model_path), rank0 = p.parent_path() / rank_file_name(0);
  std::error_code ec;
  if (p.filename() != "model.bin" || !std::filesystem::is_regular_file(rank0, ec)) return {};
  try {
    return read_rank_fields(rank0.string());
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

std::string checkpoint_doc_mask(const std::string& model_path) {
  const auto have = fields_beside(model_path);
  const auto mask = have.find("doc_mask"), eot = have.find("eot");
  if (mask == have.end() || mask->second != "true") return "";
  return "--doc-mask" + (eot != have.end() && eot->second != "-1" ? " --eot " + eot->second : std::string());
}

std::string checkpoint_data(const std::string& model_path) {
  const auto have = fields_beside(model_path);
  const auto data = have.find("data");
  return data == have.end() ? "" : data->second;
}

int checkpoint_seq(const std::string& model_path) {
  const auto have = fields_beside(model_path);
  const auto seq = have.find("seq");
  if (seq == have.end()) return -1;
  const std::optional<int64_t> v = parse_decimal(seq->second, 1, 1 << 30);
  return v ? int(*v) : -1;
}

RunLayout check_rank_file(const std::string& path, int step, const std::vector<RunField>& fields, const RunLayout& run,
                          const Grid* place, int64_t* next_sequence, ResumeChanges changes) {
  auto have = read_rank_fields(path);
  auto field = [&](const std::string& key) -> const std::string& {
    auto it = have.find(key);
    if (it == have.end()) throw file_error(path, "field '" + key + "' is missing");
    return it->second;
  };
  if (field("format") != "ulysses-rank") throw file_error(path, "format is '" + field("format") + "', not ulysses-rank");
  if (field("version") != std::to_string(kVersion))
    throw file_error(path, "version " + field("version") + " (this build reads version " + std::to_string(kVersion) + ")");
  auto expect = [&](const char* key, int want, const char* what) {
    if (field(key) != std::to_string(want))
      throw file_error(path, std::string(key) + " is " + field(key) + " but " + what + " is " + std::to_string(want));
  };
  // An integer field in [lowest, 2^30]. optional: absent reads -1 (a checkpoint from before it).
  auto count = [&](const char* key, int lowest = 1, bool optional = false) {
    if (optional && !have.count(key)) return -1;
    const std::optional<int64_t> x = parse_decimal(field(key), lowest, 1 << 30);
    if (!x) throw file_error(path, std::string(key) + " is '" + field(key) + "'");
    return int(*x);
  };
  // The options first: they are what the user has to change.
  JsonLine want_line;
  for (const RunField& f : fields) want_line.add_raw(f.key, f.json);
  auto want = parse_flat_json(want_line.str(), "run options");
  const bool llama = want["arch"] == "llama";
  // --data before the rest: the vocabulary and the EOT default to the data's, so other data shows
  // first as a --vocab the user never gave.
  std::vector<RunField> ordered;
  for (const RunField& f : fields)
    if (f.key == "data") ordered.push_back(f);
  for (const RunField& f : fields)
    if (f.key != "data") ordered.push_back(f);
  for (const RunField& f : ordered) {
    const auto it = have.find(f.key);
    if (it == have.end() && f.absent == kUnchecked) continue;
    const std::string& got = it == have.end() && !f.absent.empty() ? f.absent : field(f.key);
    if (got == want[f.key] || (!f.also.empty() && got == f.also) || (changes.seq && f.key == "seq")) continue;
    // Another rank's file that disagrees with rank 0's in the same checkpoint: a file of another
    // run put there, not this run's flag to change (its message once sent the user to --seed while
    // rank_0.json held the run's own).
    const std::filesystem::path rank0 = std::filesystem::path(path).parent_path() / rank_file_name(0);
    if (std::filesystem::path(path).filename() != rank_file_name(0)) {
      std::map<std::string, std::string> first;
      try {
        first = read_rank_fields(rank0.string());
      } catch (const std::exception&) {
        // rank 0's own check names what is wrong with it
      }
      const auto at0 = first.find(f.key);
      if (at0 != first.end() && at0->second != got)
        throw file_error(path, f.key + " is " + got + " but " + rank0.string() + " says " + at0->second +
                                   ": the checkpoint's rank files come from different runs");
    }
    const bool rope_field = f.key == "rope_theta" || f.key == "rope_scaling";
    const bool rope_asked = f.key == "rope_theta" ? changes.theta_asked : changes.scaling_asked;
    if (rope_field && changes.rope && rope_asked) continue;
    // A llama's max_seq is the longest --seq it trained at (no weight depends on it): under
    // --change-seq it may grow to --seq (as load_checkpoint lets model.bin's header); without it,
    // another --seq is what differs (its field, after this one, says so).
    const std::optional<int64_t> rows = parse_decimal(got, 1, 1 << 30), seq = parse_decimal(want["seq"], 1, 1 << 30);
    if (llama && f.key == "max_seq") {
      const std::optional<int64_t> now = parse_decimal(want[f.key], 1, 1 << 30);
      if (!changes.seq && (have.count("seq") == 0 || have.at("seq") != want["seq"])) continue;
      if (changes.seq && rows && now && seq && *rows < *now && *now == *seq) continue;
    }
    std::string hint;
    if (f.key == "seq")
      hint = changes.rollback ? " (a rollback keeps its checkpoint's length: --seq " + got + ")"
                              : " (or, to go on at --seq " + want[f.key] + " with the checkpoint's AdamW state and "
                                "schedule, --change-seq)";
    if (rope_field)
      hint = rope_asked ? " (or, to go on with this RoPE from the checkpoint's weights and AdamW state, --change-rope)"
                        : " (to go on with the checkpoint's, give " + f.flag + " " + got + ")";
    if (f.key == "max_seq" && !llama && rows && seq)  // a gpt2's positions, sized to --seq past 1024
      hint = *seq > *rows ? ": gpt2 learns one position embedding per place, and the checkpoint's end at " + got +
                                ": --seq " + want["seq"] + " is another model"
                          : ": a gpt2's positions are its shape: --max-seq " + got + " keeps them";
    if (f.key == "max_seq" && llama && rows)
      hint = ": the longest length it trained at, which --max-seq " + got + " keeps";
    // The same files under another spelling (text:./book.txt for text:book.txt, a job requeued from
    // another directory): the spec is compared as written, the files by what data_files records
    // of them (a text's size and checksum; shards' names and token counts). Synthetic data records
    // nothing there, so another task setting gets no such hint.
    if (f.key == "data" && have.count("data_files") && !want["data_files"].empty() &&
        have.at("data_files") == want["data_files"] && got.substr(0, got.find(':')) == want[f.key].substr(0, want[f.key].find(':')))
      hint = ": its files match the checkpoint's record of them, named otherwise; give --data " + got +
             " as the checkpoint names it";
    if (f.key == "data_files")  // text appended to the file, a shard added: the run's data has moved
      hint = ": restore them as they were to resume, or train on them as they are now in a new run from this "
             "checkpoint's weights (--checkpoint " + std::filesystem::path(path).parent_path().string() +
             "/model.bin and another --save-dir: AdamW's state and the schedule start afresh)";
    if (f.key == "precision" && got == "fp32" && want[f.key] == "bf16" && run.device == "cuda")
      hint = ": bf16 is --device cuda's default; give --precision fp32 to resume this run";
    if (f.key == "precision" && got == "bf16" && run.device == "cpu")  // --precision bf16 is refused there
      hint = ": the CPU backend trains in fp32 alone; resume it on --device cuda (or start a new fp32 run from its f32 "
             "master weights: --checkpoint " + std::filesystem::path(path).parent_path().string() + "/model.bin)";
    throw mismatch(path, f.key + " is " + got + " in the checkpoint but " + want[f.key] + " in this run (" + f.flag +
                             ")" + hint);
  }
  RunLayout saved{count("batch"), count("grad_accum"), count("dp"), count("sp"),
                  count("zero", 0, true), count("mlp_chunks", 1, true), count("seq"),
                  have.count("device") ? have.at("device") : std::string(), -1,
                  have.count("comm") ? field("comm") : std::string()};
  if (!saved.comm.empty() && saved.comm != "local" && saved.comm != "mpi" && saved.comm != "nccl")
    throw file_error(path, "comm is '" + saved.comm + "'");
  if (have.count("steps")) {  // any --steps (an int), not count()'s 2^30
    const std::optional<int64_t> x = parse_decimal(field("steps"), 0, INT_MAX);
    if (!x) throw file_error(path, "steps is '" + field("steps") + "'");
    saved.steps = int(*x);
  }
  const int64_t G = saved.sequences_per_step();
  if (G != run.sequences_per_step() && !changes.global_batch) {
    // What would keep G on this run's ranks: another --batch, else another --grad-accum.
    std::string hint;
    if (G % (int64_t(run.grad_accum) * run.dp) == 0)
      hint = ", e.g. --batch " + std::to_string(G / (int64_t(run.grad_accum) * run.dp));
    else if (G % (int64_t(run.batch) * run.dp) == 0)
      hint = ", e.g. --grad-accum " + std::to_string(G / (int64_t(run.batch) * run.dp));
    throw mismatch(path, "the checkpoint's steps train on " + std::to_string(G) + " sequences each (" + saved.str() +
                               ") but this run's on " + std::to_string(run.sequences_per_step()) + " (" + run.str() +
                               "): another layout resumes when --batch x --grad-accum x dp stays " + std::to_string(G) +
                               hint + " (or, to train on " + std::to_string(run.sequences_per_step()) +
                               " a step from here on, --change-global-batch)");
  }
  expect("step", step, "the directory's step");
  // Where the data stands: the first sequence of the next step (a file from before data_sequence
  // has data_position, the step, and never skipped data nor changed G: step x G).
  int64_t next = int64_t(step) * G;
  if (have.count("data_sequence")) {
    const std::optional<int64_t> x = parse_decimal(field("data_sequence"), 0, int64_t(1) << 62);
    if (!x) throw file_error(path, "data_sequence is '" + field("data_sequence") + "'");
    next = *x;
  } else {
    expect("data_position", step, "the directory's step");
  }
  if (next_sequence) *next_sequence = next;
  if (place) {
    expect("rank", place->world.rank(), "this rank");
    expect("dp_rank", place->dp_rank, "this rank's dp rank");
    expect("sp_rank", place->sp_rank, "this rank's sp rank");
  }
  return saved;
}

}  // namespace ul
