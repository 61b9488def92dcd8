// Resumable checkpoints: train --save-dir DIR [--save-every N] [--keep K] [--resume].
//
// Layout: DIR/step_00000100/ holds model.bin, optim.bin, rank_R.json for every rank, and COMPLETE
// (engine/checkpoint_files.h has the formats). A save is collective over the world:
//   1. rank 0 (re)creates the step directory; barrier;
//   2. rank 0 writes model.bin, the owner of each optimizer shard its optim file (rank 0
//      optim.bin, or under --zero 1 every rank its optim_rank_R.bin), every rank its rank_R.json — each atomically (NAME.tmp, fsync, rename, fsync dir);
//   3. barrier on the world: every rank's files are durable;
//   4. rank 0 writes COMPLETE (atomically), fsyncs DIR, then deletes the oldest complete
//      checkpoints beyond --keep.
// Only a directory with COMPLETE is a checkpoint. One without (a save that crashed) is ignored and
// removed at the next start. Deleting a checkpoint removes COMPLETE first, so a crash while
// deleting leaves an ignored directory, never a damaged "complete" one.
//
// Resume is bit-exact: parameters, AdamW m, v and t, the step counter and the data's place (the
// next step's first sequence) are restored; everything else a step reads (its batches, its learning
// rate) is a function of those and of options that are checked to match
// (engine/checkpoint_files.h: run_fields) — or, for --steps and --lr, the user's deliberate choice.
// A resume may also change the layout (--ranks, --sp, --batch, --grad-accum; --zero too) while a
// step's sequences stay the same (RunLayout): nothing in the files depends on it, so the run goes
// on within float rounding of the one never stopped. A rollback (--resume-step) loads an older
// checkpoint and moves the newer ones aside; --skip-batches and --change-global-batch move the
// data's place or change G on purpose; --change-seq changes the length (the data's place mapped to
// it: data/dataset.h sequence_at_length) and --change-rope a llama's RoPE.
//
// TEST HOOK: the environment variable ULYSSES_TEST_CRASH_IN_SAVE=N makes the N-th save of this
// process abort() after writing half of model.bin.tmp (N = 1: the first save). The crash-safety
// tests use it to kill a run in the middle of a save. Unset (or 0) in normal use.
// TEST HOOK: ULYSSES_TEST_FAIL_SAVE_RANK=R makes rank R's writes of every save fail with an error,
// as a full disk would: every rank then stops with it (rank 0 logging it); 0:dir fails rank 0's
// making of the step's directory, 0:complete its writing of the COMPLETE marker. Unset in normal use.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint_files.h"
#include "engine/rollback_record.h"

