// The parallel training equivalences with real processes (mpirun -np 4): the Trainer on the MPI
// world against a single-process reference that every rank also computes on its own, in a local
// one-rank world (run_local(1, ...)), on the full batch:
//   - dp 2 x sp 2, 5 AdamW steps: every step's loss and the parameters afterwards;
//   - sp 4 (dp 1), 5 steps: every step's loss.
// One thread per rank (--threads 1): four processes share the machine's cores.
// Checks use CHECK, not REQUIRE: a rank that stopped a test case early would leave the other ranks
// waiting in its remaining collectives.
#include "gradcheck.h"
#include "options_from.h"
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/options.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"
#include "parallel/comm_mpi.h"

using namespace ul;

namespace {

Comm& world() {
  static std::unique_ptr<Comm> w = mpi_world();
  return *w;
}

const char* kCommon = "--threads 1 --grad-clip 0 --eval-every 0 --quiet --seq 64 --layers 2 --dim 64 --steps 5 --warmup 2";

using ul_test::options;

struct Run {
  std::vector<double> losses;
  std::vector<float> params;
  std::vector<ParamSpec> specs;
};

Run run_steps(const Options& o, Comm& w, int steps) {
  Run r;
  Trainer tr(o, w);
  for (int s = 0; s < steps; s++) r.losses.push_back(tr.step().loss);
  const Params& p = tr.model().params;
  r.params.assign(p.data(), p.data() + p.numel());
  r.specs = p.specs();
  return r;
}

// The single-process reference, in a one-rank local world on a thread of this process (the
// Trainer installs its Context on the thread that builds it).
Run reference(const std::string& args, int steps) {
  Options o = options(std::string(kCommon) + " " + args + " --comm local --ranks 1 --sp 1");
  Run r;
  run_local(1, [&](Comm& w) { r = run_steps(o, w, steps); });
  return r;
}

// Largest per-tensor |got - want| relative to the tensor's max |want|.
double worst_rel(const Run& want, const Run& got, std::string& name) {
  double worst = 0;
  for (const ParamSpec& s : want.specs) {
    double diff = 0, ref = 0;
    for (size_t i = s.offset; i < s.offset + size_t(s.shape.numel()); i++) {
      diff = ul_test::max_err(diff, std::fabs(double(got.params[i]) - double(want.params[i])));
      ref = std::max(ref, std::fabs(double(want.params[i])));
    }
    double rel = ref > 0 ? diff / ref : (diff > 0 ? INFINITY : 0.0);  // a NaN diff is INFINITY here
    if (rel >= worst) worst = rel, name = s.name;
  }
  return worst;
}

double rel_diff(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

}  // namespace

TEST_CASE("mpi: dp 2 x sp 2 trains like one process on the full batch", "[mpi][parallel]") {
  REQUIRE(world().size() == 4);
  // dp rank d of step s reads sequences [2sB + dB, 2sB + dB + B): one process with batch 2B reads both.
  // lr 3e-4 and eps 1e-4: see test_parallel_equivalence.cpp on Adam and gradients near its eps (at
  // 1e-8 the parameter check would measure rounding luck).
  const std::string model = "--model llama --heads 4 --kv-heads 2 --lr 3e-4 --adam-eps 1e-4";
  Run par = run_steps(options(std::string(kCommon) + " " + model + " --comm mpi --batch 2 --sp 2"), world(), 5);
  Run ref = reference(model + " --batch 4", 5);
  for (int s = 0; s < 5; s++) {
    INFO("rank " << world().rank() << " step " << s + 1 << ": loss " << par.losses[s] << " vs " << ref.losses[s]);
    CHECK(rel_diff(par.losses[s], ref.losses[s]) < 1e-5);
  }
  CHECK(ref.losses.back() < ref.losses.front());  // the steps trained (equal runs that learn nothing prove little)
  std::string name;
  double worst = worst_rel(ref, par, name);
  INFO("rank " << world().rank() << ": worst parameter tensor " << name << ": " << worst << " of max |param|");
  CHECK(worst < 1e-5);
  // Every rank ends with the same parameters, bit for bit.
  std::vector<float> first = par.params;
  world().broadcast(first.data(), first.size(), DType::f32, 0);
  CHECK(first == par.params);
}

TEST_CASE("mpi: sp 4 gives the losses of one process", "[mpi][parallel]") {
  REQUIRE(world().size() == 4);
  const std::string model = "--model gpt2 --heads 4 --batch 2 --lr 1e-3";
  Run par = run_steps(options(std::string(kCommon) + " " + model + " --comm mpi --sp 4"), world(), 5);
  Run ref = reference(model, 5);
  for (int s = 0; s < 5; s++) {
    INFO("rank " << world().rank() << " step " << s + 1 << ": loss " << par.losses[s] << " vs " << ref.losses[s]);
    CHECK(rel_diff(par.losses[s], ref.losses[s]) < 1e-5);
  }
  CHECK(ref.losses.back() < ref.losses.front());
}
