// DIR/rollback.json: what the last rollback (--resume-step N [--skip-batches K]
// [--change-global-batch]) did, written by rank 0 once the newer checkpoints are moved aside. A
// rollback is one command, but its effect must outlive the process that ran it:
//   - until the rolled-back run saves its first checkpoint, step_N is the newest, and step_N's rank
//     files still hold the data's place of the history it replaced: a plain --resume from step_N
//     takes the record's next sequence (and its G) instead, so a crash before that save does not
//     train on the skipped data again;
//   - once that run has saved past N, the same --resume-step N again (a requeued job script) would
//     move its new checkpoints aside too: it is refused, naming the record.
// {"format":"ulysses-rollback","step":N,"data_sequence":S,"sequences_per_step":G,"skip_batches":K,
//  "time_ms":T}  (S: the first sequence of step N + 1, after the skip; G: the run's, after any change)
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace ul {

struct RollbackRecord {
  int step = 0;                    // the checkpoint rolled back to
  int64_t data_sequence = 0;       // the first sequence step + 1 trains on
  int64_t sequences_per_step = 0;  // G from then on
  int skip_batches = 0;
  int64_t time_ms = 0;             // when (ms since the epoch)
};

std::string rollback_record_path(const std::string& root);  // root/rollback.json
// The record in root, if there is one; throws naming the file when it is damaged.
std::optional<RollbackRecord> read_rollback_record(const std::string& root);
void write_rollback_record(const std::string& root, const RollbackRecord& r);  // atomically
std::string rollback_time(const RollbackRecord& r);  // "2026-12-02 09:41:07 UTC"

}  // namespace ul
