#include "engine/options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <utility>

#include "data/dataset.h"
#include "engine/file_io.h"
#include "engine/hf_format.h"
#include "engine/hf_index.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

const char* usage() {
  return R"(usage: train [flags]          (no flags: the tiny model on the passkey-retrieval task)
       train prepare --out DIR FILES...   text files -> token shards, bytes or BPE (train prepare --help)

model
  --model NAME        gpt2 | llama (tiny sizes) | tiny | gpt2-124M | gpt2-350M | llama-tiny | llama-1B |
                      llama-3.2-1B | llama-3.1-8B | qwen2.5-0.5B | qwen2.5-7B             [tiny]
  --layers N --dim N --heads N --kv-heads N --vocab N --max-seq N --ffn N --rope-theta X
                      override the preset (vocab: the tiny models take the data's, the
                      named presets their own)
  --tie-embeddings    llama: the output head is the token embedding (as Llama 3.2, SmolLM)
  --qkv-bias          llama: a bias on the q/k/v projection (as Qwen 2)
  --norm-eps X        llama: RMSNorm's eps (Qwen 2: 1e-6)                                 [1e-5]
  --sliding-window N  llama: attend only to the last N tokens (Mistral's sliding window; 0: all)
                      beside --checkpoint: set, change or (0) remove its own              [0]
  --full-attention-every N [--full-attention-first K]   with --sliding-window: layers K,
                      K + N, K + 2N, ... attend to every earlier token (hybrid local/global:
                      Gemma 3 6, GPT-OSS 2; K defaults to N - 1)                       [0: none]
  --checkpoint FILE   start from an llm.c GPT-2 checkpoint (version 3 or 5), a Hugging Face
                      FILE.safetensors (gpt2, llama, mistral, ministral or qwen2; config from
                      its metadata or config.json) or a sharded one's
                      DIR/model.safetensors.index.json,
                      or a model.bin of our checkpoints; the model's shape comes from the file
  --rope-theta X --rope-scaling SPEC   llama's RoPE (beside --checkpoint: override its own, to
                      extend its context): SPEC none | linear:factor=F |
                      llama3:factor=F,low=1,high=4,orig=8192 (Llama 3.1's rule) |
                      yarn:factor=F,orig=N[,beta_fast=32,beta_slow=1,attn=X,truncate=1]
                      (YaRN; attn defaults to 0.1 ln(F) + 1)                      [10000, none]
data and loop
  --data SPEC         passkey | recall | text:FILE | shards:GLOB                          [passkey]
  --doc-mask          packed documents: attention stays within each document, positions
                      restart at each; a document starts at each end-of-text token
  --eot N             that token's id    [shards: their headers' (train prepare's), else the
                      format's: 50256 (GPT-2) / 128000 (llama-3)]
  --batch N           sequences per rank per micro-batch                                  [8]
  --seq N             sequence length T                                                   [256]
  --steps N           optimizer steps (0: evaluate the model as loaded, once; with --export-*
                      or --sample only when --eval-batches is given)                      [1500]
  --grad-accum N      micro-batches per optimizer step                                    [1]
  --lr X              peak learning rate                                                  [3e-3]
  --warmup N          linear warmup steps, then the --schedule                            [20]
  --schedule NAME     cosine: decay to lr * final-lr-frac at the last step; wsd (warmup-
                      stable-decay): lr held, then the last --decay-frac of the steps linear
                      to it (a resume may lengthen --steps before the decay); constant: held
                                                                                     [cosine]
  --decay-frac X      wsd: the fraction of --steps that decays                            [0.2]
  --final-lr-frac X   the decay's end, a fraction of --lr (cosine, wsd)                   [0.1]
  --weight-decay X    AdamW decoupled decay on the weight matrices and embeddings (not on
                      norms and biases)                                                   [0.1]
  --grad-clip X       clip the gradient global norm (0: off)                              [1.0]
  --beta1 X --beta2 X AdamW's first and second moment decays                       [0.9, 0.95]
  --adam-eps X        AdamW's floor under sqrt(v): the update is m^ / (sqrt(v^) + eps), m^ and
                      v^ bias-corrected                                                   [1e-8]
  --seed N                                                                                [1337]
  --threads N         OpenMP threads per rank (0: the cores / the ranks on this machine)  [0]
  --device cpu|cuda   where the model runs (cuda: a build with -DULYSSES_CUDA=ON, or the
                      emulated device of -DULYSSES_CUDA_EMULATION=ON)                     [cpu]
  --precision fp32|bf16  parameter and activation dtype; bf16 keeps f32 gradients and f32
                      master weights (cuda only)                  [bf16 on cuda, fp32 on cpu]
  --eval-every N      validation every N steps (and at the end; 0: only at the end)       [250]
  --eval-batches N    validation micro-batches per eval                                   [8]
  --val-data SPEC     evaluate on another dataset's validation split (as --data; text: its last
                      10%, shards: its val-named files), e.g. a long book   [--data's own split]
  --loss-by-position  each eval also gives the val loss by position (in the document, with
                      --doc-mask), in power-of-two bands: does the model use its long context?
  --probe-lengths L,L after the run, one row per length by KV-cache decoding on the host: passkey /
                      recall accuracy (passkey: by needle depth too), text val loss by position:
                      how far the model reaches past --seq (README: "Long context")
  --profile-step N    cuda: time step N's kernels, GEMMs and copies with CUDA events and
                      print one row per op, the longest first (README: "CUDA backend")
parallelism
  --sp P              Ulysses sequence-parallel degree (dp = world / P)                   [1]
  --comm local|mpi|nccl  local: threads of this process; mpi: processes under mpirun;
                      nccl: GPUs (id bootstrapped over MPI, or --nccl-id-file)          [local]
  --nccl-id-file F    NCCL bootstrap without MPI: rank/size from RANK/WORLD_SIZE or SLURM_*
  --ranks N           world size for --comm local                                         [1]
  --comm-timeout S    a rank waiting longer than S seconds in one collective (or in
                      MPI's start-up or NCCL's init) fails the run (a hung or lost
                      peer; rank 0 alone writing a large checkpoint or sampling keeps
                      the others waiting)                                               [600]
long-context memory (README: "Long context")
  --recompute         keep only each block's input; replay the block in backward
  --offload           with --recompute on cuda: keep those block inputs in pinned host memory
  --mlp-chunks N      run the MLP over N slices of the tokens (forward and backward)     [1]
  --zero 0|1          1: shard AdamW state over the world (reduce-scatter, all-gather)  [0]
  --plan              print per-rank memory and communication for these flags; no run
  --memory SIZE       with --plan: the longest --seq that fits SIZE per rank (e.g. 24G)
checkpoints, logs and output
  --save-dir DIR      save resumable checkpoints in DIR/step_NNNNNNNN (and at the last step)
  --save-every N      also save every N steps                                             [0: end only]
  --stop-after N      save after step N and stop (the schedule is still --steps'): one stage or
                      job of a longer run, which --resume continues           [0 or --steps: at --steps]
  --keep K            keep only the K newest checkpoints                                  [0: all]
  --resume            continue from the newest complete checkpoint in --save-dir (on other
                      --ranks/--sp/--batch/--grad-accum too, if batch x grad-accum x dp stays)
  --auto-resume       --resume when --save-dir holds a complete checkpoint, else start fresh
                      (one command for a job script's first start and its requeues)
  --resume-step N     resume from DIR/step_N instead (roll back: newer checkpoints are moved
                      aside as step_M.rolled-back.TIME, the log's records past N are dropped)
  --skip-batches K    with --resume-step, skip the next K steps' sequences (a spike's data)
  --change-global-batch
                      on this resume, let batch x grad-accum x dp change: the data goes on
                      from the checkpoint's next sequence, that many a step
  --change-seq        on this resume, let --seq change (a context grown in stages): AdamW's
                      state and the schedule go on, the data from where its epoch stood
  --change-rope       on this resume, let --rope-theta and --rope-scaling change (llama)
  --log FILE          JSON-lines run log, and FILE without .jsonl + .svg: the loss plot
                                                         [DIR/log.jsonl with --save-dir, else none]
  --quiet             only the final summary
  --heartbeat S       inside a step or eval that runs longer, a progress line every S seconds
                      naming the block reached (long context on a CPU); in a save, load or
                      export the bytes so far; and one while rank 0 waits in a collective, or
                      in MPI's start-up, for the other ranks
                      (0: none)                                                            [30]
export and sampling (after the last step, or with --steps 0 from --checkpoint)
  --export-llmc FILE  write an llm.c GPT-2 checkpoint (gpt2 only)
  --export-llmc-version 3|5   3 = fp32, 5 = bf16 (round to nearest even)               [3]
  --export-safetensors DIR/model.safetensors
                      write Hugging Face names and layouts + DIR/config.json
  --export-dtype f32|bf16     dtype of --export-safetensors                           [f32]
  --sample N          generate N tokens with a KV cache and print them
  --sample-every K    also every K steps while training (the same prompt and seed each time:
                      the texts differ by what the model learned)                [0: at the end]
  --prompt TEXT       its bytes (or BPE tokens, with --tokenizer), or ids:1,2,3
  --prompt-file FILE  the prompt is FILE's text (a long one: a book; it is not echoed back; -: stdin)
  --temperature X     0 = greedy                                                        [1.0]
  --top-k K           sample among the K most likely tokens (0: all)                    [0]
  --top-p P           then among the fewest most likely whose probability adds up to P
                      (nucleus sampling; 1: off)                                          [1]
  --tokenizer FILE    llm.c tokenizer (gpt2_tokenizer.bin) or HF tokenizer.json (GPT-2,
                      digits-apart, Llama 3, Qwen 2 or SentencePiece-style) to encode the prompt
                      and decode
verification
  --check-state FILE  run one forward/backward on an llm.c debug state (needs --checkpoint),
                      print per-tensor differences and PASS/FAIL
  --check-tol X       relative tolerance of --check-state                                 [1e-5]
  --help
)";
}

bool Options::set_by_user(const std::string& flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

bool Options::reads_host_weights() const {
  return !export_llmc.empty() || !export_safetensors.empty() || sample > 0 || sample_every > 0 || !probe_lengths.empty();
}

std::string Options::shared_command_line() const {
  std::string line;
  for (const auto& [flag, value] : args)
    if (flag != "--threads" && flag != "--quiet") line += (line.empty() ? "" : " ") + flag + (value.empty() ? "" : " " + value);
  return line;
}

bool Options::evaluates() const {
  return steps > 0 || set_by_user("--eval-batches") ||
         (export_llmc.empty() && export_safetensors.empty() && sample == 0);
}

long parse_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  // (strtol skips leading blanks; a value is the characters given, so ' 5' is refused as '5 ' is)
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0])) || *end)
    throw std::runtime_error(flag + ": expected an integer, got '" + v + "'");
  if (errno == ERANGE) throw std::runtime_error(flag + ": " + v + " is out of range");
  return x;
}

