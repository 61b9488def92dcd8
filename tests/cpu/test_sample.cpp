// Sampling: the KV-cache decoder against the full forward (every position's logits; with a sliding
// window, greedy against the full forward's argmax step by step), greedy and top-k 1 agreement and
// determinism, the token sampler's rules, prompts, and the llm.c tokenizer reader (including every
// way its file can be wrong).
#include <catch2/catch.hpp>

#include <algorithm>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "gradcheck.h"
#include "engine/context.h"
#include "engine/device.h"
#include "engine/export.h"
#include "engine/rng.h"
#include "engine/sample.h"
#include "engine/tokenizer.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "model_logits.h"
#include "options_from.h"
#include "parallel/hosts.h"
#include "run_cmd.h"
#include "temp_dir.h"
#include "tokenizer_file.h"

using namespace ul;
using ul_test::byte_tokens;
using ul_test::full_logits;
using ul_test::host_params;
using ul_test::small;
using ul_test::tok_file;
namespace fs = std::filesystem;

namespace {

struct TempFile {
  std::string path = (fs::temp_directory_path() / ("ul_sample_" + std::to_string(::getpid()) + ".bin")).string();
  ~TempFile() { fs::remove(path); }
  const std::string& write(const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

}  // namespace

TEST_CASE("the KV-cache logits equal the full forward's at every position", "[sample]") {
  // One thread: a one-token step is too small to share, and on a busy CI machine every OpenMP
  // region of a one-row kernel would wait for a whole team.
  omp_set_num_threads(1);
  for (const std::string arch : {"gpt2", "llama"}) {
    CAPTURE(arch);
    Context c;
    ContextGuard g(c);
    Transformer m(small(arch));
    const std::vector<float> h = host_params(m, 11);
    // A prompt, then what greedy decoding generates from it: the cache is checked on its own output.
    KvDecoder dec(m.cfg, m.params.specs(), h.data(), 20);
    const std::vector<int> prompt = {3, 14, 15, 9, 26};
    std::vector<int> gen = generate(dec, prompt, {15, 0.0f, 0, 1});
    std::vector<int32_t> seq(prompt.begin(), prompt.end());
    seq.insert(seq.end(), gen.begin(), gen.end());
    const std::vector<float> full = full_logits(m, seq);
    dec.reset();
    const int V = m.cfg.vocab;
    double worst = 0;
    for (size_t t = 0; t < seq.size(); t++) {
      const std::vector<float>& kv = dec.step(seq[t]);
      for (int v = 0; v < V; v++) {
        const double ref = full[t * size_t(V) + size_t(v)];
        worst = ul_test::max_err(worst, std::fabs(kv[size_t(v)] - ref) / std::max(1.0, std::fabs(ref)));
      }
      // Greedy picked the first maximum of the full forward's logits at every generated position
      // (found here, not by sample_token: the rule is checked, not replayed).
      if (t + 1 >= prompt.size() && t + 1 < seq.size()) {
        const float* row = &full[t * size_t(V)];
        CHECK(int(std::max_element(row, row + V) - row) == seq[t + 1]);
      }
    }
    CHECK(worst < 1e-5);
    CHECK(dec.position() == int(seq.size()));
    CHECK_THROWS_WITH(dec.step(0), Catch::Contains("KV cache is full"));
  }
}

TEST_CASE("with a sliding window, greedy KV-cache decoding is the argmax of a full forward at each step", "[sample][window]") {
  // Every layer windowed (its cache a ring of W slots), and layer 1 without the window (hybrid).
  for (int every : {0, 2}) {
    CAPTURE(every);
    omp_set_num_threads(1);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small("llama");
    cfg.sliding_window = 4;  // prompt + generated: 17 positions, most of them past the window
    cfg.full_every = every, cfg.full_first = every ? 1 : 0;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 13);
    KvDecoder dec(m.cfg, m.params.specs(), h.data(), 20);
    const std::vector<int> prompt = {3, 14, 15, 9, 26};
    const std::vector<int> gen = generate(dec, prompt, {12, 0.0f, 0, 1});
    // Each generated token is the argmax of the full forward's last logits over everything before it,
    // recomputed from scratch (the op's window, not the cache's), and the logits agree.
    std::vector<int32_t> seq(prompt.begin(), prompt.end());
    dec.reset();
    const std::vector<float>* kv = nullptr;
    for (int t : prompt) kv = &dec.step(t);
    double worst = 0;
    for (size_t i = 0; i < gen.size(); i++) {
      CAPTURE(i);
      c.arena.reset();  // each forward's activations from a fresh arena
      const std::vector<float> full = full_logits(m, seq);
      const std::vector<float> last(full.end() - cfg.vocab, full.end());
      Rng rng(0);
      CHECK(sample_token(last, 0.0f, 0, rng) == gen[i]);
      for (int v = 0; v < cfg.vocab; v++)
        worst = ul_test::max_err(worst, double(std::fabs((*kv)[size_t(v)] - last[size_t(v)]) / std::max(1.0f, std::fabs(last[size_t(v)]))));
      seq.push_back(gen[i]);
      kv = &dec.step(gen[i]);
    }
    CHECK(worst < 1e-5);
    // The window matters: decoding without it gives other logits once a query has more than W keys,
    // and the same ones while it has no more (positions 0..3).
    ModelConfig open = cfg;
    open.sliding_window = open.full_every = open.full_first = 0;
    KvDecoder plain(open, m.params.specs(), h.data(), 20);
    dec.reset();
    double early = 0, late = 0;
    for (size_t t = 0; t < seq.size(); t++) {
      const std::vector<float> a = dec.step(seq[t]), b = plain.step(seq[t]);
      double& d = t < 4 ? early : late;
      for (int v = 0; v < cfg.vocab; v++) d = ul_test::max_err(d, double(std::fabs(a[size_t(v)] - b[size_t(v)])));
    }
    CHECK(std::isfinite(late));  // a NaN counts as a large difference: "differs" must be a number
    CHECK(early == 0);
    CHECK(late > 1e-3);
  }
}

// The largest relative difference between two logit vectors.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t v = 0; v < a.size(); v++)
    worst = ul_test::max_err(worst, std::fabs(double(a[v]) - b[v]) / std::max(1.0, std::fabs(double(b[v]))));
  return worst;
}