namespace ul {

class Comm;
class Trainer;

// One run at a time in a --save-dir: rank 0 holds an exclusive flock on DIR/.lock from start-up
// to the end of the run. A second run into the same directory (a requeued job whose first instance
// still runs, a double submit) is refused before it removes the other's half-written checkpoint as
// a crashed save, or rewrites its log. The kernel drops the lock when the process ends, however it
// ends (NFSv3 keeps a crashed node's until it is back: removing DIR/.lock clears it). A directory
// it cannot write is locked read-only; where the lock cannot be opened, a warning, not a refusal.
// flock reaches as far as the filesystem makes it: NFS without locking, or Lustre's localflock,
// only one node.
class SaveDirLock {
 public:
  explicit SaveDirLock(const std::string& root);  // creates root; throws naming the holder
  // A directory this lock made and the run left holding nothing else (a run refused before its
  // first write) is removed with the lock: a refusal leaves no output behind.
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  int fd_ = -1;
  std::string root_;
  std::string made_;  // the topmost directory this lock made ("" when root was there)
};

std::string step_dir_name(int step);                       // "step_00000100"
// 0 when a checkpoint's directory can be made in root now (one is made and removed), else the
// errno. The lock takes a directory it cannot write (a run that only evaluates or exports from a
// read-only snapshot); a run that will save asks this at start-up, not at its first save.
int save_dir_write_error(const std::string& root);
int parse_step_dir(const std::string& name);               // "step_00000100" -> 100; any other name -1
std::vector<int> complete_steps(const std::string& root);  // steps with COMPLETE, ascending
// --auto-resume settled (a collective): rank 0 reads whether --save-dir holds a complete
// checkpoint, every rank takes its answer, and o.resume is set from it. A
// resume's change (--change-seq, ...) on a fresh start is refused, on every rank alike.
void settle_auto_resume(Options& o, Comm& world);
// Every step directory under root, with whether it is complete (has COMPLETE), ascending.
std::vector<std::pair<int, bool>> list_step_dirs(const std::string& root);
// Removes root/step_N, COMPLETE first (a crashed save's leftover, a checkpoint past --keep); one
// that will not go is renamed step_N.stale.PID.TIME or left, with a warning naming `what` (false).
// A step directory that is a symlink loses the link alone, never its target's files.
bool remove_or_warn(const std::string& root, int step, const char* what);

// What a resume did besides loading, for its log lines (rank 0's).
struct ResumeNotes {
  std::vector<std::string> moved;          // --resume-step: the newer checkpoints, renamed aside
  std::optional<RollbackRecord> applied;   // a plain --resume that took a pending rollback's data place
  bool repeat = false;                     // the same --resume-step again after its run saved: a --resume
  std::string rope_before;                 // --change-rope: the checkpoint's RoPE, where this run's differs
  bool stage_done = false;                 // --stop-after N, the newest past N: nothing loaded, nothing to do
};

// Collective (engine/resume.cpp). Prepares `root` for this run: creates it and removes incomplete step directories
// (rank 0). With resume: loads the newest complete checkpoint into `tr` and returns its step, or
// throws when there is none; under --resume-step N that step's instead, and then (a rollback, the
// options' --skip-batches applied) rank 0 writes root/rollback.json and renames every newer one to
// step_M.rolled-back.TIME. The record (engine/rollback_record.h) then also serves: a plain resume
// of step N before the rolled-back run saved takes its data place and G; the same --resume-step N
// after it saved goes on from the newest (ResumeNotes::repeat), another skip or G is refused; moves
// a crash interrupted are finished. Without resume: throws when `root` already holds a complete
// checkpoint (a fresh run must not mix with an old one), else removes a stale record and returns 0.
// `saved` gets the layout the loaded checkpoint was saved at (this run's when there is none).
int start_from_save_dir(Trainer& tr, const std::string& root, bool resume, RunLayout& saved,
                        ResumeNotes* notes = nullptr);

// Collective: saves tr's state after tr.steps_done() steps into root/step_NNNNNNNN; keep > 0
// then leaves only the `keep` newest complete checkpoints.
void save_checkpoint(Trainer& tr, const std::string& root, int keep);

// What a checkpoint holds for this rank, read and checked: the f32 parameters, this rank's range
// of AdamW's m and v, its t, the step and the data's place, and the layout it was saved at.
struct LoadedCheckpoint {
  RunLayout saved;
  std::vector<float> params, m, v;
  int64_t t = 0, data = 0;
  int step = 0;
};
// This rank only, no collective: checks root/step_NNNNNNNN against the run (options, model shape,
// file integrity) and reads it; tr is not changed. Throws std::runtime_error naming the file and
// the problem (RunMismatch for this run's flags). `pending`: a rollback to this step whose run has
// not saved yet: its data place and G stand instead of the files'. `rope_before`: set to the
// checkpoint's RoPE (rope_text) when --change-rope changed it.
LoadedCheckpoint read_checkpoint(Trainer& tr, const std::string& root, int step, const RollbackRecord* pending = nullptr,
                                 std::string* rope_before = nullptr);
// Loads what read_checkpoint read into tr, this rank only, no collective: the weights (the
// masters; bf16: rounded to nearest), AdamW's m, v and t. c's arrays are freed. It allocates (a
// bf16 model's host copy), so a resume agrees on it too before finish_checkpoint.
void place_checkpoint(Trainer& tr, LoadedCheckpoint& c);
// Then the step and the data's place, and, bf16, the weights as the run rounded them at step t: a
// collective where the masters are sharded (bf16 under --zero 1: each shard's owner rounds its
// weights and the others take its bits), so every rank must have placed its part first.
void finish_checkpoint(Trainer& tr, const LoadedCheckpoint& c);
// All three, for one process or where every rank is known to read alike (tests). Returns the layout
// the checkpoint was saved at.
RunLayout load_checkpoint(Trainer& tr, const std::string& root, int step, const RollbackRecord* pending = nullptr,
                          std::string* rope_before = nullptr);

}  // namespace ul
