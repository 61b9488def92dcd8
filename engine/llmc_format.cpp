#include "engine/llmc_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/safetensors.h"

namespace ul {

namespace {

constexpr int32_t kCheckpointMagic = 20240326, kStateMagic = 20240327;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

// An llm.c file opened and its 1 KiB header read, nothing more: the header says how long the file
// must be, and that is checked against its size before any payload is read (a wrong file given,
// say an optim.bin of 64 GB, is refused at once instead of read whole first).
struct LlmcFile {
  std::ifstream f;
  size_t size = 0;
  int32_t h[256];

  LlmcFile(const std::string& path, const char* kind) {
    require_regular_file(path);
    f.open(path, std::ios::binary | std::ios::ate);
    if (!f) throw file_error(path, std::string("cannot open ") + kind + ": " + std::strerror(errno));
    size = size_t(f.tellg());
    if (size < kHeaderBytes)
      throw file_error(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                                 std::to_string(kHeaderBytes) + "-byte header of " + kind);
    f.seekg(0);
    read(path, h, kHeaderBytes);
  }
  // The next `bytes` bytes (the size was checked: a failure here is the file changing under us).
  // In pieces of 64 MiB, each counted (file_io.h): a heartbeat says how far a large load got.
  void read(const std::string& path, void* dst, size_t bytes) {
    for (size_t at = 0; at < bytes;) {
      const size_t k = std::min(bytes - at, size_t(64) << 20);
      if (!f.read(static_cast<char*>(dst) + at, std::streamsize(k)))
        throw file_error(path, "read failed (the file shrank while it was read?)");
      count_io_read(k);
      at += k;
    }
  }
};

void check_size(const std::string& path, size_t have, size_t want, const std::string& layout) {
  if (have == want) return;
  throw file_error(path, std::string(have < want ? "truncated" : "trailing bytes") + ": " + std::to_string(have) +
                             " bytes, but " + layout + " needs exactly " + std::to_string(want));
}

// The parameter count, false when it exceeds 2^50 (param_count's limit, layers/transformer.cpp): a
// hostile header can otherwise make the size_t arithmetic wrap around 2^64 to a small count that
// matches the file's size (found by fuzzing, tests/fuzz). It also keeps count * bytes per
// parameter exact.
bool checked_num_params(const LlmcConfig& c, size_t& n) {
  n = 0;
  for (auto& [name, shape] : llmc_gpt2_param_shapes(c)) {
    size_t k = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(k, size_t(d), &k)) return false;
    if (__builtin_add_overflow(n, k, &n)) return false;
  }
  return n <= (size_t(1) << 50);
}

}  // namespace

