// Sampling's prefill (engine/sample.h): a prompt fed through the KV-cache decoder in chunks of
// rows (one GEMM per weight per chunk) against the same prompt fed one token at a time (one
// matrix-vector product per weight per token: every weight read from memory once per token), in
// the same process on the same weights. Prints the time and tokens/s of each chunk size (the best
// of --reps prefills after an untimed one: the first pays for the threads' start and the first
// touch of the decoder's buffers, and the machine may be shared), its speedup over chunk 1 and how
// far its last logits are from chunk 1's (summation order only).
//   ./build/bench_prefill --help   prints the flags and their defaults (the usage string below is the one list)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/bench_args.h"
#include "bench/guarded_main.h"
#include "engine/context.h"
#include "engine/rng.h"
#include "engine/sample.h"
#include "engine/trainer.h"
#include "layers/transformer.h"

using namespace ul;

namespace {

int run(int argc, char** argv) {
  BenchArgs args(argc, argv,
                 "usage: bench_prefill [--prompt 1024] [--chunks 1,16,64,256,1024] [--layers 4] [--dim 512] [--heads 8]\n"
                 "                     [--kv-heads 4] [--ffn 1408] [--vocab 32000] [--window 0] [--threads 0 (all cores)]\n"
                 "                     [--reps 3]\n"
                 "  a llama of that shape, random weights; the first chunk size is the baseline; each chunk size's\n"
                 "  time is the best of --reps prefills after an untimed one");
  ModelConfig cfg;
  cfg.arch = "llama";
  const int n = args.positive("--prompt", 1024);
  const std::vector<int> chunks = args.ints("--chunks", {1, 16, 64, 256, 1024}, 1);
  cfg.layers = args.positive("--layers", 4), cfg.dim = args.positive("--dim", 512);
  cfg.heads = args.positive("--heads", 8), cfg.kv_heads = args.positive("--kv-heads", 4);
  cfg.ffn = args.positive("--ffn", 1408), cfg.vocab = args.positive("--vocab", 32000);
  cfg.sliding_window = int(args.integer("--window", 0, 0, 1 << 30));
  const int threads = int(args.integer("--threads", 0, 0, 1024));
  const int reps = args.positive("--reps", 3);
  args.done();
  cfg.padded_vocab = (cfg.vocab + 127) / 128 * 128;
  cfg.max_seq = n;
  cfg.validate();
  if (threads > 0) omp_set_num_threads(threads);

  Context c;
  ContextGuard guard(c);
  Transformer m(cfg);
  m.init_weights(1);
  const std::vector<float> params = m.params.to_host();
  std::vector<int> prompt(static_cast<size_t>(n));
  Rng rng(2);
  for (int& t : prompt) t = int(rng.uniform() * cfg.vocab) % cfg.vocab;

  std::printf("prefill of %d tokens | %s | %.1fM parameters | %d threads | best of %d after an untimed one\n", n,
              cfg.describe().c_str(), m.params.numel() / 1e6, omp_get_max_threads(), reps);
  std::printf("| chunk | ms | tok/s | speedup vs chunk %d | max rel diff of the last logits |\n|---|---|---|---|---|\n",
              chunks[0]);
  double base_ms = 0;
  std::vector<float> base;
  for (int chunk : chunks) {
    KvDecoder dec(cfg, m.params.specs(), params.data(), n, chunk);
    std::vector<float> logits;
    double ms = 1e300;
    for (int r = 0; r <= reps; r++) {  // r = 0 warms up, untimed
      dec.reset();
      const double t0 = now_ms();
      logits = dec.prefill(prompt.data(), n);
      if (r > 0) ms = std::min(ms, now_ms() - t0);
    }
    if (base.empty()) base = logits, base_ms = ms;
    double diff = 0;
    for (size_t v = 0; v < logits.size(); v++)
      diff = std::max(diff, std::fabs(double(logits[v]) - base[v]) / std::max(1.0, std::fabs(double(base[v]))));
    std::printf("| %d | %.1f | %.0f | %.2fx | %.1e |\n", chunk, ms, n / (ms / 1000), base_ms / ms, diff);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return guarded_main(run, argc, argv); }