TEST_CASE("a chunked prefill leaves the logits and the cache of one-token steps", "[sample][prefill]") {
  // Every layout a chunk can take against the cache: chunks of 1 (the steps themselves), shorter
  // than the window, longer than it (the ring then holds W + chunk - 1 positions), longer than the
  // prompt; full attention, a window in every layer and a hybrid; gpt2 and llama with GQA.
  omp_set_num_threads(1);  // rows of a tiny model: a thread team per op would cost more than the work
  struct Case { std::string arch; int window, every; };
  for (const Case& k : {Case{"gpt2", 0, 0}, Case{"llama", 0, 0}, Case{"llama", 4, 0}, Case{"llama", 4, 2}}) {
    CAPTURE(k.arch, k.window, k.every);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small(k.arch);
    cfg.sliding_window = k.window, cfg.full_every = k.every, cfg.full_first = k.every ? 1 : 0;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 17);
    const std::vector<int> prompt = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46, 26, 43, 38, 32};  // 19
    // The reference: one token at a time; then three more steps past the prompt.
    KvDecoder ref(m.cfg, m.params.specs(), h.data(), 24, 1);
    std::vector<std::vector<float>> want;
    for (int t : prompt) want.assign(1, ref.step(t));
    for (int t : {4, 11, 30}) want.push_back(ref.step(t));
    for (int chunk : {1, 3, 7, 64}) {
      CAPTURE(chunk);
      KvDecoder dec(m.cfg, m.params.specs(), h.data(), 24, chunk);
      std::vector<int> seen;
      const std::vector<float> got = dec.prefill(prompt.data(), int(prompt.size()), [&](int done) { seen.push_back(done); });
      CHECK(rel_diff(got, want[0]) < 1e-5);
      CHECK(seen.size() == size_t((19 + std::min(chunk, 24) - 1) / std::min(chunk, 24)));
      CHECK(seen.back() == 19);
      CHECK(dec.position() == 19);
      // The steps after it read what the prefill left in the cache (the ring's slots included).
      int i = 1;
      for (int t : {4, 11, 30}) CHECK(rel_diff(dec.step(t), want[size_t(i++)]) < 1e-5);
      // A prompt fed in two calls, the second starting mid-chunk, is the same prompt.
      dec.reset();
      dec.prefill(prompt.data(), 5);
      CHECK(rel_diff(dec.prefill(prompt.data() + 5, 14), want[0]) < 1e-5);
    }
  }
}

TEST_CASE("the decoder gives the same bits on 1 and 4 threads, prefill and steps", "[sample][threads]") {
  // dim 256: the one-row products cross the thread-team threshold (OC x C >= 2^16) and a prefill
  // of 150 positions spreads its row blocks and heads over the threads. Every sum has a fixed order
  // (blocks of 64 output rows, the GEMM's blocks fixed by shape): the logits match to the bit.
  for (const std::string arch : {"gpt2", "llama"}) {
    CAPTURE(arch);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small(arch);
    cfg.dim = 256, cfg.heads = 4, cfg.kv_heads = arch == "llama" ? 2 : 4, cfg.ffn = arch == "llama" ? 512 : 0;
    cfg.max_seq = 160;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 23);
    std::vector<int> prompt(150);
    for (int t = 0; t < 150; t++) prompt[size_t(t)] = (t * 17 + 3) % cfg.vocab;
    auto run = [&](int threads) {
      omp_set_num_threads(threads);
      KvDecoder dec(m.cfg, m.params.specs(), h.data(), 160, 32);
      std::vector<std::vector<float>> out = {dec.prefill(prompt.data(), 150)};
      for (int t : {4, 11, 30}) out.push_back(dec.step(t));
      return out;
    };
    const auto one = run(1), four = run(4);
    omp_set_num_threads(1);
    REQUIRE(one.size() == four.size());
    for (size_t i = 0; i < one.size(); i++) CHECK(one[i] == four[i]);
  }
}

TEST_CASE("a long prefill: several row blocks and key tiles, the ring wrapping inside a chunk", "[sample][prefill]") {
  // 150 positions: blocks of 64 rows and tiles of 64 keys cut the chunks unevenly; with W = 70
  // and chunks of 30, the ring has 99 slots, so tiles end where it wraps.
  omp_set_num_threads(1);
  for (int window : {0, 70}) {
    CAPTURE(window);
    Context c;
    ContextGuard g(c);
    ModelConfig cfg = small("llama");
    cfg.sliding_window = window;
    Transformer m(cfg);
    const std::vector<float> h = host_params(m, 23);
    std::vector<int> prompt(150);
    Rng rng(5);
    for (int& t : prompt) t = int(rng.uniform() * cfg.vocab) % cfg.vocab;
    KvDecoder ref(m.cfg, m.params.specs(), h.data(), 152, 1);
    std::vector<float> want = ref.prefill(prompt.data(), 150);
    const std::vector<float> next = ref.step(7);
    for (int chunk : {30, 100, 150}) {
      CAPTURE(chunk);
      KvDecoder dec(m.cfg, m.params.specs(), h.data(), 152, chunk);
      CHECK(rel_diff(dec.prefill(prompt.data(), 150), want) < 1e-5);
      CHECK(rel_diff(dec.step(7), next) < 1e-5);
    }
  }
}

