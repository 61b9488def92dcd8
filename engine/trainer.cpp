#include "engine/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <stdexcept>

#include "data/packing.h"
#include "data/shards.h"
#include "engine/device.h"
#include "engine/export.h"
#include "engine/file_io.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_launch.h"  // UL_CUDA_CHECK
#include "engine/cuda_runtime.h"
#include "engine/gemm.h"
#endif
#include "engine/heartbeat.h"
#include "engine/hf_format.h"
#include "engine/hf_index.h"
#include "engine/llmc_format.h"
#include "engine/planner.h"
#include "engine/ranks_agree.h"
#include "engine/stop_signal.h"
#include "layers/rope.h"
#include "parallel/data_parallel.h"
#include "parallel/ulysses.h"
#include "parallel/zero.h"

namespace ul {

void load_batch(const Dataset& data, int64_t first, int B, int T, int sp, int sp_rank, HostBatch& hb, int32_t eot) {
  hb.B = B;
  hb.T = T;
  hb.Tl = T / sp;
  const int Tl = hb.Tl, t0 = sp_rank * Tl;
  hb.idx.resize(size_t(B) * Tl);
  hb.targets.resize(size_t(B) * Tl);
  hb.pos.resize(size_t(B) * Tl);
  hb.answer.resize(size_t(B) * Tl);
  hb.whole_answers = 0;
  hb.pos_full.resize(size_t(B) * T);
  hb.doc_full.resize(eot >= 0 ? size_t(B) * T : 0);
  hb.valid = 0;
  std::vector<int32_t> in(T), tg(T), doc(T), pos(T), answer(T);
  for (int b = 0; b < B; b++) {
    // Targets are shifted over the WHOLE sequence before it is sliced: no target is lost at a
    // slice boundary (README, "Sequence and data parallelism": the loss over every valid target of the step).
    data.sequence(first + b, T, in.data(), tg.data());
    // Every rank reads the whole sequence, so each knows the document layout of all T tokens.
    document_layout(in.data(), T, eot, doc.data(), pos.data());
    for (int t = 0; t < T; t++)
      answer[t] = tg[t] < 0 ? -1 : t > 0 && tg[t - 1] >= 0 ? answer[t - 1] : hb.whole_answers++;
    for (int t = 0; t < Tl; t++) {
      size_t k = size_t(b) * Tl + t;
      hb.idx[k] = in[t0 + t];
      hb.targets[k] = tg[t0 + t];
      hb.pos[k] = pos[t0 + t];
      hb.answer[k] = answer[t0 + t];
      hb.valid += tg[t0 + t] >= 0;
    }
    std::copy(pos.begin(), pos.end(), hb.pos_full.begin() + size_t(b) * T);
    if (eot >= 0) std::copy(doc.begin(), doc.end(), hb.doc_full.begin() + size_t(b) * T);
  }
}

int32_t doc_mask_eot(const Options& o, const Dataset& data, int model_vocab) {
  if (!o.doc_mask) return -1;
  const int32_t eot = o.eot >= 0 ? o.eot : data.eot();
  if (eot < 0)
    throw std::runtime_error("--doc-mask: " + data.describe() + " has no end-of-text token of its own; give --eot N");
  if (eot >= model_vocab)
    throw std::runtime_error("--doc-mask: the end-of-text id " + std::to_string(eot) + " is outside the model vocab " +
                             std::to_string(model_vocab) + " (no token could split documents); give --eot N");
  return eot;
}

namespace {
std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }  // whole MiB, for messages
}  // namespace

void check_host_memory(const MemoryPlan& plan, bool plan_on_host, int ranks_here, size_t ram, size_t load,
                       const std::string& shrinks) {
  const size_t batches = plan.batches;
  // A device run's host side: --offload's pinned block inputs and collectives staged through host memory.
  const size_t device_host = plan_on_host ? 0 : plan.pinned_host + plan.host_comm;
  const size_t per_rank = (plan_on_host ? plan.total : batches + device_host) + load;  // the total holds them on the CPU
  const size_t need = per_rank * size_t(std::max(1, ranks_here));
  if (need <= ram) return;
  const std::string here = ranks_here > 1 ? " x " + std::to_string(ranks_here) + " ranks on this machine = " + mib(need) : "";
  // (--steps 0 holds the weights alone, or with their f32 masters for a bf16 model's host copy)
  const size_t fixed = plan.params + plan.grads + plan.optim;
  const std::string fixed_is = plan.grads ? "weights, gradients and AdamW state " : plan.optim ? "weights and their f32 "
                                                                                                 "masters "
                                                                                               : "weights ";
  std::string parts = plan_on_host ? fixed_is + mib(fixed) + ", activations " + mib(plan.arena_peak) + ", " : "";
  // Every part the total holds, so that they add up to it (the attention backward's scratch, a
  // local communicator's slice of the gradient).
  if (plan_on_host && plan.workspace) parts += "workspace " + mib(plan.workspace) + ", ";
  if (plan_on_host && plan.comm) parts += "communication " + mib(plan.comm) + ", ";
  if (plan.pinned_host && !plan_on_host) parts += "--offload's pinned block inputs " + mib(plan.pinned_host) + ", ";
  if (plan.host_comm && !plan_on_host) parts += "collectives staged through the host " + mib(plan.host_comm) + ", ";
  if (load) parts += "a checkpoint's f32 copy while it loads or saves " + mib(load) + ", ";
  throw std::runtime_error("this run needs " + mib(per_rank) + " of host memory per rank" + here + " (per rank: " + parts +
                           "the step's micro-batches " + mib(batches) + ", loaded before its first forward; `train --plan` "
                           "shows every part) but this machine has " + mib(ram) + ": try " +
                           // What shrinks the activations cannot help a model whose fixed part alone is too large.
                           (plan_on_host && fixed * size_t(std::max(1, ranks_here)) > ram
                                ? "a smaller model (its " + fixed_is + "alone need " + mib(fixed) + " a rank" +
                                      (plan.grads ? std::string(", of which --zero 1 over ranks on more machines shards "
                                                                "AdamW's state")
                                                  : std::string()) + ")"
                            : plan_on_host ? shrinks
                                         : std::string(plan.pinned_host ? "without --offload, or " : "") +
                                               "a smaller --grad-accum, --batch or --seq") +
                           (ranks_here > 1 ? ", or fewer ranks on this machine" : ""));
}

