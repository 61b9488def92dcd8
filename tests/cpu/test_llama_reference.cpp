// The llama architecture against an independent PyTorch float64 Llama (tools/reference_llama.py):
// RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, untied head — loss and every
// parameter gradient, also under Ulysses sequence parallelism with kv-head replication; and the
// same with Qwen 2's q/k/v bias and RMSNorm eps 1e-6 (tools/reference_llama.py --qwen).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>

#include "gradcheck.h"
#include "engine/context.h"
#include "engine/device.h"
#include "layers/transformer.h"
#include "parallel/comm_local.h"
#include "parallel/data_parallel.h"
#include "run_cmd.h"

using namespace ul;

namespace {

struct LlamaRef {
  int B, T, L, C, H, KV, V, Vp, F, theta;
  bool qkv_bias;
  float norm_eps;
  std::vector<float> params, grads;
  std::vector<int32_t> inputs, targets;
  float loss;
};

LlamaRef read_ref(const char* file) {
  std::ifstream f(ul_test::source_path(std::string("tests/data/") + file), std::ios::binary);
  REQUIRE(f.good());
  int32_t h[256];
  f.read(reinterpret_cast<char*>(h), sizeof h);
  REQUIRE(h[0] == 20261130);
  LlamaRef r{h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12] == 1,
             float(std::pow(10.0, -(h[13] ? h[13] : 5))), {}, {}, {}, {}, 0};
  const int D = r.C / r.H, QKV = (r.H + 2 * r.KV) * D;
  size_t n = size_t(r.Vp) * r.C * 2 + size_t(r.L) * (2 * r.C + QKV * r.C + (r.qkv_bias ? QKV : 0) + r.C * r.C +
                                                       2 * r.F * r.C + r.C * r.F) + r.C;
  r.params.resize(n);
  r.grads.resize(n);
  r.inputs.resize(size_t(r.B) * r.T);
  r.targets.resize(size_t(r.B) * r.T);
  f.read(reinterpret_cast<char*>(r.params.data()), n * 4);
  f.read(reinterpret_cast<char*>(r.inputs.data()), r.inputs.size() * 4);
  f.read(reinterpret_cast<char*>(r.targets.data()), r.targets.size() * 4);
  f.read(reinterpret_cast<char*>(&r.loss), 4);
  f.read(reinterpret_cast<char*>(r.grads.data()), n * 4);
  REQUIRE(f.good());
  REQUIRE(f.peek() == EOF);
  return r;
}

// Runs the reference batch on one rank of an sp group (tokens [t0, t0 + T/P)); returns the world
// loss and leaves the world-summed gradient in the model.
double run_rank(const LlamaRef& r, Comm& world, std::vector<float>& grads_out, std::vector<ParamSpec>& specs) {
  Context c;
  ContextGuard g(c);
  ModelConfig cfg;
  cfg.arch = "llama";
  cfg.layers = r.L; cfg.dim = r.C; cfg.heads = r.H; cfg.kv_heads = r.KV;
  cfg.vocab = r.V; cfg.padded_vocab = r.Vp; cfg.max_seq = r.T; cfg.ffn = r.F; cfg.rope_theta = float(r.theta);
  cfg.qkv_bias = r.qkv_bias; cfg.norm_eps = r.norm_eps;
  Transformer m(cfg);
  REQUIRE(m.params.numel() == r.params.size());
  std::memcpy(m.params.data(), r.params.data(), r.params.size() * 4);
  const int P = world.size(), Tl = r.T / P, t0 = world.rank() * Tl;
  std::vector<int32_t> idx, tgt, pos, posf;
  int64_t valid = 0;
  for (int b = 0; b < r.B; b++) {
    for (int t = 0; t < Tl; t++) {
      idx.push_back(r.inputs[b * r.T + t0 + t]);
      tgt.push_back(r.targets[b * r.T + t0 + t]);
      pos.push_back(t0 + t);
    }
    for (int t = 0; t < r.T; t++) posf.push_back(t);
  }
  for (int32_t t : r.targets) valid += t >= 0;
  auto dev = [&](std::vector<int32_t>& v, Shape s) {
    Tensor t = c.empty(s, DType::i32);
    copy_from_host(t, v.data());
    return t;
  };
  ModelInputs in{dev(idx, {r.B, Tl}), dev(tgt, {r.B, Tl}), dev(pos, {r.B, Tl}), dev(posf, {r.B, r.T}), Tensor{}};
  m.params.zero_grad();
  double loss_sum;
  {
    Recording rec(true);
    loss_sum = m.forward(in, float(1.0 / double(valid)), P > 1 ? &world : nullptr).loss_sum;
    c.tape.backward();
  }
  world.all_reduce(&loss_sum, 1, DType::f64, ReduceOp::sum);
  all_reduce_gradients(world, m.params.grad(), m.params.numel());
  grads_out.assign(m.params.grad(), m.params.grad() + m.params.numel());
  specs = m.params.specs();
  return loss_sum / double(valid);
}

}  // namespace

TEST_CASE("llama matches the PyTorch float64 reference (loss and every gradient)", "[model][reference][llama]") {
  const char* file = GENERATE("llama_tiny_ref.bin", "qwen_tiny_ref.bin");  // the second: q/k/v bias, eps 1e-6
  INFO(file);
  LlamaRef r = read_ref(file);
  // sp 1; sp 2 (kv heads split); sp 4 (kv heads 2 < 4: each kv head replicated on two ranks).
  for (int P : {1, 2, 4}) {
    std::vector<float> grads;
    std::vector<ParamSpec> specs;
    double loss = 0;
    std::mutex mu;
    run_local(P, [&](Comm& world) {
      std::vector<float> gr;
      std::vector<ParamSpec> sp;
      double l = run_rank(r, world, gr, sp);
      if (world.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        loss = l;
        grads = gr;
        specs = sp;
      }
    });
    INFO("sp " << P << ": loss " << loss << ", reference " << r.loss);
    CHECK(std::fabs(loss - r.loss) <= 1e-5 * std::fabs(r.loss));
    REQUIRE(specs.size() == (r.qkv_bias ? 10u : 9u));
    for (const ParamSpec& s : specs) {  // each tensor against its own scale
      double max_ref = 0, max_diff = 0;
      for (size_t i = s.offset; i < s.offset + size_t(s.shape.numel()); i++) {
        max_ref = std::max(max_ref, double(std::fabs(r.grads[i])));
        max_diff = ul_test::max_err(max_diff, double(std::fabs(grads[i] - r.grads[i])));
      }
      INFO(s.name << ": max |grad diff| " << max_diff << ", max |grad| " << max_ref);
      CHECK(max_diff <= 1e-5 * max_ref);
      CHECK(max_ref > 0);
    }
  }
}