TEST_CASE("the prefill against the full forward, and its refusals", "[sample][prefill]") {
  Context c;
  ContextGuard g(c);
  Transformer m(small("llama"));
  const std::vector<float> h = host_params(m, 19);
  const std::vector<int32_t> seq = {7, 1, 44, 2, 19, 23, 4, 4, 31, 0, 12, 48, 6, 17, 21, 9};
  const std::vector<float> full = full_logits(m, seq);
  const size_t V = size_t(m.cfg.vocab);
  for (int n : {1, 6, 16}) {  // the logits after n prompt tokens are the full forward's row n - 1
    CAPTURE(n);
    KvDecoder dec(m.cfg, m.params.specs(), h.data(), 16, 5);
    const std::vector<int> prompt(seq.begin(), seq.begin() + n);
    const std::vector<float> row(full.begin() + long(size_t(n - 1) * V), full.begin() + long(size_t(n) * V));
    CHECK(rel_diff(dec.prefill(prompt.data(), n), row) < 1e-5);
  }
  KvDecoder dec(m.cfg, m.params.specs(), h.data(), 8, 4);
  const std::vector<int> bad = {1, 2, 50, 3};
  CHECK_THROWS_WITH(dec.prefill(bad.data(), 4), Catch::Contains("token 50 is outside the vocab of 50"));
  CHECK(dec.position() == 0);  // refused before any row ran
  const std::vector<int> nine(9, 1);
  CHECK_THROWS_WITH(dec.prefill(nine.data(), 9), Catch::Contains("KV cache is full (8 positions; 0 used, 9 more"));
  CHECK(dec.position() == 0);
  CHECK_THROWS_WITH(dec.prefill(nine.data(), 0), Catch::Contains("no tokens"));
  CHECK_THROWS_WITH(KvDecoder(m.cfg, m.params.specs(), h.data(), 8, 0), Catch::Contains("chunk must hold at least one"));
}

TEST_CASE("greedy is deterministic, top-k 1 is greedy, sampling is seeded", "[sample]") {
  Context c;
  ContextGuard g(c);
  omp_set_num_threads(1);
  Transformer m(small("llama"));
  const std::vector<float> h = host_params(m, 12);
  KvDecoder dec(m.cfg, m.params.specs(), h.data(), 24);
  const std::vector<int> prompt = {1, 2, 3};
  const std::vector<int> greedy = generate(dec, prompt, {20, 0.0f, 0, 1});
  CHECK(generate(dec, prompt, {20, 0.0f, 0, 99}) == greedy);
  CHECK(generate(dec, prompt, {20, 1.0f, 1, 7}) == greedy);
  const std::vector<int> s1 = generate(dec, prompt, {20, 1.5f, 0, 5});
  CHECK(generate(dec, prompt, {20, 1.5f, 0, 5}) == s1);
  CHECK(generate(dec, prompt, {20, 1.5f, 0, 6}) != s1);
  CHECK_THROWS_WITH(generate(dec, prompt, {30, 1.0f, 0, 1}), Catch::Contains("KV cache is full"));
  CHECK_THROWS_WITH(generate(dec, {}, {3, 1.0f, 0, 1}), Catch::Contains("prompt is empty"));
  CHECK_THROWS_WITH(generate(dec, {50}, {3, 1.0f, 0, 1}), Catch::Contains("outside the vocab"));
  // A tokenizer with fewer tokens than the model's rows: only its ids are drawn. Greedy among the
  // first 5 ids is the argmax of those 5 logits at every step.
  SampleSettings known{12, 0.0f, 0, 1};
  known.vocab = 5;
  const std::vector<int> limited = generate(dec, prompt, known);
  dec.reset();
  const std::vector<float>* logits = &dec.prefill(prompt.data(), int(prompt.size()));
  for (int id : limited) {
    REQUIRE(id < 5);
    CHECK(id == int(std::max_element(logits->begin(), logits->begin() + 5) - logits->begin()));
    logits = &dec.step(id);
  }
  known.temperature = 2.0f, known.tokens = 20;
  for (int id : generate(dec, prompt, known)) CHECK(id < 5);
}

