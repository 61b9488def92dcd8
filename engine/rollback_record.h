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
//     another --skip-batches or G for the same step is refused (remove the record to roll back to
//     step N once more).
// A fresh run in the directory (no checkpoint left) removes it: it belonged to a deleted history.
// Checkpoints are named in it by step and identity (step_dir_id: the directory's inode and its
// COMPLETE's mtime), not by content: a rollback without a skip saves the same bits again, in new
// directories, and those are not the ones it moved.
// {"format":"ulysses-rollback","step":N,"step_id":"INO:NS","data_sequence":S,"sequences_per_step":G,
//  "skip_batches":K,"time_ms":T,"moving":"6@INO:NS,8@INO:NS"}  (S: the first sequence of step N + 1,
//  after the skip; G: the run's, after any change)
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
};

std::string rollback_record_path(const std::string& root);  // root/rollback.json
// A checkpoint directory's identity: "INODE:NS", the directory's inode and its COMPLETE file's
// modification time in ns ("" when either cannot be read: no match). A new save of the same step
// is a new directory with a new COMPLETE: another identity, whatever its bytes.
std::string step_dir_id(const std::string& dir);
// The record in root, if there is one; throws naming the file (and what to do) when it is damaged.
std::optional<RollbackRecord> read_rollback_record(const std::string& root);
void write_rollback_record(const std::string& root, const RollbackRecord& r);  // atomically
std::string rollback_time(const RollbackRecord& r);  // "2026-12-02 09:41:07 UTC"

}  // namespace ul