void validate_llmc_config(const LlmcConfig& c, const std::string& where) {
  const std::pair<const char*, int> fields[] = {{"maxT", c.max_seq}, {"V", c.vocab},  {"Vp", c.padded_vocab},
                                                {"L", c.layers},     {"H", c.heads}, {"C", c.channels}};
  for (auto& [name, v] : fields)
    if (v <= 0) throw std::runtime_error(where + ": header value " + name + " = " + std::to_string(v) + " (must be > 0)");
  if (c.vocab > c.padded_vocab)
    throw std::runtime_error(where + ": vocab V = " + std::to_string(c.vocab) + " exceeds the padded vocab Vp = " +
                             std::to_string(c.padded_vocab));
  if (c.channels % c.heads != 0)
    throw std::runtime_error(where + ": channels C = " + std::to_string(c.channels) + " is not divisible by heads H = " +
                             std::to_string(c.heads));
  size_t n;
  if (!checked_num_params(c, n))
    throw std::runtime_error(where + ": the header's sizes (L = " + std::to_string(c.layers) + ", C = " +
                             std::to_string(c.channels) + ", Vp = " + std::to_string(c.padded_vocab) + ", maxT = " +
                             std::to_string(c.max_seq) + ") give more than 2^50 parameters");
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llmc_gpt2_param_shapes(const LlmcConfig& c) {
  const int64_t L = c.layers, C = c.channels;
  return {{"wte", {c.padded_vocab, C}}, {"wpe", {c.max_seq, C}},   {"ln1w", {L, C}},
          {"ln1b", {L, C}},             {"qkvw", {L, 3 * C, C}},   {"qkvb", {L, 3 * C}},
          {"attprojw", {L, C, C}},      {"attprojb", {L, C}},      {"ln2w", {L, C}},
          {"ln2b", {L, C}},             {"fcw", {L, 4 * C, C}},    {"fcb", {L, 4 * C}},
          {"fcprojw", {L, C, 4 * C}},   {"fcprojb", {L, C}},       {"lnfw", {C}},
          {"lnfb", {C}}};
}

size_t llmc_gpt2_num_params(const LlmcConfig& c) {
  size_t n;
  if (!checked_num_params(c, n)) throw std::runtime_error("llm.c GPT-2 config: more than 2^50 parameters");
  return n;
}

LlmcConfig read_llmc_checkpoint(const std::string& path, std::vector<float>& params, bool weights) {
  LlmcFile file(path, "an llm.c GPT-2 checkpoint");
  const int32_t* h = file.h;
  if (h[0] != kCheckpointMagic)
    throw file_error(path, "bad magic " + std::to_string(h[0]) + " (expected 20240326, an llm.c GPT-2 checkpoint)");
  if (h[1] != 3 && h[1] != 5)
    throw file_error(path, "unsupported checkpoint version " + std::to_string(h[1]) + " (expected 3 = fp32 or 5 = bf16)");
  LlmcConfig c{h[2], h[3], h[7], h[4], h[5], h[6]};
  validate_llmc_config(c, path);
  const size_t n = llmc_gpt2_num_params(c), width = h[1] == 3 ? 4 : 2;
  check_size(path, file.size, kHeaderBytes + n * width,
             "a version " + std::to_string(h[1]) + " header with " + std::to_string(n) + " parameters");
  params.clear();
  if (!weights) return c;
  params.resize(n);
  if (width == 4) {
    file.read(path, params.data(), n * 4);
  } else {  // bf16, widened a piece at a time (no second copy of the whole file)
    std::vector<uint16_t> piece(size_t(1) << 20);
    for (size_t at = 0; at < n; at += piece.size()) {
      const size_t k = std::min(piece.size(), n - at);
      file.read(path, piece.data(), k * 2);
      for (size_t i = 0; i < k; i++) params[at + i] = f32_from_bf16(piece[i]);
    }
  }
  return c;
}

void write_llmc_checkpoint(const std::string& path, const LlmcConfig& c, const float* params, int version) {
  validate_llmc_config(c, path);
  if (version != 3 && version != 5)
    throw file_error(path, "cannot write checkpoint version " + std::to_string(version) + " (3 = fp32 or 5 = bf16)");
  const size_t n = llmc_gpt2_num_params(c);
  std::vector<uint16_t> half;
  if (version == 5) {
    half.resize(n);
    for (size_t k = 0; k < n; k++) half[k] = bf16_from_f32(params[k]);
  }
  int32_t h[256] = {};
  h[0] = kCheckpointMagic;
  h[1] = version;
  h[2] = c.max_seq, h[3] = c.vocab, h[4] = c.layers, h[5] = c.heads, h[6] = c.channels, h[7] = c.padded_vocab;
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw file_error(tmp, std::string("cannot create checkpoint: ") + std::strerror(errno));
  auto put = [&](const void* data, size_t len) {
    const char* q = static_cast<const char*>(data);
    while (len > 0) {
      ssize_t w = ::write(fd, q, std::min<size_t>(len, size_t(64) << 20));  // (AtomicFile's pieces)
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      count_io_written(uint64_t(w));
      q += w, len -= size_t(w);
    }
    return true;
  };
  const bool ok = put(h, sizeof h) && (version == 3 ? put(params, n * sizeof(float)) : put(half.data(), n * 2)) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(tmp.c_str());
    throw file_error(tmp, std::string("writing checkpoint failed: ") + std::strerror(ok ? errno : err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw file_error(path, std::string("cannot rename the temporary checkpoint into place: ") + std::strerror(e));
  }
  // Make the rename itself durable.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

DebugState read_debug_state(const std::string& path, const LlmcConfig& cfg) {
  validate_llmc_config(cfg, path + " (model config)");
  LlmcFile file(path, "an llm.c debug state");
  const int32_t* h = file.h;
  if (h[0] != kStateMagic)
    throw file_error(path, "bad magic " + std::to_string(h[0]) + " (expected 20240327, an llm.c debug state)");
  if (h[1] != 2) throw file_error(path, "unsupported debug state version " + std::to_string(h[1]) + " (expected 2)");
  DebugState s;
  s.B = h[2], s.T = h[3];
  if (s.B <= 0 || s.T <= 0)
    throw file_error(path, "header B = " + std::to_string(s.B) + ", T = " + std::to_string(s.T) + " (must be > 0)");
  if (s.T > cfg.max_seq)
    throw file_error(path, "T = " + std::to_string(s.T) + " exceeds the model's maxT = " + std::to_string(cfg.max_seq));
  const size_t BT = size_t(s.B) * size_t(s.T), V = size_t(cfg.vocab), n = llmc_gpt2_num_params(cfg);
  const std::string layout = "B = " + std::to_string(s.B) + ", T = " + std::to_string(s.T) + " and the model's V = " +
                             std::to_string(V) + " and " + std::to_string(n) +
                             " gradients (a state made with another model does not fit)";
  // inputs, targets (B*T each), logits (B*T*V), the loss, the gradients (n): 4 bytes each. Counted
  // with overflow checks: a hostile B could otherwise wrap the sum to the file's real size.
  size_t words = 0;
  if (__builtin_mul_overflow(BT, V + 2, &words) || __builtin_add_overflow(words, n + 1, &words) ||
      words > (size_t(1) << 60))
    throw file_error(path, "header B = " + std::to_string(s.B) + ", T = " + std::to_string(s.T) + " with the model's V = " +
                               std::to_string(V) + " give more than 2^60 values: not a debug state of this model");
  check_size(path, file.size, kHeaderBytes + 4 * words, layout);
  s.inputs.resize(BT), s.targets.resize(BT), s.logits.resize(BT * V), s.grads.resize(n);
  file.read(path, s.inputs.data(), BT * 4);
  file.read(path, s.targets.data(), BT * 4);
  file.read(path, s.logits.data(), BT * V * 4);
  file.read(path, &s.loss, 4);
  file.read(path, s.grads.data(), n * 4);
  for (size_t k = 0; k < BT; k++) {
    if (s.inputs[k] < 0 || size_t(s.inputs[k]) >= V)
      throw file_error(path, "input token " + std::to_string(s.inputs[k]) + " at position " + std::to_string(k) +
                                 " is outside [0, " + std::to_string(V) + ")");
    if (s.targets[k] < -1 || (s.targets[k] >= 0 && size_t(s.targets[k]) >= V))
      throw file_error(path, "target token " + std::to_string(s.targets[k]) + " at position " + std::to_string(k) +
                                 " is outside [0, " + std::to_string(V) + ") and not -1");
  }
  return s;
}

}  // namespace ul