void check_device_memory(const MemoryPlan& plan, int ranks_on_gpu, size_t free, const std::string& gpu,
                         const std::string& shrink, bool masters, int processes) {
  const size_t need = plan.total * size_t(std::max(1, ranks_on_gpu));
  if (need <= free) return;
  // The --memory to plan with (a rank's): its share of what the GPU had free, less 0.5 GiB for what
  // no plan holds (the CUDA libraries' own buffers: cuBLASLt's, NCCL's; once a process on the
  // GPU), rounded down to a tenth; none when that leaves under 0.1G (--memory 0.0G would be refused).
  const double share =
      (double(free) / double(size_t(1) << 30) - 0.5 * std::max(1, processes)) / std::max(1, ranks_on_gpu);
  const double budget = std::floor(share * 10) / 10;
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1fG", budget);
  const std::string plan_hint =
      budget >= 0.1 ? "; `train --plan --memory " + std::string(gib) +
                          "` with this run's flags finds the longest --seq that fits (what the GPU had free, less "
                          "0.5G for the CUDA libraries' own buffers" + (ranks_on_gpu > 1 ? ", shared by its ranks)" : ")")
                    : "; the GPU has no room left for a rank's share beside the CUDA libraries' own buffers (0.5G)";
  const std::string here =
      ranks_on_gpu > 1 ? " x " + std::to_string(ranks_on_gpu) + " ranks on this GPU = " + mib(need) : "";
  std::string parts = "weights " + mib(plan.params);  // an eval has no gradients nor AdamW state
  if (plan.grads) parts += ", gradients " + mib(plan.grads);
  if (plan.optim) parts += std::string(masters ? ", AdamW state and f32 masters " : ", AdamW state ") + mib(plan.optim);
  parts += ", activations " + mib(plan.arena_peak);
  if (plan.workspace) parts += ", workspace " + mib(plan.workspace);
  if (plan.comm) parts += ", communication " + mib(plan.comm);
  throw std::runtime_error("this run needs " + mib(plan.total) + " of GPU memory per rank" + here + " (" + parts +
                           "; `train --plan` shows every part) but " + gpu + " had " + mib(free) +
                           " free when the run started: try " + shrink +
                           (ranks_on_gpu > 1 ? ", or fewer ranks on this GPU" : "") + plan_hint);
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;  // "VmHWM:  123 kB"
  return 0;
}


namespace {

Tensor to_device(Context& c, const std::vector<int32_t>& v, Shape s) {
  Tensor t = c.empty(s, DType::i32);
  copy_from_host(t, v.data());
  return t;
}

// zero_gather_params for a bf16 buffer of n elements (2 bytes each) with the same shards:
// rank k's [k s, (k+1) s), s = zero_shard_size(n, world), and the last rank's tail. scratch: s
// bf16 or more.
void zero_gather_bf16(Comm& world, void* params, size_t n, void* scratch) {
  const int W = world.size(), k = world.rank();
  const size_t s = zero_shard_size(n, W), tail = n - s * size_t(W), e = dtype_size(DType::bf16);
  if (W == 1) return;
  char* p = static_cast<char*>(params);
  if (s > 0) {
    device_copy(scratch, world.device(), p + size_t(k) * s * e, world.device(), s * e);
    world.all_gather(scratch, p, s, DType::bf16);
  }
  if (tail) world.broadcast(p + s * size_t(W) * e, tail, DType::bf16, W - 1);
}


CommStats minus(const CommStats& a, const CommStats& b) {
  return {a.all_reduce - b.all_reduce, a.all_to_all - b.all_to_all, a.all_gather - b.all_gather,
          a.reduce_scatter - b.reduce_scatter, a.broadcast - b.broadcast};
}

// Bytes this rank sent in the step: the world's collectives plus the sp and dp groups'.
CommStats total_sent(Grid& g) {
  CommStats s = g.world.stats;
  for (Comm* c : {g.sp_group.get(), g.dp_group.get()}) {
    if (!c) continue;
    s.all_reduce += c->stats.all_reduce;
    s.all_to_all += c->stats.all_to_all;
    s.all_gather += c->stats.all_gather;
    s.reduce_scatter += c->stats.reduce_scatter;
    s.broadcast += c->stats.broadcast;
  }
  return s;
}

#if ULYSSES_HAVE_CUDA
// Under --comm nccl, before the start-up memory check and after the ranks agreed on their command
// lines (a --zero on one rank only would have them run different collectives here, which hangs).
void warm_up_nccl(Comm& world, Grid& grid, bool zero) {
  if (std::strcmp(world.backend(), "nccl") != 0) return;
  // NCCL (2.22 on) connects a communicator's peers for an algorithm at its first use, and
  // allocates their buffers then: hundreds of MiB on an H100, which no plan holds, out of the
  // memory a tightly planned run's first step needed. So the collectives the steps run go once
  // now, at a step's sizes (the world's all-reduce of the gradients, or ZeRO's reduce-scatter
  // and all-gather, on a 64 MiB scratch: past where NCCL picks its large-message algorithms;
  // the sp group's all-to-all and all-reduce), and the free memory is measured again before
  // this process allocates its own buffers. (The dp group carries no collective: the gradients
  // go over the world. On the CPU and the local or MPI communicator, nothing to make.)
  const size_t n = (size_t(64) << 20) / sizeof(float);
  const GpuInfo gpu = cuda_gpu_at_start();
  float* scratch = nullptr;
  if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&scratch), n * sizeof(float)); e != cudaSuccess) {
    cudaGetLastError();  // (not sticky: cleared)
    throw std::runtime_error("--comm nccl: the 64 MiB scratch of NCCL's first collectives, run before the memory "
                             "check, could not be allocated (" + std::string(cudaGetErrorString(e)) + "): GPU " +
                             std::to_string(gpu.device) + " (" + gpu.name + ") had " + std::to_string(gpu.free >> 20) +
                             " MiB free when the run started; they need that and NCCL's own buffers (hundreds of "
                             "MiB): free the GPU, give this rank one of its own, or lift a process limit (ulimit -v)");
  }
  try {
    UL_CUDA_CHECK(cudaMemset(scratch, 0, n * sizeof(float)));
    // The world's large collectives as a step runs them: the gradients' all-reduce, or under
    // ZeRO their reduce-scatter and the weights' all-gather (the halves apart: NCCL takes
    // in-place only at its own offsets) beside an all-reduce of a few elements.
    if (zero && world.size() > 1) {
      const size_t part = n / 2 / size_t(world.size());
      world.reduce_scatter(scratch, scratch + n / 2, part, DType::f32, ReduceOp::sum);
      world.all_gather(scratch + n / 2, scratch, part, DType::f32);
      world.all_reduce(scratch, 1, DType::f32, ReduceOp::sum);
    } else {
      world.all_reduce(scratch, n, DType::f32, ReduceOp::sum);
    }
    if (grid.sp_group->size() > 1) {
      const size_t part = n / size_t(grid.sp_group->size());
      grid.sp_group->all_to_all(scratch, scratch + n / 2, part / 2, DType::f32);
      grid.sp_group->all_reduce(scratch, 1, DType::f32, ReduceOp::sum);
    }
  } catch (const CommError& e) {
    cudaFree(scratch);
    throw CommError(std::string(e.what()) + " (in the NCCL warm-up before the memory check: GPU " +
                    std::to_string(gpu.device) + " had " + std::to_string(gpu.free >> 20) +
                    " MiB free at the start; NCCL's buffers may not have fit)");
  } catch (...) {
    cudaFree(scratch);
    throw;
  }
  UL_CUDA_CHECK(cudaFree(scratch));
  cuda_remeasure_free_memory();
}
#endif

