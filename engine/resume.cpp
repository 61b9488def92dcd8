// Where a run starts (engine/checkpoint.h, start_from_save_dir): the save directory's scan, the
// resume's choice of checkpoint, and a rollback's record and moves (engine/rollback_record.h).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/file_io.h"
#include "engine/ranks_agree.h"
#include "engine/rollback_record.h"
#include "engine/trainer.h"
#include "parallel/data_parallel.h"

namespace ul {

namespace fs = std::filesystem;

namespace {

// step_dir_id of root's step directory.
std::string step_id(const std::string& root, int step) { return step_dir_id(root + "/" + step_dir_name(step)); }

// What rank 0 finds in a save directory (after tidying it: stale leftovers tried again, crashed
// saves removed, a rollback's interrupted moves finished, each said at once): the checkpoint to
// load (the newest, or --resume-step's when it is complete, else -1), the complete one before it,
// the newest, the one before the newest, and the complete ones after the chosen one.
struct SaveDirScan {
  int chosen = -1, older = -1, newest = -1, before_newest = -1;
  std::vector<int> after;
};

SaveDirScan scan_save_dir(const std::string& root, int resume_step, const std::optional<RollbackRecord>& record) {
  SaveDirScan s;
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw std::runtime_error("--save-dir " + root + ": cannot create the save directory: " + ec.message());
  // What an earlier run had to move aside (remove_or_warn): tried again, quietly (what still will
  // not go stays for the next run).
  std::vector<fs::path> stale;
  fs::directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find(".stale.") != std::string::npos) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) {
    std::error_code gone;
    fs::remove_all(p, gone);
  }
  // A rollback interrupted between its record and its last rename: the checkpoints it was moving
  // (the same directories as then) go aside now, under the names the others got.
  if (record)
    for (const auto& [step, id] : record->moving) {
      const fs::path dir = fs::path(root) / step_dir_name(step);
      if (id.empty() || step_id(root, step) != id) continue;  // "": unreadable then, no match now
      const fs::path aside = fs::path(root) / (step_dir_name(step) + ".rolled-back." + std::to_string(record->time_ms));
      fs::rename(dir, aside, ec);
      if (ec)
        throw std::runtime_error(dir.string() + ": cannot move it aside for the rollback to step " +
                                 std::to_string(record->step) + " (" + rollback_record_path(root) + "): " + ec.message());
      // Now, not with the resume's lines: a refusal below must not hide what this start moved.
      std::fprintf(stderr, "resume  | %s: moved aside now, finishing the rollback to step %d that %s lists\n",
                   aside.string().c_str(), record->step, rollback_record_path(root).c_str());
    }
  std::vector<int> complete;
  for (auto& [step, done] : list_step_dirs(root)) {
    if (done) {
      complete.push_back(step);
    } else if (remove_or_warn(root, step, "a save that crashed")) {  // said: a restored copy without it goes too
      std::fprintf(stderr, "resume  | %s: removed, it has no COMPLETE (a save that did not finish)\n",
                   (fs::path(root) / step_dir_name(step)).string().c_str());
    }
  }
  if (!complete.empty()) s.newest = complete.back();
  if (complete.size() > 1) s.before_newest = complete[complete.size() - 2];
  const int want = resume_step >= 0 ? resume_step : s.newest;
  for (int step : complete) {
    if (step < want) s.older = step;
    else if (step == want) s.chosen = step;
    else if (s.chosen >= 0) s.after.push_back(step);
  }
  return s;
}