double parse_float(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  // strtod also reads leading blanks and C's hex floats ('0x10' is 16): neither is a decimal number.
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0])) || v.find_first_of("xX") != std::string::npos || *end)
    throw std::runtime_error(flag + ": expected a number, got '" + v + "'");
  // Below a double's range strtod gives 0 (or a subnormal) and ERANGE: 1e-400 is not 0, which
  // turns some flags off (--grad-clip 0, --heartbeat 0) or greedy (--temperature 0).
  if (errno == ERANGE && std::fabs(x) < 1)
    throw std::runtime_error(flag + ": " + v + " is too small to be told from 0 (a number's magnitude is 0 or "
                             "above about 2.2e-308)");
  return x;
}

// A float flag's value: a finite number that rounds to 0 or infinity in float would then be
// refused by a range check it meets (--lr 1e-50 "must be > 0"): say what happened instead.
float to_float(const std::string& flag, const std::string& text, double x) {
  const float f = float(x);
  // (a subnormal float, below about 1.2e-38, keeps only a few digits of the value given)
  if (std::isfinite(x) && ((x != 0 && std::fabs(f) < std::numeric_limits<float>::min()) || std::isinf(f)))
    throw std::runtime_error(flag + ": " + text + " is outside the range of a float (magnitudes from about 1.2e-38 "
                             "to 3.4e38)");
  return f;
}

double parse_bytes(const std::string& flag, const std::string& v) {
  std::string num = v;
  double unit = 1;
  const std::string units = "KMGT";
  if (!num.empty() && units.find(char(std::toupper(num.back()))) != std::string::npos) {
    unit = std::pow(1024.0, double(units.find(char(std::toupper(num.back()))) + 1));
    num.pop_back();
  }
  const std::string form = ": expected a positive size like 24G (bytes, or K, M, G, T: powers of 1024), got '" + v + "'";
  double x = 0;
  try {
    x = parse_float(flag, num) * unit;
  } catch (const std::runtime_error&) {  // "24GB", "24 G": say the form, not only that it is no number
    throw std::runtime_error(flag + form);
  }
  if (!(x > 0) || !std::isfinite(x)) throw std::runtime_error(flag + form);
  return x;
}

