// Ulysses sequence parallelism on one machine, with the local communicator (ranks are threads):
// one long sequence, sp = 1, 2, 4, and per configuration
//   - activation memory per rank: the arena high-water of a step (expected ~1/P of sp = 1);
//   - the process's peak RSS (VmHWM): each configuration runs in its own child process, so the
//     peak is that configuration's; with threads it is the WHOLE process, i.e. P ranks' activations
//     plus P copies of the parameters, gradients and AdamW state, so it does not fall as 1/P;
//   - all-to-all bytes sent per rank per step, against the formula from parallel/ulysses.cpp;
//   - all-reduce bytes per rank per step (the gradient and three f64 scalars, ring accounting);
//   - step time (the best of --reps steps after the first, which warms up; the machine may be
//     shared, and the best step is the one least disturbed), one OpenMP thread per rank.
// Ratios are against the sp = 1 run.
//   ./build/bench_sp_scaling --help   prints the flags and their defaults (the usage string below is the one list)
#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "engine/options.h"
#include "engine/trainer.h"
#include "parallel/comm_local.h"

using namespace ul;

namespace {

struct Config {
  int seq = 8192, dim = 256, layers = 4, heads = 8, batch = 1, reps = 3;
  std::vector<int> sps = {1, 2, 4};
};

struct Result {
  int sp = 0;
  double act_mib = 0, rss_mib = 0, ms = 0;
  unsigned long long a2a = 0, ar = 0;
};

long vm_hwm_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

// Child: one configuration, printed as one RESULT line.
int child(const Config& c, int sp) {
  std::ostringstream args;
  args << "train --model gpt2 --dim " << c.dim << " --layers " << c.layers << " --heads " << c.heads << " --seq " << c.seq
       << " --batch " << c.batch << " --sp " << sp << " --ranks " << sp << " --threads 1 --steps " << c.reps + 1
       << " --warmup 1 --eval-every 0 --quiet";
  std::vector<std::string> words;
  std::istringstream in(args.str());
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(&w[0]);
  Options o = parse_options(int(argv.size()), argv.data());
  std::vector<std::vector<StepResult>> steps(size_t(c.reps), std::vector<StepResult>(size_t(sp)));
  run_local(sp, [&](Comm& world) {
    Trainer tr(o, world);
    tr.step();
    for (auto& s : steps) s[size_t(world.rank())] = tr.step();
  });
  // A step takes as long as its slowest rank; the configuration's time is its best step.
  size_t act = 0;
  double ms = 1e300;
  for (const auto& s : steps) {
    double step_ms = 0;
    for (const StepResult& r : s) act = std::max(act, r.act_bytes), step_ms = std::max(step_ms, r.ms);
    ms = std::min(ms, step_ms);
  }
  const StepResult& last = steps.back()[0];
  std::printf("RESULT %d %.3f %.3f %.3f %llu %llu\n", sp, act / 1048576.0, vm_hwm_kib() / 1024.0, ms,
              (unsigned long long)last.sent.all_to_all, (unsigned long long)last.sent.all_reduce);
  return 0;
}

// Runs this program again with --child SP and parses its RESULT line.
bool run_child(const Config& c, int sp, const char* self, Result& out) {
  std::ostringstream cmd;
  cmd << self << " --child " << sp << " --seq " << c.seq << " --dim " << c.dim << " --layers " << c.layers
      << " --heads " << c.heads << " --batch " << c.batch << " --reps " << c.reps;
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return false;
  char line[512];
  bool ok = false;
  while (std::fgets(line, sizeof line, p)) {
    if (std::strncmp(line, "RESULT ", 7) == 0)
      ok = std::sscanf(line + 7, "%d %lf %lf %lf %llu %llu", &out.sp, &out.act_mib, &out.rss_mib, &out.ms, &out.a2a,
                       &out.ar) == 6;
    else
      std::fputs(line, stderr);
  }
  return pclose(p) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  BenchArgs args(argc, argv,
                 "usage: bench_sp_scaling [--seq " + std::to_string(c.seq) + "] [--dim " + std::to_string(c.dim) +
                     "] [--layers " + std::to_string(c.layers) + "] [--heads " + std::to_string(c.heads) +
                     "] [--batch " + std::to_string(c.batch) + "] [--sp 1,2,4] [--reps " + std::to_string(c.reps) +
                     "]\n  the step time is the best of --reps steps after a first one");
  c.seq = args.positive("--seq", c.seq);
  c.dim = args.positive("--dim", c.dim);
  c.layers = args.positive("--layers", c.layers);
  c.heads = args.positive("--heads", c.heads);
  c.batch = args.positive("--batch", c.batch);
  c.sps = args.ints("--sp", c.sps, 1);
  c.reps = args.positive("--reps", c.reps);
  const int child_sp = args.positive("--child", 0);  // internal: one configuration, for the parent
  args.done();
  try {
    if (child_sp > 0) return child(c, child_sp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sp_scaling: sp %d: %s\n", child_sp, e.what());
    return 1;
  }

  std::printf("gpt2 dim %d, %d layers, %d heads; batch %d x seq %d; local communicator, 1 thread per rank, %d steps "
              "(the best of the last %d is reported)\n\n",
              c.dim, c.layers, c.heads, c.batch, c.seq, c.reps + 1, c.reps);
  // The ratios are to the first sp listed (1 unless --sp says otherwise), "-" if that one failed.
  const int first = c.sps.front();
  std::printf("| sp | act MiB / rank | vs sp %d | process peak RSS MiB | a2a MiB / rank / step | formula MiB | "
              "all-reduce MiB / rank / step | step s | vs sp %d |\n", first, first);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  // This program's path, for the children (popen runs a shell, whose /proc/self/exe is the shell).
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::perror("bench_sp_scaling: readlink /proc/self/exe");
    return 1;
  }
  self[n] = 0;
  Result base;
  bool have_base = false;
  int failed = 0;
  for (size_t k = 0; k < c.sps.size(); k++) {
    const int sp = c.sps[k];
    Result r;
    if (!run_child(c, sp, self, r)) {
      std::printf("| %d | failed (see stderr) |\n", sp);
      failed++;
      continue;
    }
    if (k == 0) base = r, have_base = true;
    auto ratio = [&](const char* f, double v, double b) {
      char buf[32];
      std::snprintf(buf, sizeof buf, f, v / b);
      return have_base ? std::string(buf) : std::string("-");
    };
    // Per layer, forward: scatter_heads sends B*Tl*(3H/P)*D, gather_heads B*Tl*(H/P)*D elements per
    // chunk, (P - 1) chunks leave; the backward repeats both: 2 * 4 * B * T * C * (P - 1) / P^2 per layer.
    const double P = sp, formula = double(c.layers) * 2 * 4 * c.batch * double(c.seq) * c.dim * (P - 1) / (P * P) * 4;
    std::printf("| %d | %.1f | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s |\n", sp, r.act_mib,
                ratio("%.3f", r.act_mib, base.act_mib).c_str(), r.rss_mib, r.a2a / 1048576.0, formula / 1048576.0,
                r.ar / 1048576.0, r.ms / 1000.0, ratio("%.2f", r.ms, base.ms).c_str());
    std::fflush(stdout);
  }
  return failed ? 1 : 0;  // a table with a failed row is not a result a script should take as one
}
