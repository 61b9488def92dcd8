// The parallel training equivalences (README, "Sequence and data parallelism"), through the
// real Trainer under the local communicator (one thread per rank):
//   - Ulysses SP = 2, 4 vs SP = 1 on the same sequences: the loss and every element of the
//     world-summed gradient (what AdamW is fed), for gpt2 and for llama with GQA (kv heads
//     replicated when kv_heads < sp);
//   - dp x sp (and dp x grad-accum) vs one process on the full batch: every step's loss and
//     gradient, and every parameter after 20 AdamW steps (with an eps that keeps AdamW well
//     conditioned, kAdamEps);
//   - with the passkey task's targets only at the end of the sequence, so that some sp ranks hold no
//     valid target at all (checked, not assumed); and on a passkey that scores 1 to 5 digits by
//     sequence, so that dp replicas and micro-batches hold different numbers of them;
//   - the bytes each rank sends per step, against the formulas derived from parallel/ulysses.cpp and
//     the communicator's accounting (communicator.h);
//   - layouts the train binary must refuse, with a message that says what would work.
// Rank threads only record results (Catch2 is not thread-safe); the checks run on the main thread.
#include "options_from.h"
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "data/dataset.h"
#include "engine/options.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#include "run_cmd.h"

using namespace ul;

namespace {

// Small enough that a whole file of cases runs in seconds on two cores.
const char* kCommon = "--threads 1 --grad-clip 0 --eval-every 0 --quiet --seq 64 --layers 2 --dim 64";

using ul_test::options;

// What one rank saw, recorded by its thread.
struct RankRun {
  std::vector<double> losses;
  std::vector<CommStats> sent;       // per step
  std::vector<int64_t> valid;        // valid targets of this rank's first micro-batch of step 0
  std::vector<float> grad, params;   // after the last step
  std::vector<std::vector<float>> grads;  // the world-summed gradient of every step (rank 0 only)
  std::vector<ParamSpec> specs;
  size_t numel = 0;
};

// The passkey task with 1 to 5 of its 5 answer digits scored, by sequence (i % 5 + 1): the dp
// replicas and the micro-batches of a step hold different numbers of valid targets, as padded or
// masked data would, so a loss averaged per replica or per micro-batch, not over the whole step's
// targets, would train otherwise (every passkey sequence alone scores the same 5).
class UnevenPasskey : public Dataset {
 public:
  explicit UnevenPasskey(std::unique_ptr<Dataset> inner) : inner_(std::move(inner)) {}
  int vocab() const override { return inner_->vocab(); }
  int64_t num_sequences(int T) const override { return inner_->num_sequences(T); }
  void sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const override {
    inner_->sequence(i, T, inputs, targets);
    int64_t kept = 0;
    for (int t = 0; t < T; t++)
      if (targets[t] >= 0 && kept++ >= i % 5 + 1) targets[t] = -1;
  }
  bool synthetic() const override { return true; }
  std::string describe() const override { return "passkey, 1 to 5 digits scored"; }