namespace {

// An int flag: the value must fit (a cast would wrap 4294967297 to 1).
int parse_int32(const std::string& flag, const std::string& v) {
  const long x = parse_int(flag, v);
  if (x < INT_MIN || x > INT_MAX) throw std::runtime_error(flag + ": " + v + " is out of range");
  return int(x);
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  using Setter = std::function<void(const std::string&, const std::string&)>;
  auto I = [](int& x) -> Setter { return [&x](const std::string& f, const std::string& v) { x = parse_int32(f, v); }; };
  auto F = [](float& x) -> Setter { return [&x](const std::string& f, const std::string& v) { x = to_float(f, v, parse_float(f, v)); }; };
  auto S = [](std::string& x) -> Setter { return [&x](const std::string&, const std::string& v) { x = v; }; };
  std::map<std::string, Setter> with_value = {
      {"--model", S(o.model)}, {"--layers", I(o.layers)}, {"--dim", I(o.dim)}, {"--heads", I(o.heads)},
      {"--kv-heads", I(o.kv_heads)}, {"--vocab", I(o.vocab)}, {"--max-seq", I(o.max_seq)}, {"--ffn", I(o.ffn)},
      {"--rope-theta", F(o.rope_theta)}, {"--rope-scaling", S(o.rope_scaling)}, {"--norm-eps", F(o.norm_eps)},
      {"--sliding-window", I(o.sliding_window)}, {"--full-attention-every", I(o.full_every)},
      {"--full-attention-first", I(o.full_first)}, {"--data", S(o.data)}, {"--val-data", S(o.val_data)},
      {"--eot", I(o.eot)}, {"--batch", I(o.batch)}, {"--seq", I(o.seq)},
      {"--steps", I(o.steps)}, {"--grad-accum", I(o.grad_accum)}, {"--lr", F(o.lr)},
      {"--final-lr-frac", F(o.final_lr_frac)}, {"--warmup", I(o.warmup)}, {"--schedule", S(o.schedule)},
      {"--decay-frac", [&o](const std::string& f, const std::string& v) { o.decay_frac = parse_float(f, v); }},
      {"--weight-decay", F(o.weight_decay)}, {"--grad-clip", F(o.grad_clip)},
      {"--beta1", F(o.beta1)}, {"--beta2", F(o.beta2)}, {"--adam-eps", F(o.adam_eps)},
      {"--seed", [&o](const std::string& f, const std::string& v) {
         const long long s = parse_int(f, v);
         if (s < 0) throw std::runtime_error(f + " must be >= 0, got " + v);
         o.seed = uint64_t(s);
       }},
      {"--threads", I(o.threads)}, {"--device", S(o.device)}, {"--precision", S(o.precision)}, {"--eval-every", I(o.eval_every)}, {"--eval-batches", I(o.eval_batches)},
      {"--profile-step", I(o.profile_step)},
      {"--sp", I(o.sp)}, {"--comm", S(o.comm)}, {"--nccl-id-file", S(o.nccl_id_file)}, {"--ranks", I(o.ranks)}, {"--checkpoint", S(o.checkpoint)},
      {"--check-state", S(o.check_state)}, {"--save-dir", S(o.save_dir)}, {"--save-every", I(o.save_every)},
      {"--stop-after", I(o.stop_after)},
      {"--keep", I(o.keep)}, {"--resume-step", I(o.resume_step)}, {"--skip-batches", I(o.skip_batches)}, {"--log", S(o.log)}, {"--mlp-chunks", I(o.mlp_chunks)}, {"--zero", I(o.zero)},
      {"--memory", [&o](const std::string& f, const std::string& v) { o.memory = parse_bytes(f, v); }},
      {"--check-tol", [&o](const std::string& f, const std::string& v) { o.check_tol = parse_float(f, v); }},
      {"--heartbeat", [&o](const std::string& f, const std::string& v) { o.heartbeat = parse_float(f, v); }},
      {"--comm-timeout", [&o](const std::string& f, const std::string& v) { o.comm_timeout = parse_float(f, v); }},
      {"--export-llmc", S(o.export_llmc)}, {"--export-llmc-version", I(o.export_llmc_version)},
      {"--export-safetensors", S(o.export_safetensors)}, {"--export-dtype", S(o.export_dtype)},
      {"--probe-lengths", [&o](const std::string& f, const std::string& v) {
         o.probe_lengths.clear();
         for (size_t at = 0; at <= v.size();) {
           const size_t comma = std::min(v.find(',', at), v.size());
           const int T = parse_int32(f, v.substr(at, comma - at));
           if (T < 1) throw std::runtime_error(f + ": lengths must be >= 1, got " + std::to_string(T));
           if (std::find(o.probe_lengths.begin(), o.probe_lengths.end(), T) != o.probe_lengths.end())
             throw std::runtime_error(f + ": length " + std::to_string(T) + " is given twice");
           o.probe_lengths.push_back(T);
           at = comma + 1;
         }
       }},
      {"--sample", I(o.sample)}, {"--sample-every", I(o.sample_every)}, {"--prompt", S(o.prompt)}, {"--prompt-file", S(o.prompt_file)}, {"--temperature", F(o.temperature)},
      {"--top-k", I(o.top_k)}, {"--top-p", F(o.top_p)}, {"--tokenizer", S(o.tokenizer)},
  };
  // --help lists the flags whatever else the line holds (a value it would refuse, a flag it does
  // not know), as `train prepare --help` does; -h too, but not where a flag's value goes
  // (`--save-dir -h` printed the help and exited 0, running nothing a batch script asked for: it
  // is refused below as a value forgotten).
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--help" || (a == "-h" && !(i > 1 && with_value.count(argv[i - 1])))) {
      Options help;
      help.help = true;
      return help;
    }
  }
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i], v;
    size_t eq = a.find('=');
    bool inline_value = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    // A switch takes no value: --doc-mask=false would otherwise turn it on. A new switch: one row.
    static const std::pair<const char*, bool Options::*> kSwitches[] = {
        {"--help", &Options::help},
        {"--quiet", &Options::quiet},
        {"--resume", &Options::resume},
        {"--auto-resume", &Options::auto_resume},
        {"--recompute", &Options::recompute},
        {"--offload", &Options::offload},
        {"--plan", &Options::plan},
        {"--doc-mask", &Options::doc_mask},
        {"--loss-by-position", &Options::loss_by_position},
        {"--tie-embeddings", &Options::tie_embeddings},
        {"--qkv-bias", &Options::qkv_bias},
        {"--change-global-batch", &Options::change_global_batch},
        {"--change-seq", &Options::change_seq},
        {"--change-rope", &Options::change_rope}};
    if (a == "-h") a = "--help";
    const auto sw =
        std::find_if(std::begin(kSwitches), std::end(kSwitches), [&](const auto& k) { return a == k.first; });
    if (sw != std::end(kSwitches)) {
      if (inline_value)
        throw std::runtime_error(a + " is a switch and takes no value (got '" + v + "'): give it or leave it out");
      o.*(sw->second) = true;
      if (a != "--help") o.given.push_back(a), o.args.push_back({a, ""});
      continue;
    }
    auto it = with_value.find(a);
    if (it == with_value.end() && a == "prepare")  // `train --threads 1 prepare ...`
      throw std::runtime_error("'prepare' is a command, not a flag: it comes first (train prepare --out DIR FILES...)");
    if (it == with_value.end()) throw std::runtime_error("unknown flag '" + a + "' (train --help lists the flags)");
    if (!inline_value) {
      if (i + 1 >= argc) throw std::runtime_error(a + ": missing value");
      v = argv[++i];
      // `--save-dir --resume`: a flag where the value should be is a value forgotten (taken as the
      // value, it would start a fresh run in ./--resume), and so is any other --word (the typo
      // --resum), but in --prompt's free text; so is -h (--help's short form). A value that truly
      // starts so: --flag=VALUE.
      const std::string next = v.substr(0, v.find('='));
      const bool is_flag = next == "-h" || with_value.count(next) ||
                           std::any_of(std::begin(kSwitches), std::end(kSwitches),
                                       [&](const auto& k) { return next == k.first; }) ||
                           (a != "--prompt" && next.size() > 2 && next.compare(0, 2, "--") == 0 &&
                            std::isalpha(static_cast<unsigned char>(next[2])));
      if (is_flag)
        throw std::runtime_error(a + ": missing value (the next argument, " + v +
                                 ", is a flag; a value spelled like a flag goes as " + a + "=" + v + ")");
    }
    it->second(a, v);
    o.given.push_back(a);
    o.args.push_back({a, v});
  }
  auto positive = [](const char* flag, long v) {
    if (v < 1) throw std::runtime_error(std::string(flag) + " must be >= 1, got " + std::to_string(v));
  };
  positive("--batch", o.batch);
  positive("--seq", o.seq);
  positive("--grad-accum", o.grad_accum);
  // A checkpoint's rank file reads these back up to 2^30 (as the planner searches): a run it could
  // not resume is refused here, not at its first --resume. Sequence arithmetic (T + 1 targets, a
  // window's end) stays clear of int's end with it too.
  for (auto [flag, v] :
       {std::pair<const char*, int>{"--seq", o.seq}, {"--batch", o.batch}, {"--grad-accum", o.grad_accum}})
    if (v > (1 << 30))
      throw std::runtime_error(std::string(flag) + " " + std::to_string(v) + ": at most 2^30 (1073741824)");
  // A step's micro-batches are all loaded before its first forward (the loss is normalised over
  // the step): their tokens must stay countable, and their host copies are in the memory check.
  if (int64_t(o.grad_accum) * o.batch * o.seq > INT32_MAX)
    throw std::runtime_error("--grad-accum x --batch x --seq = " +
                             std::to_string(int64_t(o.grad_accum) * o.batch * o.seq) +
                             " tokens per rank per step, more than 2^31 - 1");
  positive("--sp", o.sp);
  positive("--ranks", o.ranks);
  if (o.ranks > 1024)  // one thread per rank, each with its own context and buffers
    throw std::runtime_error("--ranks " + std::to_string(o.ranks) + ": --comm local runs one thread per rank, at most 1024");
  positive("--eval-batches", o.eval_batches);
  if (o.steps < 0) throw std::runtime_error("--steps must be >= 0");
  if (o.warmup < 0) throw std::runtime_error("--warmup must be >= 0");
  if (o.eval_every < 0) throw std::runtime_error("--eval-every must be >= 0");
  if (o.threads < 0) throw std::runtime_error("--threads must be >= 0");
  if (o.threads > 1024)  // OpenMP could not create them (100000 crashed the process)
    throw std::runtime_error("--threads " + std::to_string(o.threads) + ": at most 1024 OpenMP threads per rank");
  // --comm local's ranks are threads of this process, each with its own OpenMP team.
  if (o.comm == "local" && int64_t(o.ranks) * std::max(1, o.threads) > 1024)
    throw std::runtime_error("--ranks " + std::to_string(o.ranks) + " x --threads " + std::to_string(o.threads) +
                             ": more than 1024 threads in one process (--comm local runs every rank here)");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw std::runtime_error("--lr must be a finite number > 0");
  if (!(o.final_lr_frac >= 0 && o.final_lr_frac <= 1))
    throw std::runtime_error("--final-lr-frac must be in [0, 1] (the decay's floor, as a fraction of --lr)");
  if (o.schedule != "cosine" && o.schedule != "wsd" && o.schedule != "constant")
    throw std::runtime_error("--schedule must be cosine, wsd or constant, got '" + o.schedule + "'");
  if (!(o.decay_frac > 0 && o.decay_frac <= 1))
    throw std::runtime_error("--decay-frac must be in (0, 1] (the fraction of --steps that decays)");
  // Flags the schedule would ignore without a word.
  if (o.set_by_user("--decay-frac") && o.schedule != "wsd")
    throw std::runtime_error("--decay-frac is for --schedule wsd (this run's schedule is " + o.schedule + ")");
  if (o.set_by_user("--final-lr-frac") && o.schedule == "constant")
    throw std::runtime_error("--final-lr-frac: --schedule constant does not decay");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    throw std::runtime_error("--weight-decay must be a finite number >= 0");
  if (!(o.grad_clip >= 0) || !std::isfinite(o.grad_clip))
    throw std::runtime_error("--grad-clip must be a finite number >= 0 (0: off)");
  for (const auto& [flag, b] : {std::pair<const char*, float>{"--beta1", o.beta1}, {"--beta2", o.beta2}})
    if (!(b >= 0 && b < 1)) {  // 1 would never move the moments off zero (and bias correction divides by 1 - b^t)
      // A value typed below 1 that the float rounds up to it: said (the message once read 1.000000).
      std::string typed;
      for (const auto& [f, v] : o.args)
        if (f == flag) typed = v;
      const bool rounded = b == 1.0f && !typed.empty() && std::strtod(typed.c_str(), nullptr) < 1.0;
      throw std::runtime_error(std::string(flag) + " must be in [0, 1), got " + (rounded ? typed : float_text(b)) +
                               (rounded ? ", which is 1 as a float (a value within 3e-8 of 1 is)" : ""));
    }
  if (!(o.adam_eps > 0) || !std::isfinite(o.adam_eps))
    throw std::runtime_error("--adam-eps must be a finite number > 0");
  // The model overrides default to 0, "the preset's"; written out, 0 would be ignored without a word.
  for (const auto& [flag, v] : {std::pair<const char*, long>{"--layers", o.layers}, {"--dim", o.dim},
                                {"--heads", o.heads}, {"--kv-heads", o.kv_heads}, {"--vocab", o.vocab},
                                {"--max-seq", o.max_seq}, {"--ffn", o.ffn}})
    if (o.set_by_user(flag)) positive(flag, v);
  // The planner walks every layer before the run starts: 2^31 of them would take minutes to refuse.
  if (o.layers > kMaxLayers)
    throw std::runtime_error("--layers " + std::to_string(o.layers) + ": at most " + std::to_string(kMaxLayers));
  // At most 1e7 s (116 days): a deadline is a clock reading in nanoseconds, and 1e10 s past now
  // overflows it into the past (every collective then timed out at once).
  if (!(o.comm_timeout > 0) || !(o.comm_timeout <= 1e7))
    throw std::runtime_error("--comm-timeout must be a number of seconds in (0, 1e7]");
  if (!(o.heartbeat >= 0) || !std::isfinite(o.heartbeat))
    throw std::runtime_error("--heartbeat must be a finite number of seconds >= 0");
  if (!(o.rope_theta > 0) || !std::isfinite(o.rope_theta))
    throw std::runtime_error("--rope-theta must be a finite number > 0");
  parse_rope_scaling(o.rope_scaling);  // a malformed spec fails here, naming the flag
  if (o.device != "cpu" && o.device != "cuda")
    throw std::runtime_error("--device: expected cpu or cuda, got '" + o.device + "'");
  // The CUDA attention kernels' grids hold a micro-batch's sequences in z: at most 65535 on every GPU.
  if (o.device == "cuda" && o.batch > 65535)
    throw std::runtime_error("--batch " + std::to_string(o.batch) + ": the CUDA attention kernels take at most 65535 "
                             "sequences a micro-batch (--grad-accum for more a step)");
