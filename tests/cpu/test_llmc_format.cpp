// The llm.c checkpoint and debug-state formats: the committed reference files (written by
// tools/reference_gpt2.py) read back with the expected sizes and self-consistent contents, the
// writer round-trips bit-exactly, and every corrupt file is an error naming the file and problem.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "engine/llmc_format.h"
#include "temp_dir.h"
#include "expect_error.h"

namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(ULYSSES_SOURCE_DIR) + "/tests/data/gpt2_tiny_model.bin";
const std::string kState = std::string(ULYSSES_SOURCE_DIR) + "/tests/data/gpt2_tiny_state.bin";
const std::string kSteps = std::string(ULYSSES_SOURCE_DIR) + "/tests/data/gpt2_tiny_steps.txt";
const ul::LlmcConfig kTiny{16, 50, 64, 2, 4, 32};

using ul_test::TempDir;

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::vector<char>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(b.data(), std::streamsize(b.size()));
}

void set_int(std::vector<char>& b, size_t index, int32_t v) { std::memcpy(b.data() + 4 * index, &v, 4); }

using ul_test::require_error;

}  // namespace

TEST_CASE("GPT-2 parameter shapes follow llm.c's order", "[llmc]") {
  auto shapes = ul::llmc_gpt2_param_shapes(kTiny);
  const char* names[] = {"wte",  "wpe", "ln1w",    "ln1b",    "qkvw", "qkvb", "attprojw", "attprojb",
                         "ln2w", "ln2b", "fcw",    "fcb",     "fcprojw", "fcprojb", "lnfw", "lnfb"};
  REQUIRE(shapes.size() == 16);
  for (int k = 0; k < 16; k++) CHECK(shapes[k].first == names[k]);
  CHECK(shapes[0].second == std::vector<int64_t>{64, 32});
  CHECK(shapes[4].second == std::vector<int64_t>{2, 96, 32});
  CHECK(shapes[12].second == std::vector<int64_t>{2, 32, 128});
  // Vp*C + maxT*C + L*(12C^2 + 13C) + 2C
  CHECK(ul::llmc_gpt2_num_params(kTiny) == size_t(64 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32));
}

TEST_CASE("the committed reference checkpoint and state read back consistently", "[llmc]") {
  std::vector<float> params;
  ul::LlmcConfig c = ul::read_llmc_checkpoint(kModel, params);
  CHECK(c.max_seq == 16);
  CHECK(c.vocab == 50);
  CHECK(c.padded_vocab == 64);
  CHECK(c.layers == 2);
  CHECK(c.heads == 4);
  CHECK(c.channels == 32);
  REQUIRE(params.size() == ul::llmc_gpt2_num_params(c));
  for (size_t k = 50 * 32; k < 64 * 32; k++) CHECK(params[k] == 0.f);  // wte pad rows

  ul::DebugState s = ul::read_debug_state(kState, c);
  CHECK(s.B == 2);
  CHECK(s.T == 8);
  CHECK(s.inputs.size() == 16);
  CHECK(s.targets.size() == 16);
  CHECK(s.logits.size() == 16 * 50);
  REQUIRE(s.grads.size() == params.size());
  for (size_t k = 50 * 32; k < 64 * 32; k++) CHECK(s.grads[k] == 0.f);  // pad rows get no gradient

  // The stored loss is the mean cross-entropy of the stored logits over the valid targets.
  double sum = 0;
  int valid = 0;
  for (int i = 0; i < 16; i++) {
    if (s.targets[i] < 0) continue;
    const float* z = &s.logits[i * 50];
    double mx = *std::max_element(z, z + 50), se = 0;
    for (int v = 0; v < 50; v++) se += std::exp(double(z[v]) - mx);
    sum += std::log(se) + mx - z[s.targets[i]];
    valid++;
  }
  CHECK(valid > 0);
  CHECK(valid < 16);  // some targets are ignored
  CHECK(sum / valid == Approx(s.loss).epsilon(1e-5));
  CHECK(std::fabs(s.loss - std::log(50.0)) < 0.3);  // near chance at init

  std::ifstream f(kSteps);
  std::string line;
  std::getline(f, line);
  CHECK(line.rfind("#", 0) == 0);
  std::vector<double> losses;
  for (double x; f >> x;) losses.push_back(x);
  REQUIRE(losses.size() == 5);
  CHECK(losses[0] == Approx(s.loss).epsilon(1e-6));
  CHECK(losses[4] < losses[0]);
}

