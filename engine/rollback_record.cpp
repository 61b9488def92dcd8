#include "engine/rollback_record.h"

#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/file_io.h"

namespace ul {

namespace {

// text cut at each `sep` ("" gives none).
std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find(sep, at);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// "6@ID,8@ID" -> {{6, "ID"}, {8, "ID"}}; throws std::invalid_argument on anything else.
std::vector<std::pair<int, std::string>> parse_moving(const std::string& text) {
  std::vector<std::pair<int, std::string>> out;
  for (const std::string& item : split(text, ',')) {
    const size_t sep = item.find('@');
    const std::optional<int64_t> step = parse_decimal(item.substr(0, sep), 1, INT32_MAX);
    if (sep == std::string::npos || !step || sep + 1 == item.size()) throw std::invalid_argument("'" + item + "'");
    out.push_back({int(*step), item.substr(sep + 1)});
  }
  return out;
}

// "2:1:16,6:0:32" -> the earlier rollbacks (step:skip:G); throws std::invalid_argument on anything else.
std::vector<RollbackRecord::Earlier> parse_earlier(const std::string& text) {
  std::vector<RollbackRecord::Earlier> out;
  for (const std::string& item : split(text, ',')) {
    const std::vector<std::string> f = split(item, ':');
    const std::optional<int64_t> step = f.size() == 3 ? parse_decimal(f[0], 1, INT32_MAX) : std::nullopt;
    const std::optional<int64_t> skip = f.size() == 3 ? parse_decimal(f[1], 0, INT32_MAX) : std::nullopt;
    const std::optional<int64_t> g = f.size() == 3 ? parse_decimal(f[2], 1, int64_t(1) << 62) : std::nullopt;
    if (!step || !skip || !g) throw std::invalid_argument("'" + item + "'");
    out.push_back({int(*step), int(*skip), *g});
  }
  return out;
}

}  // namespace

std::string rollback_record_path(const std::string& root) { return root + "/rollback.json"; }

std::string step_dir_id(const std::string& dir) {
  try {
    const std::map<std::string, std::string> f = parse_flat_json(read_whole_file(dir + "/rank_0.json"), dir);
    const auto it = f.find("save_id");
    if (it != f.end()) return "save " + it->second;
  } catch (const std::exception&) {
    return "";
  }
  struct stat d {}, c {};
  if (::stat(dir.c_str(), &d) != 0 || ::stat((dir + "/COMPLETE").c_str(), &c) != 0) return "";
  return "inode " + std::to_string((unsigned long long)d.st_ino) + ":" +
         std::to_string((long long)c.st_mtim.tv_sec * 1000000000LL + c.st_mtim.tv_nsec);
}

std::optional<RollbackRecord> read_rollback_record(const std::string& root) {
  const std::string path = rollback_record_path(root);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::string remedy = " (the record of a --resume-step; remove it if that rollback is done or abandoned)";
  try {
    const std::map<std::string, std::string> f = parse_flat_json(read_whole_file(path), path);
    auto text = [&](const char* key) -> const std::string& {
      const auto it = f.find(key);
      if (it == f.end()) throw std::runtime_error(path + ": field '" + key + "' is missing");
      return it->second;
    };
    auto number = [&](const char* key, int64_t lo, int64_t hi) {
      const std::optional<int64_t> x = parse_decimal(text(key), lo, hi);
      if (!x) throw std::runtime_error(path + ": " + key + " is '" + text(key) + "'");
      return *x;
    };
    if (text("format") != "ulysses-rollback") throw std::runtime_error(path + ": format is not ulysses-rollback");
    RollbackRecord r;
    r.step = int(number("step", 1, INT32_MAX));
    r.step_id = text("step_id");
    r.data_sequence = number("data_sequence", 0, int64_t(1) << 62);
    r.sequences_per_step = number("sequences_per_step", 1, int64_t(1) << 62);
    r.skip_batches = int(number("skip_batches", 0, INT32_MAX));
    r.time_ms = number("time_ms", 0, INT64_MAX);
    try {
      r.moving = parse_moving(text("moving"));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(path + ": moving has " + e.what());
    }
    try {
      r.earlier = parse_earlier(text("earlier"));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(path + ": earlier has " + e.what());
    }
    return r;
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(e.what() + remedy);
  }
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
  std::string moving;
  for (const auto& [step, id] : r.moving) moving += (moving.empty() ? "" : ",") + std::to_string(step) + "@" + id;
  std::string earlier;
  for (const RollbackRecord::Earlier& e : r.earlier)
    earlier += (earlier.empty() ? "" : ",") + std::to_string(e.step) + ":" + std::to_string(e.skip_batches) + ":" +
               std::to_string(e.sequences_per_step);
  JsonLine j;
  j.add("format", "ulysses-rollback").add("step", r.step).add("step_id", r.step_id);
  j.add("data_sequence", r.data_sequence).add("sequences_per_step", r.sequences_per_step);
  j.add("skip_batches", r.skip_batches).add("time_ms", r.time_ms).add("moving", moving);
  j.add("earlier", earlier);
  write_file_atomic(rollback_record_path(root), j.str() + "\n");
}

}  // namespace ul
