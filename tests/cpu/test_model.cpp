// The whole model: AdamW steps against the independent PyTorch float64 reference, the parameter
// layout against llm.c's, and activation memory linear in T.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "gradcheck.h"
#include "model_logits.h"
#include "engine/context.h"
#include "engine/device.h"
#include "engine/export.h"
#include "engine/llmc_format.h"
#include "engine/optimizer.h"
#include "layers/transformer.h"
#include "run_cmd.h"

using namespace ul;
using namespace ul_test;

namespace {

Tensor ints(Context& c, const std::vector<int32_t>& v, Shape s) {
  Tensor t = c.empty(s, DType::i32);
  copy_from_host(t, v.data());
  return t;
}

ModelInputs inputs_for(Context& c, const std::vector<int32_t>& idx, const std::vector<int32_t>& tgt, int B, int T) {
  std::vector<int32_t> pos(size_t(B) * T);
  for (size_t i = 0; i < pos.size(); i++) pos[i] = int32_t(i % T);
  return {ints(c, idx, {B, T}), ints(c, tgt, {B, T}), ints(c, pos, {B, T}), ints(c, pos, {B, T}), Tensor{}};
}

}  // namespace

TEST_CASE("the gpt2 parameter layout is llm.c's", "[model]") {
  LlmcConfig lc{16, 50, 64, 2, 4, 32};
  Context c;
  ContextGuard g(c);
  Transformer m(gpt2_config(lc));
  auto shapes = llmc_gpt2_param_shapes(lc);
  REQUIRE(m.params.specs().size() == shapes.size());
  for (size_t i = 0; i < shapes.size(); i++) {
    const ParamSpec& s = m.params.specs()[i];
    CHECK(s.name == shapes[i].first);
    REQUIRE(s.shape.ndim == int(shapes[i].second.size()));
    for (int d = 0; d < s.shape.ndim; d++) CHECK(s.shape[d] == shapes[i].second[d]);
  }
  CHECK(m.params.numel() == llmc_gpt2_num_params(lc));
}

TEST_CASE("five AdamW steps follow the PyTorch float64 reference", "[model][reference]") {
  std::vector<float> w;
  LlmcConfig lc = read_llmc_checkpoint(source_path("tests/data/gpt2_tiny_model.bin"), w);
  DebugState st = read_debug_state(source_path("tests/data/gpt2_tiny_state.bin"), lc);
  std::vector<double> ref;
  {
    std::ifstream f(source_path("tests/data/gpt2_tiny_steps.txt"));
    std::string line;
    while (std::getline(f, line))
      if (!line.empty() && line[0] != '#') ref.push_back(std::stod(line));
  }
  REQUIRE(ref.size() == 5);
  Context c;
  ContextGuard g(c);
  Transformer m(gpt2_config(lc));
  copy_from_host(Tensor{m.params.data(), {int64_t(w.size())}}, w.data());
  AdamWConfig ac;  // betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on 2-D weights, as the reference
  AdamW opt(m.params, ac);
  int64_t valid = 0;
  for (int32_t t : st.targets) valid += t >= 0;
  for (size_t s = 0; s < ref.size(); s++) {
    c.arena.reset();
    m.params.zero_grad();
    CrossEntropyStats cs;
    {
      Recording rec(true);
      cs = m.forward(inputs_for(c, st.inputs, st.targets, st.B, st.T), float(1.0 / double(valid)));
      c.tape.backward();
    }
    double loss = cs.loss_sum / double(cs.n_valid);
    INFO("step " << s << ": ours " << loss << ", reference " << ref[s]);
    CHECK(std::fabs(loss - ref[s]) <= 1e-5 * std::fabs(ref[s]));
    opt.step(1e-3f, 1.0f);
  }
}

// Arena high-water of one forward + backward of the tiny gpt2 at batch 1 and sequence T.
static size_t activation_bytes(const std::string& arch, int T) {
  ModelConfig cfg;
  cfg.arch = arch;
  cfg.layers = 2;
  cfg.dim = 64;
  cfg.heads = 4;
  cfg.kv_heads = arch == "llama" ? 2 : 4;
  cfg.vocab = 256;
  cfg.padded_vocab = 256;
  cfg.max_seq = T;
  Context c;
  ContextGuard g(c);
  Transformer m(cfg);
  m.init_weights(3);
  std::vector<int32_t> idx(T), tgt(T);
  for (int t = 0; t < T; t++) {
    idx[t] = (t * 7) % 256;
    tgt[t] = (t * 13) % 256;
  }
  c.arena.reset_high_water();
  Recording rec(true);
  m.forward(inputs_for(c, idx, tgt, 1, T), 1.0f / T);
  c.tape.backward();
  return c.arena.high_water();
}

TEST_CASE("activation memory is linear in T: T = 2048 takes at most 2.2x T = 1024", "[model][memory]") {
  for (const char* arch : {"gpt2", "llama"}) {
    size_t m1 = activation_bytes(arch, 1024), m2 = activation_bytes(arch, 2048);
    INFO(arch << ": T=1024 " << m1 << " bytes, T=2048 " << m2 << " bytes, ratio " << double(m2) / double(m1));
    CHECK(double(m2) / double(m1) <= 2.2);
    CHECK(m2 > m1);
  }
}