#if !ULYSSES_HAVE_CUDA
  if (o.device == "cuda" && !o.plan)  // a plan allocates nothing: any build can plan a GPU run
    throw std::runtime_error("--device cuda: this build has no CUDA backend (configure with -DULYSSES_CUDA=ON, or "
                             "-DULYSSES_CUDA_EMULATION=ON for the emulated device)");
#endif
  if (o.set_by_user("--precision") && o.precision.empty())
    throw std::runtime_error("--precision: expected fp32 or bf16, got ''");
  // (--check-state holds the step to llm.c's fp32 reference at 1e-5: fp32 unless told, where a
  // bf16 step, --device cuda's default for training, fails every tensor by its rounding)
  if (o.precision.empty()) o.precision = o.device == "cuda" && o.check_state.empty() ? "bf16" : "fp32";
  if (o.precision != "fp32" && o.precision != "bf16")
    throw std::runtime_error("--precision: expected fp32 or bf16, got '" + o.precision + "'");
  if (o.precision == "bf16" && o.device == "cpu")
    throw std::runtime_error("--precision bf16: the CPU backend runs fp32 only (use --device cuda, or --precision fp32)");
  if (o.comm != "local" && o.comm != "mpi" && o.comm != "nccl")
    throw std::runtime_error("--comm: expected local, mpi or nccl, got '" + o.comm + "'");
  // Flags that only one mode reads: elsewhere they would be ignored without a word.
  if (o.set_by_user("--ranks") && o.comm != "local" && !o.plan)
    throw std::runtime_error("--ranks sets the world of --comm local; under --comm " + o.comm +
                             " the world is the launcher's (mpirun -np N, or WORLD_SIZE)");
  if (o.set_by_user("--nccl-id-file") && o.comm != "nccl") throw std::runtime_error("--nccl-id-file needs --comm nccl");
  // NCCL moves device buffers: CPU ranks under it would train on the CPU while the GPUs stand idle.
  if (o.comm == "nccl" && o.device != "cuda")
    throw std::runtime_error("--comm nccl is for GPU ranks: give --device cuda (CPU ranks: --comm mpi or local)");
  if (o.set_by_user("--check-tol") && o.check_state.empty()) throw std::runtime_error("--check-tol needs --check-state");
  // --check-state runs one forward/backward against the state file and exits: the training and
  // output flags would be ignored without a word.
  if (!o.check_state.empty()) {
    const char* trains = "--check-state runs one step against its file and trains nothing";
    const char* reads = "--check-state takes its tokens (batch and length) from its file and evaluates nothing else";
    const char* shaped = "--check-state runs the llm.c GPT-2 checkpoint as its file shapes it";
    const std::pair<const char*, const char*> unread[] = {
        {"--steps", trains}, {"--save-dir", trains}, {"--resume", trains}, {"--auto-resume", trains},
        {"--resume-step", trains},
        {"--skip-batches", trains}, {"--change-global-batch", trains}, {"--change-seq", trains}, {"--change-rope", trains}, {"--stop-after", trains},
        {"--export-llmc", trains},
        {"--export-safetensors", trains}, {"--sample", trains}, {"--probe-lengths", trains}, {"--log", trains},
        {"--lr", trains}, {"--warmup", trains}, {"--schedule", trains}, {"--decay-frac", trains},
        {"--final-lr-frac", trains}, {"--weight-decay", trains}, {"--grad-clip", trains}, {"--beta1", trains},
        {"--beta2", trains}, {"--adam-eps", trains}, {"--zero", trains}, {"--seed", trains}, {"--sample-every", trains},
        {"--save-every", trains}, {"--keep", trains}, {"--heartbeat", trains}, {"--quiet", trains},
        {"--profile-step", trains},
        {"--plan", "--plan plans a training run, which --check-state is not"}, {"--memory", trains},
        {"--grad-accum", trains}, {"--seq", reads}, {"--batch", reads}, {"--data", reads},
        {"--val-data", reads}, {"--eval-batches", reads}, {"--eval-every", reads}, {"--loss-by-position", reads},
        {"--max-seq", shaped}, {"--rope-theta", shaped}, {"--rope-scaling", shaped}, {"--sliding-window", shaped},
        {"--full-attention-every", shaped}, {"--full-attention-first", shaped}};
    for (const auto& [f, why] : unread)
      if (o.set_by_user(f)) throw std::runtime_error(std::string(f) + ": " + why + "; drop " + f);
  }
  if (o.set_by_user("--val-data") && o.val_data.empty())
    throw std::runtime_error("--val-data: empty (give a dataset spec, or leave the flag out for --data's own split)");
  if (!(o.check_tol > 0) || !std::isfinite(o.check_tol))  // nan or inf would pass every difference
    throw std::runtime_error("--check-tol must be a finite number > 0");
  positive("--mlp-chunks", o.mlp_chunks);
  if (o.set_by_user("--profile-step")) {
    positive("--profile-step", o.profile_step);
    if (o.device != "cuda")
      throw std::runtime_error("--profile-step times GPU ops with CUDA events: it needs --device cuda");
    if (o.profile_step > o.steps)
      throw std::runtime_error("--profile-step " + std::to_string(o.profile_step) + " is past the last step (--steps " +
                               std::to_string(o.steps) + ")");
  }
  if (o.offload && o.device != "cuda")
    throw std::runtime_error("--offload moves block inputs from GPU memory to pinned host memory: it needs --device "
                             "cuda (on the CPU backend activations are in host memory already)");
  if (o.offload && !o.recompute)
    throw std::runtime_error("--offload needs --recompute: what it moves to the host are the block inputs that "
                             "--recompute keeps");
  if (o.zero != 0 && o.zero != 1) throw std::runtime_error("--zero: expected 0 or 1, got " + std::to_string(o.zero));
  if (o.set_by_user("--memory") && !o.plan) throw std::runtime_error("--memory needs --plan");
  if (o.save_every < 0) throw std::runtime_error("--save-every must be >= 0");
  if (o.keep < 0) throw std::runtime_error("--keep must be >= 0");
  if (o.set_by_user("--stop-after")) {
    if (o.stop_after < 0) throw std::runtime_error("--stop-after must be >= 0, got " + std::to_string(o.stop_after));
    if (o.stop_after > o.steps)
      throw std::runtime_error("--stop-after " + std::to_string(o.stop_after) + " is past the last step (--steps " +
                               std::to_string(o.steps) + ")");
    if (o.stop_after == o.steps) o.stop_after = 0;  // the run's own end (a job script's last stage)
  }
  for (const char* f : {"--save-every", "--keep", "--resume", "--auto-resume", "--resume-step"})
    if (o.set_by_user(f) && o.save_dir.empty()) throw std::runtime_error(std::string(f) + " needs --save-dir");
  // --auto-resume is settled at the run's start, from rank 0's reading of --save-dir (train.cpp,
  // settle_auto_resume): here it is a run that may resume.
  if (o.auto_resume && (o.resume || o.set_by_user("--resume-step")))
    throw std::runtime_error(std::string("--auto-resume with ") +
                             (o.set_by_user("--resume-step") ? "--resume-step" : "--resume") +
                             ": give one (--auto-resume resumes from the newest checkpoint when there is one)");
  if (o.stop_after > 0 && o.save_dir.empty())
    throw std::runtime_error("--stop-after needs --save-dir (the run goes on from its checkpoint)");
  if (o.set_by_user("--resume-step")) {
    // Step 0 is never saved (a save follows a step), and every checkpoint's step is an int.
    positive("--resume-step", o.resume_step);
    o.resume = true;  // --resume from another checkpoint than the newest
  }
  if (o.change_global_batch && !o.resume && !o.auto_resume)
    throw std::runtime_error("--change-global-batch lets a resume change batch x grad-accum x dp: it needs --resume or "
                             "--resume-step");
  if (o.change_seq && !o.set_by_user("--seq"))  // the default 256 would be a change nobody asked for
    throw std::runtime_error("--change-seq needs --seq: the length this resume goes on at");
  if (o.change_seq && !o.resume && !o.auto_resume)
    throw std::runtime_error("--change-seq lets a resume change --seq: it needs --resume (to start another run from a "
                             "checkpoint's weights at another length: --checkpoint DIR/step_NNNNNNNN/model.bin)");
  // The flag says the RoPE may change; these say to what (a preset's default would be a change
  // nobody asked for).
  if (o.change_rope && !o.set_by_user("--rope-theta") && !o.set_by_user("--rope-scaling"))
    throw std::runtime_error("--change-rope needs --rope-theta or --rope-scaling: the RoPE this resume goes on with");
  if (o.change_rope && !o.resume && !o.auto_resume)
    throw std::runtime_error("--change-rope lets a resume change --rope-theta and --rope-scaling: it needs --resume or "
                             "--resume-step (to start another run from a checkpoint's weights with another RoPE: "
                             "--checkpoint DIR/step_NNNNNNNN/model.bin with --rope-theta or --rope-scaling)");
  // A rollback keeps its checkpoint's length: DIR/rollback.json counts the data's place in
  // sequences of that length, for every later start that applies or repeats it.
  if (o.change_seq && o.set_by_user("--resume-step"))
    throw std::runtime_error("--change-seq with --resume-step: roll back at the checkpoint's --seq, then change it at a "
                             "later --resume");
  if (o.set_by_user("--skip-batches")) {
    // Only with a rollback: its record (DIR/rollback.json) refuses the same command run again
    // after the run went on, where --resume --skip-batches in a requeued script would skip again.
    if (!o.set_by_user("--resume-step"))
      throw std::runtime_error("--skip-batches moves a resumed run's data ahead: it needs --resume-step N (the "
                               "checkpoint to go on from; the newest one is fine)");
    // 0 is a rollback without a skip (a job script with K as a parameter).
    if (o.skip_batches < 0) throw std::runtime_error("--skip-batches must be >= 0, got " + std::to_string(o.skip_batches));
  }
  if ((o.resume || o.auto_resume) && o.steps == 0)  // it would evaluate the checkpoint but log it as step 0
    throw std::runtime_error(std::string(o.set_by_user("--resume-step") ? "--resume-step"
                                         : o.auto_resume                ? "--auto-resume"
                                                                        : "--resume") +
                             " with --steps 0 trains nothing; to evaluate, sample or export a checkpoint: "
                             "--steps 0 --checkpoint DIR/step_NNNNNNNN/model.bin");
  if (o.set_by_user("--save-dir") && o.save_dir.empty()) throw std::runtime_error("--save-dir: empty path");
  if (o.set_by_user("--log") && o.log.empty()) throw std::runtime_error("--log: empty path");
  if (o.set_by_user("--eot") && !o.doc_mask) throw std::runtime_error("--eot needs --doc-mask");
  if (o.set_by_user("--eot") && o.eot < 0) throw std::runtime_error("--eot must be >= 0, got " + std::to_string(o.eot));
  if (o.doc_mask && synthetic_spec(o.data))
    throw std::runtime_error("--doc-mask: the synthetic task " + o.data +
                             " has no documents (use text:FILE or shards:GLOB)");
  // Its sequences would be split wherever the task's own tokens equal the end-of-text id.
  if (o.doc_mask && synthetic_spec(o.val_data))
    throw std::runtime_error("--val-data " + o.val_data + ": a synthetic task has no documents, and --doc-mask would "
                             "split its sequences wherever a token of the task is the end-of-text id (evaluate it "
                             "in a run without --doc-mask)");
  if (o.doc_mask && o.data.rfind("text:", 0) == 0 && !o.set_by_user("--eot"))
    throw std::runtime_error("--doc-mask with text data needs --eot BYTE (plain text has no end-of-text token)");
  if (o.doc_mask && !o.check_state.empty())
    throw std::runtime_error("--doc-mask cannot be used with --check-state (llm.c's reference state has no document mask)");
  if (o.export_llmc_version != 3 && o.export_llmc_version != 5)
    throw std::runtime_error("--export-llmc-version: expected 3 (fp32) or 5 (bf16), got " + std::to_string(o.export_llmc_version));
  if (o.export_dtype != "f32" && o.export_dtype != "bf16")
    throw std::runtime_error("--export-dtype: expected f32 or bf16, got '" + o.export_dtype + "'");
  const std::pair<const char*, const std::string*> paths[] = {
      {"--export-llmc", &o.export_llmc}, {"--export-safetensors", &o.export_safetensors}, {"--tokenizer", &o.tokenizer},
      {"--checkpoint", &o.checkpoint}, {"--check-state", &o.check_state},
      {"--nccl-id-file", &o.nccl_id_file}};
  for (const auto& [flag, path] : paths)
    if (o.set_by_user(flag) && path->empty()) throw std::runtime_error(std::string(flag) + ": empty path");
  const std::string ext = ".safetensors";  // --checkpoint tells the formats apart by this name
  const std::string& st = o.export_safetensors;
  if (!st.empty() && (st.size() <= ext.size() || st.compare(st.size() - ext.size(), ext.size(), ext) != 0))
    throw std::runtime_error("--export-safetensors: the file name must end in .safetensors (e.g. DIR/model.safetensors)");
  // ... so an llm.c file under a Hugging Face name could not be read back (--checkpoint took it for safetensors).
  if (is_safetensors_path(o.export_llmc) || is_safetensors_index_path(o.export_llmc))
    throw std::runtime_error("--export-llmc " + o.export_llmc + ": an llm.c checkpoint under a Hugging Face name would "
                             "be read back as one (--checkpoint tells the formats apart by the name): name it .bin, or "
                             "give --export-safetensors for a safetensors file");
  if (o.set_by_user("--export-llmc-version") && o.export_llmc.empty()) throw std::runtime_error("--export-llmc-version needs --export-llmc");
  if (o.set_by_user("--export-dtype") && o.export_safetensors.empty()) throw std::runtime_error("--export-dtype needs --export-safetensors");
  if (o.sample < 0) throw std::runtime_error("--sample must be >= 0");
  if (o.sample_every < 0) throw std::runtime_error("--sample-every must be >= 0");
  if (o.top_k < 0) throw std::runtime_error("--top-k must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw std::runtime_error("--top-p must be in (0, 1]");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) throw std::runtime_error("--temperature must be a finite number >= 0");
  if (o.set_by_user("--prompt-file") && o.prompt_file.empty()) throw std::runtime_error("--prompt-file: empty path");
  if (o.set_by_user("--prompt") && o.prompt.empty())
    throw std::runtime_error("--prompt: empty (give text or ids:1,2,3; without --prompt a --tokenizer's end-of-text token opens the sample)");
  if (o.sample_every > 0 && o.steps == 0)
    throw std::runtime_error("--sample-every: --steps 0 trains nothing; --sample N alone samples the model once");
  if (o.sample_every > o.steps)  // it would never fire; the run's end samples without it
    throw std::runtime_error("--sample-every " + std::to_string(o.sample_every) + " is past the last step (--steps " +
                             std::to_string(o.steps) + "); the run's end samples anyway (--sample N alone)");
  if (o.set_by_user("--prompt") && o.set_by_user("--prompt-file"))
    throw std::runtime_error("--prompt and --prompt-file both give the prompt: keep one");
  for (const char* f : {"--prompt", "--prompt-file", "--sample-every", "--temperature", "--top-k", "--top-p", "--tokenizer"})
    if (o.set_by_user(f) && o.sample <= 0)
      throw std::runtime_error(std::string(f) + " needs --sample N" +
                               (o.set_by_user("--sample") ? " with N > 0 (--sample 0 samples nothing)" : ""));
  // The checkpoint decides the model's shape; a shape flag beside it would be silently ignored.
  // (--rope-theta and --rope-scaling are not shape: they override a llama checkpoint's RoPE, which
  // is how a model's context is extended; --sliding-window and --full-attention-* likewise change
  // no weight, nor does a llama's --max-seq: apply_checkpoint_flags.)
  for (const char* f : {"--model", "--layers", "--dim", "--heads", "--kv-heads", "--vocab", "--ffn",
                        "--tie-embeddings", "--qkv-bias", "--norm-eps"})
    if (o.set_by_user(f) && !o.checkpoint.empty())
      throw std::runtime_error(std::string(f) + ": the model's shape comes from --checkpoint " + o.checkpoint +
                               "; drop " + f);
  if (!o.check_state.empty() && o.checkpoint.empty())
    throw std::runtime_error("--check-state needs --checkpoint (the llm.c model the state was made with)");
  return o;
}