 private:
  std::unique_ptr<Dataset> inner_;
};

// `steps` optimizer steps of `args` on `ranks` local ranks (--ranks is set from `ranks`); `uneven`:
// on UnevenPasskey.
std::vector<RankRun> train(const std::string& args, int ranks, int steps, bool uneven = false) {
  Options o = options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
  std::vector<RankRun> out(ranks);
  run_local(ranks, [&](Comm& world) {
    Trainer tr(o, world);
    if (uneven)
      tr.replace_train_data_for_test(
          std::make_unique<UnevenPasskey>(open_dataset(o.data, Split::train, o.seed, tr.model().cfg.vocab)));
    RankRun& r = out[world.rank()];
    Grid& g = tr.grid();
    for (int m = 0; m < o.grad_accum; m++) {  // step 0's micro-batches of this rank, as step() loads them
      HostBatch hb;
      load_batch(tr.train_data(), (int64_t(m) * g.dp + g.dp_rank) * o.batch, o.batch, o.seq, g.sp, g.sp_rank, hb);
      r.valid.push_back(hb.valid);
    }
    for (int s = 0; s < steps; s++) {
      StepResult sr = tr.step();
      r.losses.push_back(sr.loss);
      r.sent.push_back(sr.sent);
      if (world.rank() == 0) r.grads.emplace_back(tr.model().params.grad(), tr.model().params.grad() + tr.model().params.numel());
    }
    const Params& p = tr.model().params;
    r.numel = p.numel();
    r.specs = p.specs();
    r.grad.assign(p.grad(), p.grad() + p.numel());
    r.params.assign(p.data(), p.data() + p.numel());
  });
  return out;
}

// Per parameter tensor: the largest |got - want| relative to the tensor's largest |want|.
struct Worst {
  std::string name;
  double rel = 0, max_ref = 0;
  size_t at = 0;  // element index within the tensor
  float want = 0, got = 0;
};
Worst worst_tensor(const std::vector<ParamSpec>& specs, const std::vector<float>& want, const std::vector<float>& got) {
  Worst w;
  for (const ParamSpec& s : specs) {
    const size_t n = size_t(s.shape.numel());
    double diff = 0, ref = 0;
    size_t at = s.offset;
    for (size_t i = s.offset; i < s.offset + n; i++) {
      double d = std::fabs(double(got[i]) - double(want[i]));
      if (d > diff) diff = d, at = i;
      ref = std::max(ref, std::fabs(double(want[i])));
    }
    // A tensor whose reference is exactly zero (e.g. unused rows) must be exactly zero too.
    double rel = ref > 0 ? diff / ref : (diff > 0 ? INFINITY : 0.0);
    if (rel >= w.rel) w = {s.name, rel, ref, at - s.offset, want[at], got[at]};
  }
  return w;
}

double rel_diff(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

const double kTol = 1e-5;

// SP = sp against SP = 1 for one forward + backward (one step; its gradient is the world sum).
// Returns rank 0's run at sp.
RankRun check_sp_gradients(const std::string& args, int sp) {
  std::vector<RankRun> ref = train(args + " --sp 1", 1, 1);
  std::vector<RankRun> par = train(args + " --sp " + std::to_string(sp), sp, 1);
  INFO(args << " --sp " << sp);
  REQUIRE(par[0].numel == ref[0].numel);
  // Every rank holds the same world-summed gradient; rank 0's is compared, the others against it.
  for (int r = 0; r < sp; r++) {
    INFO("rank " << r);
    CHECK(rel_diff(par[r].losses[0], ref[0].losses[0]) < kTol);
    if (r > 0) CHECK(par[r].grad == par[0].grad);
  }
  Worst w = worst_tensor(ref[0].specs, ref[0].grad, par[0].grad);
  INFO("loss sp1 " << ref[0].losses[0] << " sp" << sp << " " << par[0].losses[0] << "; worst gradient tensor " << w.name
                   << ": " << w.rel << " of max |grad| " << w.max_ref);
  CHECK(w.rel < kTol);
  // The gradient is not trivially zero: the comparison means something.
  double norm = 0;
  for (float g : ref[0].grad) norm += double(g) * g;
  CHECK(norm > 1e-6);
  return par[0];
}

// sp ranks that hold no valid target in step 0's batch, and the spread of their counts.
void check_uneven_targets(const std::vector<RankRun>& runs, int sp) {
  int64_t lo = INT64_MAX, hi = 0;
  int empty = 0;
  for (int r = 0; r < sp; r++) {  // the first sp group (dp rank 0)
    lo = std::min(lo, runs[r].valid[0]);
    hi = std::max(hi, runs[r].valid[0]);
    empty += runs[r].valid[0] == 0;
  }
  INFO("valid targets per sp rank: min " << lo << " max " << hi);
  CHECK(empty >= 1);  // the passkey task (the default data) scores only its answer, which ends the sequence
  CHECK(hi > 0);
}

// The dp replicas' first micro-batches hold different numbers of valid targets (UnevenPasskey).
void check_uneven_replicas(const std::vector<RankRun>& runs, int sp) {
  std::vector<int64_t> per_replica(runs.size() / size_t(sp), 0);
  for (size_t r = 0; r < runs.size(); r++) per_replica[r / size_t(sp)] += runs[r].valid[0];
  INFO("valid targets of replica 0: " << per_replica[0] << ", of replica 1: " << per_replica[1]);
  CHECK(per_replica[0] != per_replica[1]);
}

}  // namespace

TEST_CASE("SP 2 and 4 give the loss and gradient of SP 1: gpt2", "[parallel][sp]") {
  for (int sp : {2, 4}) {
    RankRun run = check_sp_gradients("--model gpt2 --heads 4 --batch 2", sp);
    // The key bias's gradient is zero in exact arithmetic (softmax ignores the per-query shift
    // q.b): what is computed is rounding noise, far below the query and value biases' gradients.
    const ParamSpec* qkvb = nullptr;
    for (const ParamSpec& p : run.specs) if (p.name == "qkvb") qkvb = &p;
    REQUIRE(qkvb);
    const size_t C = 64, n = size_t(qkvb->shape.numel());
    double key = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
      const bool is_key = i % (3 * C) >= C && i % (3 * C) < 2 * C;
      double& m = is_key ? key : other;
      m = std::max(m, double(std::fabs(run.grad[qkvb->offset + i])));
    }
    INFO("sp " << sp << ": max |key bias grad| " << key << ", max |query/value bias grad| " << other);
    CHECK(key < 1e-5 * other);
  }
}