// The host map, with this process's GPU by number and by identity (GpuInfo::id): numbers repeat
// across processes that each see one GPU (all "GPU 0"), UUIDs do not.
HostMap hosts_of(Comm& world, const Options& o) {
#if ULYSSES_HAVE_CUDA
  if (run_device(o) == Device::cuda) {
    const GpuInfo g = cuda_gpu_at_start();
    return host_map(world, g.device, g.id);
  }
#else
  (void)o;
#endif
  return host_map(world);
}

}  // namespace

ModelInputs device_inputs(Context& c, const HostBatch& hb) {
  ModelInputs in;
  in.idx = to_device(c, hb.idx, {hb.B, hb.Tl});
  in.targets = to_device(c, hb.targets, {hb.B, hb.Tl});
  in.pos = to_device(c, hb.pos, {hb.B, hb.Tl});
  in.pos_full = to_device(c, hb.pos_full, {hb.B, hb.T});
  if (!hb.doc_full.empty()) in.doc_full = to_device(c, hb.doc_full, {hb.B, hb.T});
  return in;
}

namespace {

// The most bytes of a Hugging Face checkpoint held in memory at once as it loads: the file, or a
// sharded one's largest shard; 0 for other checkpoints (read in pieces) and none.
size_t hf_checkpoint_read_bytes(const std::string& path) {
  std::error_code ec;  // (a file that cannot be sized is refused, naming it, as it is read)
  if (is_safetensors_path(path)) {
    const auto n = std::filesystem::file_size(path, ec);
    return ec ? 0 : size_t(n);
  }
  if (!is_safetensors_index_path(path)) return 0;
  size_t most = 0;
  try {
    for (const std::string& shard : read_safetensors_index(path).files)
      if (const auto n = std::filesystem::file_size(shard, ec); !ec) most = std::max(most, size_t(n));
  } catch (const std::exception&) {
    // a bad index is refused, naming it, when the model is loaded
  }
  return most;
}

}  // namespace

