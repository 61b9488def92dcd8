#include "engine/rollback_record.h"

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

std::string rollback_record_path(const std::string& root) { return root + "/rollback.json"; }

std::optional<RollbackRecord> read_rollback_record(const std::string& root) {
  const std::string path = rollback_record_path(root);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::map<std::string, std::string> f = parse_flat_json(read_whole_file(path), path);
  auto number = [&](const char* key, int64_t lo, int64_t hi) {
    const auto it = f.find(key);
    if (it == f.end()) throw std::runtime_error(path + ": field '" + key + "' is missing");
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
      throw std::runtime_error(path + ": " + key + " is '" + it->second + "'");
    return int64_t(v);
  };
  const auto format = f.find("format");
  if (format == f.end() || format->second != "ulysses-rollback")
    throw std::runtime_error(path + ": not a rollback record (format is not ulysses-rollback)");
  RollbackRecord r;
  r.step = int(number("step", 1, INT32_MAX));
  r.data_sequence = number("data_sequence", 0, int64_t(1) << 62);
  r.sequences_per_step = number("sequences_per_step", 1, int64_t(1) << 62);
  r.skip_batches = int(number("skip_batches", 0, INT32_MAX));
  r.time_ms = number("time_ms", 0, INT64_MAX);
  return r;
}

std::string rollback_time(const RollbackRecord& r) {
  const std::time_t t = std::time_t(r.time_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

void write_rollback_record(const std::string& root, const RollbackRecord& r) {
  JsonLine j;
  j.add("format", "ulysses-rollback").add("step", r.step).add("data_sequence", r.data_sequence);
  j.add("sequences_per_step", r.sequences_per_step).add("skip_batches", r.skip_batches).add("time_ms", r.time_ms);
  write_file_atomic(rollback_record_path(root), j.str() + "\n");
}

}  // namespace ul
