#include "engine/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <thread>

#include "data/dataset.h"
#include "engine/context.h"
#include "engine/device.h"
#include "engine/llmc_format.h"
#include "engine/optimizer.h"
#include "layers/transformer.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/ulysses.h"

namespace ul {

void load_batch(const Dataset& data, int64_t first, int B, int T, int sp, int sp_rank, HostBatch& hb) {
  hb.B = B;
  hb.T = T;
  hb.Tl = T / sp;
  const int Tl = hb.Tl, t0 = sp_rank * Tl;
  hb.idx.resize(size_t(B) * Tl);
  hb.targets.resize(size_t(B) * Tl);
  hb.pos.resize(size_t(B) * Tl);
  hb.pos_full.resize(size_t(B) * T);
  hb.valid = 0;
  std::vector<int32_t> in(T), tg(T);
  for (int b = 0; b < B; b++) {
    // Targets are shifted over the WHOLE sequence before it is sliced: no target is lost at a
    // slice boundary (DESIGN.md, "Loss and gradients across ranks").
    data.sequence(first + b, T, in.data(), tg.data());
    for (int t = 0; t < Tl; t++) {
      size_t k = size_t(b) * Tl + t;
      hb.idx[k] = in[t0 + t];
      hb.targets[k] = tg[t0 + t];
      hb.pos[k] = t0 + t;
      hb.valid += tg[t0 + t] >= 0;
    }
    for (int t = 0; t < T; t++) hb.pos_full[size_t(b) * T + t] = t;
  }
}

namespace {

Tensor to_device(Context& c, const std::vector<int32_t>& v, Shape s) {
  Tensor t = c.empty(s, DType::i32);
  copy_from_host(t, v.data());
  return t;
}

ModelInputs device_inputs(Context& c, const HostBatch& hb) {
  ModelInputs in;
  in.idx = to_device(c, hb.idx, {hb.B, hb.Tl});
  in.targets = to_device(c, hb.targets, {hb.B, hb.Tl});
  in.pos = to_device(c, hb.pos, {hb.B, hb.Tl});
  in.pos_full = to_device(c, hb.pos_full, {hb.B, hb.T});
  return in;
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

struct EvalResult { double loss; double acc; int64_t count; };

// Validation: eval_batches micro-batches of the val split, no tape, summed over the world.
EvalResult evaluate(const Options& o, Transformer& model, const Dataset& val, Grid& g, Context& c, int eval_index) {
  Recording off(false);
  double sums[3] = {0, 0, 0};  // loss_sum, valid, correct
  HostBatch hb;
  for (int e = 0; e < o.eval_batches; e++) {
    c.arena.reset();
    // Each eval looks at the same held-out sequences, so successive val losses are comparable.
    int64_t first = (int64_t(e) * g.dp + g.dp_rank) * o.batch;
    (void)eval_index;
    load_batch(val, first, o.batch, o.seq, g.sp, g.sp_rank, hb);
    CrossEntropyStats s = model.forward(device_inputs(c, hb), 0.0f, g.sp_group.get());
    sums[0] += s.loss_sum;
    sums[1] += double(s.n_valid);
    sums[2] += double(s.n_correct);
  }
  g.world.all_reduce(sums, 3, DType::f64, ReduceOp::sum);
  EvalResult r{sums[1] > 0 ? sums[0] / sums[1] : 0.0, sums[1] > 0 ? sums[2] / sums[1] : 0.0, int64_t(sums[1])};
  return r;
}

}  // namespace

int train_rank(const Options& o, Comm& world) {
  const bool lead = world.rank() == 0;
  auto say = [&](const char* fmt, auto... args) {
    if (lead && !o.quiet) { std::printf(fmt, args...); std::fflush(stdout); }
  };
  int threads = o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, o.comm == "local" ? o.ranks : 1));
  omp_set_num_threads(threads);

  Grid g(world, o.sp);
  Context c(Device::cpu);
  ContextGuard guard(c);

  // Data first: its vocabulary sizes the model unless --vocab says otherwise.
  auto train_data = open_dataset(o.data, Split::train, o.seed, o.vocab);
  auto val_data = open_dataset(o.data, Split::val, o.seed, o.vocab);

  ModelConfig cfg;
  std::vector<float> ckpt;
  if (!o.checkpoint.empty()) {
    LlmcConfig lc = read_llmc_checkpoint(o.checkpoint, ckpt);
    cfg.arch = "gpt2";
    cfg.layers = lc.layers; cfg.dim = lc.channels; cfg.heads = lc.heads; cfg.kv_heads = lc.heads;
    cfg.vocab = lc.vocab; cfg.padded_vocab = lc.padded_vocab; cfg.max_seq = lc.max_seq;
    cfg.validate();
    if (train_data->vocab() > cfg.vocab)
      throw std::runtime_error(o.checkpoint + ": the model's vocabulary (" + std::to_string(cfg.vocab) +
                               ") is smaller than the data's (" + std::to_string(train_data->vocab()) + ")");
  } else {
    cfg = model_config(o, train_data->vocab());
  }
  check_ulysses_config(cfg.heads, cfg.kv_heads, o.seq, o.sp);
  if (!cfg.is_llama() && o.seq > cfg.max_seq)
    throw std::runtime_error("--seq " + std::to_string(o.seq) + " exceeds the model's max sequence " +
                             std::to_string(cfg.max_seq) + " (learned positions)");