Trainer::Trainer(const Options& o, Comm& world)
    : o_(o), grid_(world, o.sp), hosts_(hosts_of(world, o)), threads_(threads_for_rank(o.threads, hosts_,
                                omp_threads_per_rank(std::strcmp(world.backend(), "local") == 0 ? world.size() : 1))),
      ctx_(run_device(o)), guard_(ctx_) {
  omp_set_num_threads(threads_);
  std::vector<float> ckpt;
  ModelConfig cfg, file_cfg;  // file_cfg: the --checkpoint's own, as its header gives it
  if (!o.checkpoint.empty()) {
    // The header alone: the weights are read once the run's checks have passed (a flag's mistake
    // or a plan larger than the machine was said only after a 32 GB model.bin had been read), and
    // a resume's are --save-dir's.
    cfg = file_cfg = checkpoint_model_config(o.checkpoint, ckpt, false);
    const std::string own = rope_scaling_str(cfg.rope_scaling);
    apply_checkpoint_flags(o, cfg);
    if (o.set_by_user("--rope-scaling") && own != "none" && own != rope_scaling_str(cfg.rope_scaling))
      replaced_rope_scaling_ = own;
  }
  // The data's vocabulary sizes a new model (unless --vocab says otherwise); a checkpoint's
  // vocabulary bounds the data's token ids.
  const int vocab = o.vocab > 0 || o.checkpoint.empty() ? o.vocab : cfg.vocab;
  try {
    train_ = open_dataset(o.data, Split::train, o.seed, vocab);
  } catch (const std::exception& e) {  // which flag's files: --val-data's are named the same way
    throw std::runtime_error("--data: " + std::string(e.what()));
  }
  // A split too short for --seq (or a synthetic task's sequence) fails now, not at the first step
  // or (hours later) the first eval.
  if (o.steps > 0) {
    try {
      train_->num_sequences(o.seq);
    } catch (const std::exception& e) {
      throw std::runtime_error("--data: " + std::string(e.what()));
    }
  }
  if (o.checkpoint.empty()) cfg = model_config(o, train_->vocab());
  if (train_->vocab() > cfg.vocab)
    throw std::runtime_error(o.checkpoint + ": the model's vocabulary (" + std::to_string(cfg.vocab) +
                             ") is smaller than the data's (" + std::to_string(train_->vocab()) + ")");
  // The val split (--data's own, or --val-data's), its token ids bounded by the model's vocabulary:
  // val files whose headers name none would otherwise be read against their format's (50257 for
  // GPT-2's), and an id past the model's rows found only at the first eval, or not at all.
  const std::string val_flag = o.val_data.empty() ? "--data (its val split)" : "--val-data";
  try {
    val_ = open_dataset(o.val_data.empty() ? o.data : o.val_data, Split::val, o.seed, cfg.vocab);
  } catch (const std::exception& e) {
    throw std::runtime_error(val_flag + ": " + e.what());
  }
  // --val-data's files must be the same tokenizer's as --data's: another's ids mean other text.
  if (!o.val_data.empty() && !token_kinds_agree(train_->token_kind(), val_->token_kind()))
    throw std::runtime_error("--val-data " + o.val_data + ": its files were written by another tokenizer (" +
                             val_->token_kind() + ") than --data's (" + train_->token_kind() + ")");
  // The val split must hold nothing the run trains on (--val-data's held-out tail of a file that
  // --data trains on whole; a val shard that is a link to a training shard): the val loss would
  // measure memory, not generalisation. One shared token is the boundary of a file's two splits.
  if (o.steps > 0)
    for (const Dataset::FileSpan& v : val_->file_spans())
      for (const Dataset::FileSpan& t : train_->file_spans()) {
        std::error_code ec;
        if (std::min(v.hi, t.hi) - std::max(v.lo, t.lo) > 1 && std::filesystem::equivalent(v.path, t.path, ec))
          throw std::runtime_error(val_flag + ": " + v.path + "'s tokens [" + std::to_string(v.lo) + ", " +
                                   std::to_string(v.hi) + ") are also in --data's training split (" +
                                   (v.path == t.path ? "its" : t.path + "'s, the same file,") + " tokens [" +
                                   std::to_string(t.lo) + ", " + std::to_string(t.hi) + ")): the evals would read "
                                   "what the run trains on; give val files of their own (a word of the name starting "
                                   "with \"val\")");
      }
  if (val_->vocab() > cfg.vocab)
    throw std::runtime_error(val_flag + " " + (o.val_data.empty() ? o.data : o.val_data) + ": its vocabulary (" +
                             std::to_string(val_->vocab()) + ") is larger than the model's (" + std::to_string(cfg.vocab) +
                             ")");
  if (o.evaluates()) {
    try {
      val_->num_sequences(o.seq);
    } catch (const std::exception& e) {  // too short for --seq: say which flag's data
      throw std::runtime_error(val_flag + ": " + e.what());
    }
  }
  // Every rank the same job, before the model is built and its weights loaded (engine/ranks_agree.h).
  std::vector<RunField> fields = run_fields(o, cfg, train_->identity(), train_->eot());
  for (RunField& f : fields)  // a checkpoint's field names a change since the save: here it is --data's files
    if (f.key == "data_files") f.flag = "--data";
  fields.push_back({"val_files", json_quote(val_->identity()), val_flag});
  fields.push_back({"layout", json_quote(run_layout(o, grid_).str()), "--batch, --grad-accum, --sp, --zero, --mlp-chunks"});
  fields.push_back({"steps", std::to_string(o.steps), "--steps"});  // the collectives' count
  fields.push_back({"lr", float_text(o.lr), "--lr"});
  fields.push_back({"eval_every", std::to_string(o.eval_every), "--eval-every"});
  fields.push_back({"save_every", std::to_string(o.save_every), "--save-every"});
  // Last, so that a field above names what differs first: every other flag (--probe-lengths,
  // --eval-batches, the --checkpoint path...), each of which would hang or mislead on some ranks.
  fields.push_back({"command_line", json_quote(o.shared_command_line()), "the command line, but --threads and --quiet"});
  check_ranks_agree(world, fields);
  cfg.validate_for(ctx_.device, o.checkpoint);  // before any allocation: a bad flag costs nothing
  check_ulysses_config(cfg.heads, cfg.kv_heads, o.seq, o.sp, world.size());
  check_seq_fits(o, cfg);
  apply_trained_length(o, cfg);
  // The run's memory as planned (engine/planner.h), before anything large is allocated. On the CPU
  // a run larger than the machine is refused here: Linux would grant the memory, then kill the run
  // once it is touched.
  PlanConfig pc = plan_config(o, cfg);
  pc.world = world.size();
  const MemoryPlan plan = plan_memory(pc);
  planned_arena_ = plan.arena_peak;
  // On the host whatever the device: the step's micro-batches (HostBatch: 5 int32 arrays of B x T
  // at most), loaded before its first forward. On the CPU the whole plan is host memory too.
  // Loading a checkpoint holds an f32 copy of the model on every rank's host until it is in place
  // (resuming, also this rank's share of AdamW's m and v). On the CPU a --checkpoint's copy is freed
  // before the gradients, the optimizer and the arena exist, which hold more than it: there only a
  // resume, or a --steps 0 run (no gradients nor optimizer), adds it to the plan.
  const size_t n_params = param_count(cfg);
  const ZeroShard mine = o.zero ? zero_shard(n_params, world.size(), world.rank()) : ZeroShard{0, n_params};
  size_t load = 0;
  if (o.resume) load = 4 * n_params + 8 * (mine.hi - mine.lo);
  else if (!o.checkpoint.empty() && (ctx_.device != Device::cpu || o.steps == 0)) load = 4 * n_params;
  // A safetensors file is read whole beside that copy (a sharded one, a shard at a time: the
  // largest); on the CPU, training, both go before the gradients and AdamW's state, which outweigh them.
  if (!o.resume && (ctx_.device != Device::cpu || o.steps == 0)) load += hf_checkpoint_read_bytes(o.checkpoint);
  // A device run's save copies the weights and this rank's AdamW shard to the host to write them
  // (counted for every rank, as a load is); the CPU writes them from where they are.
  if (!o.save_dir.empty() && o.steps > 0 && ctx_.device != Device::cpu)
    load = std::max(load, 4 * n_params + 8 * (mine.hi - mine.lo));
  const bool on_host = ctx_.device == Device::cpu;
  host_resident_ = on_host ? plan.total : plan.batches + plan.pinned_host + plan.host_comm;
  // Against this process's limit, with the ranks that draw on it; where that is a cgroup's of its
  // own (containers sharing a machine), the machine's memory against all of its ranks too.
  check_host_memory(plan, on_host, hosts_.sharing_memory(), memory_limit(), load, memory_shrinks(pc));
  if (hosts_.sharing_memory() != hosts_.ranks_here())
    check_host_memory(plan, on_host, hosts_.ranks_here(), physical_memory_bytes(), load, memory_shrinks(pc));
#if ULYSSES_HAVE_CUDA
  if (ctx_.device == Device::cuda) {
    warm_up_nccl(world, grid_, o.zero != 0);
    const GpuInfo gpu = cuda_gpu_at_start();
    check_device_memory(plan, hosts_.sharing_gpu(), gpu.free, "GPU " + std::to_string(gpu.device) + " (" + gpu.name + ")",
                        memory_shrinks(pc), param_dtype(o) == DType::bf16, o.comm == "local" ? 1 : hosts_.sharing_gpu());
  }
#endif
  // ZeRO-1 shards a bf16 model's f32 master weights with the AdamW state: each rank keeps those
  // of its own shard (the only ones its update reads), 4 bytes per parameter of the model less.
  // A model only evaluated (--steps 0) gets no gradients, AdamW state or ZeRO shards: an 8B model's
  // eval needs its weights, not the 12 bytes a parameter of training state, nor the f32 masters
  // unless it makes a host copy of them.
  const bool trains = o.steps > 0;
  MasterRange masters;
  if (!trains && !o.reads_host_weights()) {
    masters = MasterRange::none();  // bf16: the weights are all an eval reads (f32: they are the masters)
  } else if (trains && o.zero && param_dtype(o) == DType::bf16) {
    // Fewer than 4 parameters a rank leaves every rank but the last an empty shard of masters,
    // which the step's checks and the saves cannot read from (a toy model on hundreds of ranks).
    if (world.size() > 1 && zero_shard_size(param_count(cfg), world.size()) == 0)
      throw std::runtime_error("--zero 1: " + std::to_string(param_count(cfg)) + " parameters over " +
                               std::to_string(world.size()) + " ranks leave ranks with no shard of the bf16 masters "
                               "(4 parameters a rank at least): use fewer ranks, or --zero 0");
    const ZeroShard z = zero_shard(param_count(cfg), world.size(), world.rank());
    masters = {z.lo, z.hi};
  }
  model_ = std::make_unique<Transformer>(cfg, param_dtype(o), masters, trains);
  if (model_->params.numel() != param_count(cfg))  // the shard bounds above came from the count
    throw std::logic_error("param_count (layers/transformer.cpp) disagrees with the model's parameter buffer: a "
                           "parameter added to Transformer's p.add(...) list needs its count there too");
  eot_ = doc_mask_eot(o, *train_, cfg.vocab);
  model_->recompute = o.recompute;
  model_->offload = o.offload;
  model_->mlp_chunks = o.mlp_chunks;
  // A --checkpoint's weights, any format: said first where the file is large, then how far the read
  // got every --heartbeat ("  ...   load model.bin | 3.20 GiB read | 30.0 s"; an 8B safetensors
  // file was a minute of silence).
  const bool says = !o.quiet && world.rank() == 0;
  std::optional<Heartbeat> beat;
  std::optional<Heartbeat::Phase> reading;
  if (!o.resume && !o.checkpoint.empty()) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(o.checkpoint, ec);  // (an index: each shard is said as it loads)
    if (says && !ec && bytes >= (uint64_t(1) << 30))
      std::printf("load    | %s (%s) ...\n", o.checkpoint.c_str(), bytes_text(double(bytes)).c_str()), std::fflush(stdout);
    beat.emplace(says ? o.heartbeat : 0);
    reading.emplace(beat->begin("load " + std::filesystem::path(o.checkpoint).filename().string(),
                                Heartbeat::bytes_read_from_now()));
  }
  if (!o.resume && !o.checkpoint.empty() && !is_hf_checkpoint_path(o.checkpoint)) {
    // The same file still: one replaced since its header was read is another model.
    if (checkpoint_model_config(o.checkpoint, ckpt, true).describe() != file_cfg.describe())
      throw std::runtime_error("--checkpoint " + o.checkpoint + ": the file changed while the run started (its "
                               "header now describes another model)");
  }
  if (!ckpt.empty()) check_finite_weights(o.checkpoint, model_->params.specs(), ckpt.data());
  if (o.resume) {
    // Nothing yet: the resume loads --save-dir's weights over the zeroed buffer (engine/resume.cpp,
    // which compares them across ranks); drawing the seed's first (minutes at 8B on a few threads)
    // was work thrown away.
  } else if (!ckpt.empty()) {
    model_->params.load_host(ckpt.data());  // f32 values: a bf16 model's master
  } else if (is_hf_checkpoint_path(o.checkpoint)) {
    load_hf_checkpoint(o.checkpoint, *model_, says);
  } else {
    // About 25 ns a weight a thread (3 minutes at 8B on one) before the run's first line: said,
    // where that is more than a few seconds, rather than a silent start.
    if (!o.quiet && world.rank() == 0 && model_->params.numel() >= (size_t(200) << 20))
      std::printf("init    | drawing %.2fB weights from --seed %llu (%d thread%s: about %.0f s) ...\n",
                  double(model_->params.numel()) / 1e9, (unsigned long long)o.seed, threads_, threads_ == 1 ? "" : "s",
                  double(model_->params.numel()) * 25e-9 / threads_), std::fflush(stdout);
    model_->init_weights(o.seed);
  }
  reading.reset();
  beat.reset();
  std::vector<float>().swap(ckpt);  // loaded: its host memory goes before the optimizer's and the arena's
  // Every replica from the same weights: the same path may hold other bytes on another node.
  if (!o.resume && o.checkpoint.empty())
    check_same_weights(world, model_->params.fingerprint(), "initializing them from --seed " + std::to_string(o.seed),
                       "every rank draws the same numbers from the seed (another build, or another math library, on "
                       "some node?)");
  else if (!o.resume)
    check_same_weights(world, model_->params.fingerprint(), "loading --checkpoint " + o.checkpoint, kSameFile);
  AdamWConfig ac;
  ac.weight_decay = o.weight_decay;
  ac.beta1 = o.beta1;
  ac.beta2 = o.beta2;
  ac.eps = o.adam_eps;
  ac.seed = o.seed;
  if (!trains) {
    // no optimizer: step() refuses
  } else if (o.zero) {  // ZeRO-1: this rank's AdamW state covers only its shard of the buffer
    const size_t n = model_->params.numel();
    ZeroShard z = zero_shard(n, world.size(), world.rank());
    opt_ = std::make_unique<AdamW>(model_->params, ac, z.lo, z.hi);
    zero_scratch_ = static_cast<float*>(device_alloc(ctx_.device, zero_scratch_elems(n, world.size()) * sizeof(float)));
  } else {
    opt_ = std::make_unique<AdamW>(model_->params, ac);
  }
  micro_.resize(o.grad_accum);
  // The step's activation memory as planned (engine/planner.h, every target valid: the largest
  // classifier chunk), held as one block from the start: no block tail is wasted, and a run too
  // large for the device fails here rather than in the middle of a step.
