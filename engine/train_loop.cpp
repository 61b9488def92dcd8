// train_rank(): the loop `train` runs on every rank (engine/trainer.h): where to start (a fresh run
// or the newest checkpoint), each step's log line, evals, checkpoints, the JSON log and its plot,
// and the summary at the end. Only rank 0 prints.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <omp.h>

#include "data/shards.h"
#include "engine/checkpoint.h"
#include "engine/checkpoint_files.h"
#include "engine/export.h"
#include "engine/file_io.h"
#include "engine/heartbeat.h"
#include "engine/length_probe.h"
#include "engine/loss_plot.h"
#include "engine/output_paths.h"
#include "engine/probe_plot.h"
#include "engine/ranks_agree.h"
#include "engine/run_log.h"
#include "engine/stop_signal.h"
#include "engine/trainer.h"
#include "parallel/data_parallel.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#include "engine/gpu_profile.h"
#endif

namespace ul {

namespace {

// The error record of a step or save that failed, best effort: a log that cannot be written (the
// full disk that failed the save) must not replace the error being reported.
void log_error(RunLog* log, int step, const std::string& message) {
  if (!log) return;
  try {
    log->error(step, message);
  } catch (const std::exception&) {
  }
}

// The time left, to the precision that matters: "45s", "12m05s", "3h07m", "2d04h".
std::string eta_text(double seconds) {
  const long long t = std::llround(std::max(0.0, std::min(seconds, 1e9)));
  char b[32];
  if (t < 60) std::snprintf(b, sizeof b, "%llds", t);
  else if (t < 3600) std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400) std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, t % 3600 / 60);
  else std::snprintf(b, sizeof b, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
  return b;
}

// " | 0-63 3.1234 | 64-127 2.9876 ...": the val loss of each position band ("-": no target there).
std::string position_cells(const std::vector<PositionLoss>& bands) {
  std::string line;
  for (const PositionLoss& p : bands) {
    char cell[64];
    if (p.count) std::snprintf(cell, sizeof cell, " | %d-%d %.4f", p.lo, p.hi - 1, p.loss);
    else std::snprintf(cell, sizeof cell, " | %d-%d -", p.lo, p.hi - 1);
    line += cell;
  }
  return line;
}

}  // namespace