  Transformer model(cfg);
  if (!ckpt.empty()) copy_from_host(Tensor{model.params.data(), {int64_t(ckpt.size())}}, ckpt.data());
  else model.init_weights(o.seed);
  AdamWConfig ac;
  ac.weight_decay = o.weight_decay;
  AdamW opt(model.params, ac);

  say("ulysses | %s | %.2fM parameters\n", cfg.describe().c_str(), model.params.numel() / 1e6);
  say("data    | %s\n", train_data->describe().c_str());
  say("world   | %d rank(s) = dp %d x sp %d (%s) | %d thread(s) per rank | batch %d x seq %d x accum %d\n",
      world.size(), g.dp, g.sp, world.backend(), threads, o.batch, o.seq, o.grad_accum);

  const int A = o.grad_accum;
  std::vector<HostBatch> micro(A);
  double first_loss = -1, last_loss = -1;
  EvalResult last_eval{0, 0, 0};
  bool have_eval = false;
  for (int step = 0; step < o.steps; step++) {
    double t0 = now_ms();
    CommStats before = g.world.stats;
    // Every micro-batch of the step is loaded first, so the loss can be normalised by the number
    // of valid targets of the whole step, over the whole world, before any backward runs.
    double count = 0;
    for (int m = 0; m < A; m++) {
      int64_t first = ((int64_t(step) * A + m) * g.dp + g.dp_rank) * o.batch;
      load_batch(*train_data, first, o.batch, o.seq, g.sp, g.sp_rank, micro[m]);
      count += double(micro[m].valid);
    }
    world.all_reduce(&count, 1, DType::f64, ReduceOp::sum);
    if (count == 0) throw std::runtime_error("step " + std::to_string(step) + ": no valid targets in the whole batch");
    const float scale = float(1.0 / count);

    model.params.zero_grad();
    double loss_sum = 0;
    size_t act_peak = 0;
    for (int m = 0; m < A; m++) {
      c.arena.reset();
      c.arena.reset_high_water();
      Recording rec(true);
      CrossEntropyStats s = model.forward(device_inputs(c, micro[m]), scale, g.sp_group.get());
      c.tape.backward();
      loss_sum += s.loss_sum;
      act_peak = std::max(act_peak, c.arena.high_water());
    }
    all_reduce_gradients(world, model.params.grad(), model.params.numel());
    world.all_reduce(&loss_sum, 1, DType::f64, ReduceOp::sum);
    double loss = loss_sum / count;
    double norm = grad_global_norm(model.params);
    if (!std::isfinite(loss) || !std::isfinite(norm))
      throw std::runtime_error("step " + std::to_string(step) + ": loss or gradient norm is not finite (loss " +
                               std::to_string(loss) + ", norm " + std::to_string(norm) + "); try a lower --lr");
    float lr = lr_at(step, o.steps, o.warmup, o.lr, o.final_lr_frac);
    opt.step(lr, clip_factor(norm, o.grad_clip));
    double ms = now_ms() - t0;
    uint64_t sent = g.world.stats.total() - before.total();
    if (first_loss < 0) first_loss = loss;
    last_loss = loss;
    double tokens = double(g.dp) * o.batch * o.seq * A;
    say("step %5d/%d | loss %.4f | norm %.3f | lr %.2e | %.1f ms | %.0f tok/s | act %.1f MiB | sent %.2f MiB\n",
        step + 1, o.steps, loss, norm, lr, ms, tokens / (ms / 1000.0), mib(double(act_peak)), mib(double(sent)));

    bool last = step + 1 == o.steps;
    if ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last) {
      last_eval = evaluate(o, model, *val_data, g, c, step);
      have_eval = true;
      if (train_data->synthetic())
        say("eval  %5d | val loss %.4f | accuracy %.2f%% over %lld answers\n", step + 1, last_eval.loss,
            100.0 * last_eval.acc, (long long)last_eval.count);
      else
        say("eval  %5d | val loss %.4f\n", step + 1, last_eval.loss);
    }
  }
  if (lead && o.steps > 0) {
    std::printf("done | train loss %.4f -> %.4f", first_loss, last_loss);
    if (have_eval) {
      std::printf(" | val loss %.4f", last_eval.loss);
      if (train_data->synthetic()) std::printf(" | val accuracy %.2f%%", 100.0 * last_eval.acc);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace ul