#if ULYSSES_HAVE_CUDA
  // cuBLASLt's workspace (the plan's `workspace` row) before the arena: it too is there from the start.
  if (ctx_.device == Device::cuda) cuda::gemm_prepare();
#endif
  try {
    ctx_.arena.reserve(planned_arena_);
  } catch (const std::exception& e) {  // a device too small: say which memory, and what shrinks it
    throw std::runtime_error(std::string(e.what()) + ": the step's activations (" + mib(planned_arena_) +
                             "; `train --plan` shows every part) do not fit; try " + memory_shrinks(pc));
  }
}

Trainer::~Trainer() { device_free(ctx_.device, zero_scratch_); }

void Trainer::replace_train_data_for_test(std::unique_ptr<Dataset> data) {
  if (!data || data->vocab() > model_->cfg.vocab)
    throw std::invalid_argument("replace_train_data_for_test: no data, or a vocabulary past the model's");
  train_ = std::move(data);
}

void Trainer::check_current(const char* what) const {
  // Ops find their arena and tape through the thread's current context: under another trainer's
  // they would write into its buffers (a second Trainer built on this thread after this one).
  if (ctx_or_null() != &ctx_)
    throw std::logic_error(std::string("Trainer::") + what + ": another context is current on this thread (a Trainer "
                           "or ContextGuard made on it since this one, still alive): one Trainer per thread at a time");
}