int train_rank(const Options& o, Comm& world) {
  const bool lead = world.rank() == 0;
  auto say = [&](const char* fmt, auto... args) {
    if (lead && !o.quiet) {
      std::printf(fmt, args...);
      std::fflush(stdout);
    }
  };
  // From the start: a SIGTERM or SIGUSR1 during a long start-up (a large checkpoint loading) would
  // otherwise end the process by its default action; it stops the run before its first step.
  install_stop_handlers();
  if (lead) test_hold("start-up");
  check_output_paths(o);  // before anything is opened for writing: the log is, when the Trainer is made
  // Before anything in --save-dir is touched (its crashed saves removed, its log opened).
  std::unique_ptr<SaveDirLock> save_dir_lock;
  if (lead && !o.save_dir.empty()) save_dir_lock = std::make_unique<SaveDirLock>(o.save_dir);
  Trainer tr(o, world);
  // Refuses bad export / sample flags before any step; samples split documents as training does.
  // A sample or a probe decodes beside what the run still holds (every rank on this machine).
  const bool weights_copied = tr.context().device != Device::cpu;
  const RunOutputs outputs(o, tr.model().cfg, tr.document_start(), &world, tr.decoder_room(false), weights_copied);
  Grid& g = tr.grid();
  Transformer& model = tr.model();
  const bool synthetic = tr.val_data().synthetic();  // evals report the accuracy over answer tokens
  // Every rank on this machine decodes at once: each gets its share of the memory.
  check_probe_lengths(o.probe_lengths, tr.val_data(), model.cfg, o.seq, tr.decoder_room(true), weights_copied);
  say("ulysses | %s | %.2fM parameters\n", model.cfg.describe().c_str(), model.params.numel() / 1e6);
  std::string layout;
  try {
    layout = tr.train_data().layout(o.seq);
  } catch (const std::exception& e) {  // (a --steps 0 run, which no step's check reached: recall too short)
    throw std::runtime_error("--data: " + std::string(e.what()));
  }
  if (tr.document_start() >= 0)  // which token splits documents (--eot, or the data's own)
    layout += (layout.empty() ? "" : " | ") + std::string("--doc-mask: documents start at token ") +
              std::to_string(tr.document_start());
  // (an export or a sample alone reads none of it: said, rather than a line that suggests it does)
  if (o.steps == 0 && !o.evaluates() && o.probe_lengths.empty())
    layout += (layout.empty() ? "" : " | ") + std::string("not read (--steps 0 with no eval)");
  say("data    | %s%s%s\n", tr.train_data().describe().c_str(), layout.empty() ? "" : " | ", layout.c_str());
  if (!o.val_data.empty()) say("val     | %s\n", tr.val_data().describe().c_str());
  // --data's own held-out tenth is its val split, which --val-data replaces: those tokens train
  // nothing (fineweb_train_*.bin beside --val-data fineweb_val_*.bin: a tenth of the corpus).
  if (!o.val_data.empty() && !same_data_files(o.val_data, o.data) && o.steps > 0)  // (the same files: that very split)
    if (const int64_t held = tr.train_data().held_out_tokens(); held > 0)
      say("note    | --data holds out its last %lld tokens as its val split, which --val-data replaces: they train "
          "nothing (shards: a glob that also matches *val* files makes those the val split and trains on all of the "
          "others, without --val-data)\n", (long long)held);
  // A checkpoint of a run that packed documents (--doc-mask, in the rank_0.json beside its
  // model.bin) used without it: every sequence, eval and sample attends across documents, as the
  // model never did. Only a note: training on without the masks may be meant.
  if (!o.checkpoint.empty() && !o.doc_mask) {
    const std::string doc = checkpoint_doc_mask(o.checkpoint);
    // The flags to give, with the run's --data where this run's is another (the default passkey
    // task has no documents: --doc-mask alone is refused there, even for a run that only samples).
    const std::string data = checkpoint_data(o.checkpoint);
    const std::string give = doc + (!data.empty() && data != o.data ? " --data " + data : "");
    if (!doc.empty())
      say("note    | %s's run trained with %s (its rank_0.json): without it this run attends across "
          "documents, as the model never did (give %s)\n", o.checkpoint.c_str(), doc.c_str(), give.c_str());
  }
  // A checkpoint evaluated, sampled or trained on without --data runs on the default passkey task,
  // whose 32 ids are other tokens to a model of text: its evals would mean nothing, unsaid.
  if (!o.checkpoint.empty() && !o.set_by_user("--data") && !o.resume &&
      (o.steps > 0 || o.evaluates() || !o.probe_lengths.empty()))  // (an export or a sample reads no data)
    if (const std::string data = checkpoint_data(o.checkpoint); !data.empty() && data != o.data)
      say("note    | %s was trained on --data %s (its rank_0.json); this run reads --data %s, the default: its "
          "evals and probes measure another task (give --data %s)\n", o.checkpoint.c_str(), data.c_str(),
          o.data.c_str(), data.c_str());
  // A checkpoint over files a much smaller tokenizer wrote (train prepare's default byte shards or
  // text:FILE under GPT-2; GPT-2's shards under Llama 3): the ids name other tokens than the model
  // learned. Only a note: a model may have been trained on those ids. (A tokenizer's vocabulary
  // short of its model's padded one, Qwen 2.5's 151665 of 151936, is no mismatch.)
  if (!o.checkpoint.empty())
    if (const int named = token_kind_vocab(tr.train_data().token_kind()); named > 0 && model.cfg.vocab - named > 1024)
      say("note    | --data's files name %d token ids (%s) but %s's model has %d: unless it was trained on "
          "this tokenizer's ids, they are other tokens than it learned\n", named, tr.train_data().token_kind().c_str(),
          o.checkpoint.c_str(), model.cfg.vocab);
  if (!outputs.prompt_note().empty()) say("note    | %s\n", outputs.prompt_note().c_str());
  // The same for training: a step's sequences (G) past the train split's end wrap into the next
  // epoch, so a split smaller than G trains on some sequences several times in every step.
  const int64_t step_reads = int64_t(o.grad_accum) * g.dp * o.batch;
  const int64_t train_holds = o.steps > 0 ? tr.train_data().num_sequences(o.seq) : -1;
  if (train_holds >= 0 && step_reads > train_holds)
    say("note    | a step reads %lld train sequences (--batch x --grad-accum x dp) but the train split holds %lld at "
        "--seq %d: each step repeats some\n", (long long)step_reads, (long long)train_holds, o.seq);
  // The data's place in epochs of the train split (the log's step records, the done line); -1 for
  // unlimited (synthetic) data.
  auto epoch_now = [&] { return train_holds > 0 ? double(tr.next_sequence()) / double(train_holds) : -1.0; };
  // --offload moves every block's output but the last two's (engine/offload.h).
  if (o.offload && o.steps > 0 && model.cfg.layers <= 2)
    say("note    | --offload with %d layer(s) moves nothing to the host (the last two blocks' outputs stay on the "
        "device): plain --recompute holds the same or less\n", model.cfg.layers);
  // A checkpoint trained with a RoPE scaling (Llama 3.1/3.2's llama3 rule) runs with the flag's
  // instead. (A resume's weights come from --save-dir, trained with what the run gave them.)
  if (!tr.replaced_rope_scaling().empty() && !o.resume)
    say("note    | --rope-scaling %s replaces %s's own %s (the scaling its weights were trained with): for a length "
        "it already reaches, leave the flag out\n", o.rope_scaling.c_str(), o.checkpoint.c_str(),
        tr.replaced_rope_scaling().c_str());
  // A gpt2's learned positions end at max_seq (a longer sample is refused); a llama's RoPE runs on,
  // but past the length it was trained at (or configured for), the text may be noise. The length
  // trained at: this run's --seq when it trains, else its checkpoint's (rank_0.json; a preset's
  // max_seq, 1M, says nothing of what a model trained at 256 can do).
  // (a fine-tune of a --checkpoint at a shorter --seq: the longer of the two; an imported file
  // records none but its max_seq, the note above's)
  int trained_seq = o.steps > 0 || o.resume ? o.seq : -1;
  if (!o.checkpoint.empty() && !o.resume) {
    const int saved = checkpoint_seq(o.checkpoint);
    trained_seq = saved > 0 ? std::max(trained_seq, saved) : -1;
  }
  if (model.cfg.is_llama() && outputs.sample_positions() > model.cfg.max_seq)
    say("note    | --sample: the prompt and %d new tokens run the model at %lld positions, past the model's max_seq %d (the "
        "length it was trained or configured for): the sample past it tests extrapolation\n", o.sample,
        (long long)outputs.sample_positions(), model.cfg.max_seq);
  else if (trained_seq > 0 && outputs.sample_positions() > trained_seq)  // (a gpt2's position rows past it: untrained)
    say("note    | --sample: the prompt and %d new tokens run the model at %lld positions, past the --seq %d it trained "
        "at%s: %s\n", o.sample, (long long)outputs.sample_positions(), trained_seq,
        trained_seq == o.seq && (o.steps > 0 || o.resume) ? "" : (" (" + o.checkpoint + "'s rank_0.json)").c_str(),
        model.cfg.is_llama() ? "the sample past it tests extrapolation"
                             : "its learned positions past it had no gradient in that run (unless an earlier run "
                               "trained them), so the sample past it may be noise");
  // transformers' from_pretrained(DIR) looks for DIR/model.safetensors (or an index) only.
  if (!o.export_safetensors.empty() &&
      std::filesystem::path(o.export_safetensors).filename() != "model.safetensors")
    say("note    | --export-safetensors %s: transformers' from_pretrained(DIR) reads DIR/model.safetensors, not this "
        "name (this engine's --checkpoint reads it by its path)\n", o.export_safetensors.c_str());
  // A sharded checkpoint beside the export (a run that imported DIR's index, fine-tuned, and exports
  // to DIR/model.safetensors): the export replaces config.json, which the old shards' index is then
  // read with (by this engine's --checkpoint INDEX, shapes alike, the old weights under the new
  // RoPE or window).
  if (!o.export_safetensors.empty()) {
    const std::filesystem::path index =
        std::filesystem::path(o.export_safetensors).parent_path() / "model.safetensors.index.json";
    std::error_code ec;
    if (std::filesystem::exists(index, ec))
      say("note    | --export-safetensors %s: %s beside it lists a sharded checkpoint's files, which the "
          "config.json written here does not describe: move the export or the shards (transformers reads "
          "model.safetensors first; --checkpoint %s would read their weights with this config)\n",
          o.export_safetensors.c_str(), index.string().c_str(), index.string().c_str());
  }
  // ZeRO-1 shards AdamW's state over the world: one rank's shard is all of it.
  if (o.zero && o.steps > 0 && world.size() == 1)
    say("note    | --zero 1 with one rank shards nothing (its shard is the whole AdamW state): it saves memory only "
        "over several ranks\n");
  // --steps 0 reads no training flag: a command line copied from a training run would keep them.
  if (o.steps == 0) {
    std::string unread;
    for (const char* f : {"--lr", "--warmup", "--schedule", "--decay-frac", "--final-lr-frac", "--weight-decay", "--eval-every",
                          "--grad-clip", "--beta1", "--beta2", "--adam-eps", "--grad-accum", "--zero", "--recompute",
                          "--offload", "--save-every", "--keep"})
      if (o.set_by_user(f)) unread += std::string(unread.empty() ? "" : ", ") + f;
    // An export or sample alone evaluates nothing (--eval-batches asks for the eval).
    if (!o.evaluates())  // (--probe-lengths read the val split too)
      for (const char* f : {"--val-data", "--loss-by-position"})
        if (o.set_by_user(f) && !(o.probe_lengths.size() && std::string(f) == "--val-data"))
          unread += std::string(unread.empty() ? "" : ", ") + f;
    if (!unread.empty()) say("note    | --steps 0 trains nothing%s: %s not read\n",
                             o.evaluates() ? "" : " and evaluates nothing (give --eval-batches N for an eval)", unread.c_str());
  }
  // An eval reads --eval-batches x dp x --batch val sequences; past the split's end they wrap.
  const int64_t eval_reads = int64_t(o.eval_batches) * g.dp * o.batch;
  if ((o.evaluates() || !o.probe_lengths.empty()) && eval_reads > INT32_MAX)  // their sequence counts are ints
    throw std::runtime_error("--eval-batches x dp x --batch = " + std::to_string(eval_reads) +
                             " val sequences an eval reads, more than 2^31 - 1");
  const int64_t val_holds = o.evaluates() ? tr.val_data().num_sequences(o.seq) : -1;  // -1: unlimited (synthetic)
  if (val_holds >= 0 && eval_reads > val_holds)
    say("note    | an eval reads %lld val sequences (--eval-batches x dp x --batch) but the val split holds %lld at "
        "--seq %d: some count more than once\n", (long long)eval_reads, (long long)val_holds, o.seq);
  // Packing splits --val-data's sequences at the training data's end-of-text token, the one the
  // model learned documents by; data that names another says so.
  if (tr.document_start() >= 0 && !o.val_data.empty() && tr.val_data().eot() >= 0 &&
      tr.val_data().eot() != tr.document_start())
    say("note    | --doc-mask: --val-data's files start documents at token %d, the run at %d (--eot): its "
        "sequences are split at %d\n", tr.val_data().eot(), tr.document_start(), tr.document_start());
  std::string gpu;  // which GPU rank 0 runs on, and its memory before the run took any
#if ULYSSES_HAVE_CUDA
  if (tr.context().device == Device::cuda) gpu = " | " + cuda_gpu_at_start().describe();
#endif
  // (what this run holds: a --steps 0 run has no gradients, and a bf16 one masters only when it
  // exports, samples or probes)
  std::string held;
  if (model.params.grad()) held = "f32 gradients";
  if (o.precision == "bf16" && model.params.has_masters())
    held += std::string(held.empty() ? "" : ", ") + "f32 master weights";
  say("device  | %s, %s parameters and activations%s%s\n", device_name(tr.context().device),
      o.precision == "bf16" ? "bf16" : "fp32", held.empty() ? "" : (" (" + held + ")").c_str(), gpu.c_str());
  say("world   | %d rank(s) = dp %d x sp %d (%s) | %d thread(s) per rank%s | batch %d x seq %d x accum %d\n",
      world.size(), g.dp, g.sp, world.backend(), tr.threads(),
      o.threads == 0 && omp_num_threads_env() > 0 ? " (OMP_NUM_THREADS)" : "", o.batch, o.seq, o.grad_accum);
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env && o.threads == 0 && omp_num_threads_env() == 0)
    say("note    | OMP_NUM_THREADS=%s is not a number of threads in [1, 1024]: ignored (--threads sets them)\n", env);
  // Where the ranks landed (parallel/hosts.h): an sp group split over machines runs its all-to-alls
  // over the network, and every step waits for it.
  const std::vector<int> across = sp_groups_across_hosts(tr.hosts(), g.sp);
  if (!across.empty())
    say("note    | %zu of %d sp group(s) span machines (the first: ranks %d-%d): their all-to-alls cross the network; "
        "give each machine a multiple of --sp %d ranks, numbered machine by machine (mpirun --map-by slot, srun's "
        "block distribution)\n", across.size(), g.dp, across[0] * g.sp, across[0] * g.sp + g.sp - 1, g.sp);
  if (const std::string gpu = shared_gpu(tr.hosts()); !gpu.empty())
    say("note    | %s: each rank picks its GPU by its rank on the machine (the launcher's local rank): give each rank "
        "its own, or expect them to share its memory and time\n", gpu.c_str());
  // OMP_PROC_BIND pins each process's (or, --comm local, the one process's) OpenMP threads to the
  // places of the CPU set it started with: ranks that share a set then all run on its first places,
  // the rest of its cores idle, whatever the thread count says.
  if (omp_get_proc_bind() != omp_proc_bind_false && tr.hosts().sharing_cpus() > 1)
    say("note    | OpenMP binds threads (OMP_PROC_BIND or OMP_PLACES) and %d ranks of this machine share one CPU "
        "set: every rank's threads go to its same first cores; set OMP_PROC_BIND=false%s\n", tr.hosts().sharing_cpus(),
        std::strcmp(world.backend(), "local") == 0
            ? ""
            : ", or bind the ranks apart (mpirun --bind-to core --map-by slot:PE=N, srun --cpu-bind=cores)");

  // Where this run starts: step 0, or the newest complete checkpoint under --resume.
  int start = 0;
  const RunLayout spread = run_layout(o, g);
  RunLayout saved = spread;
  ResumeNotes notes;  // a rollback's moves, or the pending rollback a plain resume took up
  if (!o.save_dir.empty()) start = start_from_save_dir(tr, o.save_dir, o.resume, saved, &notes);
  // A --stop-after stage requeued at its own pause has no step left either (its checkpoint loads
  // to make up an eval a signal skipped there).
  const int stage_end = o.stop_after > 0 ? std::min(o.stop_after, o.steps) : o.steps;
  // A --save-dir this run cannot write (read-only, another user's) would fail its first save, after
  // the training it was to keep: at the last step unless --save-every says sooner.
  if (!o.save_dir.empty() && start < stage_end) {
    int32_t err = lead ? save_dir_write_error(o.save_dir) : 0;
    world.broadcast(&err, 1, DType::i32, 0);
    const std::string first_save =
        std::to_string(o.save_every > 0 ? std::min(stage_end, (start / o.save_every + 1) * o.save_every) : stage_end);
    if (err != 0)
      throw std::runtime_error("--save-dir " + o.save_dir + ": cannot create a checkpoint there (" +
                               std::strerror(err) + "); this run would save at step " + first_save);
    // Every rank writes its rank_R.json there (and under --zero 1 its AdamW shard): a directory
    // that is another on another machine (node-local, a relative path from another working
    // directory) or that it cannot write would fail the first save, after the training.
    if (world.size() > 1) {
      const int mine = lead ? 0 : save_dir_write_error(o.save_dir);
      agree_on_errors(world, mine == 0 ? "" : "--save-dir " + o.save_dir + ": cannot create a checkpoint there (" +
                                                  std::strerror(mine) + ") where rank 0 could: every rank writes its "
                                                  "files there, so it must be one directory on a filesystem every "
                                                  "rank's machine shares; this run would save at step " + first_save);
    }
    // A filesystem without room for one more checkpoint (a new one is written before --keep removes
    // an old one) fails the first save, hours of training later for a large model: said now.
    if (lead) {
      const double need = double(model.params.numel()) * 12;  // f32 weights and AdamW's m and v
      std::error_code ec;
      double free_bytes = double(std::filesystem::space(o.save_dir, ec).available);
      if (const char* t = std::getenv("ULYSSES_TEST_FREE_BYTES")) free_bytes = std::atof(t), ec.clear();  // TEST HOOK
      if (!ec && free_bytes < need)
        say("note    | --save-dir %s: its filesystem has %s free, a checkpoint of this model needs about %s (12 "
            "bytes a parameter): the save at step %s fails unless space is freed first\n", o.save_dir.c_str(),
            bytes_text(free_bytes).c_str(), bytes_text(need).c_str(), first_save.c_str());
    }
  }
  if (o.auto_resume && !o.resume)  // (settled: none found)
    say("resume  | --auto-resume: %s holds no complete checkpoint: starting a fresh run\n", o.save_dir.c_str());
  if (o.resume && !notes.stage_done && start < stage_end)
    say("resume  | %s/%s: continuing after step %d of %d\n", o.save_dir.c_str(), step_dir_name(start).c_str(), start,
        o.steps);
  else if (o.resume && !notes.stage_done)  // "done | nothing to do" follows, once the evals are made
    say("resume  | %s/%s: the checkpoint is at step %d, %s %d: no step left\n", o.save_dir.c_str(),
        step_dir_name(start).c_str(), start, stage_end < o.steps ? "--stop-after" : "--steps", stage_end);
  if (notes.repeat)
    say("resume  | --resume-step %d was done before (%s) and its run has saved since: going on from its newest "
        "checkpoint, as --resume would (to roll back to step %d once more, remove that record first)\n", o.resume_step,
        rollback_record_path(o.save_dir).c_str(), o.resume_step);
  if (!notes.moved.empty())  // newest first
    say("resume  | rolled back: %s%s moved aside, no longer resumable (delete them when sure)\n",
        notes.moved.back().c_str(),
        notes.moved.size() > 1 ? (" and the " + std::to_string(notes.moved.size() - 1) + " newer").c_str() : "");
  if (notes.applied)
    say("resume  | the rollback to this step of %s (%s): step %d trains on sequences from %lld, %lld a step%s\n",
        rollback_time(*notes.applied).c_str(), rollback_record_path(o.save_dir).c_str(), start + 1,
        (long long)notes.applied->data_sequence, (long long)notes.applied->sequences_per_step,
        saved.seq != o.seq ? (" (at --seq " + std::to_string(saved.seq) + ")").c_str() : "");
  const int64_t G = spread.sequences_per_step(), G_saved = saved.sequences_per_step();
  // The steps' data this start skipped (a rollback's; not the same command repeated after its run saved).
  const int skipped = o.resume_step >= 0 && !notes.repeat ? o.skip_batches : 0;
  if (G != G_saved)  // --change-global-batch, now or in the pending rollback (else refused)
    say("resume  | another global batch: saved at %lld sequences a step (%s), now %lld (%s): the data goes on from "
        "sequence %lld (not the run never stopped)\n", (long long)G_saved, saved.str().c_str(), (long long)G,
        spread.str().c_str(), (long long)(tr.next_sequence() - int64_t(skipped) * G));
  else if (!saved.same_sums(spread))
    say("resume  | another layout: saved at %s; now %s: the same %lld sequences a step, summed in another order "
        "(not bit-exact)\n", saved.str().c_str(), spread.str().c_str(), (long long)G);
  else if (o.change_global_batch && !notes.stage_done)
    say("note    | --change-global-batch: this resume keeps the checkpoint's %lld sequences a step\n", (long long)G);
  // An eval reads --eval-batches x dp x --batch val sequences (not --grad-accum's): another split of
  // the same step between them changes the val set the curve is measured on, unless --eval-batches
  // changed with it (the checkpoint does not record it: said either way).
  const int64_t per_now = int64_t(spread.dp) * spread.batch, per_saved = int64_t(saved.dp) * saved.batch;
  if (o.evaluates() && per_now != per_saved && !notes.stage_done)
    say("note    | an eval reads --eval-batches x dp x --batch val sequences: dp x --batch was %lld and is now %lld, "
        "so the val set of the evals before takes %g x the earlier run's --eval-batches (else the val losses are "
        "measured on another set)\n", (long long)per_saved, (long long)per_now, double(per_saved) / double(per_now));
  if (saved.seq != o.seq)  // --change-seq (else refused)
    say("resume  | another sequence length: saved at --seq %d, now %d: step %d trains on sequences from %lld at %d "
        "(%s); AdamW's state and the schedule go on\n", saved.seq, o.seq, start + 1, (long long)tr.next_sequence(),
        o.seq, tr.train_data().num_sequences(o.seq) < 0 ? "a fresh draw each, as before"
                                                        : "where the data's epoch stood, at the new length");
  else if (o.change_seq && !notes.stage_done)
    say("note    | --change-seq: this resume keeps the checkpoint's --seq %d\n", o.seq);
  if (!notes.rope_before.empty())  // --change-rope (else refused)
    say("resume  | another RoPE: saved with %s, now %s: the weights and AdamW's state go on under the new rotation\n",
        notes.rope_before.c_str(), rope_text(tr.model().cfg).c_str());
  else if (o.change_rope && !notes.stage_done)
    say("note    | --change-rope: this resume keeps the checkpoint's RoPE (%s)\n", rope_text(tr.model().cfg).c_str());
  // A resume may lengthen or shorten the run: the schedule is then one of the new --steps (under
  // wsd, lengthened before its decay began, the same rates; otherwise the curve bends or, past a
  // decay already begun, climbs back). Said where the next step's rate moves, since a wrong --steps
  // in a requeued job's script would otherwise pass unseen.
  if (o.resume && saved.steps >= 0 && saved.steps != o.steps && start < stage_end && !notes.stage_done) {
    const LrSchedule was{o.schedule, saved.steps, o.warmup, o.lr, o.final_lr_frac, o.decay_frac};
    const LrSchedule now{o.schedule, o.steps, o.warmup, o.lr, o.final_lr_frac, o.decay_frac};
    // The first step both schedules have whose rate moves (a shortened wsd run's decay begins sooner;
    // a cosine run's curve bends, maybe only past its warmup); but a wsd run lengthened: the next
    // step's alone (lengthened before its decay it keeps every rate until the new decay: what
    // lengthening is for).
    // A finished run lengthened starts past its old schedule's end (whose rate stays the floor):
    // the next step is compared all the same (a cosine run's rate climbed back unsaid).
    const int last = o.steps > saved.steps && o.schedule == "wsd" ? start + 1
                                                                  : std::max(start + 1, std::min(o.steps, saved.steps));
    for (int s = start; s < last; s++)
      if (lr_at(s, was) != lr_at(s, now)) {
        say("resume  | --steps %d where the checkpoint's run had %d: the %s schedule is one of %d steps from here "
            "(step %d's rate %.6g, %.6g under --steps %d)\n", o.steps, saved.steps, o.schedule.c_str(), o.steps,
            s + 1, double(lr_at(s, now)), double(lr_at(s, was)), saved.steps);
        break;
      }
  }
  // A run no longer than its warmup never reaches --lr, nor decays (unless a resume has no step left).
  if (o.steps > 0 && o.steps < o.warmup && start < stage_end)
    say("note    | --steps %d < --warmup %d: the run ends inside the warmup, at lr %.3g (--lr %.3g)\n", o.steps, o.warmup,
        double(o.lr) * o.steps / o.warmup, double(o.lr));
  else if (o.steps > 0 && o.steps == o.warmup && o.schedule != "constant" && start < stage_end)
    say("note    | --steps %d = --warmup: the run ends as its warmup does, at --lr, with no %s decay\n", o.steps,
        o.schedule.c_str());
  if (skipped > 0)  // applied by start_from_save_dir, before the newer checkpoints were moved
    say("resume  | skipping %d step(s)' data (%lld sequences): step %d trains on sequences %lld to %lld\n",
        skipped, (long long)(int64_t(skipped) * G), start + 1, (long long)tr.next_sequence(),
        (long long)(tr.next_sequence() + G - 1));
  const std::string log_path = o.log_path();
  std::unique_ptr<RunLog> log;
  // The resume record names the data's place when it is not where the step puts it.
  if (lead && !log_path.empty() && !notes.stage_done)  // (a stage done has nothing to log)
    log = std::make_unique<RunLog>(log_path, o.resume ? start : -1,
                                   tr.next_sequence() != int64_t(start) * G ? tr.next_sequence() : -1,
                                   saved.seq != o.seq ? o.seq : 0,
                                   notes.rope_before.empty() ? "" : rope_text(tr.model().cfg));

  double first_loss = 0, last_loss = 0;
  size_t peak_act = 0;  // the arena high-water of the run (train --plan predicts it)
  bool trained = false;  // a step ran (a resume's cut made-up eval can stop the run before any)
  EvalResult ev;
  bool have_eval = false, final_eval = false;  // any eval so far; the one after the last step
  const double tokens = double(g.dp) * o.batch * o.seq * o.grad_accum;
  Heartbeat beat(lead && !o.quiet ? o.heartbeat : 0);
  if (o.device == "cuda") beat.milestones_are("queued");  // (launched: the GPU runs them in order after)
  if (lead && !o.quiet && o.heartbeat > 0) model.progress = [&beat](const std::string& where) { beat.at(where); };
  // The stop signal every rank sees: the highest any caught (it may have reached one process only),
  // but a SIGPIPE (13) lowest: a person's or a scheduler's signal on another rank names the stop.
  // A collective: every rank calls it at the same point.
  auto agreed_stop_signal = [&] {
    int32_t sig = stop_signal();
    if (world.size() > 1) {  // ranked: none 0, SIGPIPE 1, any other 100 + its number
      int32_t rank = sig == 0 ? 0 : sig == SIGPIPE ? 1 : 100 + sig;
      world.all_reduce(&rank, 1, DType::i32, ReduceOp::max);
      sig = rank == 0 ? 0 : rank == 1 ? SIGPIPE : rank - 100;
    }
    return int(sig);
  };
  // A stop signal cuts an eval short (Trainer::evaluate, every rank before the same batch): nothing
  // of it is logged, so a --resume from this step's checkpoint runs it again in full (the made-up
  // eval below) when the step is one it evaluates at: --eval-every's, the last, or the same
  // --stop-after's.
  // The steps a run evaluates at: --eval-every's and the last (scheduled), and --stop-after's.
  auto scheduled_eval = [&](int step) { return (o.eval_every > 0 && step % o.eval_every == 0) || step == o.steps; };
  auto evaluates_at = [&](int step) { return scheduled_eval(step) || step == o.stop_after; };
  auto say_cut = [&](const char* what, int step, const EvalResult& r, int of) {
    const int sig = agreed_stop_signal();
    const bool due = scheduled_eval(step);
    say("%s %5d | cut short by %s before batch %d of %d | not logged%s\n", what, step, stop_signal_name(sig),
        r.cut_at + 1, of,
        o.save_dir.empty() || step == 0 ? ""
        : due                           ? " (a --resume runs it)"
                                        : " (a --resume with this --stop-after runs it)");
  };
  // One eval at `step`: its line, and after the run's last one the task's probes: the same eval with
  // one random setting held fixed (passkey: the needle at depths 0 to 1), one line saying where in
  // the context retrieval fails. The log record carries both. False when a stop signal cut it short.
  // The plots, redrawn as the run goes (at its first eval, then at most once a minute of evals and
  // saves), so a long run's loss can be watched, and a run that fails keeps them up to its last eval
  // (the end draws them again). Quietly: a failure here is the end's to report.
  double plots_drawn_ms = -1e300;
  auto redraw_plots = [&] {
    if (!log || now_ms() - plots_drawn_ms < 60000) return;
    plots_drawn_ms = now_ms();
    std::string failed;
    write_run_plots(log_path, failed);
  };
  auto run_eval = [&](int step, bool last) -> bool {
    Heartbeat::Phase phase = beat.begin("eval " + std::to_string(step));
    EvalResult now;
    try {
      now = tr.evaluate();
    } catch (const std::exception& e) {
      log_error(log.get(), step, std::string("eval: ") + e.what());  // as a step's: the log says why
      throw;
    }
    phase.end();  // (before the eval's own line)
    if (now.cut_short()) {
      say_cut("eval ", step, now, o.eval_batches);
      return false;
    }
    ev = std::move(now);
    have_eval = true, final_eval = last;
    if (synthetic)
      say("eval  %5d | val loss %.4f | accuracy %.2f%% over %lld answer tokens | whole answers %.2f%% of %lld\n", step,
          ev.loss, 100.0 * ev.accuracy, (long long)ev.answers, 100.0 * ev.whole_accuracy, (long long)ev.whole_answers);
    else
      say("eval  %5d | val loss %.4f\n", step, ev.loss);
    if (!ev.by_position.empty())  // --loss-by-position: one line of bands
      say("eval  %5d | val loss by position%s\n", step, position_cells(ev.by_position).c_str());
    std::vector<std::pair<std::string, std::unique_ptr<Dataset>>> probes;
    if (last) probes = tr.val_data().probes();
    std::string line;
    int64_t answers = 0;
    for (const auto& [name, data] : probes) {
      Heartbeat::Phase probe_phase = beat.begin("probe " + name);
      const EvalResult e = tr.evaluate(*data);
      probe_phase.end();
      if (e.cut_short()) {  // the eval is left unlogged with its probes: the resume makes both
        final_eval = false;
        say_cut("probe", step, e, o.eval_batches);
        return false;
      }
      ev.probes.emplace_back(name, e.accuracy);
      char cell[96];
      std::snprintf(cell, sizeof cell, " | %s: %.2f%%", name.c_str(), 100.0 * e.accuracy);
      line += cell;
      answers = e.answers;
    }
    if (!probes.empty())
      say("probe %5d%s (accuracy, %lld answer tokens each)\n", step, line.c_str(), (long long)answers);
    if (log) log->eval(step, ev);
    redraw_plots();
    return true;
  };
  int stopped_by = 0, stopped_at = 0;  // a stop signal: which, and after which step
  // A signal during start-up: nothing is trained, nothing new saved (a resume's checkpoint stays as
  // it was), and the run ends before its first step.
  bool stopped_early = false, made_up_eval = false;
  started_training();  // a signal from here on: "after this step" (one just before may still stop it here)
  if (const int sig = agreed_stop_signal()) {
    stopped_by = sig, stopped_at = start, stopped_early = true;
    if (log) log->stop(start, stop_signal_name(sig));
  }
  // The eval due at the step a resume starts from may never have run: a stop signal saves before
  // its step's eval and skips it (a scheduler's grace period is for the checkpoint), and a run can
  // die during one. The log read back tells (rank 0 has it); the eval runs now if it is missing, so
  // the val history matches the run never stopped. Not at another --seq or RoPE: that eval would
  // be the new stage's, logged as the old one's step.
  // --stop-after's step evaluates whatever --eval-every says, the last step always (with its
  // probes): a run killed during its final eval, resumed, has no step left but that eval to make.
  const bool final_step = start == o.steps;
  if (!stopped_early && o.resume && start > 0 && start <= o.steps && !notes.stage_done &&
      evaluates_at(start) && saved.seq == o.seq && notes.rope_before.empty()) {
    int32_t missing = 0;
    if (lead && log) {
      missing = 1;
      for (const LogRecord& rec : read_run_log(log->path(), nullptr, {{"eval"}, {"step"}}))
        if (rec.count("type") && rec.at("type") == "eval" && rec.count("step") && rec.at("step") == std::to_string(start))
          missing = 0;
    }
    world.broadcast(&missing, 1, DType::i32, 0);
    made_up_eval = missing && run_eval(start, final_step);
    // A signal during that eval stops the run now (the checkpoint at `start` is there already).
    if (const int32_t sig = missing ? agreed_stop_signal() : 0) {
      stopped_by = sig, stopped_at = start;
      if (log) log->stop(start, stop_signal_name(sig));
    }
  }
  const double loop_t0 = now_ms();  // the ETA: this process's wall time per step so far, evals and saves included
  // --stop-after: the loop ends there, saved and evaluated; the schedule (and the final evals,
  // probes, exports and sample, at --steps) are the whole run's.
  const int until = o.stop_after > 0 ? o.stop_after : o.steps;
  if (o.profile_step > 0 && until <= start)
    say("note    | --profile-step %d: this run has no step left to train, so no step is profiled\n", o.profile_step);
  else if (o.profile_step > 0 && (o.profile_step <= start || o.profile_step > until))
    say("note    | --profile-step %d: this run trains steps %d to %d, so no step is profiled\n", o.profile_step,
        start + 1, until);
  // Threads of one process share a GPU's legacy stream: one rank's two events bracket the other
  // ranks' kernels launched between them too (the emulator gives each thread its own stream).
  if (o.profile_step > 0 && o.comm == "local" && world.size() > 1 && tr.context().device == Device::cuda)
    say("note    | --profile-step with %d local ranks on one GPU: they share its stream, so rank 0's times of "
        "an op include the other ranks' kernels launched meanwhile (profile one rank for an op's own time)\n",
        world.size());
  for (int s = start; s < until && !stopped_by; s++) {
    Heartbeat::Phase phase = beat.begin("step " + std::to_string(s + 1) + "/" + std::to_string(o.steps));
#if ULYSSES_HAVE_CUDA
    const bool profiled = o.profile_step == s + 1;
    if (profiled) gpu_profile::start();  // this rank's ops only (each rank's thread records its own)
#endif
    StepResult r;
    try {
      r = tr.step();
    } catch (const std::exception& e) {
      // In the log too: an unattended run resumed by its scheduler fails here again, and the log
      // is what says why (a step that fails is the same step on every resume).
      log_error(log.get(), s + 1, e.what());
      throw;
    }
    phase.end();  // (before the step's own line)
    std::string profile;  // the step's GPU time per op, printed under its line
#if ULYSSES_HAVE_CUDA
    if (profiled) {
      gpu_profile::stop();
      profile = gpu_profile::table(gpu_profile::report(), r.ms);
    }
#endif
    if (s == start) first_loss = r.loss;
    peak_act = std::max(peak_act, r.act_bytes);
    last_loss = r.loss;
    trained = true;
    if (log) log->step(s + 1, r, tokens / (r.ms / 1000.0), epoch_now());
    // ZeRO-1 moves the gradients by reduce-scatter and the weights by all-gather: their own columns.
    char zero_sent[64] = "";
    if (o.zero)
      std::snprintf(zero_sent, sizeof zero_sent, " rs %.2f MiB ag %.2f MiB", r.sent.reduce_scatter / 1048576.0,
                    r.sent.all_gather / 1048576.0);
    // (to the --stop-after pause when there is one: the step counter beside it is the whole run's)
    const std::string eta = s + 1 < until ? " | eta " + eta_text((now_ms() - loop_t0) / 1000.0 / (s + 1 - start) *
                                                                 (until - s - 1)) +
                                                (until < o.steps ? " (to --stop-after " + std::to_string(until) + ")" : "")
                                          : "";
    say("step %5d/%d | loss %.4f | norm %.3f | lr %.2e | %.1f ms | %.0f tok/s | act %.1f MiB | a2a %.2f MiB ar %.2f MiB%s%s\n",
        s + 1, o.steps, r.loss, r.grad_norm, r.lr, r.ms, tokens / (r.ms / 1000.0), r.act_bytes / 1048576.0,
        r.sent.all_to_all / 1048576.0, r.sent.all_reduce / 1048576.0, zero_sent, eta.c_str());
    if (!profile.empty()) say("%s", profile.c_str());
    test_hold("step " + std::to_string(s + 1));
    // A mask that splits nothing on any rank (the sum counts each sp group's sequences sp times;
    // only zero matters).
    // Long documents (books, each longer than --seq) do this with the right token; a --eot given
    // by hand may also be the wrong one (one the data's files name is theirs).
    if (s == start && tr.document_start() >= 0 && global_count(world, r.packed) == 0)
      say("note    | --doc-mask: no sequence of this step holds token %d after its start, so none is split "
          "into documents: its documents are longer than --seq %d%s\n", tr.document_start(), o.seq,
          o.set_by_user("--eot") ? ", or --eot is not the data's end-of-text" : "");
    const bool last = s + 1 == o.steps, pause = s + 1 == o.stop_after;
    // A stop signal (engine/stop_signal.h) is acted on at the step boundary, by every rank at once
    // (the one that caught it may be alone: a signal sent to one process of an MPI job), before the
    // eval and the sample: a scheduler's grace period is for the checkpoint. At the last step too:
    // the checkpoint holds the finished training, and the final evals, probes and exports are left.
    int32_t sig = agreed_stop_signal();
    bool saved = false;
    auto save = [&] {
      test_hold("save");
      const double t0 = now_ms();
      // A large model's save takes a while (its weights and AdamW state, 12 bytes a parameter, or
      // 16 with bf16's masters): said first, not only when it is done.
      const double gib = double(model.params.numel()) * 12 / double(1 << 30);
      if (gib >= 1)
        say("save    | writing %s/%s (about %.1f GiB) ...\n", o.save_dir.c_str(), step_dir_name(s + 1).c_str(), gib);
      if (log) log->sync();  // first: a durable checkpoint of step s has a log that reaches step s
      Heartbeat::Phase phase = beat.begin("save " + step_dir_name(s + 1), Heartbeat::bytes_written_from_now());
      try {
        save_checkpoint(tr, o.save_dir, o.keep);
      } catch (const std::exception& e) {
        // In the log too (a full disk, a quota): a requeued job fails at the same save, and the log
        // is what says why. The older checkpoints are whole; the incomplete directory goes at the
        // next start.
        log_error(log.get(), s + 1, "saving " + o.save_dir + "/" + step_dir_name(s + 1) + " failed: " + e.what());
        throw;
      }
      phase.end();
      const double took = now_ms() - t0;  // (a large model's in seconds: "1800000 ms" reads badly)
      if (took < 10000) say("save    | %s/%s (%.0f ms)\n", o.save_dir.c_str(), step_dir_name(s + 1).c_str(), took);
      else say("save    | %s/%s (%.1f s)\n", o.save_dir.c_str(), step_dir_name(s + 1).c_str(), took / 1000);
      saved = true;
      redraw_plots();
    };
    if (!o.save_dir.empty() && ((o.save_every > 0 && (s + 1) % o.save_every == 0) || last || pause || sig)) save();
    // A signal that came during a periodic save has its checkpoint already: stop now, not after
    // another step and another save (a large model's save can be much of a grace period).
    if (saved && !sig) sig = agreed_stop_signal();
    if (!sig) {
      const bool evals = evaluates_at(s + 1);
      const bool cut = evals && !run_eval(s + 1, last);
      // --sample-every: rank 0 samples (the others wait for it at the agreement below); the last
      // step's sample is finish()'s, after the run. Not after a cut eval: the signal is for the save.
      const bool samples = o.sample_every > 0 && (s + 1) % o.sample_every == 0 && !last && !cut;
      if (samples) {
        std::vector<float> copy;
        const float* host = tr.host_weights(lead, copy);  // collective when the masters are sharded
        if (lead) outputs.sample(host, model.params.specs(), s + 1);
      }
      // A signal during an eval (which it cut short) or a sample stops the run now, not a step later.
      if (evals || samples) {
        sig = agreed_stop_signal();
        if (sig && !saved && !o.save_dir.empty()) save();
      }
    }
    if (sig) {
      stopped_by = sig, stopped_at = s + 1;
      if (log) log->stop(s + 1, stop_signal_name(sig));
      break;
    }
  }

  started_final();  // a signal from here on: what is left of the final evals and probes is skipped
  // --steps 0: no training; the model as loaded (--checkpoint) or initialised is evaluated once,
  // unless the run is there to export or sample (Options::evaluates).
  const bool eval_at_zero = o.steps == 0 && o.evaluates() && !stopped_early;
  if (eval_at_zero) run_eval(0, true);
  // A signal after the loop, during the final evals and probes: what is left of them is skipped.
  bool stopped_late = false;
  auto stop_now = [&] {
    if (stopped_by) return true;
    if (!(stopped_by = agreed_stop_signal())) return false;
    stopped_at = std::max(start, o.steps), stopped_late = true;
    if (log) log->stop(stopped_at, stop_signal_name(stopped_by));
    return true;
  };
  // --probe-lengths: every rank decodes a share of the windows from a host copy of the weights.
  // Also after a resume that had nothing left to train: the probes run on the model as loaded, as
  // the exports do (they were once skipped there without a word).
  const bool paused = o.stop_after > 0 && !stopped_by;  // --stop-after: the run goes on later
  int lengths_done = 0;  // rows printed (a stop says whether it skipped all of them or the rest)
  int lengths_probed = 0;  // of them, probed by this run (not logged already)
  if (!o.probe_lengths.empty() && !paused && !stop_now()) {
    std::vector<float> copy;
    const float* host = tr.host_weights(true, copy);
    const int n = o.eval_batches * g.dp * o.batch;  // the sequences an eval reads
    // A resume of a run stopped during its probes (or one that ended) has the rows it made logged
    // at this step: those lengths are not probed, nor logged, twice. Only rows measured as this
    // run would measure them: the same model and RoPE (a --change-rope resume with no step left
    // logs rows its checkpoint does not keep), --seq, sequence count and val data (--val-data may
    // change on a resume).
    const int probe_step = std::max(start, o.steps);
    const std::string val_id = tr.val_data().identity();
    // Text rows take the bands of the longest length probed (position_bands), so a row of the length
    // table is one band: a row logged with other bands is probed again.
    const int widest = *std::max_element(o.probe_lengths.begin(), o.probe_lengths.end());
    const std::string bands = tr.val_data().synthetic()
                                  ? ""
                                  : "; bands 0-" + std::to_string(std::max(64, position_bands(widest)[0].second) - 1);
    const std::string measured = model.cfg.describe() + "; " + rope_text(model.cfg) + "; --seq " +
                                 std::to_string(o.seq) + "; " + std::to_string(n) + " sequences; " +
                                 tr.val_data().describe() + (val_id.empty() ? "" : " (" + val_id + ")") + bands;
    std::vector<int32_t> logged;
    if (o.resume && lead && log) {
      try {
        for (const LogRecord& rec : read_run_log(log->path(), nullptr, {{"length"}, {"T", "measured"}}))
          if (rec.count("step") && rec.at("step") == std::to_string(probe_step) && rec.count("T") &&
              rec.count("measured") && rec.at("measured") == measured)
            logged.push_back(int32_t(std::stol(rec.at("T"))));
      } catch (const std::exception& e) {  // rank 0 alone: not a reason to leave the others waiting
        logged.clear();
        say("note    | %s: its length rows unread (%s): every length is probed\n", log->path().c_str(), e.what());
      }
    }
    int32_t n_logged = int32_t(logged.size());
    if (world.size() > 1) {
      world.broadcast(&n_logged, 1, DType::i32, 0);
      logged.resize(size_t(n_logged));
      if (n_logged > 0) world.broadcast(logged.data(), logged.size(), DType::i32, 0);
    }
    for (int T : o.probe_lengths) {
      if (stop_now()) break;
      if (std::find(logged.begin(), logged.end(), T) != logged.end()) {
        say("length %6d | logged already at step %d\n", T, probe_step);
        lengths_done++;
        continue;
      }
      const double t0 = now_ms();
      Heartbeat::Phase phase = beat.begin("length " + std::to_string(T));
      LengthProbe p;
      try {
        p = probe_length(
            model.cfg, model.params.specs(), host, tr.val_data(), o.seq, T, n, tr.document_start(), &world,
            [&](const std::string& where) {
              if (lead && !o.quiet && o.heartbeat > 0) beat.at(where);
            },
            widest);
      } catch (const std::exception& e) {  // (a bad token id past what the evals read): the log says why
        log_error(log.get(), probe_step, "length " + std::to_string(T) + ": " + e.what());
        throw;
      }
      phase.end();  // (before the length's own line)
      std::string line;
      for (const auto& [name, acc] : p.accuracy) {
        char cell[96];
        std::snprintf(cell, sizeof cell, " | %s: %.2f%%", name.c_str(), 100.0 * acc);
        line += cell;
      }
      if (synthetic) {
        say("length %6d%s | whole answers %.2f%% of %lld | val loss %.4f (accuracy, %lld answer tokens each;"
            " %.1f s)\n", T, line.c_str(), 100.0 * p.whole_accuracy, (long long)p.whole_answers, p.loss,
            (long long)p.answers, (now_ms() - t0) / 1000);
      } else {
        say("length %6d | val loss %.4f | by position%s (%lld targets; %.1f s)\n", T, p.loss,
            position_cells(p.by_position).c_str(), (long long)p.answers, (now_ms() - t0) / 1000);
      }
      if (log) log->length_probe(probe_step, p, measured);
      lengths_done++, lengths_probed++;
      test_hold("length " + std::to_string(T));
    }
  }
  if (!paused) stop_now();  // the exports and the sample are not started after a signal (a pause has none)
  // The last stop check: a signal from here on can only let what follows finish (the plots, the
  // exports and the sample), and its line says so.
  started_outputs();
  if (log) {
    log.reset();  // closed: the plots read it back
    std::string failed;
    for (const std::string& svg : write_run_plots(log_path, failed)) say("plot    | %s\n", svg.c_str());
    if (!failed.empty())  // the run's results stand: its exports and sample follow
      say("warning | the plots were not drawn: %s\n", failed.c_str());
  }
  // A --steps 0 run's arena held its evals' forwards alone (nothing resets the high-water there).
  const bool eval_only = o.steps == 0 && have_eval;
  if (trained || eval_only)
    say("memory  | arena high-water %.1f MiB (planned %.1f MiB%s) | peak RSS %.1f MiB (this process)\n",
        (eval_only ? tr.context().arena.high_water() : peak_act) / 1048576.0, tr.planned_arena() / 1048576.0,
        eval_only ? ": an eval's forward" : "", peak_rss_bytes() / 1048576.0);
  if (tr.context().arena.blocks() > 1)  // a planner bug, not the user's: say so rather than hide it
    say("memory  | note: the arena outgrew the planned reservation (%zu blocks, %.1f MiB held)\n",
        tr.context().arena.blocks(), tr.context().arena.reserved() / 1048576.0);
  // A resume with no step left may still have made what the run lacked: say which.
  const char* resumed = made_up_eval && lengths_probed ? "no step left, its missing eval and --probe-lengths rows made"
                        : made_up_eval                 ? "no step left, its missing eval made"
                        : lengths_probed               ? "no step left, its --probe-lengths rows made"
                                                       : "nothing to do";
  if (lead && start >= o.steps && o.steps > 0 && !stopped_by)
    std::printf("done | %s: the checkpoint is at step %d and --steps is %d\n", resumed, start, o.steps);
  else if (lead && paused && start >= o.stop_after)
    std::printf("done | %s: the checkpoint is at step %d and --stop-after is %d\n", resumed, start, o.stop_after);
  if (lead && stopped_by) {  // what is left of the run (evals, probes, exports, sample) is skipped
    const std::string sig = stop_signal_name(stopped_by), dir = o.save_dir + "/" + step_dir_name(stopped_at);
    std::string left;  // what the signal skipped of what follows the training
    auto skip = [&](bool asked, const char* what) { if (asked) left += (left.empty() ? "" : ", ") + std::string(what); };
    skip(!final_eval && !stopped_late && (o.steps > 0 || o.evaluates()), "the final eval");
    // (a signal during the last length lets it finish: then none was skipped)
    skip(lengths_done < int(o.probe_lengths.size()), lengths_done > 0 ? "the rest of --probe-lengths" : "--probe-lengths");
    skip(!o.export_llmc.empty() || !o.export_safetensors.empty(), "the exports");
    skip(o.sample > 0, "the sample");
    left = left.empty() ? "" : "; skipped: " + left;
    std::string what;
    if (stopped_early)
      what = std::string("during start-up") +
             (o.steps > start ? ", before step " + std::to_string(start + 1) + " | nothing trained" : "") +
             (o.resume && start > 0 ? " | checkpoint " + dir + " as it was: continue with --resume" : "") + left;
    else if (stopped_late)
      what = "during the final evals and probes (step " + std::to_string(stopped_at) + ")" + left;
    else if (stopped_at < o.steps)
      what = "after step " + std::to_string(stopped_at) + " of " + std::to_string(o.steps) + " | " +
             (o.save_dir.empty() ? "nothing saved (no --save-dir)" : "checkpoint " + dir + ": continue with --resume");
    else
      what = "after the last step (" + std::to_string(stopped_at) + ") | " +
             (o.save_dir.empty() ? "nothing saved (no --save-dir)" : "checkpoint " + dir + ": the training is done") + left +
             // (--resume, not --steps 0 --checkpoint: a bf16 run's weights are the masters rounded
             // stochastically, which a resume restores and a checkpoint load rounds to nearest)
             (left.empty() || o.save_dir.empty() ? "" : " (--resume runs them)");
    std::printf("stopped | %s %s\n", sig.c_str(), what.c_str());
  } else if (lead && (eval_at_zero || until > start)) {
    if (eval_at_zero) std::printf("done | no training (--steps 0)");
    else std::printf("%s | train loss %.4f -> %.4f%s", paused ? "paused " : "done", first_loss, last_loss,
                     // a resumed run's first loss is its first step's, not the whole run's
                     start > 0 ? (start + 1 == until ? " (step " + std::to_string(until) + ")"
                                                     : " (steps " + std::to_string(start + 1) + "-" +
                                                           std::to_string(until) + ")").c_str()
                               : "");
    if (have_eval) {
      std::printf(" | val loss %.4f", ev.loss);
      if (synthetic)
        std::printf(" | val accuracy %.2f%% (whole answers %.2f%%)", 100.0 * ev.accuracy, 100.0 * ev.whole_accuracy);
    }
    if (!eval_at_zero && epoch_now() >= 0) std::printf(" | epoch %.2f", epoch_now());
    if (paused)
      std::printf(" | after step %d of %d (--stop-after) | checkpoint %s/%s: continue with --resume", until, o.steps,
                  o.save_dir.c_str(), step_dir_name(until).c_str());
    std::printf("\n");
  }
  std::fflush(stdout);  // before the exports and the sample, which take a while on a large model
  model.progress = nullptr;  // sampling after the run is not a step
  if (stopped_by) {
    std::fflush(stdout);
    return 128 + stopped_by;  // as a shell reports a process the signal ended
  }
  if (paused) {  // the run's end (its exports and sample) is still to come
    if (lead && stop_signal()) {  // the stage is saved; the exit status still says a signal came
      std::printf("stopped | %s as the stage ended\n", stop_signal_name(stop_signal()));
      std::fflush(stdout);
      return 128 + stop_signal();
    }
    return 0;
  }
  // The f32 weights, on rank 0 only (on a device a copy as large as the model, made when asked for;
  // the CPU's are read where they are).
  std::vector<float> copy;
  const float* host = outputs.wants_params() ? tr.host_weights(lead, copy) : nullptr;
  if (lead && outputs.wants_params()) test_hold("outputs");
  if (lead) outputs.finish(host, model.params.specs());
  // A signal while they ran: they finished (written whole), and the exit status still says so.
  if (lead && stop_signal()) {
    std::printf("stopped | %s %s\n", stop_signal_name(stop_signal()),
                outputs.wants_params() ? "during the exports and the sample, which finished" : "as the run ended");
    std::fflush(stdout);
    return 128 + stop_signal();
  }
  return 0;
}

}  // namespace ul
