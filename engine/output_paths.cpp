#include "engine/output_paths.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/hf_format.h"
#include "engine/hf_index.h"
#include "engine/loss_plot.h"
#include "engine/probe_plot.h"

namespace ul {

namespace {

namespace fs = std::filesystem;

// A path as the file system resolves it, whether or not it exists yet (so "./a" and "a" match).
std::string resolved(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? path : p.string();
}

// Whether two paths name one file: the same resolved path, or, both existing, the same inode (a
// hard link to the training text, which the log's truncating open would have emptied).
bool same_file(const std::string& a, const std::string& b) {
  if (resolved(a) == resolved(b)) return true;
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec) && !ec;
}

// The files a data spec reads: text:FILE, or what shards:GLOB matches (synthetic tasks: none).
std::vector<std::string> data_files(const std::string& spec) {
  if (spec.rfind("text:", 0) == 0) return {spec.substr(5)};
  std::vector<std::string> out;
  if (spec.rfind("shards:", 0) == 0) {
    glob_t g{};
    if (glob(spec.c_str() + 7, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return out;
}

// Whether NAME.tmp, the name every output is first written under, can be made in its directory:
// what access(W_OK) misses (root passes it on /proc and /sys; a name too long). Tried as NAME.prb,
// as long a name that no writer uses (a run writing NAME.tmp now keeps it). "" when it can (or the
// directory is made later, at start-up), else why not.
std::string cannot_create(const std::string& path) {
  struct stat st {};
  if (::lstat((path + ".tmp").c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return path + ".tmp is there and is not a regular file";
  // Whether the directory is there, asked before the probe: rank 0 may make it (--save-dir) while
  // another rank probes, which then fails with ENOENT and would find the directory there after.
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  const bool parent_there = fs::is_directory(parent.empty() ? fs::path(".") : parent, ec);
  const std::string probe = path + ".prb";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
  }
  const int err = errno;
  if (err == EEXIST || (err == ENOENT && !parent_there)) return "";
  return std::strerror(err);
}

// The checkpoint directory (step_N holding a checkpoint's files, of any run) in which `path` names
// one of those files (model.bin, optim.bin, optim_rank_R.bin, rank_R.json, COMPLETE), "" when
// none: an export or a log written there would replace it (a new name beside them, an export of
// the checkpoint's weights, is left alone).
std::string checkpoint_file_at(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::path(resolved(path));
  const fs::path step = p.parent_path();
  if (parse_step_dir(step.filename().string()) < 0 || !fs::is_directory(step, ec)) return "";
  bool checkpoint = false;
  for (const char* file : {"COMPLETE", "rank_0.json", "model.bin"}) checkpoint = checkpoint || fs::exists(step / file, ec);
  const std::string name = p.filename().string();
  auto numbered = [&](const std::string& head, const std::string& tail) {
    return name.size() > head.size() + tail.size() && name.rfind(head, 0) == 0 &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0 &&
           std::all_of(name.begin() + long(head.size()), name.end() - long(tail.size()),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
  };
  const bool theirs = name == "model.bin" || name == "optim.bin" || name == "COMPLETE" || numbered("rank_", ".json") ||
                      numbered("optim_rank_", ".bin");
  return checkpoint && theirs ? step.string() : "";
}

}  // namespace

bool same_data_files(const std::string& a, const std::string& b) {
  std::vector<std::string> fa = data_files(a), fb = data_files(b);
  if (fa.empty() || fa.size() != fb.size()) return false;
  for (const std::string& f : fa)
    if (std::none_of(fb.begin(), fb.end(), [&](const std::string& g) { return same_file(f, g); })) return false;
  return true;
}

void check_output_paths(const Options& o) {
  using Named = std::pair<std::string, std::string>;  // (flag, path)
  std::vector<Named> outputs, inputs;
  const std::string log = o.log_path();
  const std::string log_flag = !o.log.empty() ? "--log" : "--save-dir's log";
  if (!log.empty()) {
    outputs.push_back({log_flag, log});
    outputs.push_back({log_flag + " (its loss plot)", plot_path_for_log(log)});
    // (without --probe-lengths too: a log without length records removes a plot of that name)
    outputs.push_back({log_flag + " (its length plot)", probe_plot_path_for_log(log)});
  }
  if (!o.export_llmc.empty()) outputs.push_back({"--export-llmc", o.export_llmc});
  if (!o.export_safetensors.empty()) {
    outputs.push_back({"--export-safetensors", o.export_safetensors});
    outputs.push_back({"--export-safetensors (its config.json)",
                       (fs::path(o.export_safetensors).parent_path() / "config.json").string()});
  }
  for (const std::string& f : data_files(o.data)) inputs.push_back({"--data", f});
  for (const std::string& f : data_files(o.val_data)) inputs.push_back({"--val-data", f});
  // A Hugging Face checkpoint's config.json is read too (an export beside it would replace it), and
  // a sharded one's every shard.
  if (is_safetensors_path(o.checkpoint) || is_safetensors_index_path(o.checkpoint))
    inputs.push_back({"--checkpoint (its config.json)", hf_dir_of(o.checkpoint) + "/config.json"});
  if (is_safetensors_index_path(o.checkpoint)) {
    try {
      for (const std::string& shard : read_safetensors_index(o.checkpoint).files) inputs.push_back({"--checkpoint (a shard)", shard});
    } catch (const std::exception&) {
      // a bad index is refused, naming it, when the model is loaded
    }
  }
  for (const auto& [flag, path] : {Named{"--checkpoint", o.checkpoint}, Named{"--check-state", o.check_state},
                                   Named{"--tokenizer", o.tokenizer}, Named{"--prompt-file", o.prompt_file}})
    if (!path.empty()) inputs.push_back({flag, path});

  for (size_t i = 0; i < outputs.size(); i++) {
    const auto& [flag, path] = outputs[i];
    std::error_code ec;
    if (path.back() == '/' || fs::path(path).filename() == "." || fs::path(path).filename() == "..")
      throw std::runtime_error(flag + ": " + path + " names a directory; give a file path");
    const fs::file_status st = fs::status(path, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
      throw std::runtime_error(flag + ": " + path + " exists and is not a regular file (" +
                               (fs::is_directory(st) ? "a directory" : "a pipe, device or socket") +
                               "); give a file path");
    // The directory must take new files: each output is written as NAME.tmp, then renamed. (One
    // that does not exist yet is made at start-up, and that failing is reported there.)
    const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    if (fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) != 0)
      throw std::runtime_error(flag + ": " + path + ": the directory " + dir.string() + " is not writable");
    if (const std::string why = cannot_create(path); !why.empty())
      throw std::runtime_error(flag + ": " + path + ": cannot create a file there (" + why + ")");
    for (const auto& [in_flag, in_path] : inputs)
      if (same_file(in_path, path))
        throw std::runtime_error(flag + " " + path + " is " + in_flag + "'s file: the run would overwrite its own input");
    if (!o.save_dir.empty() && same_file(o.save_dir, path))
      throw std::runtime_error(flag + " " + path + " is --save-dir's directory; give a file path");
    if (!o.save_dir.empty()) {  // a checkpoint's files are the run's own: an export there would replace one
      const fs::path rel = fs::weakly_canonical(path, ec).lexically_relative(fs::weakly_canonical(o.save_dir, ec));
      if (!rel.empty() && parse_step_dir(rel.begin()->string()) >= 0)
        throw std::runtime_error(flag + " " + path + " is inside --save-dir's checkpoint " + rel.begin()->string() +
                                 "; write it elsewhere");
      if (rel == ".lock")  // the run's lock (engine/checkpoint.h): the next run would empty it
        throw std::runtime_error(flag + " " + path + " is --save-dir's lock file; write it elsewhere");
      if (rel == "rollback.json")  // a rollback's record (engine/rollback_record.h): every resume reads it
        throw std::runtime_error(flag + " " + path + " is --save-dir's rollback record; write it elsewhere");
    }
    if (const std::string step = checkpoint_file_at(path); !step.empty())
      throw std::runtime_error(flag + " " + path + " is a file of the checkpoint " + step +
                               ": this run would replace it; write it elsewhere");
    for (size_t j = 0; j < i; j++)
      if (same_file(outputs[j].second, path))
        throw std::runtime_error(flag + " " + path + " is also " + outputs[j].first + "'s: one would overwrite the other");
  }
  // A --log in another run's --save-dir (a directory holding its checkpoints or its lock) whose
  // log or plots (named after the log: loss_plot.h, probe_plot.h) are that run's (log.jsonl,
  // log.svg, log_lengths.svg) or any file already there (the other run's own --log name, whatever
  // it was) would replace its history or append this run's records to it, or redraw or remove its
  // plots. A new name there (an eval's log beside the checkpoint it read) touches nothing of it.
  if (!o.log.empty()) {
    const fs::path dir = fs::path(o.log).parent_path().empty() ? fs::path(".") : fs::path(o.log).parent_path();
    std::error_code ec;
    const bool own = !o.save_dir.empty() && same_file(o.save_dir, dir.string());
    bool run_dir = !own && fs::exists(dir / ".lock", ec);
    if (!own && !run_dir && fs::is_directory(dir, ec))
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end && !run_dir; it.increment(ec))
        run_dir = parse_step_dir(it->path().filename().string()) >= 0 && fs::is_directory(it->path(), ec);
    const std::string theirs[] = {"log.jsonl", "log.svg", "log_lengths.svg"};
    for (const std::string& file : {o.log, plot_path_for_log(o.log), probe_plot_path_for_log(o.log)}) {
      if (!run_dir) break;
      const bool exists = fs::exists(file, ec);
      const std::string name = fs::path(file).filename().string();
      if (exists || std::find(std::begin(theirs), std::end(theirs), name) != std::end(theirs))
        throw std::runtime_error("--log " + o.log + ": " + (file == o.log ? "it" : "its plot " + file) + " is " +
                                 (exists ? "a file" : "a name") + " of another run's --save-dir (" + dir.string() +
                                 " holds its checkpoints or lock): this run would " +
                                 (file == o.log && o.resume ? "add its records to" : "replace") +
                                 " it; write it elsewhere, or under a new name");
    }
  }
  // What this run writes must not be what a shards: pattern matches once written: the files above
  // (not there yet, so no input of theirs matched), --save-dir and a checkpoint in it. The run
  // would go on, and then neither resume nor start again on that pattern (a log or a step directory
  // read as a shard). As glob(3) matches: '/' and a leading '.' only literally.
  if (!o.save_dir.empty()) {
    outputs.push_back({"--save-dir", o.save_dir});
    const fs::path step = fs::path(o.save_dir) / step_dir_name(1);
    outputs.push_back({"--save-dir (a checkpoint in it)", step.string()});
    for (const char* file : {"model.bin", "optim.bin", "rank_0.json", "COMPLETE"})
      outputs.push_back({"--save-dir (a checkpoint's file)", (step / file).string()});
  }
  for (const auto& [in_flag, spec] : {Named{"--data", o.data}, Named{"--val-data", o.val_data}}) {
    if (spec.rfind("shards:", 0) != 0 || spec.size() == 7) continue;  // (an empty pattern: refused when opened)
    const std::string pattern = fs::absolute(spec.substr(7)).lexically_normal().string();
    for (const auto& [flag, path] : outputs)
      if (::fnmatch(pattern.c_str(), fs::absolute(path).lexically_normal().string().c_str(), FNM_PATHNAME | FNM_PERIOD) == 0)
        throw std::runtime_error(flag + " " + path + " matches " + in_flag + "'s pattern " + spec +
                                 ": later runs on it would read it as a shard; write it elsewhere (or name the "
                                 "shards more narrowly)");
  }
}

}  // namespace ul
