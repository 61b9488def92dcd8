#include "engine/rollback_record.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

namespace {

// "6@INO:NS,8@INO:NS" -> {{6, "INO:NS"}, {8, "INO:NS"}}; throws std::invalid_argument on anything else.
std::vector<std::pair<int, std::string>> parse_moving(const std::string& text) {
  std::vector<std::pair<int, std::string>> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const size_t sep = item.find('@');
    char* e = nullptr;
    errno = 0;
    const long step = sep == std::string::npos ? -1 : std::strtol(item.c_str(), &e, 10);
    if (sep == std::string::npos || e != item.c_str() + sep || errno == ERANGE || step < 1 || step > INT32_MAX ||
        sep + 1 == item.size())
      throw std::invalid_argument("'" + item + "'");
    out.push_back({int(step), item.substr(sep + 1)});
    at = end + 1;
  }
  return out;
}

// "2:1:16,6:0:32" -> the earlier rollbacks; throws std::invalid_argument on anything else.
std::vector<RollbackRecord::Earlier> parse_earlier(const std::string& text) {
  std::vector<RollbackRecord::Earlier> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    char *e1 = nullptr, *e2 = nullptr, *e3 = nullptr;
    errno = 0;
    const long step = std::strtol(item.c_str(), &e1, 10);
    const long skip = *e1 == ':' ? std::strtol(e1 + 1, &e2, 10) : -1;
    const long long g = e2 && *e2 == ':' ? std::strtoll(e2 + 1, &e3, 10) : -1;
    if (!e3 || *e3 != '\0' || errno == ERANGE || step < 1 || step > INT32_MAX || skip < 0 || skip > INT32_MAX || g < 1)
      throw std::invalid_argument("'" + item + "'");
    out.push_back({int(step), int(skip), int64_t(g)});
    at = end + 1;
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
      const std::string& v = text(key);
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
        throw std::runtime_error(path + ": " + key + " is '" + v + "'");
      return int64_t(x);
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