TEST_CASE("SP gives the loss and gradient of SP = 1: llama with grouped-query attention", "[parallel][sp]") {
  // kv heads 2 < sp 4: each kv head is replicated on two ranks, and its gradient summed back.
  check_sp_gradients("--model llama --heads 4 --kv-heads 2 --batch 2", 4);
  // kv heads 4 > sp 2: two kv heads per rank.
  check_sp_gradients("--model llama --heads 4 --kv-heads 4 --batch 2", 2);
}

TEST_CASE("the passkey task leaves some sp ranks without any valid target", "[parallel][sp]") {
  for (int sp : {2, 4}) {
    INFO("sp " << sp);
    std::vector<RankRun> runs = train("--model gpt2 --batch 2 --sp " + std::to_string(sp), sp, 0);
    check_uneven_targets(runs, sp);
    // The ranks see the slices of the SAME sequences: their counts add up to the sp = 1 count.
    std::vector<RankRun> one = train("--model gpt2 --batch 2 --sp 1", 1, 0);
    int64_t sum = 0;
    for (int r = 0; r < sp; r++) sum += runs[r].valid[0];
    CHECK(sum == one[0].valid[0]);
  }
}

namespace {

// The parameter check needs AdamW to be well conditioned. Adam moves an element by lr * m / (sqrt(v)
// + eps), whose slope in g reaches lr / eps where g is near zero (at step 1 the update is
// lr * g / (|g| + eps)). With the default eps 1e-8 and lr 3e-3 that slope is 3e5: an element whose
// gradient is ~1e-7 (these models have them; so is the key bias's, zero in exact arithmetic, see
// the SP test) and whose two roundings differ by 1e-9, 3e-8 of its tensor's max, far inside the
// gradient check, lands ~1e-6 apart, 1e-5 of max |param|: the check would measure rounding luck
// (it did: a GELU rounding differently, as exactly, moved it from 8.6e-6 to 1.4e-5 of max |param|). eps 1e-4 bounds the slope at
// 30, so a 1e-8 gradient difference moves a parameter at most 3e-7 a step; most elements' |g| is
// still well above eps, so Adam still normalises them.
const char* kAdamEps = "--adam-eps 1e-4";

// Each step: the loss, and the world-summed gradient that AdamW is fed, within kTol of the
// reference (the parameters already differ by the earlier steps' rounding, so this also shows that
// the rounding does not grow). After the last step: the parameters, every element.
void check_training(const std::vector<RankRun>& ref, const std::vector<RankRun>& par, int steps) {
  for (int s = 0; s < steps; s++) {
    Worst g = worst_tensor(ref[0].specs, ref[0].grads[s], par[0].grads[s]);
    INFO("step " << s + 1 << ": loss " << par[0].losses[s] << " vs " << ref[0].losses[s] << "; worst gradient tensor "
                 << g.name << ": " << g.rel << " of max |grad| " << g.max_ref);
    CHECK(rel_diff(par[0].losses[s], ref[0].losses[s]) < kTol);
    CHECK(g.rel < kTol);
  }
  CHECK(ref[0].losses.back() < ref[0].losses.front());  // it trained
  for (size_t r = 0; r < par.size(); r++) {
    INFO("rank " << r);
    CHECK(par[r].params == par[0].params);  // the replicas never drift apart
    Worst w = worst_tensor(ref[0].specs, ref[0].params, par[r].params);
    INFO("worst parameter tensor " << w.name << "[" << w.at << "]: " << w.got << " vs " << w.want << ", " << w.rel
                                   << " of max |param| " << w.max_ref);
    CHECK(w.rel < kTol);
  }
}

}  // namespace

