// Everything `train` can be told, its defaults, and the checks that refuse a bad combination
// before any work starts.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layers/transformer.h"

namespace ul {

struct Options {
  // model: --model is an architecture (gpt2, llama: tiny sizes) or a preset (tiny, gpt2-124M, ...)
  std::string model = "tiny";
  int layers = -1, dim = -1, heads = -1, kv_heads = -1, vocab = -1, max_seq = -1, ffn = -1;
  float rope_theta = 10000.0f;
  std::string rope_scaling = "none";
  bool tie_embeddings = false;  // llama: the output head is the embedding (gpt2 always ties)
  bool qkv_bias = false;        // llama: a bias on the q/k/v projection (Qwen 2)
  float norm_eps = 1e-5f;       // llama: RMSNorm's eps
  int sliding_window = 0;       // llama: attend only to the last N tokens (Mistral's; 0: all)
  int full_every = 0, full_first = 0;  // --full-attention-every / -first: the layers without the window
  // data and loop
  std::string data = "passkey";
  std::string val_data;       // --val-data: evals read this dataset's validation split ("": --data's)
  bool doc_mask = false;      // --doc-mask: attention and positions stay within each document
  bool loss_by_position = false;  // --loss-by-position: evals also give the val loss by position band
  std::vector<int> probe_lengths;  // --probe-lengths: the task's accuracy at these lengths after the run
  int eot = -1;               // the id that starts each document (-1: the data's own, data/packing.h)
  int batch = 8, seq = 256, steps = 1500, grad_accum = 1;
  float lr = 3e-3f, final_lr_frac = 0.1f, weight_decay = 0.1f, grad_clip = 1.0f;
  float beta1 = 0.9f, beta2 = 0.95f, adam_eps = 1e-8f;  // AdamW's moment decays and denominator floor
  int warmup = 20;
  // --schedule after the warmup: cosine to lr * final_lr_frac at the last step; wsd: lr held, then
  // the last decay_frac of the steps linear to it; constant: lr held (engine/optimizer.h: lr_at).
  std::string schedule = "cosine";
  double decay_frac = 0.2;  // a double: round(decay_frac * steps) meets its halves as written
  uint64_t seed = 1337;
  int threads = 0;            // 0: all cores
  // backend: --device cpu|cuda; --precision fp32|bf16 ("" until parsed: bf16 on cuda, fp32 on cpu)
  std::string device = "cpu", precision;
  int eval_every = 250, eval_batches = 8;
  int profile_step = 0;       // --profile-step N: print step N's GPU time per op (0: none)
  // parallelism
  int sp = 1, ranks = 1;
  std::string comm = "local";
  std::string nccl_id_file;   // --comm nccl without MPI: where rank 0 leaves the NCCL unique id
  double comm_timeout = 600;  // seconds a rank may wait in one collective (local, MPI, NCCL)
  // files
  std::string checkpoint, check_state;
  double check_tol = 1e-5;
  // interop and sampling after the run (engine/export.h): README "Interop", "Sampling"
  std::string export_llmc, export_safetensors, export_dtype = "f32", tokenizer, prompt, prompt_file;
  int export_llmc_version = 3;
  int sample = 0, top_k = 0;  // sample: new tokens to generate; top_k 0: the whole vocabulary
  float top_p = 1.0f;         // nucleus sampling's mass (1: off)
  int sample_every = 0;       // also sample every N steps while training (0: only at the end)
  float temperature = 1.0f;   // 0: greedy
  // checkpoints and logs (engine/checkpoint.h, engine/run_log.h)
  std::string save_dir, log;  // log: "" = save_dir/log.jsonl when saving, else no log
  int save_every = 0, keep = 0;  // 0: save only at the end / keep every checkpoint
  // Save after this step and stop, the schedule still --steps' (a stage of a longer run; 0: none).
  int stop_after = 0;
  bool resume = false;
  // --auto-resume: resume when --save-dir holds a complete checkpoint, else start fresh (one command
  // for a job script's first start and its requeues). Settled at the run's start from rank 0's
  // reading of the directory (settle_auto_resume, engine/checkpoint.h), which sets `resume`.
  bool auto_resume = false;
  // Rolling back (README "Rolling back past a loss spike"): resume from this step's checkpoint, not
  // the newest (-1: the newest; the newer ones are moved aside), and move the data skip_batches
  // steps' sequences ahead (K x G sequences trained on by no step).
  int resume_step = -1, skip_batches = 0;
  // A resume may change G (batch x grad_accum x dp): the data goes on from the checkpoint's next
  // sequence, G' a step (refused without it: another G is another run).
  bool change_global_batch = false;
  // A resume may change --seq (a context grown in stages): the data goes on at the same place in
  // its epoch (data/dataset.h: sequence_at_length); refused without it.
  bool change_seq = false;
  // A resume may change a llama's RoPE (--rope-theta, --rope-scaling: a larger base as the context
  // grows); the weights and AdamW's state go on under the new rotation. Refused without it.
  bool change_rope = false;
  // long-context memory (engine/planner.h): recompute, tiled MLP, ZeRO-1, and the memory planner
  bool recompute = false;
  bool offload = false;       // cuda + recompute: the kept block inputs in pinned host memory
  int mlp_chunks = 1;
  int zero = 0;               // 0: every rank keeps all AdamW state; 1: sharded over the world
  bool plan = false;          // print the memory plan and exit, allocating nothing
  double memory = 0;          // bytes per rank the plan searches the longest T for (0: none)
  bool help = false;
  bool quiet = false;
  double heartbeat = 30;      // seconds between progress lines inside a long step or eval (0: none)