TEST_CASE("tied llama embeddings: the untied model with lm_head = wte, its two gradients summed", "[model]") {
  // One forward + backward of a llama whose head is its embedding against the same llama with an
  // lm_head holding a copy: the loss is the same and wte's gradient is the untied wte's plus lm_head's.
  ModelConfig cfg;
  cfg.arch = "llama", cfg.layers = 2, cfg.dim = 32, cfg.heads = 4, cfg.kv_heads = 2, cfg.vocab = 50;
  cfg.padded_vocab = 128, cfg.max_seq = 64;
  ModelConfig tied = cfg;
  tied.tie_embeddings = true;
  const int B = 2, T = 12;
  std::vector<int32_t> idx(B * T), tgt(B * T);
  for (int i = 0; i < B * T; i++) idx[size_t(i)] = (i * 7 + 3) % 50, tgt[size_t(i)] = (i * 11 + 5) % 50;
  struct Run {
    double loss;
    std::vector<float> grad;
    std::vector<ParamSpec> specs;
  };
  auto run = [&](const ModelConfig& mc) {
    Context c;
    ContextGuard g(c);
    Transformer m(mc);
    m.init_weights(9);
    std::vector<float> w(m.params.numel());
    copy_to_host(w.data(), Tensor{m.params.data(), {int64_t(w.size())}});
    if (mc.has_lm_head()) {  // lm_head = wte
      const ParamSpec &e = m.params.spec("wte"), &h = m.params.spec("lm_head");
      std::copy(w.begin() + long(e.offset), w.begin() + long(e.offset + e.shape.numel()), w.begin() + long(h.offset));
      copy_from_host(Tensor{m.params.data(), {int64_t(w.size())}}, w.data());
    }
    m.params.zero_grad();
    Recording rec(true);
    const CrossEntropyStats cs = m.forward(inputs_for(c, idx, tgt, B, T), 1.0f / float(B * T));
    c.tape.backward();
    Run r{cs.loss_sum / double(cs.n_valid), std::vector<float>(m.params.numel()), m.params.specs()};
    std::copy(m.params.grad(), m.params.grad() + r.grad.size(), r.grad.begin());
    return r;
  };
  const Run u = run(cfg), t = run(tied);
  CHECK(t.specs.size() + 1 == u.specs.size());  // no lm_head
  CHECK(t.loss == Approx(u.loss).epsilon(1e-6));
  auto find = [](const Run& r, const std::string& name) {
    for (const ParamSpec& s : r.specs)
      if (s.name == name) return s;
    FAIL("no parameter " << name);
    return r.specs[0];
  };
  const ParamSpec tw = find(t, "wte"), uw = find(u, "wte"), uh = find(u, "lm_head");
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < tw.shape.numel(); i++) {
    const double want = double(u.grad[uw.offset + size_t(i)]) + double(u.grad[uh.offset + size_t(i)]);
    worst = ul_test::max_err(worst, std::fabs(double(t.grad[tw.offset + size_t(i)]) - want));
    scale = std::max(scale, std::fabs(want));
  }
  CHECK(scale > 0);
  CHECK(worst <= 1e-5 * scale);
  // Every other parameter's gradient agrees too.
  for (const ParamSpec& s : t.specs) {
    if (s.name == "wte") continue;
    const ParamSpec us = find(u, s.name);
    for (int64_t i = 0; i < s.shape.numel(); i += 7)
      CHECK(t.grad[s.offset + size_t(i)] == Approx(u.grad[us.offset + size_t(i)]).epsilon(1e-4).margin(1e-7));
  }
}

TEST_CASE("a step that throws in its forward or its backward leaves nothing on the tape for the next one", "[model]") {
  // A library user (a fork's loop, a bench) may catch a step's error and go on: the next step must
  // not run the failed one's nodes (emptied, or pointing into the arena it reuses).
  for (bool recompute : {false, true}) {
    CAPTURE(recompute);
    Context c(Device::cpu);
    ContextGuard g(c);
    Transformer m(small("llama"));
    m.init_weights(5);
    m.recompute = recompute;
    const int B = 1, T = 8;
    std::vector<int32_t> idx(T), tgt(T);
    for (int t = 0; t < T; t++) idx[size_t(t)] = (3 * t) % 50, tgt[size_t(t)] = (3 * t + 1) % 50;
    auto step = [&](const std::vector<int32_t>& targets) {
      c.arena.reset();
      m.params.zero_grad();
      Recording rec(true);
      m.forward(inputs_for(c, idx, targets, B, T), 1.0f / T);
      c.tape.backward();
      return std::vector<float>(m.params.grad(), m.params.grad() + m.params.numel());
    };
    const std::vector<float> want = step(tgt);
    // The forward throws at the classifier's target check, after every block has recorded.
    std::vector<int32_t> bad = tgt;
    bad[3] = 999;
    CHECK_THROWS_WITH(step(bad), Catch::Contains("999"));
    CHECK(c.tape.size() == 0);
    CHECK(step(tgt) == want);
    // The backward throws midway (here its progress report; a collective's timeout alike).
    m.progress = [](const std::string& where) {
      if (where == "backward 1/2 blocks") throw std::runtime_error("stopped in " + where);
    };
    CHECK_THROWS_WITH(step(tgt), "stopped in backward 1/2 blocks");
    CHECK(c.tape.size() == 0);
    m.progress = nullptr;
    CHECK(step(tgt) == want);
  }
}
