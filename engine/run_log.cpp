#include "engine/run_log.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/file_io.h"

namespace ul {

namespace {

// The length of the file up to its last newline (its size when it ends with one, 0 with none):
// what a run killed mid-line (kill -9, a full disk) leaves before its torn last record. -1: no file.
int64_t whole_lines_length(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return -1;
  int64_t end = f.tellg();
  char buf[65536];
  while (end > 0) {  // backwards, a block at a time (the log of a long run is megabytes)
    const int64_t n = std::min<int64_t>(end, sizeof buf);
    f.seekg(end - n);
    if (!f.read(buf, n)) return -1;
    for (int64_t i = n - 1; i >= 0; i--)
      if (buf[i] == '\n') return end - n + i + 1;
    end -= n;
  }
  return 0;
}

}  // namespace

RunLog::RunLog(const std::string& path, int resume_step, int64_t data_sequence, int seq, const std::string& rope)
    : path_(path) {
  // Its directory is made as the exports' are (--log runs/today/log.jsonl before runs/today exists).
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  // Opened without truncating, then locked (flock, held while the run lives): a second run given
  // the same --log (one into another's checkpoint directory, running) is refused before it empties
  // the file under the writer, which went on at its offset behind a run of NUL bytes. Every write
  // appends (O_APPEND).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 && ec)  // the directory could not be made: that is the reason, not the ENOENT after it
    throw std::runtime_error(path + ": cannot open the run log: cannot create " + dir.string() + ": " + ec.message());
  if (fd < 0) throw std::runtime_error(path + ": cannot open the run log: " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      ::close(fd);
      throw std::runtime_error(path + ": another run is writing this log now (it holds its lock): give this run "
                               "another --log");
    }
    // A filesystem without flock (some NFS mounts: ENOLCK) writes the log all the same, as the
    // --save-dir lock does there.
    std::fprintf(stderr, "warning | %s: cannot lock the run log (%s): make sure no other run writes it\n", path.c_str(),
                 std::strerror(e));
  }
  // A fresh run's log starts empty. A resume's keeps its lines, but a torn last one (the run that
  // wrote it died mid-record) is cut off: every line stays JSON, as the README promises (pandas,
  // jq). Its record lay past the checkpoint, or is made again.
  const int64_t keep = resume_step >= 0 ? whole_lines_length(path) : 0;
  struct stat st {};
  if (keep >= 0 && ::fstat(fd, &st) == 0 && keep < int64_t(st.st_size) && ::ftruncate(fd, off_t(keep)) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(path + (resume_step >= 0 ? ": cannot cut the run log's torn last line: "
                                                      : ": cannot empty the run log: ") + std::strerror(e));
  }
  f_ = ::fdopen(fd, "a");
  if (!f_) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot open the run log: " + std::strerror(e));
  }
  if (resume_step >= 0) {
    JsonLine j;
    j.add("type", "resume").add("step", resume_step);
    if (data_sequence >= 0) j.add("data_sequence", data_sequence);
    if (seq > 0) j.add("seq", seq);
    if (!rope.empty()) j.add("rope", rope);
    line(j.str());
  }
}

RunLog::~RunLog() {
  if (f_) std::fclose(f_);
}

void RunLog::line(const std::string& json) {
  // Flushed per line: whoever tails the log (or reads it after a crash) sees every finished step.
  if (std::fputs((json + "\n").c_str(), f_) < 0 || std::fflush(f_) != 0)
    throw std::runtime_error(path_ + ": writing the run log failed: " + std::strerror(errno));
}

void RunLog::sync() {
  // EINVAL: a file that cannot be synced (nothing to make durable there).
  if (std::fflush(f_) != 0 || (::fsync(::fileno(f_)) != 0 && errno != EINVAL))
    throw std::runtime_error(path_ + ": syncing the run log failed: " + std::strerror(errno));
}

void RunLog::step(int step, const StepResult& r, double tok_per_s, double epoch) {
  const double MiB = 1048576.0;
  JsonLine j;
  j.add("type", "step").add("step", step).add("loss", r.loss).add("grad_norm", r.grad_norm);
  j.add("lr", double(r.lr)).add("ms", r.ms, 6).add("tok_per_s", tok_per_s, 6);
  j.add("act_mib", r.act_bytes / MiB, 6).add("a2a_mib", r.sent.all_to_all / MiB, 6);
  j.add("ar_mib", r.sent.all_reduce / MiB, 6);
  if (r.sent.reduce_scatter || r.sent.all_gather)  // ZeRO-1: the gradients' and the weights' traffic
    j.add("rs_mib", r.sent.reduce_scatter / MiB, 6).add("ag_mib", r.sent.all_gather / MiB, 6);
  if (epoch >= 0) j.add("epoch", epoch, 6);
  line(j.str());
}