TEST_CASE("the token sampler: argmax, ties, top-k, temperature", "[sample]") {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -3.0f};
  Rng rng(3);
  CHECK(sample_token(logits, 0.0f, 0, rng) == 1);  // ties: the lower id
  CHECK(sample_token(logits, 2.0f, 1, rng) == 1);
  std::set<int> seen;
  for (int i = 0; i < 2000; i++) seen.insert(sample_token(logits, 1.0f, 3, rng));
  CHECK(seen == std::set<int>{1, 3, 4});
  int ones = 0;  // a tiny temperature is (almost) greedy; a huge one (almost) uniform
  for (int i = 0; i < 1000; i++) ones += sample_token(logits, 1e-3f, 0, rng) == 1;
  CHECK(ones > 400);
  CHECK(ones < 600);  // ids 1 and 3 tie: each about half
  seen.clear();
  for (int i = 0; i < 2000; i++) seen.insert(sample_token(logits, 1e3f, 0, rng));
  CHECK(seen.size() == logits.size());
  // A diverged model's NaN or inf is refused, naming the token (NaN defeated every comparison, and
  // with top-p the nucleus kept nothing and read before its start).
  std::vector<float> bad = logits;
  bad[4] = std::nanf("");
  CHECK_THROWS_WITH(sample_token(bad, 1.0f, 0, rng, 0.9f), Catch::Contains("logit for token 4 is nan"));
  bad[4] = INFINITY;
  CHECK_THROWS_WITH(sample_token(bad, 0.0f, 0, rng), Catch::Contains("diverged"));
}

TEST_CASE("top-p keeps the fewest most likely tokens whose probability reaches p", "[sample]") {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  Rng rng(11);
  auto draws = [&](int top_k, float top_p) {
    std::map<int, int> n;
    for (int i = 0; i < 4000; i++) n[sample_token(logits, 1.0f, top_k, rng, top_p)]++;
    return n;
  };
  CHECK(draws(0, 0.45f) == std::map<int, int>{{2, 4000}});  // 0.5 alone reaches 0.45
  const std::map<int, int> two = draws(0, 0.7f);             // 0.5 + 0.3: ids 2 and 0, 5 : 3
  CHECK(two.size() == 2);
  CHECK(std::abs(two.at(2) / 4000.0 - 0.625) < 0.03);
  CHECK(draws(0, 0.81f).size() == 3);
  CHECK(draws(0, 1.0f).size() == 4);
  // After top-k 2 the shares are renormalised: 0.5 / 0.8 = 0.625 reaches 0.6 alone.
  CHECK(draws(2, 0.6f) == std::map<int, int>{{2, 4000}});
  CHECK(draws(2, 0.7f).size() == 2);
  // Greedy ignores it; generate refuses a p outside (0, 1].
  CHECK(sample_token(logits, 0.0f, 0, rng, 0.1f) == 2);
  Context c;
  ContextGuard g(c);
  Transformer m(small("llama"));
  const std::vector<float> h = host_params(m, 12);
  KvDecoder dec(m.cfg, m.params.specs(), h.data(), 8);
  SampleSettings bad{3, 1.0f, 0, 1, 0.0f};
  CHECK_THROWS_WITH(generate(dec, {1}, bad), Catch::Contains("top-p in (0, 1]"));
}

TEST_CASE("prompts: bytes, ids:, tokenizer encoding, range checks", "[sample]") {
  CHECK(parse_prompt("ab", 256, nullptr) == std::vector<int>{97, 98});
  CHECK(parse_prompt("ids:1,2,30", 31, nullptr) == std::vector<int>{1, 2, 30});
  CHECK_THROWS_WITH(parse_prompt("ids:1,,2", 31, nullptr), Catch::Contains("not a token id"));
  CHECK_THROWS_WITH(parse_prompt("ids: 3", 31, nullptr), Catch::Contains("' 3' is not a token id"));  // strtol's blanks
  CHECK_THROWS_WITH(parse_prompt("ids:+3", 31, nullptr), Catch::Contains("'+3' is not a token id"));
  CHECK_THROWS_WITH(parse_prompt("ids:31", 31, nullptr), Catch::Contains("outside the model's vocab of 31"));
  // The id as typed, not clamped (it once said -1 for -3 and 1073741824 for a number past a long).
  CHECK_THROWS_WITH(parse_prompt("ids:-3", 31, nullptr), Catch::Contains("token -3 is outside"));
  CHECK_THROWS_WITH(parse_prompt("ids:99999999999999999999", 31, nullptr),
                    Catch::Contains("token 99999999999999999999 is outside"));
  CHECK_THROWS_WITH(parse_prompt("a", 64, nullptr), Catch::Contains("ids:1,2,3"));
  TempFile f;
  // 256 bytes, then the merges a+b (256) and ab+c (257), then the EOT (258); more in test_bpe.cpp.
  Tokenizer tok(f.write(tok_file(20240328, 2, 259, 258, byte_tokens({"ab", "abc", "<|eot|>"}))));
  CHECK(tok.vocab() == 259);
  CHECK(tok.eot() == 258);
  CHECK(tok.decode(257) == "abc");
  CHECK(tok.encode("abcabba") == std::vector<int>{257, 256, 'b', 'a'});  // GPT-2's BPE: merges by rank
  CHECK(parse_prompt("aab c", 259, &tok) == std::vector<int>{'a', 256, ' ', 'c'});
  CHECK_THROWS_WITH(parse_prompt("ab\xff", 259, &tok), Catch::Contains("--prompt: invalid UTF-8 at byte 2"));
  CHECK_THROWS_WITH(parse_prompt("abc", 257, &tok), Catch::Contains("token 257 is outside the model's vocab of 257"));
  CHECK_THROWS_WITH(tok.decode(259), Catch::Contains("outside the tokenizer's vocab"));
  CHECK(Tokenizer(f.write(tok_file(20240328, 1, 2, 0, {"x", "y"}))).eot() == -1);
}

