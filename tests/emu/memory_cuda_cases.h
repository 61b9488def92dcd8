// Long-context memory on the CUDA backend; written only against the engine, so the same cases run
// emulated (tests/emu/test_memory_cuda.cpp, in CI) and on a real GPU (tests/gpu/test_memory_gpu.cpp);
// the including file picks the Catch2 tag. sp 2 runs as two threads of one process (the local
// communicator, its collectives staged through host memory).
//   - --recompute leaves the loss and every gradient bitwise equal to a run that keeps every
//     activation, and --offload (block inputs through pinned host memory on a side stream) equal to
//     --recompute alone: gpt2 and llama, 5 layers (so three block
//     outputs make the round trip), sp 1 and 2, two micro-batches (the host slots are reused). On
//     the emulator in both stream orders (engine/cuda_emu/runtime.h): the side stream's copies run
//     late, so an overwrite that does not wait for a copy shows, and the legacy stream's kernels
//     run late, so a copy that does not wait for the kernels before it shows;
//   - the planner's arena peak equals the measured one byte for byte, in fp32 and bf16, with and
//     without recompute, offload, tiled MLP and sp 2, and the trainer's reservation is never outgrown;
//     a --steps 0 run's is its eval's forward, byte for byte.
#pragma once
#include "options_from.h"
#include "stream_order.h"
#include "temp_dir.h"
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/planner.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including memory_cuda_cases.h"
#endif