Device run_device(const Options& o) {
  if (o.device != "cuda") return Device::cpu;
#if ULYSSES_HAVE_CUDA
  init_cuda_backend();
  return Device::cuda;
#else
  throw std::runtime_error("--device cuda: this build has no CUDA backend");
#endif
}

DType param_dtype(const Options& o) { return o.precision == "bf16" ? DType::bf16 : DType::f32; }

void apply_rope_flags(const Options& o, ModelConfig& c) {
  const bool theta = o.set_by_user("--rope-theta"), scaling = o.set_by_user("--rope-scaling");
  if (!c.is_llama() && (theta || scaling))
    throw std::runtime_error(std::string(theta ? "--rope-theta" : "--rope-scaling") +
                             ": gpt2 has learned positions, not RoPE (--model llama)");
  if (theta) c.rope_theta = o.rope_theta;
  if (scaling) c.rope_scaling = parse_rope_scaling(o.rope_scaling);
}

void apply_window_flag(const Options& o, ModelConfig& c) {
  // On gpt2 (and for a pattern without a window) ModelConfig::validate refuses them, naming the flag.
  if (o.set_by_user("--sliding-window")) {  // even 0, written out, counts: it turns a window off
    c.sliding_window = o.sliding_window;
    if (!c.sliding_window) c.full_every = c.full_first = 0;  // no window: no layer to exempt from it
  }
  if (o.set_by_user("--full-attention-every")) {
    c.full_every = o.full_every;
    c.full_first = std::max(0, o.full_every - 1);  // the last layer of each group (Gemma's, GPT-OSS's)
  }
  if (o.set_by_user("--full-attention-first")) {
    if (!c.full_every)
      throw std::runtime_error("--full-attention-first needs --full-attention-every (or a checkpoint with such a pattern)");
    c.full_first = o.full_first;
  }
  // Flags that would exempt no layer (a window on all of them) say so; a checkpoint's own pattern
  // is taken as it is (runs saved before this check may hold one).
  if ((o.set_by_user("--full-attention-every") || o.set_by_user("--full-attention-first")) && c.full_every &&
      c.full_first < c.full_every && c.full_first >= c.layers)  // (first >= every: validate names that)
    throw std::runtime_error("--full-attention-every " + std::to_string(c.full_every) + " (from layer " +
                             std::to_string(c.full_first) + "): the model has only " + std::to_string(c.layers) +
                             " layers, so no layer would attend to every earlier token");
  // And the other way: flags that exempt every layer leave the window on none (a run saved so
  // before this check resumes as it was).
  if (o.set_by_user("--full-attention-every") && c.full_every == 1 && c.sliding_window > 0 && !o.resume)
    throw std::runtime_error("--full-attention-every 1: every layer attends to every earlier token, so --sliding-window " +
                             std::to_string(c.sliding_window) + " would apply to none (leave both out for full "
                             "attention)");
}