namespace {

// While alive, the model's progress lines (--heartbeat) also name the batch of `n` reached
// ("micro-batch 2/4, forward 3/12 blocks"): a long eval or an accumulated step shows how far
// through its batches it is. One batch says nothing more.
class BatchProgress {
 public:
  BatchProgress(Transformer& model, const char* what, int n) : model_(model), outer_(model.progress), what_(what), n_(n) {
    if (outer_ && n > 1) model_.progress = [this](const std::string& where) { outer_(label_ + where); };
  }
  ~BatchProgress() { model_.progress = outer_; }
  BatchProgress(const BatchProgress&) = delete;
  BatchProgress& operator=(const BatchProgress&) = delete;
  void at(int k) { label_ = what_ + " " + std::to_string(k + 1) + "/" + std::to_string(n_) + ", "; }

 private:
  Transformer& model_;
  std::function<void(const std::string&)> outer_;
  std::string what_, label_;
  int n_;
};

}  // namespace

StepResult Trainer::step() {
  if (!opt_) throw std::logic_error("Trainer::step: this trainer was made for --steps 0 (no gradients or optimizer)");
  check_current("step");
  Grid& g = grid_;
  const int A = o_.grad_accum;
  double t0 = now_ms();
  CommStats before = total_sent(g);
  // Every micro-batch of the step is loaded first, so the number of valid targets of the whole
  // step, over the whole world, and with it the loss gradient's scale 1/count, is known before
  // the first forward: the classifier applies it during the forward (no seed gradient).
  // The refusals below (a bad token id in the step's data, no valid target) fail the same way on
  // every resume: the way on is past this step's data.
  const std::string past = "this step trains on sequences " + std::to_string(next_seq_) + " to " +
                           std::to_string(next_seq_ + sequences_per_step() - 1) + ": resume from a checkpoint before " +
                           "it with --resume-step N --skip-batches K, K enough for step N + 1 to start past them (its " +
                           "resume line says where it starts)";
  int64_t local_valid = 0;
  std::string load_error;  // this rank's sequences could not be read (a bad token id in its part)
  try {
    for (int m = 0; m < A; m++) {
      const int64_t first = next_seq_ + (int64_t(m) * g.dp + g.dp_rank) * o_.batch;
      named_load(*train_, "--data", first, micro_[m]);
      local_valid += micro_[m].valid;
    }
  } catch (const BadTokenError& e) {  // the data's own, at this step on every resume: the way past it
    load_error = std::string(e.what()) + "; " + past;
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  // The step's first collective: a rank whose data failed makes the whole world fail here with its
  // message (an MPI rank failing alone would abort the job before rank 0's log could say why).
  const int64_t count = global_count(g.world, local_valid, load_error);
  int64_t packed = 0;  // a document id above 0 in a sequence: an EOT split it
  for (const HostBatch& hb : micro_)
    for (size_t b = 0; b < hb.doc_full.size(); b += size_t(hb.T))
      packed += std::any_of(hb.doc_full.begin() + long(b), hb.doc_full.begin() + long(b) + hb.T, [](int32_t d) { return d > 0; });
  if (count == 0)
    throw JobError("step " + std::to_string(step_ + 1) + ": no valid targets in the whole batch; " + past);
  const float scale = float(1.0 / double(count));

  StepResult r;
  r.valid = local_valid;
  r.packed = packed;
  model_->params.zero_grad();
  double loss_sum = 0;
  BatchProgress batch(*model_, "micro-batch", A);
  for (int m = 0; m < A; m++) {
    batch.at(m);
    ctx_.arena.reset();
    ctx_.arena.reset_high_water();
    Recording rec(true);
    CrossEntropyStats s = model_->forward(device_inputs(ctx_, micro_[m]), scale, g.sp_group.get());
    // No loss to seed: the classifier (the tape's last op) already added the loss gradient,
    // scaled by 1/count, during the forward; the walk starts from what it wrote.
    ctx_.tape.backward();
    loss_sum += s.loss_sum;
    r.act_bytes = std::max(r.act_bytes, ctx_.arena.high_water());
  }
  Params& P = model_->params;
  if (o_.zero) zero_reduce_gradients(g.world, P.grad(), P.numel(), zero_scratch_);
  else all_reduce_gradients(g.world, P.grad(), P.numel());
  g.world.all_reduce(&loss_sum, 1, DType::f64, ReduceOp::sum);
  r.loss = loss_sum / double(count);
  {
    // The global norm is summed shard by shard whether or not --zero 1 shards the state: each rank
    // adds the squares of its ZeRO shard (under ZeRO the only part of the gradient it holds
    // reduced), and the world adds the ranks' sums. So --zero 1 gives the norm's bits of --zero 0
    // where the backend's all-reduce and reduce-scatter add the ranks in the same order (with 3+
    // MPI or NCCL processes they may not: README), and with them the clip factor's: a norm added
    // in another order differs in its last digits and moves every
    // weight of every step after.
    const ZeroShard mine = zero_shard(P.numel(), g.world.size(), g.world.rank());
    double ss = sum_squares_on(P.device(), P.grad() + mine.lo, mine.hi - mine.lo);
    if (g.world.size() > 1) g.world.all_reduce(&ss, 1, DType::f64, ReduceOp::sum);
    r.grad_norm = std::sqrt(ss);
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    throw JobError("step " + std::to_string(step_ + 1) + ": loss or gradient norm is not finite (loss " +
                   std::to_string(r.loss) + ", norm " + std::to_string(r.grad_norm) + "); try a lower --lr, or " + past);
  r.lr = lr_at(step_, {o_.schedule, o_.steps, o_.warmup, o_.lr, o_.final_lr_frac, o_.decay_frac});
  opt_->step(r.lr, clip_factor(r.grad_norm, o_.grad_clip));
  if (o_.zero) {
    // The f32 values of every shard (an f32 model's weights; a bf16 model's masters stay with their
    // owners); a bf16 model takes each owner's rounded bf16 shard as it is, so the replicas stay
    // bitwise equal.
    if (!P.masters_sharded()) zero_gather_params(g.world, P.master(), P.numel(), zero_scratch_);
    if (P.dtype() == DType::bf16) zero_gather_bf16(g.world, P.raw(), P.numel(), zero_scratch_);
  }
  {
    // The update itself can overflow (an --lr near 1e38): the next step's loss would say so only
    // after a save, an eval or an export had used the weights (a checkpoint of infinities). Both
    // backends sum the squares in f64, which no f32 value overflows: the sum is finite exactly
    // when every weight is. Replicas check the same bits (every all-reduce hands each rank the
    // same result), so they fail together; sharded masters (bf16 under --zero 1) add up their sums.
    double ws = sum_squares_on(P.device(), P.master_at(P.master_lo()), P.master_hi() - P.master_lo());
    if (P.masters_sharded() && g.world.size() > 1) g.world.all_reduce(&ws, 1, DType::f64, ReduceOp::sum);
    // bf16: a master past bf16's largest finite value (3.39e38, a finite f32) rounds to infinity in
    // the weights the forward reads; its square alone passes this bound (which only weights near
    // 1e34 and more could reach otherwise: no run that trains).
    const double bf16_max = 3.3895313892515355e38;
    if (!std::isfinite(ws) || (P.dtype() == DType::bf16 && ws >= bf16_max * bf16_max))
      throw JobError("step " + std::to_string(step_ + 1) + ": the update made weights that are not finite (lr " +
                     float_text(r.lr) + ", gradient norm " + std::to_string(r.grad_norm) +
                     "): lower --lr; nothing from this step was saved");
  }
  step_++;
  next_seq_ += sequences_per_step();
  r.ms = now_ms() - t0;
  r.sent = minus(total_sent(g), before);
  return r;
}

void Trainer::set_steps_done(int s, int64_t next_sequence) {
  if (s < 0 || next_sequence < 0) throw std::logic_error("Trainer::set_steps_done: negative step or sequence");
  step_ = s;
  next_seq_ = next_sequence;
}

int64_t Trainer::sequences_per_step() const { return int64_t(o_.batch) * o_.grad_accum * grid_.dp; }

void Trainer::skip_batches(int64_t k) {
  if (k < 0) throw std::logic_error("Trainer::skip_batches: k < 0");
  // 2^62: checkpoints refuse a place past it (its int64 arithmetic then stays far from overflow).
  if (k > ((int64_t(1) << 62) - next_seq_) / sequences_per_step())
    throw std::runtime_error("--skip-batches " + std::to_string(k) + ": the data's place would pass 2^62 sequences");
  next_seq_ += k * sequences_per_step();
}

void Trainer::named_load(const Dataset& data, const char* flag, int64_t first, HostBatch& hb) const {
  try {
    load_batch(data, first, o_.batch, o_.seq, grid_.sp, grid_.sp_rank, hb, eot_);
  } catch (const BadTokenError& e) {  // a token id past the vocabulary, found as it is read
    throw BadTokenError(std::string(flag) + ": " + e.what());
  } catch (const std::runtime_error& e) {  // (a file gone or cut while the run reads it)
    throw std::runtime_error(std::string(flag) + ": " + e.what());
  }
}

std::vector<float> Trainer::host_params(bool want) {
  Params& P = model_->params;
  if (!P.has_masters()) P.master();  // throws: the run was set up without them (Options::reads_host_weights)
  if (!P.masters_sharded()) return want ? P.to_host() : std::vector<float>{};
  // Each owner's masters into its place in the gradient buffer (free between steps: the next
  // step zeroes it first), then gathered there as ZeRO gathers an f32 model's weights.
  const Device d = P.device();
  float* all = P.grad();
  device_copy(all + P.master_lo(), d, P.master_at(P.master_lo()), d, (P.master_hi() - P.master_lo()) * sizeof(float));
  zero_gather_params(grid_.world, all, P.numel(), zero_scratch_);
  std::vector<float> h(want ? P.numel() : 0);
  if (want) device_copy(h.data(), Device::cpu, all, d, P.numel() * sizeof(float));
  return h;
}

size_t decoder_room(size_t resident, int sharing, size_t limit, int here, size_t physical, bool each) {
  size_t room = SIZE_MAX;
  for (const auto& [ranks, bytes] : {std::pair<int, size_t>{sharing, limit}, std::pair<int, size_t>{here, physical}}) {
    const size_t n = size_t(std::max(1, ranks)), held = resident * n;
    const size_t left = held < bytes ? bytes - held : 0;
    room = std::min(room, each ? left / n : left);
  }
  return room;
}

size_t Trainer::decoder_room(bool each) const {
  return ul::decoder_room(host_resident_, hosts_.sharing_memory(), memory_limit(), hosts_.ranks_here(),
                          physical_memory_bytes(), each);
}

const float* Trainer::host_weights(bool want, std::vector<float>& copy) {
  Params& P = model_->params;
  if (P.device() == Device::cpu && P.has_masters() && !P.masters_sharded()) return want ? P.master() : nullptr;
  copy = host_params(want);
  return want ? copy.data() : nullptr;
}

void Trainer::round_bf16_from_masters() {
  Params& P = model_->params;
  if (!P.masters_sharded()) {
    opt_->round_params(0, P.numel());  // the bits depend on the element's index only, not on the shard
    return;
  }
  opt_->round_params(P.master_lo(), P.master_hi());  // its own shard, then every owner's bits
  zero_gather_bf16(grid_.world, P.raw(), P.numel(), zero_scratch_);
}

std::vector<std::pair<int, int>> position_bands(int T, int widest) {
  const int64_t L = std::max(T, widest);
  int first = 64;
  while (first < L && (L - 1) / first >= 256) first *= 2;  // at most 1 + 8 bands (at L)
  std::vector<std::pair<int, int>> bands;
  for (int64_t lo = 0, hi = first; lo < T; lo = hi, hi *= 2) bands.emplace_back(int(lo), int(std::min<int64_t>(hi, T)));
  return bands;
}

EvalResult Trainer::evaluate(const Dataset& data) {
  check_current("evaluate");
  Grid& g = grid_;
  Recording off(false);
  // loss_sum, valid, correct, whole answers right, whole answers; then with --loss-by-position
  // (loss_sum, valid) per band.
  constexpr size_t kBand0 = 5;
  std::vector<std::pair<int, int>> bands;
  if (o_.loss_by_position) bands = position_bands(o_.seq);
  std::vector<double> sums(kBand0 + 2 * bands.size(), 0.0);
  const bool whole = data.synthetic();  // whole answers: a task's (text's targets are all one run)
  std::vector<uint8_t> row_hit;
  std::vector<double> misses;
  std::vector<int> band_of(bands.empty() ? 0 : o_.seq);  // position -> band
  for (size_t k = 0; k < bands.size(); k++)
    std::fill(band_of.begin() + bands[k].first, band_of.begin() + bands[k].second, int(k));
  std::vector<float> row_loss;
  HostBatch hb;
  BatchProgress batch(*model_, "batch", o_.eval_batches);
  for (int e = 0; e < o_.eval_batches; e++) {
    batch.at(e);
    ctx_.arena.reset();
    // Every eval reads the same held-out sequences, so successive val losses are comparable.
    int64_t first = (int64_t(e) * g.dp + g.dp_rank) * o_.batch;
    std::string load_error;
    try {
      // The val split's flag as start-up names it (a probe's data is the val data's, or train's).
      named_load(data, &data != val_.get() ? "--data" : o_.val_data.empty() ? "--data (its val split)" : "--val-data",
                 first, hb);
    } catch (const std::exception& ex) {
      load_error = ex.what();
    }
    // Before the forward's collectives: a rank that could not read its sequences (a bad token id
    // in the val files) fails every rank here, with its message, as in step(). The same all-reduce
    // carries the stop signal, so every rank leaves the eval before the same micro-batch.
    test_hold("eval batch " + std::to_string(e + 1));
    if (global_count(g.world, stop_signal() != 0, load_error) > 0) {
      EvalResult cut;
      cut.cut_at = e;
      return cut;
    }
    ModelInputs in = device_inputs(ctx_, hb);
    if (!bands.empty()) {
      row_loss.assign(hb.targets.size(), 0.f);
      in.row_loss = row_loss.data();
    }
    if (whole) {
      row_hit.assign(hb.targets.size(), 0);
      in.row_hit = row_hit.data();
    }
    CrossEntropyStats s = model_->forward(in, 0.0f, g.sp_group.get());
    sums[0] += s.loss_sum;
    sums[1] += double(s.n_valid);
    sums[2] += double(s.n_correct);
    if (whole) {
      // An answer is right when all its targets are, on whichever sp ranks they lie: the group adds
      // up each answer's misses, and its first rank counts the answers with none.
      misses.assign(size_t(hb.whole_answers), 0.0);
      for (size_t i = 0; i < row_hit.size(); i++)
        if (hb.answer[i] >= 0 && !row_hit[i]) misses[size_t(hb.answer[i])] += 1;
      if (g.sp > 1 && !misses.empty()) g.sp_group->all_reduce(misses.data(), misses.size(), DType::f64, ReduceOp::sum);
      if (g.sp_rank == 0) {
        for (double m : misses) sums[3] += m == 0;
        sums[4] += double(hb.whole_answers);
      }
    }
    // This rank's tokens, by the position each one's prediction is made from (hb.pos: in the
    // document with --doc-mask, global in the sequence under sp).
    for (size_t i = 0; i < row_loss.size(); i++) {  // empty without bands
      if (hb.targets[i] < 0) continue;
      const int k = band_of[hb.pos[i]];
      sums[kBand0 + 2 * k] += row_loss[i];
      sums[kBand0 + 1 + 2 * k] += 1;
    }
  }
  g.world.all_reduce(sums.data(), sums.size(), DType::f64, ReduceOp::sum);
  EvalResult r;
  r.answers = int64_t(sums[1]);
  if (sums[1] > 0) {
    r.loss = sums[0] / sums[1];
    r.accuracy = sums[2] / sums[1];
  }
  r.whole_answers = int64_t(sums[4]);
  if (sums[4] > 0) r.whole_accuracy = sums[3] / sums[4];
  // Every rank has the sums: all fail together, as a step with a loss that is not finite does.
  if (!std::isfinite(r.loss))
    throw JobError("the val loss is not finite (" + std::to_string(r.loss) + " over " + std::to_string(r.answers) +
                   " targets): the weights' outputs overflow");
  for (size_t k = 0; k < bands.size(); k++) {
    const double n = sums[kBand0 + 1 + 2 * k];
    r.by_position.push_back({bands[k].first, bands[k].second, n > 0 ? sums[kBand0 + 2 * k] / n : 0.0, int64_t(n)});
  }
  return r;
}

}  // namespace ul