namespace {

// Named accuracies as fields: "depth 0.25" -> "acc_depth_0.25".
void add_accuracies(JsonLine& j, const std::vector<std::pair<std::string, double>>& named) {
  for (const auto& [name, accuracy] : named) {
    std::string key = "acc_" + name;
    std::replace(key.begin(), key.end(), ' ', '_');
    j.add(key, accuracy);
  }
}

// The band from position 64 on -> "val_loss_pos_64" (bands without a target are left out).
void add_position_losses(JsonLine& j, const std::vector<PositionLoss>& bands) {
  for (const PositionLoss& p : bands)
    if (p.count) j.add("val_loss_pos_" + std::to_string(p.lo), p.loss);
}

}  // namespace

void RunLog::eval(int step, const EvalResult& e) {
  JsonLine j;
  j.add("type", "eval").add("step", step).add("val_loss", e.loss).add("accuracy", e.accuracy);
  if (e.whole_answers > 0) j.add("whole_accuracy", e.whole_accuracy).add("whole_answers", e.whole_answers);
  add_accuracies(j, e.probes);
  add_position_losses(j, e.by_position);
  line(j.str());
}

void RunLog::length_probe(int step, const LengthProbe& p, const std::string& measured) {
  JsonLine j;
  j.add("type", "length").add("step", step).add("T", p.T).add("answers", p.answers);
  add_accuracies(j, p.accuracy);
  if (p.whole_answers > 0) j.add("whole_accuracy", p.whole_accuracy).add("whole_answers", p.whole_answers);
  j.add("val_loss", p.loss);
  add_position_losses(j, p.by_position);  // text: by band
  j.add("measured", measured);
  line(j.str());
}

void RunLog::stop(int step, const char* signal) {
  JsonLine j;
  j.add("type", "stop").add("step", step).add("signal", signal);
  line(j.str());
}

void RunLog::error(int step, const std::string& message) {
  JsonLine j;
  j.add("type", "error").add("step", step).add("message", message);
  line(j.str());
}

std::vector<LogRecord> read_run_log(const std::string& path, int* skipped, const LogFilter& filter) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open the run log: " + std::strerror(errno));
  std::vector<LogRecord> out;
  std::vector<long> steps;                      // each record's step
  std::vector<std::pair<size_t, long>> resumes;  // (records before it, the step it resumed after)
  int bad = 0;
  std::string text;
  // The writer's own spelling (JsonLine): a line of no wanted type is passed over unparsed.
  auto wanted = [&](const std::string& line) {
    if (filter.types.empty() || line.find("\"type\":\"resume\"") != std::string::npos) return true;
    for (const std::string& t : filter.types)
      if (line.find("\"type\":\"" + t + "\"") != std::string::npos) return true;
    return false;
  };
  for (int line_no = 1; std::getline(f, text); line_no++) {
    if (text.empty() || !wanted(text)) continue;
    LogRecord r;
    try {
      r = parse_flat_json(text, path + ":" + std::to_string(line_no));
    } catch (const std::runtime_error&) {
      bad++;
      continue;
    }
    auto type = r.find("type"), step = r.find("step");
    if (type == r.end() || step == r.end()) {
      bad++;
      continue;
    }
    const long at = std::atol(step->second.c_str());
    if (type->second == "resume") {  // what an earlier attempt logged after this step is void (below)
      resumes.push_back({out.size(), at});
      continue;
    }
    if (!filter.types.empty() &&
        std::find(filter.types.begin(), filter.types.end(), type->second) == filter.types.end())
      continue;
    if (!filter.fields.empty())
      for (auto it = r.begin(); it != r.end();)
        it = it->first == "type" || it->first == "step" ||
                     std::find(filter.fields.begin(), filter.fields.end(), it->first) != filter.fields.end()
                 ? std::next(it)
                 : r.erase(it);
    out.push_back(std::move(r));
    steps.push_back(at);
  }
  // A record stays when no later resume went on from an earlier step than its own: one pass from
  // the end with the smallest such step so far (linear however the steps are ordered; a log edited
  // by hand, or written by two runs at once, once made each resume copy every record kept).
  long limit = LONG_MAX;
  size_t kept = out.size(), r = resumes.size();
  for (size_t i = out.size(); i-- > 0;) {
    for (; r > 0 && resumes[r - 1].first > i; r--) limit = std::min(limit, resumes[r - 1].second);
    if (steps[i] > limit) {
      out[i] = LogRecord();
      continue;
    }
    if (--kept != i) out[kept] = std::move(out[i]);
  }
  out.erase(out.begin(), out.begin() + long(kept));
  if (skipped) *skipped = bad;
  return out;
}

}  // namespace ul