void apply_checkpoint_flags(const Options& o, ModelConfig& c) {
  apply_rope_flags(o, c);
  apply_window_flag(o, c);
  if (o.set_by_user("--max-seq")) {
    if (!c.is_llama())
      throw std::runtime_error("--max-seq: a gpt2's positions are its shape, which comes from --checkpoint " +
                               o.checkpoint + "; drop --max-seq");
    c.max_seq = o.max_seq;
  }
}

void apply_trained_length(const Options& o, ModelConfig& c) {
  if (c.is_llama() && o.steps > 0 && o.seq > c.max_seq) c.max_seq = o.seq;
}

void check_seq_fits(const Options& o, const ModelConfig& c) {
  if (!c.is_llama() && o.seq > c.max_seq && (o.evaluates() || o.set_by_user("--seq")))
    throw std::runtime_error("--seq " + std::to_string(o.seq) + " exceeds the model's max sequence " +
                             std::to_string(c.max_seq) + " (learned positions)");
}

bool preset_has_vocab(const std::string& m) {
  for (const char* p : {"gpt2-124M", "gpt2-350M", "llama-1B", "llama-3.2-1B", "llama-3.1-8B", "qwen2.5-0.5B", "qwen2.5-7B"})
    if (m == p) return true;
  return false;
}