namespace memory_cases {

using namespace ul;

const char* kCommon =
    "--threads 1 --grad-clip 0 --eval-every 0 --quiet --layers 5 --dim 64 --heads 2 --seq 16 --max-seq 16 "
    "--batch 2 --device cuda";

struct RankRun {
  double loss = 0;
  std::vector<float> grad;  // world-summed, after the step
  size_t act = 0, blocks = 0, eval_act = 0;  // eval_act: the arena's high-water in an eval
  int64_t valid = 0;
};

std::vector<RankRun> run(const std::string& args, int ranks) {
  Options o = ul_test::options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
  LocalOptions lo;
  lo.device = run_device(o);
  std::vector<RankRun> out(ranks);
  run_local(ranks, [&](Comm& world) {
    Trainer tr(o, world);
    RankRun& r = out[world.rank()];
    StepResult sr = tr.step();
    r.valid = sr.valid;
    r.loss = sr.loss;
    r.act = sr.act_bytes;
    r.blocks = tr.context().arena.blocks();
    tr.context().arena.reset_high_water();
    tr.evaluate();  // a forward that records nothing must fit the step's reservation too
    r.eval_act = tr.context().arena.high_water();
    const Params& p = tr.model().params;
    r.grad.resize(p.numel());
    device_copy(r.grad.data(), Device::cpu, p.grad(), p.device(), r.grad.size() * sizeof(float));
  }, lo);
  return out;
}

TEST_CASE("recomputing blocks, and offloading their inputs to pinned host memory, leave the loss and every gradient bitwise equal", UL_CUDA_TEST_TAG "[memory]") {
  for (const char* layout : {"--sp 1", "--sp 2"}) {
    for (const char* arch : {"gpt2", "llama"}) {
      for (const char* precision : {"fp32", "bf16"}) {
        const int ranks = std::string(layout) == "--sp 2" ? 2 : 1;
        const std::string a = std::string("--model ") + arch + " --precision " + precision + " " + layout +
                              " --grad-accum 2 --recompute";
        INFO(a);
        std::vector<RankRun> plain = run(a, ranks);
        // And --recompute's replay against no recompute: the same kernels on the same inputs (the
        // GEMMs' alignment hints capped at 16 bytes, engine/gemm.cu, so another arena layout picks
        // no other cuBLASLt algorithm): README's bit-for-bit claim, on a GPU where one is lent.
        {
          std::string kept = a;
          kept.erase(kept.find(" --recompute"));
          const std::vector<RankRun> no_replay = run(kept, ranks);
          CHECK(no_replay[0].loss == plain[0].loss);
          REQUIRE(no_replay[0].grad.size() == plain[0].grad.size());
          CHECK(std::memcmp(no_replay[0].grad.data(), plain[0].grad.data(), plain[0].grad.size() * sizeof(float)) == 0);
        }
        ul_test::in_each_stream_order([&](const char* order) {
          INFO("stream order " << order);
          std::vector<RankRun> off = run(a + " --offload", ranks);
          CHECK(off[0].loss == plain[0].loss);
          REQUIRE(off[0].grad.size() == plain[0].grad.size());
          CHECK(std::memcmp(off[0].grad.data(), plain[0].grad.data(), off[0].grad.size() * sizeof(float)) == 0);
          // two (B, Tl, C) buffers instead of one per layer: three layers' fewer at 5 layers
          const size_t one = size_t(2) * (16 / ranks) * 64 * (std::string(precision) == "bf16" ? 2 : 4);
          CHECK(plain[0].act - off[0].act == 3 * one);
        });
      }
    }
  }
}

TEST_CASE("the planner's arena peak is the device's, byte for byte", UL_CUDA_TEST_TAG "[memory][planner]") {
  ul_test::TempDir dir;  // packed documents, a line each (--eot 10): the attention's scratch for their ids
  const std::string lines = (dir.path / "lines.txt").string();
  {
    std::ofstream f(lines);
    for (int i = 0; i < 300; i++) f << "line " << i % 7 << " of a document\n";
  }
  std::vector<std::pair<std::string, int>> runs = {
      {"--model llama --precision bf16 --doc-mask --eot 10 --data text:" + lines, 1},
      {"--model gpt2 --precision bf16 --doc-mask --eot 10 --sp 2 --recompute --data text:" + lines, 2},
      {"--model gpt2 --precision fp32", 1},
      {"--model gpt2 --precision bf16 --mlp-chunks 3", 1},
      {"--model llama --precision bf16 --recompute", 1},
      {"--model llama --precision bf16 --recompute --offload --sp 2", 2},
      {"--model gpt2 --precision fp32 --sp 2 --recompute --mlp-chunks 2", 2},
      {"--model llama --precision fp32 --sp 2", 2},
      {"--model llama --precision fp32 --qkv-bias", 1},  // Qwen 2's q/k/v bias: its column-sum scratch
      {"--model gpt2 --precision bf16 --sp 2 --batch 1", 2},  // batch 1: the all-to-alls skip buffers
      // many layers, a classifier chunk larger than a block: an eval must not outgrow the step
      {"--model gpt2 --precision bf16 --recompute --offload --layers 12 --vocab 8192", 1},
  };
  for (const auto& [args, ranks] : runs) {
    std::vector<RankRun> got = run(args, ranks);
    Options o = ul_test::options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
    for (int r = 0; r < ranks; r++) {
      PlanConfig pc = plan_config(o);
      pc.valid_rows = got[r].valid;
      const MemoryPlan p = plan_memory(pc);
      INFO(args << " rank " << r << ": planned " << p.arena_peak << ", measured " << got[r].act);
      CHECK(p.arena_peak == got[r].act);
      CHECK(got[r].blocks == 1);
      CHECK(got[r].eval_act <= p.arena_peak);
    }
  }
}

TEST_CASE("a --steps 0 run reserves its eval's forward on the device, byte for byte", UL_CUDA_TEST_TAG "[memory][planner]") {
  const std::vector<std::pair<std::string, int>> runs = {
      {"--model gpt2 --precision bf16", 1},
      {"--model llama --precision fp32 --recompute --offload", 1},  // an eval neither replays nor offloads
      {"--model llama --precision bf16 --sp 2 --mlp-chunks 3", 2},
      {"--model gpt2 --precision bf16 --sp 2 --batch 1", 2},
  };
  for (const auto& [args, ranks] : runs) {
    Options o = ul_test::options(std::string(kCommon) + " " + args + " --steps 0 --eval-batches 1 --ranks " +
                                 std::to_string(ranks));
    LocalOptions lo;
    lo.device = run_device(o);
    std::vector<size_t> measured(ranks), blocks(ranks);
    run_local(ranks, [&](Comm& world) {
      Trainer tr(o, world);
      tr.context().arena.reset_high_water();
      tr.evaluate();
      measured[world.rank()] = tr.context().arena.high_water();
      blocks[world.rank()] = tr.context().arena.blocks();
    }, lo);
    PlanConfig pc = plan_config(o);
    const MemoryPlan p = plan_memory(pc);
    pc.trains = true;
    const size_t training = plan_memory(pc).arena_peak;
    for (int r = 0; r < ranks; r++) {
      INFO(args << " rank " << r << ": planned " << p.arena_peak << ", measured " << measured[r] << "; training "
                << training);
      CHECK(p.arena_peak == measured[r]);
      CHECK(blocks[r] == 1);
      CHECK(p.arena_peak < training);
    }
  }
}

TEST_CASE("a bf16 model only evaluated keeps no f32 masters and evaluates as one that keeps them", UL_CUDA_TEST_TAG "[memory]") {
  // The same initial weights (one seed), with nothing reading a host copy and with --sample 4: the
  // eval reads the bf16 weights alone, so the losses agree to the bit.
  const std::string base = std::string(kCommon) + " --model llama --precision bf16 --steps 0 --eval-batches 2 --ranks 1";
  double loss[2] = {0, 0};
  bool masters[2] = {true, false}, threw = false;
  for (int with : {0, 1}) {
    Options o = ul_test::options(base + (with ? " --sample 4" : ""));
    LocalOptions lo;
    lo.device = run_device(o);
    run_local(1, [&](Comm& world) {
      Trainer tr(o, world);
      loss[with] = tr.evaluate().loss;
      masters[with] = tr.model().params.has_masters();
      if (!with) {
        try {
          tr.host_params();
        } catch (const std::logic_error&) {
          threw = true;
        }
      }
    }, lo);
  }
  CHECK(!masters[0]);
  CHECK(masters[1]);
  CHECK(loss[0] == loss[1]);
  CHECK(threw);  // a host copy asked of a model set up without one is a bug, said as one
}

TEST_CASE("the planner's weights, gradients, AdamW state and arena are what the trainer allocates", UL_CUDA_TEST_TAG) {
  // (A --steps 0 trainer allocates its weights and the arena alone, and a bf16 model's masters only
  // for a host copy of the weights: checked below too.)
  // Device bytes from device_alloc while every rank's trainer is alive, against the plan's
  // parameters + gradients + optimizer state (+ fp32 masters) + ZeRO's shard buffer + the arena's
  // reservation, per rank times the ranks. The slack: AdamW's decay-run tables (bytes), and the planner's shard
  // being the largest one (up to 12 bytes per rank more than the others).
  const std::vector<std::pair<std::string, int>> runs = {
      {"--model gpt2 --precision bf16", 1},
      {"--model gpt2 --precision bf16", 2},
      {"--model gpt2 --precision bf16 --zero 1", 2},  // the masters sharded with m and v
      {"--model llama --precision bf16 --zero 1 --sp 2", 4},
      {"--model llama --precision fp32 --zero 1", 2},
      {"--model gpt2 --precision fp32 --zero 1", 1},  // one rank shards nothing: no shard buffer
      // Only evaluated: the weights alone, no gradients, AdamW state, ZeRO shard (--zero ignored) or
      // f32 masters; these too when the run reads a host copy of the weights (here to sample).
      {"--model llama --precision bf16 --zero 1 --steps 0", 2},
      {"--model gpt2 --precision fp32 --steps 0", 1},
      {"--model gpt2 --precision bf16 --steps 0 --sample 4", 1},
  };
  for (const auto& [args, ranks] : runs) {
    Options o = ul_test::options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
    LocalOptions lo;
    lo.device = run_device(o);
    const size_t before = device_bytes_in_use(Device::cuda);
    size_t measured = 0;
    run_local(ranks, [&](Comm& world) {
      Trainer tr(o, world);
      world.barrier();  // every rank's buffers are there
      if (world.rank() == 0) measured = device_bytes_in_use(Device::cuda) - before;
      world.barrier();
    }, lo);
    PlanConfig pc = plan_config(o);
    pc.world = ranks;
    const MemoryPlan p = plan_memory(pc);
    const size_t reserved = (p.arena_peak + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);  // Arena::reserve's 2 MiB steps
    const size_t planned = size_t(ranks) * (p.params + p.grads + p.optim + p.comm + reserved);
    INFO(args << " on " << ranks << " ranks: planned " << planned << " bytes, allocated " << measured);
    CHECK(measured + size_t(ranks) * 12 * size_t(ranks) >= planned);
    CHECK(measured <= planned + size_t(ranks) * 1024);
  }
}

TEST_CASE("the planner's bytes sent are a device step's, bf16 with sharded masters included", UL_CUDA_TEST_TAG
          "[planner]") {
  const std::vector<std::pair<std::string, int>> runs = {
      {"--model gpt2 --precision bf16", 2},
      {"--model gpt2 --precision bf16 --zero 1", 2},  // + the weight check over the sharded masters
      {"--model llama --precision bf16 --zero 1 --sp 2", 4},
      {"--model llama --precision fp32 --zero 1", 2},
  };
  for (const auto& [args, ranks] : runs) {
    Options o = ul_test::options(std::string(kCommon) + " " + args + " --ranks " + std::to_string(ranks));
    LocalOptions lo;
    lo.device = run_device(o);
    std::vector<CommStats> sent(static_cast<size_t>(ranks), CommStats{});
    run_local(ranks, [&](Comm& world) {
      Trainer tr(o, world);
      sent[size_t(world.rank())] = tr.step().sent;
    }, lo);
    PlanConfig pc = plan_config(o);
    pc.world = ranks;
    const MemoryPlan p = plan_memory(pc);
    for (int r = 0; r < ranks; r++) {
      INFO(args << " rank " << r);
      CHECK(p.sent.all_reduce == sent[size_t(r)].all_reduce);
      CHECK(p.sent.all_to_all == sent[size_t(r)].all_to_all);
      CHECK(p.sent.reduce_scatter == sent[size_t(r)].reduce_scatter);
      CHECK(p.sent.all_gather == sent[size_t(r)].all_gather);
    }
  }
}

}  // namespace memory_cases
