// A CPU training step is the same bits at any thread count: every op's parallel loop either writes
// disjoint outputs or sums in an order fixed by the sizes (layers/row_sums.h, the GEMM's blocks in
// layers/gemm_blocks.h), so a run resumed with another --threads (on the same CPU model and build)
// continues on the very losses it would have had.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "engine/context.h"
#include "engine/device.h"
#include "engine/float_env.h"
#include "engine/rng.h"
#include "layers/transformer.h"

using namespace ul;

namespace {

struct Step {
  double loss = 0;
  std::vector<float> grad;
};

// One forward + backward of a model large enough that every op takes its threaded path (the
// GEMMs split above ~4M multiply-adds).
Step step(const ModelConfig& mc, int threads, int B, int T, int scored_every) {
  omp_set_num_threads(threads);
  Context c;
  ContextGuard g(c);
  Transformer m(mc);
  m.init_weights(5);
  std::vector<int32_t> idx(B * T), tgt(B * T), pos(B * T);
  for (int i = 0; i < B * T; i++) {
    idx[size_t(i)] = (i * 7 + 3) % mc.vocab;
    tgt[size_t(i)] = i % scored_every == 0 ? (i * 11 + 5) % mc.vocab : -1;
    pos[size_t(i)] = i % T;
  }
  auto ints = [&](const std::vector<int32_t>& v) {
    Tensor t = c.empty({B, T}, DType::i32);
    copy_from_host(t, v.data());
    return t;
  };
  m.params.zero_grad();
  Recording rec(true);
  const CrossEntropyStats cs = m.forward({ints(idx), ints(tgt), ints(pos), ints(pos), Tensor{}}, 1.0f / float(B * T));
  c.tape.backward();
  Step s{cs.loss_sum, std::vector<float>(m.params.numel())};
  std::copy(m.params.grad(), m.params.grad() + s.grad.size(), s.grad.begin());
  return s;
}

// The parameters whose gradients differ (the first element of each), for the failure message.
std::string differing_params(const ModelConfig& mc, const Step& a, const Step& b) {
  Context c;
  ContextGuard g(c);
  Transformer m(mc);
  std::string out;
  for (const ParamSpec& s : m.params.specs())
    for (int64_t i = 0; i < s.shape.numel(); i++)
      if (a.grad[s.offset + size_t(i)] != b.grad[s.offset + size_t(i)]) {
        out += s.name + "[" + std::to_string(i) + "] ";
        break;
      }
  return out.empty() ? "none" : out;
}

// Two layers of 128: every op's threaded path, and stacked weights of several 65536-element blocks.
ModelConfig small_gpt2() {
  ModelConfig c;
  c.arch = "gpt2", c.layers = 2, c.dim = 128, c.heads = 4, c.vocab = 300, c.padded_vocab = 320, c.max_seq = 160;
  return c;
}
ModelConfig small_llama() {
  ModelConfig c = small_gpt2();
  c.arch = "llama", c.kv_heads = 2, c.ffn = 352;
  return c;
}

}  // namespace

TEST_CASE("a CPU step is the same bits at 1 to 7 threads", "[model][threads]") {
  const ModelConfig gpt2 = small_gpt2(), llama = small_llama();
  // The default job's shape too: vocab 32, most targets ignored (passkey scores its digits only).
  ModelConfig tiny = gpt2;
  tiny.dim = 64, tiny.vocab = 32, tiny.padded_vocab = 128, tiny.max_seq = 256;
  struct Run {
    ModelConfig mc;
    int B, T, scored_every;
  };
  for (const Run& r : {Run{gpt2, 2, 160, 1}, Run{llama, 2, 160, 3}, Run{tiny, 8, 256, 40}}) {
    const ModelConfig& mc = r.mc;
    const Step one = step(mc, 1, r.B, r.T, r.scored_every);
    for (int threads : {2, 3, 4, 7}) {
      const Step s = step(mc, threads, r.B, r.T, r.scored_every);
      INFO(mc.arch << " at " << threads << " threads: gradients that differ: " << differing_params(mc, one, s));
      CHECK(s.loss == one.loss);
      CHECK(s.grad == one.grad);
    }
  }
  omp_set_num_threads(1);
}

TEST_CASE("the initial weights are one seeded stream in order, the same bits at 1 to 7 threads", "[model][threads]") {
  for (const ModelConfig& mc : {small_gpt2(), small_llama()}) {
    Context c;
    ContextGuard g(c);
    Transformer m(mc);
    // The reference: one Rng drawing every weight matrix's values in the buffer's order (the
    // stacked ones hold 2 x 384 x 128 and more: several of init_weights' 65536-element blocks).
    std::vector<float> want(m.params.numel(), 0.0f);
    Rng rng(11);
    const double std0 = 0.02, std_res = 0.02 / std::sqrt(2.0 * mc.layers);
    for (const ParamSpec& s : m.params.specs()) {
      const bool norm_weight = s.name == "ln1w" || s.name == "ln2w" || s.name == "lnfw";
      for (int64_t i = 0; i < s.shape.numel(); i++) {
        float& w = want[s.offset + size_t(i)];
        if (norm_weight) w = 1.0f;
        else if (s.decay) w = float((s.name == "attprojw" || s.name == "fcprojw" ? std_res : std0) * rng.normal());
      }
      if (s.name == "wte" || s.name == "lm_head")
        for (int64_t i = int64_t(mc.vocab) * mc.dim; i < s.shape.numel(); i++) want[s.offset + size_t(i)] = 0.0f;
    }
    for (int threads : {1, 3, 7}) {
      omp_set_num_threads(threads);
      m.init_weights(11);
      INFO(mc.arch << " at " << threads << " threads");
      CHECK(m.params.to_host() == want);
    }
  }
  omp_set_num_threads(1);
}

TEST_CASE("subnormals flush to zero in the main thread, OpenMP's workers and threads started later",
          "[threads]") {
  // train (and this test's main, and every benchmark) calls flush_subnormals first: threads copy
  // the setting from their creator. Without it a confident model's softmax tails, below 1.2e-38,
  // cost a microcode assist each and its backward ran 5-60x slower (engine/float_env.h).
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
  auto flushed = [] {
    volatile float tiny = 1e-30f, scale = 1e-10f;
    const float product = tiny * scale;  // 1e-40: a subnormal, unless flushed
    return ul::flushes_subnormals() && product == 0.0f;
  };
  CHECK(flushed());
  std::vector<int> ok(8, 0);
  omp_set_num_threads(8);
#pragma omp parallel num_threads(8)
  ok[size_t(omp_get_thread_num())] = flushed();
  for (int t = 0; t < 8; t++) CHECK(ok[size_t(t)] == 1);
  int in_thread = 0;
  std::thread([&] { in_thread = flushed(); }).join();
  CHECK(in_thread == 1);
#else
  CHECK_FALSE(ul::flushes_subnormals());  // no such control here: said, not assumed
#endif
}
