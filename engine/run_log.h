// The machine-readable run log (--log FILE, default DIR/log.jsonl under --save-dir): one JSON
// object per line, written by rank 0 only and flushed per line, so the log of a killed run is
// whole up to its last step.
//   {"type":"step","step":12,"loss":..,"grad_norm":..,"lr":..,"ms":..,"tok_per_s":..,
//    "act_mib":..,"a2a_mib":..,"ar_mib":..}   (with --zero 1 also "rs_mib":..,"ag_mib":..: the
//    gradients' reduce-scatter and the weights' all-gather)
//   {"type":"eval","step":100,"val_loss":..,"accuracy":..}   (a task's also "whole_accuracy":..,
//    "whole_answers":..: the answers with every token right; the last eval of a passkey run also
//    "acc_depth_0":.., "acc_depth_0.25":.. .. "acc_depth_1":..: its probes, train_loop.cpp; with
//    --loss-by-position "val_loss_pos_0":.., "val_loss_pos_64":.., ...: each band's val loss, by its
//    first position)
//   {"type":"length","step":1500,"T":1024,"answers":320,"acc_all":..,"acc_depth_0":.., ..,
//    "whole_accuracy":..,"whole_answers":64,"val_loss":..,"measured":"..."}
//    (--probe-lengths: one per length, after the run, for the model at that step; the val loss is
//    the answers' on a synthetic task; on text "val_loss":.. and "val_loss_pos_N":.. instead of
//    the accuracies)
//   {"type":"stop","step":420,"signal":"SIGTERM"}   (a stop signal ended the run after that step)
//   {"type":"resume","step":300}   (with "data_sequence":8000, the first sequence of step 301,
//    when it is not 300 G: --skip-batches, --change-global-batch or --change-seq, now or before;
//    with "seq":65536 when this resume changed --seq: the steps after it train at that length, and
//    "rope":"theta 500000" when it changed the RoPE)
// A resumed run appends to the log after a resume record. Records past step 300 written before
// it came from an attempt that died after its last checkpoint; readers drop them, so the log read
// back is the history of the run that continues.
// loss, grad_norm, lr, val_loss and accuracy keep all 17 digits: a resumed run can be compared
// bit for bit with an uninterrupted one.
#pragma once
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/length_probe.h"
#include "engine/trainer.h"

namespace ul {

class RunLog {
 public:
  // resume_step < 0: a fresh run, the file is truncated. Else the file is appended to (after a
  // newline if a killed run left its last line unfinished), starting with a resume record (with
  // the next step's first sequence when it is given, >= 0, the new --seq when it is > 0, and the
  // new RoPE (rope_text) when it is not empty).
  RunLog(const std::string& path, int resume_step, int64_t data_sequence = -1, int seq = 0,
         const std::string& rope = "");
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // epoch: the data's place after the step in epochs of the train split (< 0: unlimited data, left out).
  void step(int step, const StepResult& r, double tok_per_s, double epoch = -1);
  void eval(int step, const EvalResult& e);
  // measured: what the row was measured on (the model, its RoPE, --seq, the sequences), so that a
  // resume can tell the rows it would make again from another model's at the same step.
  void length_probe(int step, const LengthProbe& p, const std::string& measured);
  void stop(int step, const char* signal);
  void error(int step, const std::string& message);  // the step failed: {"type":"error",...}
  // Makes every line so far durable (fsync): called with each checkpoint, so that after a power
  // loss the log reaches at least the step the resume starts from.
  void sync();
  const std::string& path() const { return path_; }

 private:
  void line(const std::string& json);
  std::string path_;
  FILE* f_ = nullptr;
};

using LogRecord = std::map<std::string, std::string>;  // field -> value text (parse_flat_json)

// What a reader keeps of a log: a long run's log holds millions of records, and each kept one is
// a map of its fields. A line of another type is passed over before it is parsed.
struct LogFilter {
  std::vector<std::string> types;   // only records of these types (empty: every type)
  std::vector<std::string> fields;  // only these fields besides type and step (empty: every field)
};

// The records of the run as it stands (resume records applied, then dropped). Lines that do not
// parse — the torn last line of a killed run — are skipped and counted in *skipped. Linear in the
// log's length however many resumes it holds.
std::vector<LogRecord> read_run_log(const std::string& path, int* skipped = nullptr, const LogFilter& filter = {});

}  // namespace ul