// A rollback's other half (rank 0, once every rank has loaded step `to` and the record is written):
// the checkpoints after it belong to the history this run replaces. They are renamed, not deleted
// (the user may still want them), to names that are no checkpoint, so that --keep, a later --resume
// and the next saves (often at their very steps) see only this run's; the newest first, so that a
// rename that fails leaves the ones still in place a run of steps right after `to`, never a gap
// (and the next start finishes the moves from the record).
std::vector<std::string> move_aside(const std::string& root, const std::vector<int>& after, int to, int64_t suffix) {
  std::vector<std::string> moved;
  for (auto step = after.rbegin(); step != after.rend(); ++step) {
    const fs::path dir = fs::path(root) / step_dir_name(*step);
    const fs::path aside = fs::path(root) / (step_dir_name(*step) + ".rolled-back." + std::to_string(suffix));
    std::error_code ec;
    fs::rename(dir, aside, ec);
    if (ec)
      throw std::runtime_error(dir.string() + ": cannot move it aside for --resume-step " + std::to_string(to) + " (to " +
                               aside.string() + "): " + ec.message() + " (the next start tries again: " +
                               rollback_record_path(root) + " lists it)");
    moved.push_back(aside.string());
  }
  fsync_dir(root);
  return moved;
}

}  // namespace

