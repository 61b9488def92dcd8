// DIR/rollback.json: what the last rollback (--resume-step N [--skip-batches K]
// [--change-global-batch]) did, written by rank 0 before it moves the newer checkpoints aside. A
// rollback is one command, but its effect must outlive the process that ran it:
//   - the moves it lists are finished by the next start if a crash or a failed rename interrupted
//     them;
//   - until the rolled-back run saves its first checkpoint, step_N is the newest, and step_N's rank
//     files still hold the data's place of the history it replaced: a plain --resume from that
//     step_N takes the record's next sequence and G instead, so a crash before that save does not
//     train on the skipped data again;
//   - once that run has saved past N, the same command again (a requeued job script) goes on from
//     the newest checkpoint as --resume would, instead of moving that run's checkpoints aside too;
//     so does the command of any earlier rollback the record remembers (a later rollback keeps
//     them in "earlier"); another skip or G for such a step is refused (remove the record to roll
//     back to that step once more).
// A fresh run in the directory (no checkpoint left) removes it: it belonged to a deleted history.
// Checkpoints are named in it by step and identity (step_dir_id: the save_id their rank_0.json
// carries, a random number each save draws), not by content: a rollback without a skip saves the
// same bits again, in new directories, and those are not the ones it moved; a copy of the
// directory (cp -a, rsync, a restore) keeps them.
// {"format":"ulysses-rollback","step":N,"step_id":"ID","data_sequence":S,"sequences_per_step":G,
//  "skip_batches":K,"time_ms":T,"moving":"6@ID,8@ID","earlier":"2:1:16,..."}  (S: the first
//  sequence of step N + 1, after the skip; G: the run's, after any change; earlier: step:K:G each)
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ul {

struct RollbackRecord {
  int step = 0;                    // the checkpoint rolled back to
  std::string step_id;             // its directory's identity (step_dir_id)
  int64_t data_sequence = 0;       // the first sequence step + 1 trains on
  int64_t sequences_per_step = 0;  // G from then on
  int skip_batches = 0;
  int64_t time_ms = 0;             // when (ms since the epoch; also the moved directories' suffix)
  std::vector<std::pair<int, std::string>> moving;  // the newer checkpoints to move aside, with their identities
  struct Earlier {
    int step = 0, skip_batches = 0;
    int64_t sequences_per_step = 0;
  };
  std::vector<Earlier> earlier;    // the rollbacks before this one, oldest first
};

std::string rollback_record_path(const std::string& root);  // root/rollback.json
// A checkpoint directory's identity: "save ID", the save_id its rank_0.json carries; for a
// checkpoint from before save_id, "inode INO:NS", the directory's inode and its COMPLETE file's
// modification time in ns (which a copy does not keep); "" when neither can be read (no match).
std::string step_dir_id(const std::string& dir);
// The record in root, if there is one; throws naming the file (and what to do) when it is damaged.
std::optional<RollbackRecord> read_rollback_record(const std::string& root);
void write_rollback_record(const std::string& root, const RollbackRecord& r);  // atomically
std::string rollback_time(const RollbackRecord& r);  // "2026-12-02 09:41:07 UTC"

}  // namespace ul
