// The long-context memory features (README, "Long context"), through the real Trainer under the
// local communicator:
//   - recompute and tiled MLP change no gradient (gpt2 and llama, sp 1 and 2);
//   - recompute keeps at most 2 C floats per token per layer (measured arena use after forward);
//   - ZeRO-1 follows plain data parallelism step for step (world 2, 4, and dp 2 x sp 2);
//   - the planner's arena high-water, kept activations and bytes per collective against the
//     measured ones, and its total against the train binary's peak RSS.
// Rank threads only record results (Catch2 is not thread-safe); the checks run on the main thread.
#include "gradcheck.h"
#include "options_from.h"
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/device.h"
#include "engine/file_io.h"
#include "engine/options.h"
#include "engine/planner.h"
#include "engine/run_log.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#include "run_cmd.h"

using namespace ul;

namespace {

const char* kCommon = "--threads 1 --grad-clip 0 --eval-every 0 --quiet --seq 64 --batch 2 --layers 2 --dim 64";

using ul_test::options;

struct RankRun {
  std::vector<double> losses, norms;
  std::vector<float> grad, params;  // after the last step (grad: the world-summed gradient)
  std::vector<StepResult> steps;
  int64_t valid = 0;                // valid targets of this rank's first step (one micro-batch here)
  size_t arena_blocks = 0;          // after the steps: 1 unless the arena outgrew its reservation
};

Options full_options(const std::string& args, int ranks) {
  return options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
}

std::vector<RankRun> train(const std::string& args, int ranks, int steps, std::vector<ParamSpec>* specs = nullptr) {
  Options o = full_options(args, ranks);
  std::vector<RankRun> out(ranks);
  run_local(ranks, [&](Comm& world) {
    Trainer tr(o, world);
    RankRun& r = out[world.rank()];
    for (int s = 0; s < steps; s++) {
      StepResult sr = tr.step();
      if (s == 0) r.valid = sr.valid;
      r.losses.push_back(sr.loss);
      r.norms.push_back(sr.grad_norm);
      r.steps.push_back(sr);
    }
    r.arena_blocks = tr.context().arena.blocks();
    const Params& p = tr.model().params;
    r.grad.assign(p.grad(), p.grad() + p.numel());
    r.params.assign(p.data(), p.data() + p.numel());
    if (specs && world.rank() == 0) *specs = p.specs();
  });
  return out;
}

// max |a - b| over each parameter tensor, relative to that tensor's max |a|.
void check_close(const std::vector<float>& a, const std::vector<float>& b, const std::vector<ParamSpec>& specs,
                 double tol, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (const ParamSpec& s : specs) {
    double diff = 0, scale = 0;
    for (size_t i = s.offset; i < s.offset + size_t(s.shape.numel()); i++) {
      diff = ul_test::max_err(diff, double(std::fabs(a[i] - b[i])));
      scale = std::max(scale, double(std::fabs(a[i])));
    }
    INFO(what << ": " << s.name << " differs by " << diff << " (scale " << scale << ")");
    CHECK(diff <= tol * std::max(scale, 1e-30));
  }
}

}  // namespace