int start_from_save_dir(Trainer& tr, const std::string& root, bool resume, RunLayout& saved, ResumeNotes* notes) {
  Comm& world = tr.grid().world;
  const Options& o = tr.options();
  const int resume_step = resume ? o.resume_step : -1;
  saved = run_layout(o, tr.grid());
  SaveDirScan scan;
  std::optional<RollbackRecord> record;
  bool here = false;  // the record is of the chosen checkpoint (its step, the same model)
  bool at_newest = false;  // ... of the newest (a repeated rollback command goes on from there)
  if (world.rank() == 0) {
    // A fresh run reads no record: one left without checkpoints belonged to a deleted history.
    if (resume) record = read_rollback_record(root);
    scan = scan_save_dir(root, resume_step, record);
    auto record_of = [&](int step) {
      return record && step >= 0 && record->step == step && !record->step_id.empty() &&
             step_id(root, step) == record->step_id;
    };
    here = record_of(scan.chosen);
    at_newest = record_of(scan.newest);
    if (record && record->step == scan.chosen && !here)
      std::fprintf(stderr, "note    | %s names %s, but the one here now is not that save (another save of that "
                   "step, or a copy of a checkpoint without a save_id, whose identity a copy does not keep): the "
                   "record is not applied (if it is the rollback's own, copied, run the rollback's command again: "
                   "--resume-step %d --skip-batches %d)\n", rollback_record_path(root).c_str(),
                   step_dir_name(scan.chosen).c_str(), record->step, record->skip_batches);
    if (!resume && scan.newest < 0) {
      std::error_code gone;
      fs::remove(rollback_record_path(root), gone);
    }
  }
  // Rank 0 decides, so that every rank loads the same step (or refuses the same way).
  // The rollback to --resume-step's step the record remembers (the latest, or an earlier one): -1 none.
  int64_t done_skip = -1, done_g = 0, done_earlier = 0;
  if (record && resume_step >= 0) {
    if (record->step == resume_step) done_skip = record->skip_batches, done_g = record->sequences_per_step;
    else
      for (const RollbackRecord::Earlier& e : record->earlier)
        if (e.step == resume_step) done_skip = e.skip_batches, done_g = e.sequences_per_step, done_earlier = 1;
  }
  int64_t v[13] = {scan.chosen, scan.older, scan.newest, scan.before_newest, here, 0, 0, 0, 0, done_skip, done_g,
                   done_earlier, at_newest};
  if (here || at_newest)
    v[5] = record->step, v[6] = record->data_sequence, v[7] = record->sequences_per_step, v[8] = record->skip_batches;
  world.broadcast(v, 2 * 13, DType::i32, 0);  // as words: the values are only copied
  int chosen = int(v[0]), older = int(v[1]);
  const int newest = int(v[2]), before_newest = int(v[3]);
  here = v[4] != 0, at_newest = v[12] != 0;
  if ((here || at_newest) && !record) record = RollbackRecord{int(v[5]), "", v[6], v[7], int(v[8]), 0, {}, {}};
  done_skip = v[9], done_g = v[10], done_earlier = v[11];
  if (!resume) {
    if (newest >= 0)
      throw std::runtime_error(root + ": already holds checkpoints (newest " + step_dir_name(newest) +
                               "); pass --resume to continue that run (--auto-resume in a job script that also starts "
                               "it), or choose another --save-dir");
    return 0;
  }
  const char* flag = resume_step >= 0 ? "--resume-step" : "--resume";
  if (newest < 0)
    throw std::runtime_error(root + ": no complete checkpoint to resume from (" + flag + "); run without it to start fresh "
                             "(--auto-resume does either, as it finds the directory)");
  // A rollback to this step was done (the record's, or an earlier one it remembers), and the runs
  // since have saved past it (step N itself may be gone since, to --keep), or, for an earlier one,
  // up to it (a later rollback moved that step_N aside: the one there now is a later save): the
  // same command again (a requeued job script that still says --resume-step N) goes on from the
  // newest checkpoint, as --resume would; another skip or G for that step would be a second
  // rollback, refused.
  bool rollback = resume_step >= 0;
  if (rollback && done_skip >= 0 && (newest > resume_step || (done_earlier && newest == resume_step))) {
    const int64_t G = run_layout(o, tr.grid()).sequences_per_step();
    if (done_skip != o.skip_batches || done_g != G)
      throw std::runtime_error(root + ": a rollback to step " + std::to_string(resume_step) + " with --skip-batches " +
                               std::to_string(done_skip) + " at " + std::to_string(done_g) + " sequences a step (" +
                               rollback_record_path(root) + ") was done, and the run has saved up to " +
                               step_dir_name(newest) + " since; this command asks for --skip-batches " +
                               std::to_string(o.skip_batches) + " at " + std::to_string(G) + ": continue the run with " +
                               "--resume" +
                               (chosen >= 0 ? ", or remove " + rollback_record_path(root) + " to roll back to step " +
                                                  std::to_string(resume_step) + " once more"
                                            : " (" + step_dir_name(resume_step) + " itself is gone: roll back to a step " +
                                                  "still there)"));
    // As --resume: a later rollback to the newest step that has not saved yet is applied too (its
    // record, not step_N's files, has the data's place).
    if (notes) notes->repeat = true;
    rollback = false, older = before_newest, chosen = newest, here = at_newest;
  }
  if (chosen < 0)
    throw std::runtime_error(root + "/" + step_dir_name(resume_step) + ": no such complete checkpoint (--resume-step " +
                             std::to_string(resume_step) + "); the newest is " + step_dir_name(newest) +
                             (older >= 0 ? ", the newest before step " + std::to_string(resume_step) + " is " +
                                               step_dir_name(older)
                                         : ""));
  // --stop-after N, and a later stage has saved past N (this stage's job requeued): nothing to do,
  // and nothing to load (the newest may be at another length, RoPE or G than this command's). The
  // same stage requeued (its own pause the newest) loads, to make up an eval a signal skipped there.
  if (!rollback && o.stop_after > 0 && chosen > o.stop_after) {
    world.barrier();
    if (notes) notes->stage_done = true;
    return chosen;
  }
  // A rollback whose run has not saved yet: step_N's files hold the data's place of the history
  // it replaced, the record the one the rollback chose.
  const bool pending = !rollback && here && chosen == record->step;
  // Some failures only some ranks meet (a ZeRO shard damaged inside is read by the ranks whose
  // range it meets; a rank_R.json by its rank): agreed on, so every rank stops with the reader's
  // message at once.
  std::string failed;
  LoadedCheckpoint loaded;
  bool read = false;  // the files passed their checks: a failure after is not theirs
  const std::string dir = root + "/" + step_dir_name(chosen);
  try {
    loaded = read_checkpoint(tr, root, chosen, pending ? &*record : nullptr, notes ? &notes->rope_before : nullptr);
    read = true;
    place_checkpoint(tr, loaded);  // (host memory for a bf16 model's copy, the device: agreed on too)
  } catch (const RunMismatch& e) {
    failed = failure_text(e);  // this run's flags, not the checkpoint: an older one would be refused the same way
  } catch (const std::bad_alloc&) {  // (a rank short of host memory: the others must not wait for it)
    failed = "out of host memory loading " + dir;
  } catch (const std::exception& e) {
    // A damaged checkpoint would stop every resume: say how to continue from the one before (not
    // done unasked: the checkpoint may be sound and the fault elsewhere). Not for a pending
    // rollback's step: the one before has no record of its skip.
    failed = failure_text(e);
    if (!read && older >= 0 && !pending)
      failed += " (if " + dir + " is damaged, " +
                (rollback ? "--resume-step " + std::to_string(older) + " continues from " + step_dir_name(older)
                          : "move it aside: mv " + dir + " " + dir + ".bad, and --resume continues from " +
                                step_dir_name(older)) + ")";
  }
  // Before any collective of the load's own (bf16 masters under --zero 1 are gathered as it
  // finishes): a rank that failed must not meet the others' gather with this agreement's.
  agree_on_errors(world, failed);
  saved = loaded.saved;
  finish_checkpoint(tr, loaded);
  check_same_weights(world, tr.model().params.fingerprint(), "loading " + dir + "/model.bin", kSameFile);
  if (pending && notes) notes->applied = record;
  if (!rollback) {
    world.barrier();
    return chosen;
  }
  // A rollback: checked before anything in the directory changes.
  if (chosen >= o.steps)
    throw std::runtime_error("--resume-step " + std::to_string(chosen) + ": nothing to train, --steps is " +
                             std::to_string(o.steps) + ": give the run's --steps (it may change on a resume; the " +
                             "schedule follows it)");
  if (o.stop_after > 0 && chosen >= o.stop_after)
    throw std::runtime_error("--resume-step " + std::to_string(chosen) + ": nothing to train before --stop-after " +
                             std::to_string(o.stop_after) + ": give a later --stop-after (or none)");
  if (o.skip_batches > 0) tr.skip_batches(o.skip_batches);
  world.barrier();  // every rank has its state: only now are the newer checkpoints let go
  if (world.rank() == 0) {
    // The record first: a crash or a failed rename among the moves leaves them listed, for the
    // next start to finish.
    RollbackRecord r;
    r.step = chosen;
    r.step_id = step_id(root, chosen);
    r.data_sequence = tr.next_sequence();
    r.sequences_per_step = tr.sequences_per_step();
    r.skip_batches = o.skip_batches;
    r.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
    for (int step : scan.after) r.moving.push_back({step, step_id(root, step)});
    if (record) {  // the rollbacks before this one, for their job scripts' repeats
      r.earlier = record->earlier;
      r.earlier.push_back({record->step, record->skip_batches, record->sequences_per_step});
    }
    write_rollback_record(root, r);
    std::vector<std::string> moved = move_aside(root, scan.after, chosen, r.time_ms);
    if (notes) notes->moved = std::move(moved);
  }
  return chosen;
}

void settle_auto_resume(Options& o, Comm& world) {
  if (!o.auto_resume) return;
  // Rank 0's reading (a node's stale listing of a shared directory must not start it fresh while
  // the others resume); 2 where it could not list the directory (its reason is on its own error).
  int32_t found = 0;
  std::string why;
  if (world.rank() == 0) {
    try {
      std::error_code ec;
      found = std::filesystem::exists(o.save_dir, ec) && !complete_steps(o.save_dir).empty() ? 1 : 0;
    } catch (const std::exception& e) {
      found = 2;
      why = e.what();
    }
  }
  if (world.size() > 1) world.broadcast(&found, 1, DType::i32, 0);
  if (found == 2)  // rank 0's reason on every rank (the local communicator reports whichever throws first)
    throw JobError("--auto-resume: " + broadcast_text(world, why, 0));
  o.resume = found == 1;
  for (const char* f : {"--change-global-batch", "--change-seq", "--change-rope"})
    if (!o.resume && o.set_by_user(f))
      throw JobError(std::string("--auto-resume: ") + o.save_dir + " holds no complete checkpoint, so this run starts "
                     "fresh, and " + f + " (a resume's change) has nothing to change: give it to a later stage's command");
}

}  // namespace ul