TEST_CASE("write_llmc_checkpoint round-trips bit-exactly and atomically", "[llmc]") {
  TempDir dir;
  std::vector<float> params, back;
  ul::LlmcConfig c = ul::read_llmc_checkpoint(kModel, params);
  const std::string out = dir.file("copy.bin");
  ul::write_llmc_checkpoint(out, c, params.data());
  CHECK(slurp(out) == slurp(kModel));  // same header and bytes as the reference's writer
  CHECK_FALSE(fs::exists(out + ".tmp"));
  ul::LlmcConfig c2 = ul::read_llmc_checkpoint(out, back);
  CHECK(std::memcmp(&c, &c2, sizeof c) == 0);
  REQUIRE(back.size() == params.size());
  CHECK(std::memcmp(back.data(), params.data(), params.size() * 4) == 0);
  // The header alone (--plan's shape): no weights kept, the size still checked against it.
  std::vector<float> none{1.f};
  ul::LlmcConfig c3 = ul::read_llmc_checkpoint(out, none, false);
  CHECK(std::memcmp(&c, &c3, sizeof c) == 0);
  CHECK(none.empty());
  fs::resize_file(out, fs::file_size(out) - 4);
  require_error([&] { ul::read_llmc_checkpoint(out, none, false); }, {out});

  // Overwriting keeps the file valid; a failed write (no such directory) leaves nothing behind.
  params[5] = 1.5f;
  ul::write_llmc_checkpoint(out, c, params.data());
  ul::read_llmc_checkpoint(out, back);
  CHECK(back[5] == 1.5f);
  const std::string bad = dir.file("no_dir/x.bin");
  require_error([&] { ul::write_llmc_checkpoint(bad, c, params.data()); }, {bad});
  CHECK_FALSE(fs::exists(bad + ".tmp"));
  require_error([&] { ul::write_llmc_checkpoint(out, ul::LlmcConfig{16, 50, 64, 2, 5, 32}, params.data()); },
                {out, "divisible"});
}

TEST_CASE("bf16 checkpoints (version 5) read as fp32", "[llmc]") {
  TempDir dir;
  std::vector<char> b = slurp(kModel);
  const size_t n = ul::llmc_gpt2_num_params(kTiny);
  std::vector<char> v5(b.begin(), b.begin() + 1024);
  set_int(v5, 1, 5);
  for (size_t k = 0; k < n; k++) {
    const float x = float(k % 7) - 2.5f;  // exact in bf16
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint16_t h = uint16_t(bits >> 16);
    v5.push_back(char(h & 0xff));
    v5.push_back(char(h >> 8));
  }
  const std::string path = dir.file("bf16.bin");
  spit(path, v5);
  std::vector<float> params;
  ul::read_llmc_checkpoint(path, params);
  REQUIRE(params.size() == n);
  for (size_t k = 0; k < n; k++) CHECK(params[k] == float(k % 7) - 2.5f);
}