TEST_CASE("recompute leaves every gradient bit for bit, tiled MLP within rounding", "[memory]") {
  for (const char* model : {"gpt2", "llama"}) {
    for (int sp : {1, 2}) {
      const std::string base = std::string("--model ") + model + " --sp " + std::to_string(sp);
      std::vector<ParamSpec> specs;
      RankRun ref = train(base, sp, 1, &specs)[0];
      // Tiled MLP sums its weight gradients chunk by chunk (and a GEMM of fewer rows may round its
      // rows otherwise): within rounding.
      RankRun chunks = train(base + " --mlp-chunks 5", sp, 1)[0];
      INFO(base << " --mlp-chunks 5");
      CHECK(std::fabs(chunks.losses[0] - ref.losses[0]) <= 1e-6 * std::fabs(ref.losses[0]));
      check_close(ref.grad, chunks.grad, specs, 1e-6, base + " --mlp-chunks 5");
      // Recompute replays the same ops on the same inputs: the same bits, with or without chunks.
      for (const auto& [feature, want] : {std::pair<const char*, const RankRun*>{"--recompute", &ref},
                                          {"--recompute --mlp-chunks 5", &chunks}}) {
        RankRun r = train(base + " " + feature, sp, 1)[0];
        INFO(base << " " << feature);
        CHECK(r.losses[0] == want->losses[0]);
        REQUIRE(r.grad.size() == want->grad.size());
        CHECK(std::memcmp(r.grad.data(), want->grad.data(), r.grad.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("recompute keeps at most 2 C floats per token per layer", "[memory]") {
  for (const char* model : {"gpt2", "llama"}) {
    // The arena in use after forward, at 2 and 4 layers: the difference is what one layer keeps.
    auto kept = [&](int layers, const char* flags) {
      Options o = full_options(std::string("--model ") + model + " --layers " + std::to_string(layers) + " " + flags, 1);
      size_t used = 0, planned = 0;
      run_local(1, [&](Comm& world) {
        Trainer tr(o, world);
        Context& c = tr.context();
        HostBatch hb;
        load_batch(tr.train_data(), 0, o.batch, o.seq, 1, 0, hb);
        auto ints = [&](const std::vector<int32_t>& v, Shape s) {
          Tensor t = c.empty(s, DType::i32);
          copy_from_host(t, v.data());
          return t;
        };
        ModelInputs in{ints(hb.idx, {o.batch, o.seq}), ints(hb.targets, {o.batch, o.seq}), ints(hb.pos, {o.batch, o.seq}),
                       ints(hb.pos_full, {o.batch, o.seq}), Tensor{}};
        Recording rec(true);
        tr.model().forward(in, 1.0f, nullptr);
        used = c.arena.used();
        c.tape.backward();
        PlanConfig pc = plan_config(o);
        pc.valid_rows = hb.valid;
        planned = plan_memory(pc).kept;
      });
      CHECK(planned == used);  // the planner walks the same allocations
      return double(used);
    };
    const double tokens = 2 * 64, C = 64;
    const double per_layer = (kept(4, "--recompute") - kept(2, "--recompute")) / 2 / tokens;
    const double without = (kept(4, "") - kept(2, "")) / 2 / tokens;
    INFO(model << ": kept bytes per token per layer " << per_layer << " with recompute, " << without << " without");
    CHECK(per_layer <= 2 * C * 4);
    CHECK(without > 4 * per_layer);
  }
}

TEST_CASE("ZeRO-1 is bitwise plain data parallelism after 10 clipped steps", "[memory][zero]") {
  const std::vector<std::pair<std::string, int>> layouts = {
      {"", 2}, {"", 4}, {"--sp 2", 4}, {"--sp 2 --model llama", 4}};
  for (const auto& [layout, ranks] : layouts) {
    const std::string base = "--grad-clip 1 --lr 1e-2 " + layout;  // clipping: the global norm from shards
    std::vector<ParamSpec> specs;
    std::vector<RankRun> dp = train(base, ranks, 10, &specs), z = train(base + " --zero 1", ranks, 10);
    INFO(layout << " on " << ranks << " ranks");
    // Bitwise: the norm, which sets the clip factor, is summed shard by shard either way.
    CHECK(z[0].losses == dp[0].losses);
    CHECK(z[0].norms == dp[0].norms);
    for (double n : dp[0].norms) CHECK(n > 1.0);  // clipped every step
    CHECK(z[0].params == dp[0].params);
    for (int r = 1; r < ranks; r++) CHECK(z[r].params == z[0].params);  // every rank gathered every shard
    CHECK(z[0].steps[0].sent.all_reduce < dp[0].steps[0].sent.all_reduce / 100);
    CHECK(z[0].steps[0].sent.reduce_scatter > 0);
  }
}

TEST_CASE("the planner matches the measured arena high-water and bytes per collective", "[memory][planner]") {
  const std::vector<std::pair<std::string, int>> runs = {
      {"--model gpt2", 1},
      {"--model gpt2 --recompute --seq 128", 1},
      {"--model llama --mlp-chunks 4 --batch 3", 1},
      {"--model llama --sp 2 --recompute --mlp-chunks 3", 2},
      {"--model gpt2 --sp 4 --seq 128 --mlp-chunks 2", 4},
      {"--model gpt2 --sp 2 --zero 1 --recompute", 4},
      {"--model llama --sp 4 --batch 1 --seq 128", 4},   // batch 1: the all-to-alls skip a buffer
      {"--model gpt2 --sp 2 --batch 1 --recompute --mlp-chunks 2", 2},
  };
  for (const auto& [args, ranks] : runs) {
    std::vector<RankRun> got = train(args, ranks, 1);
    Options o = full_options(args, ranks);
    for (int r = 0; r < ranks; r++) {
      PlanConfig pc = plan_config(o);
      pc.valid_rows = got[r].valid;
      MemoryPlan p = plan_memory(pc);
      const StepResult& sr = got[r].steps[0];
      INFO(args << " rank " << r << ": planned " << p.arena_peak << " measured " << sr.act_bytes);
      CHECK(p.arena_peak == sr.act_bytes);
      CHECK(got[r].arena_blocks == 1);  // the trainer's reservation (the plan for all rows valid) sufficed
      CHECK(p.sent.all_to_all == sr.sent.all_to_all);
      CHECK(p.sent.all_reduce == sr.sent.all_reduce);
      CHECK(p.sent.reduce_scatter == sr.sent.reduce_scatter);
      CHECK(p.sent.all_gather == sr.sent.all_gather);
    }
  }
}

TEST_CASE("the planner counts the CPU attention's dq scratch by the group a rank runs, kv heads replicated too",
          "[memory][planner]") {
  // --heads 4 --kv-heads 1 --sp 2: each rank runs 2 query heads on 1 (replicated) kv head, a group
  // of 2, not the model's 4; at T = 65536 its dq scratch (2 x T x 64 floats, 32 MiB) is within the
  // one-pass limit, so the kernel takes it. Planned with the model's group (64 MiB, over the
  // limit) it was left out: 0.5 MiB of row sums planned beside a 32 MiB scratch.
  const PlanConfig pc = plan_config(full_options("--model llama --dim 256 --heads 4 --kv-heads 1 --sp 2 --seq 65536", 2));
  const size_t rows = size_t(pc.batch) * 2 * 65536 * 4, dq = size_t(pc.batch) * 2 * 65536 * 64 * 4;
  CHECK(plan_memory(pc).workspace == rows + dq);
}

TEST_CASE("train --plan names the flag of what it cannot plan, and reads no text file for its vocabulary", "[memory][planner]") {
  // --sp without --ranks (planning an MPI or NCCL run): the flag to give, not a bare "not a multiple".
  ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd("--plan --sp 2"));
  CHECK(r.code == 1);
  CHECK(r.out.find("--plan: --ranks 1 is not a multiple of --sp 2: give --ranks N, the world size to plan for") !=
        std::string::npos);
  // Data that does not open is --data's, as the run says it.
  r = ul_test::run_cmd(ul_test::train_cmd("--plan --data 'shards:/nonexistent/x_*.bin'"));
  CHECK(r.code == 1);
  CHECK(r.out.find("train: error: --data: shards:/nonexistent/x_*.bin: no file matches") != std::string::npos);
  // text:FILE is 256 ids whatever it holds: planned without reading it (a 1 GB file once peaked at 1 GB).
  r = ul_test::run_cmd(ul_test::train_cmd("--plan --data text:/nonexistent.txt"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("vocab=256") != std::string::npos);
}

TEST_CASE("a --steps 0 run plans and reserves its eval's forward, byte for byte", "[memory][planner]") {
  // One rank: the CPU classifier's chunk follows the batch's scored rows, which the eval reports
  // (EvalResult::answers); under sp 2 each rank's differ, so there the reservation must hold.
  const std::vector<std::pair<std::string, int>> runs = {
      {"--model gpt2 --layers 4", 1},
      {"--model gpt2 --layers 4 --recompute --mlp-chunks 3", 1},  // an eval runs one block at a time anyway
      {"--model llama --doc-mask --eot 10 --data text:" ULYSSES_SOURCE_DIR "/README.md", 1},
      {"--model llama --sp 2 --mlp-chunks 2", 2},
  };
  for (const auto& [args, ranks] : runs) {
    Options o = full_options(args + " --steps 0 --eval-batches 1", ranks);
    std::vector<size_t> measured(ranks), blocks(ranks);
    int64_t answers = 0;
    run_local(ranks, [&](Comm& world) {
      Trainer tr(o, world);
      tr.context().arena.reset_high_water();
      const EvalResult e = tr.evaluate();
      measured[world.rank()] = tr.context().arena.high_water();
      blocks[world.rank()] = tr.context().arena.blocks();
      if (world.rank() == 0) answers = e.answers;
    });
    PlanConfig pc = plan_config(o);
    const MemoryPlan reserved = plan_memory(pc);  // every row scored: the largest classifier chunk
    pc.valid_rows = answers;
    const MemoryPlan exact = plan_memory(pc);
    pc.trains = true;
    const MemoryPlan training = plan_memory(pc);
    INFO(args << ": planned " << exact.arena_peak << " (reserved " << reserved.arena_peak << "), measured "
              << measured[0] << "; a training step's " << training.arena_peak);
    if (ranks == 1) CHECK(exact.arena_peak == measured[0]);
    for (int r = 0; r < ranks; r++) {
      CHECK(measured[r] <= reserved.arena_peak);
      CHECK(blocks[r] == 1);
    }
    CHECK(exact.arena_peak < training.arena_peak);
    CHECK(reserved.grads == 0);
    CHECK(reserved.workspace == 0);  // the row sums are the attention backward's
  }
  // Four layers more add nothing to an eval's activations (one block at a time), and most of a
  // training step's.
  auto peak = [](const std::string& args) { return plan_memory(plan_config(full_options(args, 1))).arena_peak; };
  CHECK(peak("--layers 8 --steps 0") == peak("--layers 4 --steps 0"));
  // A --steps 0 run that only samples (or exports) evaluates nothing: it reserves no arena.
  CHECK(peak("--steps 0 --sample 2 --prompt ids:1") == 0);
  CHECK(peak("--steps 0 --sample 2 --prompt ids:1 --eval-batches 1") == peak("--steps 0"));
  CHECK(peak("--layers 8") > peak("--layers 4") + 3 * (peak("--layers 4 --steps 0") / 2));
  // Collectives staged through the host on a device (--comm local): an all-to-all's buffers only
  // where one runs (sp > 1); at sp 1 the gradient's all-reduce alone.
  {
    PlanConfig dp = plan_config(full_options("--model llama --seq 4096 --ranks 2", 2));
    dp.device = Device::cuda;
    PlanConfig sp = plan_config(full_options("--model llama --seq 4096 --ranks 2 --sp 2", 2));
    sp.device = Device::cuda;
    const size_t n = param_count(dp.model) * 4, slice = (param_count(dp.model) + 1) / 2 * 4;
    CHECK(plan_memory(dp).host_comm == n + slice);
    CHECK(plan_memory(sp).host_comm > n + slice);  // B T W D x 2 x 4 bytes at T 4096 passes the model
    dp.trains = false;
    CHECK(plan_memory(dp).host_comm == 0);
  }
  // Nor does an eval offload: no pinned host memory is planned (or allocated) for it.
  PlanConfig offloads = plan_config(full_options("--recompute --layers 4", 1));
  offloads.device = Device::cuda, offloads.offload = true;
  CHECK(plan_memory(offloads).pinned_host > 0);
  offloads.trains = false;
  CHECK(plan_memory(offloads).pinned_host == 0);
}

TEST_CASE("the planner's edges: shorter than 64 sp, past 2^62 bytes, a task's minimum, no larger --sp", "[memory][planner]") {
  // A --seq that fits, below one unit of 64 sp: named, not "0 (not even 64)".
  PlanConfig small = plan_config(full_options("--seq 32 --data recall", 1));
  const double fits_32 = double(plan_memory(small).total);
  const int64_t T = longest_seq(small, fits_32);
  CHECK(T >= 32);
  CHECK(T < 64);
  CHECK(longest_seq(plan_config(full_options("--seq 32 --data recall --sp 2 --heads 2", 2)), fits_32) % 2 == 0);
  // Activations past 2^62 bytes (the size_t sums wrapped to a total below the weights' own): refused.
  CHECK_THROWS_WITH(plan_memory(plan_config(full_options("--model llama --dim 4096 --heads 32 --kv-heads 8 --layers "
                                                        "60000 --seq 1073741824 --batch 1", 1))),
                    Catch::Contains("pass 2^62 bytes a rank"));
  // ... and the longest --seq search steps over them.
  CHECK(longest_seq(plan_config(full_options("--model llama --dim 64 --heads 2 --layers 1", 1)), 1e30) > 0);
  // ... never below the task's own minimum (passkey's 12 at 5 digits: it named 10, which the run refuses).
  PlanConfig passkey = plan_config(full_options("--seq 12 --data passkey", 1));
  CHECK(passkey.min_seq == 12);
  CHECK(longest_seq(passkey, double(plan_memory(passkey).total)) >= 12);
  CHECK(longest_seq(passkey, double(plan_memory(passkey).total) - 1) == 0);
  // ... and a minimum above 64 sp is tried itself, not only the multiple of 64 sp past it (6002
  // fitted where 6016 did not: "0 (not even 6002)").
  PlanConfig long_key = plan_config(full_options("--seq 6002 --data passkey:digits=3000 --layers 1 --batch 1", 1));
  CHECK(long_key.min_seq == 6002);
  CHECK(longest_seq(long_key, double(plan_memory(long_key).total)) == 6002);
  // A synthetic task's own minimum: --plan no longer plans a run the data refuses.
  CHECK_THROWS_WITH(plan_config(full_options("--seq 8", 1)), Catch::Contains("--data: passkey: sequence length 8 is too short"));
  // The memory hint offers a larger --sp only where one divides the heads (4 heads at sp 4: none).
  const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(
      "--plan --sp 4 --ranks 4 --recompute --mlp-chunks 8 --zero 1 --memory 1M"));
  INFO(r.out);
  CHECK(r.out.find("(not even 12: try a smaller --batch or --seq)") != std::string::npos);  // (passkey takes 12 at least)
  CHECK(r.out.find("larger --sp") == std::string::npos);
  const ul_test::CmdResult two = ul_test::run_cmd(ul_test::train_cmd("--plan --sp 2 --ranks 2 --memory 1M"));
  CHECK(two.out.find("a larger --sp") != std::string::npos);
}

TEST_CASE("the longest --seq the planner names is one train accepts", "[memory][planner]") {
  // A budget nothing fills: the search stops where grad_accum x batch x seq would pass 2^31 - 1
  // tokens (it once named 2^30 - 64 at --batch 8, which train refuses).
  PlanConfig c = plan_config(full_options("--layers 1 --dim 64 --heads 2 --batch 8 --grad-accum 3", 1));
  const int64_t T = longest_seq(c, 1e30);
  CHECK(T > 0);
  CHECK(T % 64 == 0);
  CHECK(T * 8 * 3 <= INT32_MAX);
  CHECK((T + 64) * 8 * 3 > INT32_MAX);  // and not far below it
  // gpt2's positions, written out with --max-seq, bound it too (train refuses a longer --seq).
  PlanConfig fixed = plan_config(full_options("--layers 1 --dim 64 --heads 2 --max-seq 256", 1));
  CHECK(longest_seq(fixed, 1e30) == 256);
  // ... also below 64 x sp, where the search in those units found nothing and blamed the memory:
  // the longest multiple of sp the positions hold.
  CHECK(longest_seq(plan_config(full_options("--layers 1 --dim 64 --heads 2 --max-seq 32 --seq 32", 1)), 1e30) == 32);
  CHECK(longest_seq(plan_config(full_options("--layers 1 --dim 64 --heads 2 --max-seq 101 --seq 64 --sp 2", 2)), 1e30) ==
        100);
  CHECK(longest_seq(plan_config(full_options("--layers 1 --dim 64 --heads 2 --max-seq 32 --seq 32", 1)), 1e3) == 0);
  // ... and above it, not the multiple of 64 sp below them (128 for 200 at sp 2)
  CHECK(longest_seq(plan_config(full_options("--layers 1 --dim 64 --heads 2 --max-seq 200 --seq 64 --sp 2", 2)), 1e30) ==
        200);
  // A gpt2 whose positions follow --seq: the longest is the same whatever --seq asked (the asked
  // one's table, its gradient and AdamW state once weighed on every shorter length: 0 at 4M).
  {
    const std::string gpt2 = "--model gpt2-124M --batch 1 --recompute --mlp-chunks 8 --seq ";
    const double budget = 8.0 * (1 << 30);
    const int64_t at_1k = longest_seq(plan_config(options(gpt2 + "1024")), budget);
    CHECK(at_1k > 4096);
    for (const char* seq : {"262144", "4194304"})
      CHECK(longest_seq(plan_config(options(gpt2 + seq)), budget) == at_1k);
  }
  const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd("--max-seq 32 --seq 32 --plan --memory 1G"));
  INFO(r.out);
  CHECK(r.out.find(" per rank: 32 (the model's learned positions end at max_seq 32)\n") != std::string::npos);
  // The step's micro-batches (x --grad-accum) are in a CPU plan's total, as in the check train
  // makes: --plan's longest --seq was refused by the run it named. They are what load_batch fills
  // (the plan once counted 20 bytes a token where --doc-mask at sp 1 holds 24).
  auto held = [](const HostBatch& hb) {
    return sizeof(int32_t) * (hb.idx.size() + hb.targets.size() + hb.pos.size() + hb.answer.size() +
                              hb.pos_full.size() + hb.doc_full.size());
  };
  for (int accum : {1, 8})
    for (int sp : {1, 2})
      for (bool docs : {false, true}) {
        const std::string sp_flags = " --sp " + std::to_string(sp);
        PlanConfig p = plan_config(
            full_options("--model llama --batch 2 --seq 4096 --grad-accum " + std::to_string(accum) + sp_flags, sp));
        p.doc_mask = docs;
        const MemoryPlan m = plan_memory(p);
        HostBatch hb;
        load_batch(*open_dataset("passkey", Split::train, 1, 0), 0, 2, 4096, sp, sp - 1, hb, docs ? 0 : -1);
        INFO("sp " << sp << (docs ? ", --doc-mask" : ""));
        CHECK(hb.doc_full.empty() == !docs);
        CHECK(m.batches == size_t(accum) * held(hb));
        CHECK(m.total == m.params + m.grads + m.optim + m.arena_peak + m.workspace + m.comm + m.batches);
      }
  PlanConfig one = plan_config(full_options("--model llama --batch 1", 1)), eight = one;
  eight.grad_accum = 8;
  const double budget = 2e9;
  CHECK(longest_seq(eight, budget) < longest_seq(one, budget));
  one.seq = int(longest_seq(one, budget));
  CHECK(double(plan_memory(one).total) <= budget);
}

// AddressSanitizer's shadow memory and quarantine inflate RSS 1.5-2.5x: the comparison only means
// something in the normal build, so the sanitizer build does not have this test at all (a test
// case that returned early would fail there: catch_main warns about test cases that check nothing).
#if !defined(__SANITIZE_ADDRESS__) && !defined(ULYSSES_SANITIZED)
TEST_CASE("the planner's total is the train binary's peak RSS within 10%", "[memory][planner]") {
  // Large enough that the process itself (code, libraries, thread stacks) is a few percent.
  for (const std::string args : {"--model gpt2 --layers 4 --dim 256 --seq 1024 --batch 2 --mlp-chunks 4",
                                 "--model llama --layers 2 --dim 256 --seq 2048 --batch 2 --recompute"}) {
    const std::string flags = args + " --steps 1 --threads 2 --eval-batches 1 --eval-every 0";
    ul_test::CmdResult res = ul_test::run_cmd(ul_test::train_cmd(flags));
    REQUIRE(res.code == 0);
    const size_t at = res.out.find("peak RSS ");
    REQUIRE(at != std::string::npos);
    const double rss = std::stod(res.out.substr(at + 9)) * 1048576.0;
    const double plan = double(plan_memory(plan_config(options(flags))).total);
    INFO(args << ": planned " << plan / 1048576.0 << " MiB, peak RSS " << rss / 1048576.0 << " MiB");
    CHECK(std::fabs(rss - plan) <= 0.10 * plan);
  }
}
#endif

TEST_CASE("a ZeRO-1 run resumes from its per-rank optimizer shards, bit-exactly", "[memory][zero]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ulysses-zero-resume-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string flags = " --model gpt2 --layers 2 --dim 64 --seq 64 --batch 2 --threads 1 --eval-batches 1 "
                            "--eval-every 0 --ranks 4 --sp 2 --zero 1 --steps 4";
  const fs::path run = dir / "run", ref = dir / "step4";
  REQUIRE(ul_test::run_cmd(ul_test::train_cmd(flags + " --log " + (dir / "straight.jsonl").string())).code == 0);
  REQUIRE(ul_test::run_cmd(ul_test::train_cmd(flags + " --save-dir " + run.string() + " --save-every 2")).code == 0);
  // The run's step-4 checkpoint set aside: the resume from step 2 must write the same bytes.
  fs::rename(run / "step_00000004", ref);
  ul_test::CmdResult again = ul_test::run_cmd(ul_test::train_cmd(flags + " --save-dir " + run.string() + " --resume"));
  INFO(again.out);
  REQUIRE(again.code == 0);
  CHECK(again.out.find("continuing after step 2") != std::string::npos);
  // Every step's loss and gradient norm, all 17 digits, as the run never stopped.
  auto history = [](const fs::path& log) {
    std::vector<std::string> h;
    for (const LogRecord& r : read_run_log(log.string()))
      if (r.at("type") == "step") h.push_back(r.at("step") + " " + r.at("loss") + " " + r.at("grad_norm"));
    return h;
  };
  CHECK(history(run / "log.jsonl") == history(dir / "straight.jsonl"));
  CHECK(history(run / "log.jsonl").size() == 4);
  // And the files it ends with: the model and each rank's optimizer shard, byte for byte.
  int files = 0;
  for (const auto& f : fs::directory_iterator(ref)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("optim_rank_", 0) != 0 && name != "model.bin") continue;
    INFO(name);
    CHECK(read_whole_file(f.path().string()) == read_whole_file((run / "step_00000004" / name).string()));
    files++;
  }
  CHECK(files == 5);  // model.bin and 4 shards
  fs::remove_all(dir);
}

TEST_CASE("the planner counts the large presets' parameters as their published models have them", "[memory][planner]") {
  // fp32 on the CPU: 4 bytes a parameter. Llama 3.2 1B: 1,235,814,400 (tied embeddings, one
  // 128256 x 2048 table); TinyLlama 1.1B: 1,100,048,384; GPT-2 124M: llm.c's 124,475,904 (its
  // vocabulary padded to 50304 rows; Hugging Face's 124,439,808 has 50257); Qwen 2.5 0.5B:
  // 494,032,768 (tied, q/k/v biases; its 151936 rows are already a multiple of 128); Llama 3.1 8B:
  // 8,030,261,248; Qwen 2.5 7B: 7,615,616,512 (transformers' counts for their configs).
  const std::pair<const char*, size_t> presets[] = {{"llama-3.2-1B", 1235814400}, {"llama-1B", 1100048384},
                                                    {"gpt2-124M", 124475904},     {"qwen2.5-0.5B", 494032768},
                                                    {"llama-3.1-8B", 8030261248}, {"qwen2.5-7B", 7615616512}};
  for (const auto& p : presets) {
    CAPTURE(p.first);
    // Data that does not exist: a preset with its own vocabulary never opens it.
    const MemoryPlan plan = plan_memory(
        plan_config(options(std::string("--model ") + p.first + " --seq 1024 --batch 1 --data shards:/nonexistent/x_*.bin")));
    CHECK(plan.params == p.second * 4);
  }
}

TEST_CASE("the GPU memory check: the plan of every rank on the GPU against what it had free", "[memory]") {
  MemoryPlan p;
  p.params = 1 << 20, p.grads = 2 << 20, p.optim = 3 << 20, p.arena_peak = 4 << 20, p.total = 10 << 20;
  const std::string shrink = "--recompute, a smaller --seq";
  CHECK_NOTHROW(check_device_memory(p, 1, 10 << 20, "GPU 0 (X)", shrink, true));  // exactly full: every byte is planned
  CHECK_THROWS_WITH(check_device_memory(p, 1, (10 << 20) - 1, "GPU 0 (NVIDIA GeForce RTX 4090)", shrink, true),
                    Catch::Contains("needs 10 MiB of GPU memory per rank (weights 1 MiB, gradients 2 MiB, AdamW state "
                                    "and f32 masters 3 MiB, activations 4 MiB;") &&
                        Catch::Contains("but GPU 0 (NVIDIA GeForce RTX 4090) had 9 MiB free when the run started") &&
                        Catch::Contains("try --recompute, a smaller --seq;") && !Catch::Contains("fewer ranks"));
  // Ranks as threads of one process (--comm local) share its GPU.
  CHECK_NOTHROW(check_device_memory(p, 2, 20 << 20, "GPU 0 (X)", shrink, true));
  CHECK_THROWS_WITH(check_device_memory(p, 3, 20 << 20, "GPU 0 (X)", shrink, true),
                    Catch::Contains("x 3 ranks on this GPU = 30 MiB") && Catch::Contains("fewer ranks on this GPU"));
  // fp32 has no masters; an eval neither gradients nor AdamW state: only what it holds is named.
  CHECK_THROWS_WITH(check_device_memory(p, 1, 1 << 20, "GPU 0 (X)", shrink, false),
                    Catch::Contains("gradients 2 MiB, AdamW state 3 MiB, activations"));
  MemoryPlan eval = p;
  eval.grads = eval.optim = 0;
  CHECK_THROWS_WITH(check_device_memory(eval, 1, 1 << 20, "GPU 0 (X)", shrink, true),
                    Catch::Contains("(weights 1 MiB, activations 4 MiB;"));
  // The --memory it suggests for --plan, a rank's: what was free less 0.5 GiB (once a process:
  // --comm local's ranks share one process's libraries), shared out, rounded down: 23.96 GiB free
  // -> 23.4G; with 3 ranks on the GPU, 23.46 / 3 -> 7.8G.
  p.total = size_t(30) << 30;
  const size_t free = size_t(23.96 * double(size_t(1) << 30));
  CHECK_THROWS_WITH(check_device_memory(p, 1, free, "GPU 0 (X)", shrink, true),
                    Catch::Contains("`train --plan --memory 23.4G` with this run's flags"));
  CHECK_THROWS_WITH(check_device_memory(p, 3, free, "GPU 0 (X)", shrink, true),
                    Catch::Contains("`train --plan --memory 7.8G` with this run's flags"));
  // Three processes on the GPU (MPI, NCCL): each has the libraries' buffers, (23.96 - 1.5) / 3 -> 7.4G.
  CHECK_THROWS_WITH(check_device_memory(p, 3, free, "GPU 0 (X)", shrink, true, 3),
                    Catch::Contains("`train --plan --memory 7.4G` with this run's flags"));
  // Under 0.1G a rank left: no --memory named (it once said --memory 0.0G, which --memory refuses).
  CHECK_THROWS_WITH(check_device_memory(p, 512, free, "GPU 0 (X)", shrink, true),
                    Catch::Contains("the GPU has no room left for a rank's share") && !Catch::Contains("--memory 0.0G"));
}

TEST_CASE("the memory hints name only the flags a run does not have yet", "[memory]") {
  auto shrinks = [](const std::string& args, int world) {
    PlanConfig c = plan_config(options(args));
    c.world = world;
    return memory_shrinks(c);
  };
  CHECK(shrinks("--plan --device cuda", 1) == "--recompute, --mlp-chunks 8, a larger --sp over more GPUs, a smaller --batch or "
                                       "--seq, --zero 1 over more GPUs");
  CHECK(shrinks("--plan --device cuda --recompute --mlp-chunks 8 --layers 4", 2) ==
        "--offload, a larger --sp over more GPUs, a smaller --batch or --seq, --zero 1");
  // --offload keeps the last two blocks' outputs on the device: with two layers it moves nothing.
  CHECK(shrinks("--plan --device cuda --recompute --mlp-chunks 8 --layers 2", 2) ==
        "a larger --sp over more GPUs, a smaller --batch or --seq, --zero 1");
  CHECK(shrinks("--plan --device cuda --recompute --offload --mlp-chunks 16 --zero 1", 2) ==
        "a larger --sp over more GPUs, a smaller --batch or --seq");
  // The CPU has no --offload; an eval (--steps 0) reads neither --recompute nor --zero.
  CHECK(shrinks("--recompute", 1) ==
        "--mlp-chunks 8, a larger --sp over more machines, a smaller --batch or --seq, --zero 1 over more machines");
  CHECK(shrinks("--plan --device cuda --steps 0", 1) == "--mlp-chunks 8, a larger --sp over more GPUs, a smaller --batch or --seq");
}

TEST_CASE("the host memory check counts every rank that shares the machine", "[memory]") {
  MemoryPlan p;
  // On the CPU the total holds the step's micro-batches.
  p.params = 1 << 20, p.grads = 1 << 20, p.optim = 2 << 20, p.arena_peak = 6 << 20, p.batches = 1 << 20, p.total = 11 << 20;
  CHECK_NOTHROW(check_host_memory(p, true, 1, 15 << 20));
  // Two ranks as threads of one process (--comm local) need it twice.
  // What shrinks it: the flags the run lacks (memory_shrinks), not a fixed list.
  CHECK_THROWS_WITH(check_host_memory(p, true, 1, 10 << 20, 0, "a larger --sp over more machines"),
                    Catch::Contains("try a larger --sp over more machines") && !Catch::Contains("--recompute"));
  CHECK_THROWS_WITH(check_host_memory(p, true, 2, 15 << 20),
                    Catch::Contains("needs 11 MiB of host memory per rank x 2 ranks on this machine = 22 MiB") &&
                        Catch::Contains("the step's micro-batches 1 MiB") && Catch::Contains("but this machine has 15 MiB") &&
                        Catch::Contains("fewer ranks on this machine"));
  // Its parts add up to the total: the attention backward's workspace and a local communicator's
  // slice are named too (the message once left them out of a total that held them).
  {
    MemoryPlan q = p;
    q.workspace = 3 << 20, q.comm = 2 << 20, q.total = 16 << 20;
    CHECK_THROWS_WITH(check_host_memory(q, true, 1, 15 << 20),
                      Catch::Contains("needs 16 MiB") && Catch::Contains("activations 6 MiB, workspace 3 MiB, "
                                                                         "communication 2 MiB, the step's micro-batches"));
  }
  // On a GPU only the micro-batches are host memory.
  CHECK_NOTHROW(check_host_memory(p, false, 2, 15 << 20));
  p.batches = 10 << 20;
  CHECK_THROWS_WITH(check_host_memory(p, false, 2, 15 << 20),
                    Catch::Contains("needs 10 MiB of host memory per rank") && Catch::Contains("a smaller --grad-accum"));
  p.batches = 1 << 20;
  // ... and --offload's pinned block inputs and collectives staged through the host, per rank.
  p.pinned_host = 5 << 20, p.host_comm = 1 << 20;
  CHECK_NOTHROW(check_host_memory(p, false, 2, 15 << 20));
  // A checkpoint's f32 copy while it loads, per rank.
  CHECK_NOTHROW(check_host_memory(p, false, 2, 17 << 20, 1 << 20));
  CHECK_THROWS_WITH(check_host_memory(p, false, 2, 15 << 20, 1 << 20),
                    Catch::Contains("a checkpoint's f32 copy while it loads or saves 1 MiB"));
  CHECK_THROWS_WITH(check_host_memory(p, false, 3, 15 << 20),
                    Catch::Contains("needs 7 MiB of host memory per rank x 3 ranks on this machine = 21 MiB") &&
                        Catch::Contains("--offload's pinned block inputs 5 MiB") &&
                        Catch::Contains("collectives staged through the host 1 MiB") && Catch::Contains("without --offload"));
}