  bool set_by_user(const std::string& flag) const;
  // Whether the run evaluates on the val split: every run that trains, and --steps 0 unless it is
  // there to export or sample (a conversion of a large model should not spend minutes on an eval
  // nobody asked for) and --eval-batches does not ask for one.
  bool evaluates() const;
  // Whether the run reads a host copy of its f32 weights: to export, sample or probe lengths (the
  // decoder's). A bf16 model only evaluated without them keeps no f32 master weights.
  bool reads_host_weights() const;
  // The run log's path: --log, else DIR/log.jsonl with --save-dir, else "" (no log).
  std::string log_path() const { return !log.empty() ? log : save_dir.empty() ? "" : save_dir + "/log.jsonl"; }
  std::vector<std::string> given;  // flags given on the command line, for presets and checks
  // The command line as parsed: each flag given and its value ("" for a switch), in order.
  std::vector<std::pair<std::string, std::string>> args;
  // The command line as every rank must have it: `args` without the flags a rank may set for
  // itself (--threads, --quiet), as "--flag value" words.
  std::string shared_command_line() const;
};

// Parses argv; throws std::runtime_error naming the flag on an unknown flag or bad value.
Options parse_options(int argc, char** argv);
const char* usage();

// The value parsers behind the flags (the benchmarks' too, bench/bench_args.h): the whole value
// must parse, else std::runtime_error naming the flag. parse_bytes reads "24G", "512M", "1.5T",
// "1000000" (binary units, K = 1024) and wants a positive size.
long parse_int(const std::string& flag, const std::string& v);
double parse_float(const std::string& flag, const std::string& v);
double parse_bytes(const std::string& flag, const std::string& v);

// The device of --device (registering the CUDA backend first when it is cuda), and the parameters'
// dtype of --precision (bf16 or f32).
Device run_device(const Options& o);
DType param_dtype(const Options& o);

// The model configuration: preset, then flag overrides; vocab from the data when not given.
ModelConfig model_config(const Options& o, int data_vocab);
// Whether --model NAME is a preset with its own vocabulary (gpt2-124M, llama-3.2-1B, ...): the
// data then need not be opened to size the model.
bool preset_has_vocab(const std::string& model);
// --rope-theta and --rope-scaling, when given, onto c (a preset's or a checkpoint's: overriding a
// llama checkpoint's RoPE is how its context is extended); refused on gpt2.
void apply_rope_flags(const Options& o, ModelConfig& c);
// --sliding-window, when given (0 too), onto c, a preset's or a checkpoint's: the window changes no
// weight, so a checkpoint's can be set, changed or removed for a fine-tune; refused on gpt2. So do
// --full-attention-every / --full-attention-first (which layers keep full attention).
void apply_window_flag(const Options& o, ModelConfig& c);
// What a --checkpoint's config takes from the flags: the two above, and a llama's --max-seq (the
// trained length, which no weight depends on; a gpt2's is its position rows: refused).
void apply_checkpoint_flags(const Options& o, ModelConfig& c);
// RoPE sets no length limit: a llama trained past its max_seq (a checkpoint's
// max_position_embeddings, when its context is being extended) has the longer one from then on, in
// its checkpoints and in the max_position_embeddings its exports write. Train and --plan both apply it.
void apply_trained_length(const Options& o, ModelConfig& c);
// A gpt2's learned positions end at max_seq: a longer --seq is refused (train and --plan), unless a
// --steps 0 run reads no sequence (it only exports or samples: the default --seq is not its).
void check_seq_fits(const Options& o, const ModelConfig& c);

}  // namespace ul