TEST_CASE("the llm.c tokenizer reader refuses bad files, naming the file and the problem", "[sample]") {
  TempFile f;
  const std::vector<std::string> two = {"x", "yz"};
  const std::pair<std::string, std::string> bad[] = {
      {tok_file(20240327, 2, 2, 0, two), "bad magic"},
      {tok_file(20240328, 3, 2, 0, two), "unsupported version 3"},
      {tok_file(20240328, 2, 2, 0, two).substr(0, 1000), "truncated"},
      {tok_file(20240328, 2, 0, 0, two), "vocab_size 0"},
      {tok_file(20240328, 2, 3, 0, two), "vocab_size 3"},
      {tok_file(20240328, 2, 2, 2, two), "eot_token 2"},
      {tok_file(20240328, 2, 2, 0, {"x", "yz"}).substr(0, 1024 + 4), "runs past the end"},
      {tok_file(20240328, 2, 2, 0, {"x", ""}) + "abc", "length 0"},
      {tok_file(20240328, 2, 2, 0, {"x", "yz", "w"}), "trailing bytes"},
  };
  for (const auto& [bytes, words] : bad) {
    CAPTURE(words);
    CHECK_THROWS_WITH(Tokenizer(f.write(bytes)), Catch::Contains(f.path) && Catch::Contains(words));
  }
  CHECK_THROWS_WITH(Tokenizer(f.path + ".missing"), Catch::Contains(".missing"));
}