TEST_CASE("corrupt checkpoints and states are errors naming the file and the problem", "[llmc]") {
  TempDir dir;
  std::vector<float> p;
  const std::vector<char> model = slurp(kModel), state = slurp(kState);
  auto variant = [&](const std::string& name, std::vector<char> b) {
    const std::string path = dir.file(name);
    spit(path, b);
    return path;
  };
  auto ckpt = [&](const std::string& path) { ul::read_llmc_checkpoint(path, p); };

  const std::string missing = dir.file("missing.bin");
  require_error([&] { ckpt(missing); }, {missing, "cannot open"});
  auto b = model;
  set_int(b, 0, 12345);
  std::string path = variant("magic.bin", b);
  require_error([&] { ckpt(path); }, {path, "bad magic 12345", "20240326"});
  b = model, set_int(b, 1, 4), path = variant("version.bin", b);
  require_error([&] { ckpt(path); }, {path, "version 4"});
  path = variant("trunc.bin", std::vector<char>(model.begin(), model.end() - 4));
  require_error([&] { ckpt(path); }, {path, "truncated"});
  path = variant("header_only.bin", std::vector<char>(model.begin(), model.begin() + 100));
  require_error([&] { ckpt(path); }, {path, "truncated", "header"});
  b = model, b.push_back(0), path = variant("trail.bin", b);
  require_error([&] { ckpt(path); }, {path, "trailing bytes"});
  b = model, set_int(b, 3, 65), path = variant("vocab.bin", b);  // V > Vp
  require_error([&] { ckpt(path); }, {path, "exceeds the padded vocab"});
  b = model, set_int(b, 4, 0), path = variant("layers.bin", b);
  require_error([&] { ckpt(path); }, {path, "L = 0"});
  b = model, set_int(b, 5, 5), path = variant("heads.bin", b);
  require_error([&] { ckpt(path); }, {path, "not divisible"});

  auto st = [&](const std::string& path) { ul::read_debug_state(path, kTiny); };
  b = state, set_int(b, 0, 20240326), path = variant("s_magic.bin", b);
  require_error([&] { st(path); }, {path, "bad magic 20240326", "debug state"});
  b = state, set_int(b, 1, 1), path = variant("s_version.bin", b);
  require_error([&] { st(path); }, {path, "version 1"});
  path = variant("s_trunc.bin", std::vector<char>(state.begin(), state.end() - 1));
  require_error([&] { st(path); }, {path, "truncated"});
  b = state, b.resize(b.size() + 8), path = variant("s_trail.bin", b);
  require_error([&] { st(path); }, {path, "trailing bytes"});
  b = state, set_int(b, 256 + 3, 50), path = variant("s_input.bin", b);  // inputs[3] = V
  require_error([&] { st(path); }, {path, "input token 50"});
  b = state, set_int(b, 256 + 16 + 1, -2), path = variant("s_target.bin", b);  // targets[1] = -2
  require_error([&] { st(path); }, {path, "target token -2"});

  // A state whose header makes 4 * (2 B T + B T V + 1 + n) wrap around 2^64 to the file's real
  // size (B = 2^30, T = 2^16, V = 65534: 4 B T (V + 2) = 2^64 exactly): the count is checked, not
  // wrapped, so the reader never sizes its arrays from it.
  {
    const ul::LlmcConfig wide{65536, 65534, 65536, 1, 1, 1};
    const size_t n = ul::llmc_gpt2_num_params(wide);
    std::vector<char> w(1024 + 4 * (1 + n), 0);
    set_int(w, 0, 20240327), set_int(w, 1, 2), set_int(w, 2, 1 << 30), set_int(w, 3, 65536);
    path = variant("s_wrap.bin", w);
    require_error([&] { ul::read_debug_state(path, wide); }, {path, "B = 1073741824, T = 65536", "more than 2^60"});
  }
}

// The reader checks a file's length against its header before reading any of it: a wrong file
// given as --checkpoint (an optim.bin of tens of GB, a token shard) was read whole into memory
// first, and a large one killed the process for memory before the one-line refusal.
TEST_CASE("a checkpoint or state far longer than its header says is refused without reading it", "[llmc]") {
  TempDir dir;
  const std::vector<char> model = slurp(kModel), state = slurp(kState);
  const off_t big = off_t(3) << 30;  // sparse: 3 GiB long, a few KiB on disk
  auto sparse = [&](const std::string& name, const std::vector<char>& head) {
    const std::string path = dir.file(name);
    spit(path, std::vector<char>(head.begin(), head.begin() + 1024));
    REQUIRE(::truncate(path.c_str(), big) == 0);
    return path;
  };
  auto max_rss_kib = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return long(u.ru_maxrss);
  };
  const long before = max_rss_kib();
  std::vector<float> p;
  const std::string m = sparse("model.bin", model), s = sparse("state.bin", state);
  require_error([&] { ul::read_llmc_checkpoint(m, p); }, {m, "trailing bytes: 3221225472 bytes"});
  require_error([&] { ul::read_debug_state(s, kTiny); }, {s, "trailing bytes: 3221225472 bytes"});
  CHECK(max_rss_kib() - before < 256 * 1024);  // reading either whole would add 3 GiB
}
