// Per-op GPU time (the contract is in engine/gpu_profile.h): a list of (name, event pair) records
// under one mutex, and a pool of events reused from one report to the next (a step launches about
// a thousand ops; creating two events each would cost more host time than the launches).
#include "engine/gpu_profile.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
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

std::atomic<bool> g_on{false};
std::mutex g_mu;
std::vector<Record> g_records;    // under g_mu
std::vector<cudaEvent_t> g_pool;  // under g_mu: created events not in use
uint64_t g_generation = 0;        // under g_mu: counts the times the records were dropped

cudaEvent_t take_event() {
  if (g_pool.empty()) {
    cudaEvent_t e = nullptr;
    UL_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  cudaEvent_t e = g_pool.back();
  g_pool.pop_back();
  return e;
}

void drop_records() {
  for (Record& r : g_records) {
    g_pool.push_back(r.begin);
    g_pool.push_back(r.end);
  }
  g_records.clear();
  g_generation++;
}

}  // namespace

bool enabled() { return g_on.load(std::memory_order_relaxed); }

void start() {
  std::lock_guard<std::mutex> lock(g_mu);
  UL_CUDA_CHECK(cudaDeviceSynchronize());  // an event still pending must not be reused
  drop_records();
  g_on = true;
}

void stop() { g_on = false; }

void Span::begin(std::string name, cudaStream_t stream, double flops) {
  std::lock_guard<std::mutex> lock(g_mu);
  Record r;
  r.name = std::move(name);
  r.begin = take_event();
  r.end = take_event();
  r.flops = flops;
  UL_CUDA_CHECK(cudaEventRecord(r.begin, stream));
  record_ = g_records.size();
  generation_ = g_generation;
  stream_ = stream;
  g_records.push_back(std::move(r));
}

Span::~Span() {
  if (record_ == kNone) return;
  std::lock_guard<std::mutex> lock(g_mu);
  // A report() or start() between begin and here (another thread's) dropped the record.
  if (generation_ != g_generation) return;
  // Not checked: a destructor must not throw, and an op that failed has already thrown its error.
  if (cudaEventRecord(g_records[record_].end, stream_) == cudaSuccess) g_records[record_].closed = true;
}

std::vector<Row> report() {
  std::lock_guard<std::mutex> lock(g_mu);
  UL_CUDA_CHECK(cudaDeviceSynchronize());
  std::map<std::string, Row> by_name;
  for (const Record& r : g_records) {
    if (!r.closed) continue;
    float ms = 0;
    UL_CUDA_CHECK(cudaEventElapsedTime(&ms, r.begin, r.end));
    Row& row = by_name[r.name];
    row.name = r.name;
    row.calls++;
    row.ms += ms;
    row.flops += r.flops;
  }
  drop_records();
  std::vector<Row> rows;
  for (auto& kv : by_name) rows.push_back(std::move(kv.second));
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return rows;
}

}  // namespace gpu_profile
}  // namespace ul