TEST_CASE("dp 2 x sp 2 trains like one process on the full batch (20 AdamW steps)", "[parallel][dp]") {
  // Step s on dp rank d reads sequences ((s * A + m) * dp + d) * B + b: at dp 2, batch B, the two
  // ranks read [2sB, 2sB + 2B) together, which is what one process with batch 2B reads.
  const std::string model = std::string("--model gpt2 --heads 4 --steps 20 --warmup 2 --lr 3e-3 ") + kAdamEps;
  std::vector<RankRun> ref = train(model + " --batch 4 --sp 1", 1, 20);
  std::vector<RankRun> par = train(model + " --batch 2 --sp 2", 4, 20);
  check_uneven_targets(par, 2);
  check_training(ref, par, 20);
  // Replicas holding different numbers of targets: the loss is still the mean over all of them.
  ref = train(model + " --batch 4 --sp 1", 1, 20, true);
  par = train(model + " --batch 2 --sp 2", 4, 20, true);
  check_uneven_replicas(par, 2);
  check_training(ref, par, 20);
}

TEST_CASE("dp 2 x grad-accum 2 (x sp 2) trains like one process with batch 4B", "[parallel][dp]") {
  // Micro-batch m of step s on dp rank d: sequences ((2s + m) * 2 + d) * B + [0, B): the four
  // micro-batches of a step cover [4sB, 4sB + 4B), one process's batch of 4B.
  const std::string model = std::string("--model llama --heads 4 --kv-heads 2 --steps 10 --warmup 2 --lr 3e-3 ") + kAdamEps;
  std::vector<RankRun> ref = train(model + " --batch 4 --sp 1", 1, 10);
  for (int sp : {1, 2}) {
    INFO("dp 2 x sp " << sp << " x accum 2");
    std::vector<RankRun> par = train(model + " --batch 1 --grad-accum 2 --sp " + std::to_string(sp), 2 * sp, 10);
    if (sp == 2) check_uneven_targets(par, 2);
    check_training(ref, par, 10);
  }
  // Replicas and micro-batches holding different numbers of targets.
  ref = train(model + " --batch 4 --sp 1", 1, 10, true);
  std::vector<RankRun> par = train(model + " --batch 1 --grad-accum 2 --sp 2", 4, 10, true);
  check_uneven_replicas(par, 2);
  CHECK(par[0].valid[0] + par[1].valid[0] != par[0].valid[1] + par[1].valid[1]);  // replica 0's two micro-batches
  check_training(ref, par, 10);
}