TEST_CASE("train --sample prints the prompt and its continuation, bad tokenizers fail first", "[sample][cli]") {
  using namespace ul_test;
  TempFile text, tok;
  text.path += ".txt";
  text.write(std::string(3000, 'x') + "hello world " + std::string(1000, 'y'));
  const std::vector<std::string> bytes = byte_tokens();
  tok.write(tok_file(20240328, 1, 256, 0, bytes));
  const std::string common = "--data text:" + text.path + " --seq 32 --batch 2 --threads 1 --eval-batches 1 --steps 1";
  CmdResult r = run_cmd(train_cmd(common + " --sample 6 --prompt 'hello' --top-k 3 --tokenizer " + tok.path));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sample  | 5 prompt + 6 new tokens") != std::string::npos);
  CHECK(r.out.find("\nhello") != std::string::npos);
  // A model with more rows than the tokenizer has tokens (Qwen 2.5's 151936 for 151665): sampled
  // among the tokenizer's (an id past it could not be decoded; it was refused before).
  r = run_cmd(train_cmd(common + " --vocab 300 --sample 40 --prompt 'hello' --tokenizer " + tok.path));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sample  | 5 prompt + 40 new tokens") != std::string::npos);
  // ... but an ids: prompt past the tokenizer is refused before training (decoding it for the
  // output failed after), and a tokenizer far smaller than the model is another model's.
  r = run_cmd(train_cmd(common + " --vocab 300 --sample 4 --prompt ids:280 --tokenizer " + tok.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("--prompt: token 280 is outside the tokenizer's vocab of 256") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  // A tokenizer larger than the model: its ids past the model's could never be drawn (a byte
  // model sampled through a BPE printed another text's tokens).
  r = run_cmd(train_cmd(common + " --vocab 200 --sample 4 --prompt hi --tokenizer " + tok.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("the tokenizer has 256 tokens, more than the model's vocab 200: not this model's tokenizer") !=
        std::string::npos);
  r = run_cmd(train_cmd(common + " --vocab 2000 --sample 4 --prompt hi --tokenizer " + tok.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("the tokenizer has 256 tokens, the model's vocab 2000: not this model's tokenizer") != std::string::npos);
  r = run_cmd(train_cmd(common + " --sample 4 --prompt hi --tokenizer " + tok.path + ".missing"));
  CHECK(r.out.find("--tokenizer: " + tok.path + ".missing") != std::string::npos);
  tok.write(tok_file(20240328, 1, 300, 0, bytes));
  r = run_cmd(train_cmd(common + " --sample 6 --prompt 'hello' --tokenizer " + tok.path));
  CHECK(r.code != 0);
  CHECK(r.out.find(tok.path + ": llm.c tokenizer: vocab_size 300") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  r = run_cmd(train_cmd(common + " --model gpt2 --max-seq 32 --sample 40 --prompt 'hello'"));
  CHECK(r.out.find("new tokens run the model at 44 positions, past the model's max sequence 32") != std::string::npos);
  // The last new token is drawn, never fed back: 5 + 40 tokens take 44 positions.
  r = run_cmd(train_cmd(common + " --model gpt2 --max-seq 43 --sample 40 --prompt 'hello'"));
  CHECK(r.code != 0);
  CHECK(r.out.find("new tokens run the model at 44 positions, past the model's max sequence 43") != std::string::npos);
  r = run_cmd(train_cmd(common + " --model gpt2 --max-seq 44 --sample 40 --prompt 'hello'"));
  CHECK(r.code == 0);
  CHECK(r.out.find("sample  | 5 prompt + 40 new tokens") != std::string::npos);
  // A llama's RoPE runs past max_seq: sampled, with a note (none within it).
  r = run_cmd(train_cmd(common + " --model llama --max-seq 40 --sample 40 --prompt 'hello'"));
  CHECK(r.code == 0);
  CHECK(r.out.find("note    | --sample: the prompt and 40 new tokens run the model at 44 positions, past the model's "
                   "max_seq 40") !=
        std::string::npos);
  CHECK(r.out.find("sample  | 5 prompt + 40 new tokens") != std::string::npos);
  r = run_cmd(train_cmd(common + " --model llama --max-seq 44 --sample 40 --prompt 'hello'"));
  CHECK(r.code == 0);
  CHECK(r.out.find("past the model's max_seq") == std::string::npos);
  // A byte-level model prints bytes, NUL included (a "%s" printf once cut the line there, dropping
  // the rest of the continuation).
  r = run_cmd(train_cmd(common + " --sample 3 --prompt ids:104,0,105 --temperature 0"));
  REQUIRE(r.code == 0);
  const size_t at = r.out.find(std::string("\nh") + '\0' + "i");
  REQUIRE(at != std::string::npos);
  CHECK(r.out.size() >= at + 4 + 3 + 1);  // "\nh\0i", 3 new bytes, the closing newline
  CHECK(r.out.back() == '\n');
}

TEST_CASE("train --prompt-file feeds a file's text, continues it without echoing it, refuses bad files", "[sample][cli]") {
  using namespace ul_test;
  TempFile text, prompt;
  text.path += ".txt";
  prompt.path += ".prompt";
  text.write(std::string(3000, 'x') + "hello world " + std::string(1000, 'y'));
  const std::string common = "--data text:" + text.path + " --seq 32 --batch 2 --threads 1 --eval-batches 1 --steps 1 --model llama";
  // A prompt of 700 bytes: three prefill chunks. Greedy from the file equals greedy from the same
  // bytes given as ids.
  std::string body, ids = "ids:";
  for (int i = 0; i < 700; i++) {
    body += char('a' + i % 26);
    ids += (i ? "," : "") + std::to_string('a' + i % 26);
  }
  prompt.write(body);
  CmdResult r = run_cmd(train_cmd(common + " --sample 5 --temperature 0 --prompt-file " + prompt.path));
  REQUIRE(r.code == 0);
  const size_t line = r.out.find("sample  | 700 prompt + 5 new tokens");
  REQUIRE(line != std::string::npos);
  CHECK(r.out.find("prefill ") != std::string::npos);
  CHECK(r.out.find("abcdefgh") == std::string::npos);  // not echoed
  const std::string from_file = r.out.substr(r.out.find('\n', line) + 1);
  r = run_cmd(train_cmd(common + " --sample 5 --temperature 0 --prompt " + ids));
  REQUIRE(r.code == 0);
  CHECK(r.out.size() >= from_file.size());
  CHECK(r.out.compare(r.out.size() - from_file.size(), from_file.size(), from_file) == 0);
  // Down a pipe (read once, whole), the same prompt and the same text.
  r = run_cmd("cat " + prompt.path + " | " + train_cmd(common + " --sample 5 --temperature 0 --prompt-file /dev/stdin"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sample  | 700 prompt + 5 new tokens") != std::string::npos);
  CHECK(r.out.compare(r.out.size() - from_file.size(), from_file.size(), from_file) == 0);
  // "-" is standard input too (as prepare's --files-from -).
  r = run_cmd("cat " + prompt.path + " | " + train_cmd(common + " --sample 5 --temperature 0 --prompt-file -"));
  REQUIRE(r.code == 0);
  CHECK(r.out.compare(r.out.size() - from_file.size(), from_file.size(), from_file) == 0);
  r = run_cmd(train_cmd(common + " --sample 5 --prompt-file - < /dev/null"));  // a device, not a pipe or a file
  CHECK(r.code == 1);
  CHECK(r.out.find("--prompt-file -: standard input cannot be read as a prompt (") != std::string::npos);
  CHECK(r.out.find("pipe the prompt in or redirect a file") != std::string::npos);
  // Two ranks, one pipe: rank 0 reads it and sends its bytes (each rank once read it: the second
  // found it empty, or blocked forever on a named pipe).
  r = run_cmd("cat " + prompt.path + " | " + train_cmd(common + " --ranks 2 --sample 5 --temperature 0 --prompt-file /dev/stdin"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sample  | 700 prompt + 5 new tokens") != std::string::npos);
  // Refusals name the flag and the file, before any step; under two ranks too (rank 0's message).
  for (const std::string ranks : {"", " --ranks 2"}) {
    r = run_cmd(train_cmd(common + ranks + " --sample 5 --prompt-file " + prompt.path + ".missing"));
    CHECK(r.code != 0);
    CHECK(r.out.find("--prompt-file: " + prompt.path + ".missing") != std::string::npos);
    CHECK(r.out.find("step ") == std::string::npos);
  }
  r = run_cmd(train_cmd(common + " --sample 5 --prompt ''"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--prompt: empty") != std::string::npos);
  prompt.write("");
  r = run_cmd(train_cmd(common + " --sample 5 --prompt-file " + prompt.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("--prompt-file " + prompt.path + ": the file is empty") != std::string::npos);
  r = run_cmd(train_cmd(common + " --sample 5 --prompt x --prompt-file " + prompt.path));
  CHECK(r.out.find("--prompt and --prompt-file both give the prompt") != std::string::npos);
  r = run_cmd(train_cmd(common + " --prompt-file " + prompt.path));
  CHECK(r.out.find("--prompt-file needs --sample N") != std::string::npos);
  // A cache larger than the machine is refused before training, as is a count past int positions.
  prompt.write("hello");
  r = run_cmd(train_cmd(common + " --sample 2000000000 --prompt-file " + prompt.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("new tokens need ") != std::string::npos);
  // On the CPU the sampler reads the weights in place: the cache alone, beside the run's memory.
  CHECK(r.out.find("MiB for the KV cache and the tokens' ids and text, but beside what the run holds this machine has ") !=
        std::string::npos);
  CHECK(r.out.find("shorten --prompt-file " + prompt.path) != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  r = run_cmd(train_cmd(common + " --sample 2147483647 --prompt ids:1,2"));
  CHECK(r.out.find("exceed 2^31 - 1 positions") != std::string::npos);
  prompt.write("h\xc3\xa9llo");  // bytes 195 and 169 are outside a 50-token vocabulary
  r = run_cmd(train_cmd(common + " --vocab 50 --data passkey --sample 5 --prompt-file " + prompt.path));
  CHECK(r.code != 0);
  CHECK(r.out.find("--prompt-file " + prompt.path + ": token 104 is outside the model's vocab of 50") != std::string::npos);
}

TEST_CASE("train --sample-every prints a sample every K steps and at the end, under sp too", "[sample][cli]") {
  using namespace ul_test;
  TempFile text;
  text.path += ".txt";
  text.write(std::string(3000, 'x') + "hello world " + std::string(1000, 'y'));
  const std::string common = "--data text:" + text.path + " --seq 32 --batch 2 --threads 1 --eval-batches 1 --eval-every 0 "
                             "--steps 5 --model llama --sample 4 --prompt hi --temperature 0";
  for (const std::string layout : {"", " --ranks 2 --sp 2"}) {
    CAPTURE(layout);
    CmdResult r = run_cmd(train_cmd(common + layout + " --sample-every 2"));
    REQUIRE(r.code == 0);
    const size_t s2 = r.out.find("sample  | step 2 | 2 prompt + 4 new tokens"), s4 = r.out.find("sample  | step 4 |");
    const size_t end = r.out.find("sample  | 2 prompt + 4 new tokens");
    CHECK(s2 != std::string::npos);
    CHECK(s4 != std::string::npos);
    CHECK(end != std::string::npos);
    CHECK(r.out.find("sample  | step 5") == std::string::npos);  // the last step's is the final one
    CHECK((s2 < r.out.find("step     3/5") && r.out.find("step     3/5") < s4 && s4 < end));
  }
  {  // --quiet: each periodic sample still says its step (bare lines of text once, one per sample)
    CmdResult r = run_cmd(train_cmd(common + " --sample-every 2 --quiet"));
    REQUIRE(r.code == 0);
    const size_t s2 = r.out.find("sample  | step 2\n"), s4 = r.out.find("sample  | step 4\n");
    CHECK(s2 != std::string::npos);
    CHECK(s4 != std::string::npos);
    CHECK(s2 < s4);
    CHECK(r.out.find("prompt + 4 new tokens") == std::string::npos);
  }
  CmdResult r = run_cmd(train_cmd("--steps 2 --sample-every 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--sample-every needs --sample N") != std::string::npos);
  r = run_cmd(train_cmd("--steps 2 --sample 0 --prompt ids:1"));  // given, but 0: says so
  CHECK(r.code != 0);
  CHECK(r.out.find("--prompt needs --sample N with N > 0 (--sample 0 samples nothing)") != std::string::npos);
  r = run_cmd(train_cmd("--steps 2 --sample 2 --prompt ids:1 --sample-every -1"));
  CHECK(r.out.find("--sample-every must be >= 0") != std::string::npos);
  r = run_cmd(train_cmd("--steps 0 --sample 2 --prompt ids:1 --sample-every 1"));
  CHECK(r.code != 0);
  CHECK(r.out.find("--sample-every: --steps 0 trains nothing") != std::string::npos);
}

TEST_CASE("a long sample says how far its prefill and its decoding got (--heartbeat)", "[sample][cli]") {
  using namespace ul_test;
  TempFile text;
  text.path += ".txt";
  text.write(std::string(3000, 'x') + "hello world " + std::string(1000, 'y'));
  // A 600-byte prompt: prefilled in chunks of 256, then 40 tokens drawn one at a time; a heartbeat
  // so short that every callback prints.
  CmdResult r = run_cmd(train_cmd("--data text:" + text.path + " --seq 32 --batch 2 --threads 1 --eval-batches 1 "
                                  "--steps 1 --model llama --sample 40 --prompt " + std::string(600, 'x') +
                                  " --heartbeat 0.000001"));
  REQUIRE(r.code == 0);
  CHECK(r.out.find("  ...   prefill | 256/600 prompt tokens done | ") != std::string::npos);
  CHECK(r.out.find("  ...   decode | 1/40 new tokens done | ") != std::string::npos);
  CHECK(r.out.find("  ...   decode | 39/40 new tokens done | ") != std::string::npos);
  CHECK(r.out.find("  ...   decode | 40/40") == std::string::npos);  // (the last needs no forward: said by the sample)
}

TEST_CASE("a run refused after its export directory was made takes it back, one that exports keeps it", "[sample][cli]") {
  using namespace ul_test;
  TempDir d;
  std::ofstream(d / "text.txt") << std::string(3000, 'x') + "hello world " + std::string(1000, 'y');
  const std::string common = "--data text:" + (d / "text.txt") + " --seq 32 --batch 2 --threads 1 --eval-batches 1 "
                             "--steps 1 --export-safetensors " + (d / "nd/sub/model.safetensors");
  // Refused in the outputs' own checks (a prompt past the vocabulary), and later at start-up (a
  // probe length the val split cannot hold).
  for (const std::string& bad : {std::string(" --sample 4 --prompt ids:999"), std::string(" --probe-lengths 20000")}) {
    CmdResult r = run_cmd(train_cmd(common + bad));
    INFO(bad << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK_FALSE(std::filesystem::exists(d / "nd"));
  }
  CmdResult r = run_cmd(train_cmd(common));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(d / "nd/sub/model.safetensors"));
  CHECK(std::filesystem::exists(d / "nd/sub/config.json"));
}

TEST_CASE("a sample's memory is checked beside what the run holds", "[sample]") {
  const ul::Options o = ul_test::options("--model llama --sample 20 --prompt ids:1,2,3");
  const ul::ModelConfig cfg = ul::model_config(o, 256);
  CHECK_NOTHROW(ul::RunOutputs(o, cfg, -1, nullptr, size_t(1) << 30, false));
  CHECK_THROWS_WITH(ul::RunOutputs(o, cfg, -1, nullptr, 1 << 10, false),
                    Catch::Contains("--sample: the prompt (3 tokens) plus 20 new tokens need ") &&
                        Catch::Contains(" MiB for the KV cache and the tokens' ids and text, but beside what the run holds "
                                        "this machine has 0 MiB"));
  CHECK_THROWS_WITH(ul::RunOutputs(o, cfg, -1, nullptr, 1 << 10, true),
                    Catch::Contains("MiB for the KV cache, a host copy of the weights and the tokens' ids and text, but "
                                    "beside what the run holds"));
  // A windowed model's cache is a ring of fixed size, but every drawn id is kept, with its text.
  const ul::Options w = ul_test::options("--model llama --sliding-window 8 --sample 2000000000 --prompt ids:1,2,3");
  const ul::ModelConfig wcfg = ul::model_config(w, 256);
  CHECK_THROWS_WITH(ul::RunOutputs(w, wcfg, -1, nullptr, size_t(16) << 30, false),
                    Catch::Contains("plus 2000000000 new tokens need ") &&
                        Catch::Contains(" MiB for the KV cache and the tokens' ids and text, but beside what the run holds "
                                        "this machine has 16384 MiB"));
}

TEST_CASE("a sample printed to a terminal shows control bytes escaped, to a pipe as they are", "[sample][cli]") {
  CHECK(ul::terminal_safe(std::string("a\x1b[2Jb\n\tc\x7f", 10) + std::string(1, '\0') + "\xc3\xa9") ==
        "a\\x1B[2Jb\n\tc\\x7F\\x00\xc3\xa9");  // ESC, DEL and NUL shown; newline, tab and UTF-8 kept
  // C1's CSI as UTF-8 (C2 9B) and a stray byte (9B, FF) shown; a 3- and a 4-byte character kept.
  CHECK(ul::terminal_safe("x\xc2\x9b" "31m\x9by\xff\xe4\xb8\x80\xf0\x9f\x93\x96") ==
        "x\\xC2\\x9B" "31m\\x9By\\xFF\xe4\xb8\x80\xf0\x9f\x93\x96");
  // The same sample down a pipe and on a terminal (script(1) gives it one, where installed).
  const std::string run = ul_test::train_cmd("--steps 0 --data text:" + ul_test::source_path("README.md") +
                                             " --sample 200 --prompt 'The ' --seq 64 --quiet --seed 3");
  const ul_test::CmdResult piped = ul_test::run_cmd(run);
  REQUIRE(piped.code == 0);
  const std::string text = piped.out.substr(piped.out.rfind("The "));
  if (ul_test::run_cmd("command -v script").code == 0) {
    const ul_test::CmdResult tty = ul_test::run_cmd("script -qec \"" + run + "\" /dev/null");
    REQUIRE(tty.code == 0);
    std::string shown = tty.out.substr(tty.out.rfind("The "));
    shown.erase(std::remove(shown.begin(), shown.end(), '\r'), shown.end());  // the terminal's CR LF
    std::string want = ul::terminal_safe(text);
    want.erase(std::remove(want.begin(), want.end(), '\r'), want.end());
    CHECK(shown == want);
  }
}

TEST_CASE("train's --temperature, --top-k and --top-p reach the sampler, not only its header line", "[sample][cli]") {
  // The weights from a file, so that --seed moves only the draws. Greedy ignores the seed, and
  // --top-k 1 and a tiny --top-p are greedy too; at temperature 1 two seeds draw differently, and
  // another temperature at the same seed too. (The header prints the options: a sampler given
  // none of them passed every test that read it.)
  using namespace ul_test;
  const std::string base = "--checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") +
                           " --steps 0 --threads 1 --sample 12 --prompt ids:1,2,3 ";
  auto drawn = [&](const std::string& flags) {
    const CmdResult r = run_cmd(train_cmd(base + flags));
    INFO(flags << "\n" << r.out);
    REQUIRE(r.code == 0);
    const size_t at = r.out.rfind("ids: 1 2 3 | ids: ");
    REQUIRE(at != std::string::npos);
    return r.out.substr(at);
  };
  const std::string greedy = drawn("--temperature 0 --seed 1");
  CHECK(drawn("--temperature 0 --seed 2") == greedy);
  CHECK(drawn("--top-k 1 --seed 2") == greedy);
  CHECK(drawn("--top-p 0.01 --seed 2") == greedy);
  const std::string one = drawn("--temperature 1 --seed 1");
  CHECK(one != greedy);
  CHECK(drawn("--temperature 1 --seed 2") != one);
  CHECK(drawn("--temperature 2 --seed 1") != one);
  CHECK(drawn("--temperature 1 --top-k 3 --seed 1") != one);
}
