// Per-op GPU time (the contract is in engine/gpu_profile.h): each host thread keeps its own list of
// (name, event pair) records, and a pool of events reused from one report to the next (a step
// launches about a thousand ops; creating two events each would cost more host time than the
// launches). Per thread, because the local communicator's ranks are threads: each profiles its
// own ops, and no lock is taken on the launch path.
#include "engine/gpu_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "engine/cuda_launch.h"

namespace ul {
namespace gpu_profile {
namespace {

struct Record {
  std::string name;
  cudaEvent_t begin = nullptr, end = nullptr;
  double flops = 0;
  bool closed = false;
};

struct Recorder {
  bool on = false;
  std::vector<Record> records;
  std::vector<cudaEvent_t> pool;  // created events not in use
  uint64_t generation = 0;        // counts the times the records were dropped
  int open_spans = 0;             // Spans begun and not yet closed on this thread

  ~Recorder() {
    // At thread or process exit the runtime may already be unloading: errors are ignored.
    for (const Record& r : records) cudaEventDestroy(r.begin), cudaEventDestroy(r.end);
    for (cudaEvent_t e : pool) cudaEventDestroy(e);
  }
  cudaEvent_t take_event() {
    if (pool.empty()) {
      cudaEvent_t e = nullptr;
      UL_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  void drop_records() {
    for (const Record& r : records) {
      pool.push_back(r.begin);
      pool.push_back(r.end);
    }
    records.clear();
    generation++;
  }
};

Recorder& recorder() {
  thread_local Recorder r;
  return r;
}

}  // namespace

bool enabled() { return recorder().on; }

void start() {
  Recorder& rec = recorder();
  UL_CUDA_CHECK(cudaDeviceSynchronize());  // an event still pending must not be reused
  rec.drop_records();
  rec.on = true;
}

void stop() { recorder().on = false; }

void Span::begin(std::string name, cudaStream_t stream, double flops) {
  Recorder& rec = recorder();
  open_ = true;
  if (rec.open_spans++ > 0) return;  // inside another op's span: its time is that op's
  Record r;
  r.name = std::move(name);
  r.begin = rec.take_event();
  r.end = rec.take_event();
  r.flops = flops;
  UL_CUDA_CHECK(cudaEventRecord(r.begin, stream));
  record_ = rec.records.size();
  generation_ = rec.generation;
  stream_ = stream;
  rec.records.push_back(std::move(r));
}

Span::~Span() {
  Recorder& rec = recorder();
  if (open_) rec.open_spans--;
  if (record_ == kNone) return;
  if (generation_ != rec.generation) return;  // a report() inside the op dropped the record
  // Not checked: a destructor must not throw, and an op that failed has already thrown its error.
  if (cudaEventRecord(rec.records[record_].end, stream_) == cudaSuccess) rec.records[record_].closed = true;
}

std::vector<Row> report() {
  Recorder& rec = recorder();
  UL_CUDA_CHECK(cudaDeviceSynchronize());
  std::map<std::string, Row> by_name;
  for (const Record& r : rec.records) {
    if (!r.closed) continue;
    float ms = 0;
    UL_CUDA_CHECK(cudaEventElapsedTime(&ms, r.begin, r.end));
    Row& row = by_name[r.name];
    row.name = r.name;
    row.calls++;
    row.ms += ms;
    row.flops += r.flops;
  }
  rec.drop_records();
  std::vector<Row> rows;
  for (auto& kv : by_name) rows.push_back(std::move(kv.second));
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return rows;
}

std::string table(const std::vector<Row>& rows, double wall_ms) {
  double total = 0;
  for (const Row& r : rows) total += r.ms;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "profile: one step, %.2f ms wall (events add host time), %.2f ms in %zu op names\n",
                wall_ms, total, rows.size());
  out += line;
  std::snprintf(line, sizeof line, "%9s %6s %7s %9s  %s\n", "ms", "%", "calls", "TFLOP/s", "op");
  out += line;
  for (const Row& r : rows) {
    char rate[32] = "-";
    if (r.flops > 0 && r.ms > 0) std::snprintf(rate, sizeof rate, "%.1f", r.flops / (r.ms * 1e-3) / 1e12);
    std::snprintf(line, sizeof line, "%9.3f %6.1f %7ld %9s  %s\n", r.ms, total > 0 ? 100.0 * r.ms / total : 0.0,
                  r.calls, rate, r.name.c_str());
    out += line;
  }
  return out;
}

}  // namespace gpu_profile
}  // namespace ul