TEST_CASE("bytes per step: the Ulysses all-to-alls and the gradient all-reduce", "[parallel][bytes]") {
  const int B = 2, T = 64, C = 64, L = 2, H = 4;
  for (int P : {2, 4}) {
    INFO("gpt2, sp " << P);
    std::vector<RankRun> runs = train("--model gpt2 --heads 4 --batch 2 --sp " + std::to_string(P), P, 1);
    const uint64_t Tl = T / P, D = C / H, e = 4;
    // Per layer and direction (forward; the backward repeats both on the gradients), from ulysses.cpp:
    //   scatter_heads: chunk = B * Tl * (Hq/P + 2 * Hkv/P) * D, gather_heads: chunk = B * Tl * (Hq/P) * D,
    //   and all_to_all(chunk) counts chunk * (P - 1) * e bytes.
    const uint64_t scatter = uint64_t(B) * Tl * (3 * H / P) * D, gather = uint64_t(B) * Tl * (H / P) * D;
    const uint64_t a2a = uint64_t(L) * 2 * (scatter + gather) * (P - 1) * e;
    // README ("Long context"): about 4 B T C / P elements per layer per direction, of which (P - 1) / P leave the rank.
    const double design = double(L) * 2 * 4.0 * B * T * C / P * (P - 1) / P * e;
    // The world all-reduces: the gradient (f32), the valid count, the loss sum and the squared
    // gradient norm (one f64 each).
    const uint64_t n = runs[0].numel;
    const uint64_t ar = 2 * n * (P - 1) * 4 / P + 3 * (2 * 1 * uint64_t(P - 1) * 8 / P);
    for (int r = 0; r < P; r++) {
      const CommStats& s = runs[r].sent[0];
      INFO("rank " << r << ": all_to_all " << s.all_to_all << " (expected " << a2a << "), all_reduce " << s.all_reduce
                   << " (expected " << ar << ")");
      CHECK(s.all_to_all == a2a);
      CHECK(std::fabs(double(s.all_to_all) - design) <= 0.01 * design);
      CHECK(s.all_reduce == ar);
      CHECK(s.all_gather + s.reduce_scatter + s.broadcast == 0);
    }
  }
  {
    // Llama, kv heads 2 < sp 4: every rank receives one (replicated) kv head, so the scatter carries
    // Hq/P + 2 heads per token, more than the MHA share (Hq + 2 Hkv) / P.
    const int P = 4, Hkv = 2;
    std::vector<RankRun> runs = train("--model llama --heads 4 --kv-heads 2 --batch 2 --sp 4", P, 1);
    const uint64_t Tl = T / P, D = C / H, e = 4;
    const uint64_t scatter = uint64_t(B) * Tl * (H / P + 2 * 1) * D, gather = uint64_t(B) * Tl * (H / P) * D;
    const uint64_t a2a = uint64_t(L) * 2 * (scatter + gather) * (P - 1) * e;
    (void)Hkv;
    INFO("llama kv 2, sp 4: all_to_all " << runs[0].sent[0].all_to_all << " (expected " << a2a << ")");
    for (int r = 0; r < P; r++) CHECK(runs[r].sent[0].all_to_all == a2a);
  }
  {
    std::vector<RankRun> one = train("--model gpt2 --heads 4 --batch 2 --sp 1", 1, 1);  // nothing leaves one rank
    CHECK(one[0].sent[0].total() == 0);
  }
}

TEST_CASE("train refuses layouts that cannot work and says what would", "[parallel][cli]") {
  using namespace ul_test;
  struct Case {
    std::string args, problem, fix;
  };
  const Case cases[] = {
      {"--sp 3 --ranks 4", "does not divide the world size 4", "sp values that divide it: 1, 2, 4"},
      {"--sp 2", "does not divide the world size 1", "this world has one rank: give --ranks N (--comm local)"},
      {"--heads 4 --sp 8 --ranks 8", "the query heads are not divisible by sp",
       "work for this model and sequence and divide the world size 8: 1, 2, 4"},
      // (2 and 4 suit the model but not a world of 3, which the grid would then refuse)
      {"--seq 100 --sp 3 --ranks 3", "not divisible by sp", "work for this model and sequence and divide the world size 3: 1\n"},
      {"--heads 6 --dim 96 --seq 100 --sp 3 --ranks 3", "the sequence length is not divisible by sp",
       "and divide the world size 3: 1\n"},
      {"--model llama --heads 6 --dim 96 --kv-heads 2 --sp 3 --ranks 3", "sp is not a multiple of the kv heads",
       "and divide the world size 3: 1\n"},
      {"--model llama --heads 8 --kv-heads 4 --dim 64 --sp 8 --ranks 8 --seq 60", "sequence length is not divisible",
       "work for this model and sequence and divide the world size 8: 1, 2, 4"},
  };
  for (const Case& c : cases) {
    CmdResult r = run_cmd(train_cmd(c.args + " --steps 1 --threads 1 --batch 1 --eval-every 0"));
    INFO("train " << c.args << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK(r.out.find(c.problem) != std::string::npos);
    CHECK(r.out.find(c.fix) != std::string::npos);
    CHECK(r.out.find("step ") == std::string::npos);  // refused before any step
  }
}
