#include "engine/check_state.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/checkpoint_files.h"
#include "engine/context.h"
#include "engine/device.h"
#include "engine/export.h"
#include "engine/llmc_format.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/hosts.h"
#include "parallel/ulysses.h"

namespace ul {
namespace {

// t (f32 or bf16, any device) as f32 values on the host.
void hidden_to_host(float* dst, const Tensor& t) {
  if (t.dtype == DType::f32) return copy_to_host(dst, t);
  if (t.dtype != DType::bf16) throw std::runtime_error(std::string("check-state: hidden state of dtype ") + dtype_name(t.dtype));
  std::vector<uint16_t> h(size_t(t.numel()));
  copy_to_host(h.data(), t);
  for (size_t i = 0; i < h.size(); i++) {
    const uint32_t u = uint32_t(h[i]) << 16;  // bf16 is the top half of an f32
    std::memcpy(dst + i, &u, 4);
  }
}

}  // namespace

// |ours - ref|, infinite when either is NaN or infinite: std::max drops a NaN (every comparison
// with it is false), and a reference or a result holding one must fail, not pass unseen.
static double abs_diff(double ours, double ref) {
  const double d = std::fabs(ours - ref);
  return std::isfinite(d) ? d : INFINITY;
}

int check_state_rank(const Options& o, Comm& world) {
  const bool lead = world.rank() == 0;
  // as a training run's (parallel/hosts.h)
  const int ranks_here = std::strcmp(world.backend(), "local") == 0 ? world.size() : 1;
  omp_set_num_threads(threads_for_rank(o.threads, host_map(world), omp_threads_per_rank(ranks_here)));
  Grid g(world, o.sp);
  Context c(run_device(o));
  ContextGuard guard(c);

  // --checkpoint takes three formats; the debug state is llm.c's, and so is the model it checks.
  if (is_hf_checkpoint_path(o.checkpoint) || is_model_file(o.checkpoint))
    throw std::runtime_error("--check-state compares an llm.c GPT-2 checkpoint (.bin) with its debug state, and " +
                             o.checkpoint + " is " + (is_model_file(o.checkpoint) ? "one of this engine's model.bin files"
                                                                                   : "a Hugging Face checkpoint") +
                             ": a gpt2 converts with --steps 0 --checkpoint " + o.checkpoint + " --export-llmc FILE.bin (llm.c's "
                             "format, and this check, hold gpt2 models only)");
  std::vector<float> weights;
  LlmcConfig lc = read_llmc_checkpoint(o.checkpoint, weights);
  DebugState st = read_debug_state(o.check_state, lc);
  const int B = st.B, T = st.T, V = lc.vocab, C = lc.channels;
  if (T > lc.max_seq) throw std::runtime_error(o.check_state + ": T " + std::to_string(T) + " exceeds the model's max_seq");
  if (B % g.dp)
    throw std::runtime_error("--check-state: the state's batch " + std::to_string(B) + " is not divisible by dp " + std::to_string(g.dp));
  ModelConfig cfg;
  cfg.arch = "gpt2";
  cfg.layers = lc.layers; cfg.dim = C; cfg.heads = lc.heads; cfg.kv_heads = lc.heads;
  cfg.vocab = V; cfg.padded_vocab = lc.padded_vocab; cfg.max_seq = lc.max_seq;
  check_ulysses_config(cfg.heads, cfg.kv_heads, T, g.sp, world.size());
  cfg.validate_for(c.device, o.checkpoint);  // (a head dim the CUDA kernels lack failed inside one)
  Transformer model(cfg, param_dtype(o));
  // The memory flags change how the step runs, not what it computes: checked against the file too.
  model.recompute = o.recompute;
  model.offload = o.offload;
  model.mlp_chunks = o.mlp_chunks;
  if (weights.size() != model.params.numel())
    throw std::runtime_error(o.checkpoint + ": holds " + std::to_string(weights.size()) + " parameters, the model " +
                             std::to_string(model.params.numel()));
  model.params.load_host(weights.data());

  // This rank's rows and columns of the state: sequences [b0, b0 + Bl), tokens [t0, t0 + Tl).
  const int Bl = B / g.dp, Tl = T / g.sp, b0 = g.dp_rank * Bl, t0 = g.sp_rank * Tl;
  std::vector<int32_t> idx(size_t(Bl) * Tl), tgt(size_t(Bl) * Tl), pos(size_t(Bl) * Tl), pos_full(size_t(Bl) * T);
  int64_t valid_local = 0;
  for (int b = 0; b < Bl; b++) {
    for (int t = 0; t < Tl; t++) {
      size_t k = size_t(b) * Tl + t, src = size_t(b0 + b) * T + t0 + t;
      idx[k] = st.inputs[src];
      tgt[k] = st.targets[src];
      pos[k] = t0 + t;
      valid_local += tgt[k] >= 0;
    }
    for (int t = 0; t < T; t++) pos_full[size_t(b) * T + t] = t;
  }
  double count = double(valid_local);
  world.all_reduce(&count, 1, DType::f64, ReduceOp::sum);

  auto dev = [&](const std::vector<int32_t>& v, Shape s) {
    Tensor t = c.empty(s, DType::i32);
    copy_from_host(t, v.data());
    return t;
  };
  ModelInputs in;
  in.idx = dev(idx, {Bl, Tl});
  in.targets = dev(tgt, {Bl, Tl});
  in.pos = dev(pos, {Bl, Tl});
  in.pos_full = dev(pos_full, {Bl, T});
  model.params.zero_grad();
  CrossEntropyStats s;
  {
    Recording rec(true);
    s = model.forward(in, float(1.0 / count), g.sp_group.get());
    c.tape.backward();
  }
  // Logits of this rank's tokens over the unpadded vocabulary: (Bl * Tl, V) = hidden wte[:V]^T.
  std::vector<float> hidden(size_t(Bl) * Tl * C), logits(size_t(Bl) * Tl * V);
  hidden_to_host(hidden.data(), model.last_hidden);
  // wte's f32 values (a bf16 model's master copy; the forward used their bf16 rounding).
  std::vector<float> wte(size_t(V) * C);
  device_copy(wte.data(), Device::cpu, model.params.master() + model.params.spec("wte").offset, c.device,
              wte.size() * sizeof(float));
  cpu::linear_forward<float>(logits.data(), hidden.data(), wte.data(), nullptr, Bl * Tl, C, V);
  double logit_stats[2] = {0, 0};  // max |diff|, max |ref|
  for (int b = 0; b < Bl; b++)
    for (int t = 0; t < Tl; t++)
      for (int v = 0; v < V; v++) {
        double ours = logits[(size_t(b) * Tl + t) * V + v];
        double ref = st.logits[(size_t(b0 + b) * T + t0 + t) * V + v];
        logit_stats[0] = std::max(logit_stats[0], abs_diff(ours, ref));
        logit_stats[1] = std::max(logit_stats[1], std::fabs(ref));
      }
  world.all_reduce(logit_stats, 2, DType::f64, ReduceOp::max);
  double loss_sum = s.loss_sum;
  world.all_reduce(&loss_sum, 1, DType::f64, ReduceOp::sum);
  all_reduce_gradients(world, model.params.grad(), model.params.numel());
  if (!lead) return 0;

  std::vector<float> grads(model.params.numel());
  device_copy(grads.data(), Device::cpu, model.params.grad(), c.device, grads.size() * sizeof(float));
  bool pass = true;
  auto report = [&](const std::string& name, double diff, double ref) {
    bool ok = diff <= o.check_tol * std::max(ref, 1e-6) && std::isfinite(diff);
    pass = pass && ok;
    std::printf("%-10s max_abs_diff %.3e max_abs_ref %.3e%s\n", name.c_str(), diff, ref, ok ? "" : "  <-- FAIL");
  };
  report("logits", logit_stats[0], logit_stats[1]);
  double loss = loss_sum / count;
  report("loss", abs_diff(loss, st.loss), std::fabs(st.loss));
  for (const ParamSpec& p : model.params.specs()) {
    double diff = 0, ref = 0;
    for (size_t i = p.offset; i < p.offset + size_t(p.shape.numel()); i++) {
      diff = std::max(diff, abs_diff(grads[i], st.grads[i]));
      ref = std::max(ref, double(std::fabs(st.grads[i])));
    }
    report(p.name, diff, ref);
  }
  std::string how;  // the memory flags the step ran with (the model's, which the step read)
  if (model.recompute) how += ", --recompute";
  if (model.offload) how += ", --offload";
  if (model.mlp_chunks > 1) how += ", --mlp-chunks " + std::to_string(model.mlp_chunks);
  std::printf("check-state: %s (loss %.6f, reference %.6f, %s, dp %d x sp %d%s, tolerance %.1e relative)\n",
              pass ? "PASS" : "FAIL", loss, st.loss, o.precision.c_str(), g.dp, g.sp, how.c_str(), o.check_tol);
  // A bf16 step differs from the fp32 reference by its roundings (about 1e-3), not by a bug.
  if (!pass && o.precision == "bf16")
    std::printf("check-state: this step ran in bf16, against an fp32 reference: --precision fp32 checks the kernels "
                "to the reference's precision\n");
  return pass ? 0 : 1;
}

}  // namespace ul