ModelConfig model_config(const Options& o, int data_vocab) {
  ModelConfig c;
  const std::string& m = o.model;
  if (m == "tiny" || m == "gpt2") {
    c.arch = "gpt2"; c.layers = 2; c.dim = 64; c.heads = 4; c.kv_heads = 4; c.max_seq = 1024;
  } else if (m == "llama" || m == "llama-tiny") {
    c.arch = "llama"; c.layers = 2; c.dim = 64; c.heads = 4; c.kv_heads = 2; c.max_seq = 1 << 20;
  } else if (m == "gpt2-124M") {
    c.arch = "gpt2"; c.layers = 12; c.dim = 768; c.heads = 12; c.kv_heads = 12; c.max_seq = 1024; c.vocab = 50257;
  } else if (m == "gpt2-350M") {
    c.arch = "gpt2"; c.layers = 24; c.dim = 1024; c.heads = 16; c.kv_heads = 16; c.max_seq = 1024; c.vocab = 50257;
  } else if (m == "llama-1B") {  // TinyLlama-1.1B's shape
    c.arch = "llama"; c.layers = 22; c.dim = 2048; c.heads = 32; c.kv_heads = 4; c.ffn = 5632;
    c.max_seq = 1 << 20; c.vocab = 32000;
  } else if (m == "llama-3.2-1B") {  // Llama 3.2 1B's shape: RoPE scaled for 128K, tied embeddings
    c.arch = "llama"; c.layers = 16; c.dim = 2048; c.heads = 32; c.kv_heads = 8; c.ffn = 8192;
    c.max_seq = 1 << 20; c.vocab = 128256; c.rope_theta = 500000.0f; c.tie_embeddings = true;
    c.rope_scaling = parse_rope_scaling("llama3:factor=32,low=1,high=4,orig=8192");
  } else if (m == "llama-3.1-8B") {  // Llama 3.1 8B's shape: RoPE scaled for 128K, untied
    c.arch = "llama"; c.layers = 32; c.dim = 4096; c.heads = 32; c.kv_heads = 8; c.ffn = 14336;
    c.max_seq = 1 << 20; c.vocab = 128256; c.rope_theta = 500000.0f;
    c.rope_scaling = parse_rope_scaling("llama3:factor=8,low=1,high=4,orig=8192");
  } else if (m == "qwen2.5-0.5B" || m == "qwen2.5-7B") {  // Qwen 2.5's: q/k/v bias, RMSNorm eps 1e-6
    const bool small = m == "qwen2.5-0.5B";  // tied embeddings; 7B's are not
    c.arch = "llama"; c.layers = small ? 24 : 28; c.dim = small ? 896 : 3584; c.heads = small ? 14 : 28;
    c.kv_heads = small ? 2 : 4; c.ffn = small ? 4864 : 18944; c.vocab = small ? 151936 : 152064;
    c.max_seq = 1 << 20; c.rope_theta = 1000000.0f; c.tie_embeddings = small;
    c.qkv_bias = true; c.norm_eps = 1e-6f;
  } else {
    throw std::runtime_error("--model: unknown model '" + m +
                             "' (gpt2, llama, tiny, gpt2-124M, gpt2-350M, llama-tiny, llama-1B, llama-3.2-1B, "
                             "llama-3.1-8B, qwen2.5-0.5B, qwen2.5-7B)");
  }
  if (!preset_has_vocab(m)) c.vocab = data_vocab;
  if (o.layers > 0) c.layers = o.layers;
  if (o.dim > 0) c.dim = o.dim;
  if (o.heads > 0) c.heads = o.heads;
  if (o.kv_heads > 0) c.kv_heads = o.kv_heads;
  else if (c.arch == "gpt2") c.kv_heads = c.heads;
  else if (o.heads > 0 && c.heads % c.kv_heads)  // the preset's grouping, which the user did not name
    throw std::runtime_error("--heads " + std::to_string(c.heads) + ": the preset's " + std::to_string(c.kv_heads) +
                             " kv heads do not divide it; give --kv-heads too (a divisor of --heads)");
  if (o.vocab > 0) c.vocab = o.vocab;
  if (o.max_seq > 0) c.max_seq = o.max_seq;
  if (o.ffn > 0) c.ffn = o.ffn;
  c.tie_embeddings = c.tie_embeddings || o.tie_embeddings;
  c.qkv_bias = c.qkv_bias || o.qkv_bias;
  if (o.set_by_user("--norm-eps")) c.norm_eps = o.norm_eps;
  apply_rope_flags(o, c);  // the preset's RoPE unless the flags say otherwise
  apply_window_flag(o, c);
  // llama's knobs: on gpt2 (an MLP of 4 x dim, learned positions) they would change nothing.
  if (c.arch == "gpt2" && o.set_by_user("--ffn"))
    throw std::runtime_error("--ffn: gpt2's MLP is 4 x --dim; the width is a llama setting (--model llama)");
  if (c.arch == "gpt2" && o.max_seq <= 0 && c.max_seq < o.seq) c.max_seq = o.seq;
  // llm.c pads the vocabulary to a multiple of 128 for GEMM-friendly shapes; the pad rows are never scored.
  if (c.vocab > kMaxVocab)
    throw std::runtime_error((o.vocab > 0 ? "--vocab " : "the data's vocabulary ") + std::to_string(c.vocab) +
                             ": at most " + std::to_string(kMaxVocab));
  c.padded_vocab = round_up(c.vocab, 128);
  if (c.vocab < data_vocab)  // named by where the number came from: the flag, or the preset
    throw std::runtime_error((o.vocab > 0 ? "--vocab " + std::to_string(c.vocab)
                                          : "--model " + m + "'s vocabulary " + std::to_string(c.vocab)) +
                             " is smaller than --data's vocabulary (" + std::to_string(data_vocab) +
                             "); give a larger --vocab or another --model");
  c.validate();
  return c;
}

}  // namespace ul
