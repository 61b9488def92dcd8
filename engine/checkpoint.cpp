#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/checkpoint_files.h"
#include "engine/device.h"
#include "engine/file_io.h"
#include "engine/heartbeat.h"
#include "engine/ranks_agree.h"
#include "engine/trainer.h"
#include "parallel/hosts.h"

namespace ul {

namespace fs = std::filesystem;

namespace {

const char* kComplete = "COMPLETE";

}  // namespace

// The step of a directory named as step_dir_name(step) names it, or -1: step_5 is not step 5's
// (a load reads step_00000005), so it is no checkpoint.
int parse_step_dir(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  if (name.size() > 5 + 10) return -1;  // more digits than an int holds (step_%08d of 2^31 - 1: 10)
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step <= INT32_MAX && name == step_dir_name(int(step)) ? int(step) : -1;
}

std::vector<std::pair<int, bool>> list_step_dirs(const std::string& root) {
  std::vector<std::pair<int, bool>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int step = parse_step_dir(it->path().filename().string());
    if (step < 0 || !it->is_directory()) continue;
    out.push_back({step, fs::exists(it->path() / kComplete)});
  }
  if (ec) throw std::runtime_error(root + ": cannot list the save directory: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// COMPLETE goes first (and durably), so the directory stops being a checkpoint before any of its
// files disappear. A step directory that is a link (another run's checkpoint, linked in to branch
// from it) loses only the link: its COMPLETE once went through it, and that run's next start
// removed its own checkpoint as a crashed save.
void remove_step_dir(const std::string& root, int step) {
  const fs::path dir = fs::path(root) / step_dir_name(step);
  std::error_code ec;
  if (!fs::is_symlink(dir, ec) && fs::remove(dir / kComplete, ec)) fsync_dir(dir.string());
  fs::remove_all(dir, ec);
  if (ec) throw std::runtime_error(dir.string() + ": cannot remove: " + ec.message());
  fsync_dir(root);
}

}  // namespace

// remove_step_dir for what only tidies up: a directory that will not go (a file held open on NFS,
// permissions) is renamed out of the way (step_00000004.stale.PID.TIME: no step name, so no
// checkpoint, and its step free for the next save, which is often exactly that step; the next run
// tries it again), else left with a warning: neither stops a run whose checkpoint was just saved
// nor blocks every later resume.
bool remove_or_warn(const std::string& root, int step, const char* what) {
  try {
    remove_step_dir(root, step);
    return true;
  } catch (const std::exception& e) {
    const fs::path dir = fs::path(root) / step_dir_name(step);
    // The process id alone repeats (containers start at the same one): the time too.
    const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
    const fs::path aside =
        fs::path(root) / (step_dir_name(step) + ".stale." + std::to_string(::getpid()) + "." + std::to_string(ms));
    std::error_code ec;
    fs::rename(dir, aside, ec);
    std::fprintf(stderr, "warning | %s (%s): %s\n", e.what(), what,
                 ec ? "left in place" : ("moved to " + aside.string()).c_str());
    return false;
  }
}

namespace {

int crash_hook_save() {
  const char* v = std::getenv("ULYSSES_TEST_CRASH_IN_SAVE");
  return v ? std::atoi(v) : 0;
}

// TEST HOOK (checkpoint.h): the rank whose writes fail, as a full disk would fail them (-1: none),
// and at which stage: its files (R), rank 0's step directory (0:dir) or its COMPLETE marker
// (0:complete).
int failing_rank_hook(const char* stage = "") {
  const char* v = std::getenv("ULYSSES_TEST_FAIL_SAVE_RANK");
  if (!v || !*v) return -1;
  const char* colon = std::strchr(v, ':');
  return std::string(colon ? colon + 1 : "") == stage ? std::atoi(v) : -1;
}

std::vector<float> to_host(const float* p, Device d, size_t n) {
  std::vector<float> h(n);
  device_copy(h.data(), Device::cpu, p, d, n * sizeof(float));
  return h;
}

// root as an absolute path without a trailing separator: "runs/a/" would otherwise walk up to
// "runs/a" as its own parent, and the directories made above it would stay.
fs::path absolute_dir(const std::string& root, std::error_code& ec) {
  fs::path p = fs::absolute(root, ec).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

}  // namespace

SaveDirLock::SaveDirLock(const std::string& root) : root_(root) {
  std::error_code ec;
  // The topmost directory this lock makes (--save-dir runs/a/b with runs/ there: runs/a), to take
  // away again when the run is refused before it writes anything.
  for (fs::path p = absolute_dir(root, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made_ = p.string();
    if (p == p.parent_path()) break;
  }
  fs::create_directories(root, ec);
  if (ec) throw std::runtime_error("--save-dir " + root + ": cannot create the save directory: " + ec.message());
  const std::string path = (fs::path(root) / ".lock").string();
  // 0666 less the umask: a teammate resuming a shared run can open it too. A directory this run
  // cannot write (a read-only snapshot it only evaluates or exports from) is locked through a
  // read-only descriptor, and one where not even that opens only warns.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    std::fprintf(stderr, "warning | %s: cannot open the lock (%s): make sure no other run uses this --save-dir\n",
                 path.c_str(), std::strerror(errno));
    return;
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char who[256] = {};
      const ssize_t got = ::pread(fd_, who, sizeof who - 1, 0);
      std::string holder = got > 0 ? std::string(who, size_t(got)) : "";
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(root + ": another run is using this --save-dir (" +
                               (holder.empty() ? std::string("its process holds ") + path : holder) +
                               "); two runs in one directory delete each other's checkpoints: wait for it to end, "
                               "or choose another --save-dir (if that holder is gone, as after a node crash on "
                               "NFSv3, remove " + path + ")");
    }
    ::close(fd_);
    fd_ = -1;
    std::fprintf(stderr, "warning | %s: cannot lock (%s): make sure no other run uses this --save-dir\n", path.c_str(),
                 std::strerror(err));
    return;
  }
  // Locked, but is it still the directory's lock? A run refused at the same moment removes a lock
  // file it made (with the directory): a lock on that removed file would guard nothing.
  struct stat held {}, now {};
  if (::fstat(fd_, &held) != 0 || ::stat(path.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
      held.st_dev != now.st_dev) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(path + ": the lock file was removed while this run took it (another run starting in "
                             "this --save-dir at the same moment?): start it again");
  }
  const std::string who = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  // Who holds it, for the refusal's message only: nothing depends on these bytes being there.
  const bool noted = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, who.data(), who.size(), 0) == ssize_t(who.size());
  (void)noted;
}

SaveDirLock::~SaveDirLock() {
  std::error_code ec;
  if (!made_.empty() && fd_ >= 0) {
    // Nothing but the lock in it (no step, no log): the run wrote nothing, and leaves nothing.
    bool only_lock = true;
    fs::directory_iterator it(root_, ec), end;
    for (; !ec && it != end; it.increment(ec)) only_lock = only_lock && it->path().filename() == ".lock";
    if (!ec && only_lock) {
      fs::remove(fs::path(root_) / ".lock", ec);
      for (fs::path p = absolute_dir(root_, ec); fs::remove(p, ec) && p.string() != made_; p = p.parent_path()) {
      }
    }
  }
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::string step_dir_name(int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08d", step);
  return buf;
}

int save_dir_write_error(const std::string& root) {
  // Not a step's name: a probe a crash leaves behind is never taken for a checkpoint.
  const std::string probe = (fs::path(root) / (".write_probe." + std::to_string(::getpid()))).string();
  if (::mkdir(probe.c_str(), 0755) != 0) return errno == EEXIST ? 0 : errno;
  ::rmdir(probe.c_str());
  return 0;
}

std::vector<int> complete_steps(const std::string& root) {
  std::vector<int> steps;
  for (auto& [step, complete] : list_step_dirs(root))
    if (complete) steps.push_back(step);
  return steps;
}

void save_checkpoint(Trainer& tr, const std::string& root, int keep) {
  Grid& g = tr.grid();
  const int rank = g.world.rank(), step = tr.steps_done();
  const std::string dir = root + "/" + step_dir_name(step);
  // Rank 0 alone makes the directory; a failure there (a full disk, a quota) is agreed on as the
  // files' are below, so that every rank stops with it rather than the job by MPI_Abort.
  std::string made;
  if (rank == 0) {
    try {
      if (failing_rank_hook("dir") == 0) throw std::runtime_error(dir + ": cannot create (ULYSSES_TEST_FAIL_SAVE_RANK)");
      // A directory for this step can only be the leftover of an attempt that crashed.
      if (fs::exists(dir)) remove_or_warn(root, step, "a save that crashed");
      std::error_code ec;
      // false without an error: the leftover is still there (neither removed nor moved aside); its
      // files of another layout (more ranks' rank_R.json) must not join this save.
      if (!fs::create_directory(dir, ec) && !ec)
        throw std::runtime_error(dir + ": a crashed save's leftover that could be neither removed nor moved aside "
                                 "is in the way: remove it, then start again");
      if (ec) throw std::runtime_error(dir + ": cannot create the checkpoint directory: " + ec.message());
      fsync_dir(root);
    } catch (const std::exception& e) {
      made = failure_text(e);
    }
  }
  agree_on_errors(g.world, made);  // also the barrier before any rank writes into the directory

  Params& params = tr.model().params;
  const size_t n = params.numel();
  // The f32 values on rank 0's host (a bf16 model's master weights, not their bf16 rounding;
  // gathered from their owners when ZeRO-1 shards them).
  std::vector<float> copy;  // where the weights are not already on the host as f32 (a device's)
  const float* host = tr.host_weights(rank == 0, copy);
  std::vector<std::pair<std::string, uint32_t>> crcs;  // of the files this rank writes, for its rank file
  // One id for the save, rank 0's, in every rank's file (16 hex digits and a NUL, as bytes).
  char save_id[17] = {};
  if (rank == 0) std::snprintf(save_id, sizeof save_id, "%s", new_save_id().c_str());
  if (g.world.size() > 1) g.world.broadcast(save_id, 4, DType::i32, 0);
  // This rank's files: a failure is caught, for every rank to learn of it (agree_on_errors).
  auto write_files = [&] {
    if (failing_rank_hook() == rank) throw std::runtime_error(dir + ": cannot write (ULYSSES_TEST_FAIL_SAVE_RANK)");
    if (rank == 0) {
      static std::atomic<int> saves{0};  // this process's saves, for the test hook
      const int nth = ++saves;
      if (nth == crash_hook_save()) write_model_file_and_crash(dir + "/model.bin", tr.model().cfg, host, n);
      crcs.push_back({"model.bin", write_model_file(dir + "/model.bin", tr.model().cfg, host, n)});
    }
    // The owner of each optimizer shard writes it: rank 0 the whole state, or (ZeRO-1) every rank
    // its own slice, optim_rank_R.bin.
    AdamW& opt = tr.optimizer();
    // Decided as the trainer shards (not from this rank's range: with fewer than 4 elements a rank,
    // the last rank's shard is the whole buffer, and it alone would have written no file).
    const bool sharded = tr.options().zero && g.world.size() > 1;
    if (rank == 0 || sharded) {
      OptimShard s;
      const size_t count = opt.hi() - opt.lo();
      s.t = opt.t(), s.numel = n, s.offset = opt.lo(), s.count = count;
      s.shard = sharded ? rank : 0, s.shards = sharded ? g.world.size() : 1;
      // On the CPU written from AdamW's own buffers (a copy would be 8 bytes a parameter more).
      const bool in_place = params.device() == Device::cpu;
      if (!in_place) s.m = to_host(opt.m(), params.device(), count), s.v = to_host(opt.v(), params.device(), count);
      const std::string name = optim_file_name(s.shard, s.shards);
      crcs.push_back({name, write_optim_file(dir + "/" + name, s, in_place ? opt.m() : s.m.data(),
                                             in_place ? opt.v() : s.v.data())});
    }
    write_rank_file(dir + "/" + rank_file_name(rank), step, tr.next_sequence(), rank, g, run_layout(tr.options(), g),
                    run_fields(tr.options(), tr.model().cfg, tr.train_data().identity(), tr.train_data().eot()), crcs,
                    save_id);
  };
  std::string failed;
  try {
    write_files();
  } catch (const std::exception& e) {
    failed = failure_text(e);
  }
  try {
    agree_on_errors(g.world, failed);  // every rank's files are durable: only now may the directory count
  } catch (const CommError& e) {
    // A rank that timed out here waited for another's writes (rank 0 writes model.bin alone), not
    // necessarily for a dead peer: say which wait it was, and the flag that lengthens it.
    if (!std::strstr(e.what(), "timed out")) throw;
    throw CommError(std::string(e.what()) + " (waiting for every rank's files of " + dir +
                    ": a save slower than --comm-timeout needs a larger one)");
  }

  // The marker that makes the directory a checkpoint: rank 0's, agreed on as the rest.
  std::string marked;
  if (rank == 0) {
    try {
      if (failing_rank_hook("complete") == 0) throw std::runtime_error(dir + ": cannot write " + kComplete +
                                                                         " (ULYSSES_TEST_FAIL_SAVE_RANK)");
      write_file_atomic(dir + "/" + kComplete, "step " + std::to_string(step) + "\n");
      fsync_dir(root);
    } catch (const std::exception& e) {
      marked = failure_text(e);
    }
  }
  agree_on_errors(g.world, marked);
  if (rank == 0) {
    if (keep > 0) {
      std::vector<int> steps = complete_steps(root);
      for (size_t i = 0; i + size_t(keep) < steps.size(); i++) remove_or_warn(root, steps[i], "past --keep");
    }
  }
}

namespace {

// Whether the checkpoint's optimizer state is one optim.bin (else ZeRO's optim_rank_R.bin): the
// files rank_0.json recorded a crc32 for, not the files there (a copy that merged another save's
// step directory into this one leaves an optim.bin of the same step beside ZeRO's shards, which
// AdamW's t does not tell apart); a checkpoint from before the crcs: the one there.
bool whole_optimizer(const std::string& dir) {
  const std::string rank0 = dir + "/" + rank_file_name(0);
  if (recorded_crc(rank0, optim_file_name(0, 1)) >= 0) return true;
  if (recorded_crc(rank0, optim_file_name(0, 2)) >= 0) return false;
  return std::ifstream(dir + "/" + optim_file_name(0, 1)).good();
}

}  // namespace

LoadedCheckpoint read_checkpoint(Trainer& tr, const std::string& root, int step, const RollbackRecord* pending,
                                 std::string* rope_before) {
  Grid& g = tr.grid();
  const int rank = g.world.rank();
  const std::string dir = root + "/" + step_dir_name(step);
  Params& params = tr.model().params;
  const size_t n = params.numel();
  // A large model's load takes a while (the checkpoint is 12 bytes a parameter; a ZeRO rank reads
  // the model and its part of the rest): said first, as a save is.
  const double gib = double(n) * 12 / double(1 << 30);
  if (rank == 0 && gib >= 1 && !tr.options().quiet)
    std::printf("resume  | loading %s (about %.1f GiB) ...\n", dir.c_str(), gib), std::fflush(stdout);
  // and then how far it got, every --heartbeat ("  ...   resume step_00001500 | 3.20 GiB read | 30.0 s")
  Heartbeat beat(rank == 0 && !tr.options().quiet ? tr.options().heartbeat : 0);
  Heartbeat::Phase reading = beat.begin("resume " + step_dir_name(step), Heartbeat::bytes_read_from_now());

  // rank_0.json is in every checkpoint, whatever its world: the options and the layout it was saved
  // at. At the same layout each rank also checks its own file, its place in the grid included.
  const std::vector<RunField> fields = run_fields(tr.options(), tr.model().cfg, tr.train_data().identity(), tr.train_data().eot());
  const RunLayout run = run_layout(tr.options(), g);
  // A pending rollback's G is the one to keep (the files have the history's before it).
  const bool new_g = tr.options().change_global_batch;
  const Options& o = tr.options();
  const ResumeChanges changes{new_g || pending, o.change_seq, o.change_rope, o.resume_step >= 0,
                              o.set_by_user("--rope-theta"), o.set_by_user("--rope-scaling")};
  int64_t data = 0;  // the next step's first sequence, rank 0's (every rank's file records the same)
  // Before its run fields: a rank_0.json that recorded other crc32s than both files rank 0 wrote
  // carry is another checkpoint's or run's, not a reason to change this run's flags (one file alone
  // amiss is that file, named where it is read).
  {
    const std::string rank0 = dir + "/" + rank_file_name(0);
    const std::string opt0 = whole_optimizer(dir) ? optim_file_name(0, 1) : optim_file_name(0, 2);
    int amiss = 0;
    for (const std::string& name : {std::string("model.bin"), opt0}) {
      const int64_t want = recorded_crc(rank0, name), have = stored_crc(dir + "/" + name);
      amiss += want >= 0 && have >= 0 && want != have;
    }
    // Which side is the stranger is not known here: this rank_0.json, or both files (copied in
    // from another step together; their own checks below would name them had it been them alone).
    if (amiss == 2)
      throw std::runtime_error(rank0 + ": the crc32s it recorded are not those of model.bin and " + opt0 +
                               " beside it: either this rank file or both of those files come from another "
                               "checkpoint or run");
  }
  const RunLayout saved = check_rank_file(dir + "/" + rank_file_name(0), step, fields, run, rank == 0 ? &g : nullptr,
                                          &data, changes);
  int64_t own = data;
  if (saved == run && rank != 0) {
    check_rank_file(dir + "/" + rank_file_name(rank), step, fields, run, &g, &own, changes);
    check_rank_file_matches_rank0(dir + "/" + rank_file_name(rank));
  }
  if (own != data)
    throw std::runtime_error(dir + "/" + rank_file_name(rank) + ": data_sequence " + std::to_string(own) + " but " +
                             rank_file_name(0) + " has " + std::to_string(data));
  if (pending) {
    if (!new_g && pending->sequences_per_step != run.sequences_per_step())
      throw RunMismatch(rollback_record_path(root) + ": the rollback to step " + std::to_string(step) + " trains on " +
                        std::to_string(pending->sequences_per_step) + " sequences a step but this run on " +
                        std::to_string(run.sequences_per_step()) + " (" + run.str() + "): keep --batch x --grad-accum " +
                        "x dp at " + std::to_string(pending->sequences_per_step) + ", or --change-global-batch");
    data = pending->data_sequence;  // in sequences of this checkpoint's --seq too (a rollback keeps it)
  }
  // --change-seq: the same place in the data's epoch, in sequences of the new length.
  if (saved.seq != run.seq) data = sequence_at_length(tr.train_data(), data, saved.seq, run.seq);

  // Each binary file against the crc32 its writer's rank file recorded: a model.bin or optimizer
  // file of another checkpoint or run put in this one's place is refused, not loaded.
  auto check_crc = [&](const std::string& path, const std::string& name, int writer, uint32_t crc) {
    const std::string rank_path = dir + "/" + rank_file_name(writer);
    const int64_t want = recorded_crc(rank_path, name);
    if (want >= 0 && uint32_t(want) != crc) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ": its crc32 is %08x but %s recorded %08x for it", crc, rank_file_name(writer).c_str(),
                    unsigned(want));
      throw std::runtime_error(path + buf + ": a file of another checkpoint or run");
    }
  };
  const std::string model_path = dir + "/model.bin";
  std::vector<float> p;
  uint32_t model_crc = 0;
  // The CRC first: a model.bin of another run put in this one's place is that, not a flag to change.
  const ModelConfig in_file = read_model_file(model_path, p, &model_crc);
  check_crc(model_path, "model.bin", 0, model_crc);
  ModelConfig trained = in_file;
  // --change-seq: a llama's max_seq, the longest --seq it trained at, has grown with this run's
  // (apply_trained_length); it never shrinks (give --max-seq to keep a longer one).
  if (changes.seq && trained.is_llama() && trained.max_seq < tr.model().cfg.max_seq &&
      tr.model().cfg.max_seq == tr.options().seq)
    trained.max_seq = tr.model().cfg.max_seq;
  // --change-rope: the weights go on under this run's rotation (no weight depends on it).
  if (changes.rope) {
    if (changes.theta_asked) trained.rope_theta = tr.model().cfg.rope_theta;
    if (changes.scaling_asked) trained.rope_scaling = tr.model().cfg.rope_scaling;
    if (rope_before && rope_text(in_file) != rope_text(trained)) *rope_before = rope_text(in_file);
  }
  check_model_config(model_path, trained, tr.model().cfg);
  if (p.size() != n)
    throw std::runtime_error(model_path + ": holds " + std::to_string(p.size()) + " parameters but this model has " +
                             std::to_string(n));

  // The optimizer state: optim.bin (one shard) or optim_rank_R.bin (ZeRO-1, any world size); this
  // rank takes the part of each file that falls in its own range [lo, hi). Every file's header is
  // checked on every rank (its shard, t, and the crc32 its rank file recorded: a stranger is refused
  // everywhere), but a file's payload is read, and its checksum checked, only by the ranks whose
  // range it meets: on N ranks of ZeRO each shard is read once in all at the world it was saved at
  // (on fewer ranks, by the two or so it straddles; on M from N, by about M/N + 1), not N times (64
  // ranks of an 8B model: 64 GB of AdamW state, not 4 TB). A shard damaged inside is then found
  // by those ranks alone: resume.cpp has the ranks agree on the load's outcome.
  AdamW& opt = tr.optimizer();
  const size_t lo = opt.lo(), hi = opt.hi();
  std::vector<float> m(hi - lo), v(hi - lo);
  size_t covered = 0;
  int64_t t = -1;
  const bool whole = whole_optimizer(dir);
  if (!std::ifstream(dir + "/" + optim_file_name(0, whole ? 1 : 2)).good()) {
    if (!std::ifstream(dir + "/" + optim_file_name(0, whole ? 2 : 1)).good())
      throw std::runtime_error(dir + ": no optimizer state: neither " + optim_file_name(0, 1) + " nor (--zero 1) " +
                               optim_file_name(0, 2) + " is there");
    throw std::runtime_error(dir + ": " + rank_file_name(0) + " records the optimizer state in " +
                             optim_file_name(0, whole ? 1 : 2) + ", which is not there (" +
                             optim_file_name(0, whole ? 2 : 1) + " is, from another save)");
  }
  for (int k = 0, shards = 1; k < shards; k++) {
    // optim_file_name(k, any shards > 1) is optim_rank_k.bin; the count comes from shard 0's header
    const std::string path = dir + "/" + optim_file_name(whole ? 0 : k, whole ? 1 : 2);
    OptimShard s = read_optim_file(path, lo, hi, m.data(), v.data(), true);  // into this rank's range
    if (!whole && k == 0) shards = s.shards;
    if (s.numel != n || s.shard != k || s.shards != (whole ? 1 : shards))
      throw std::runtime_error(path + ": holds shard " + std::to_string(s.shard) + " of " + std::to_string(s.shards) +
                               " of " + std::to_string(s.numel) + " parameters; expected shard " + std::to_string(k) +
                               " of " + std::to_string(n));
    // Every step takes one AdamW update: t is the step the state was saved at.
    if (s.t != step)
      throw std::runtime_error(path + ": AdamW step count t = " + std::to_string(s.t) + " but the checkpoint is step " +
                               std::to_string(step) + ": a file of another checkpoint");
    // Its writer's rank file first: a stranger there is named, not the shard it has another crc for.
    if (!whole && k > 0) check_rank_file_matches_rank0(dir + "/" + rank_file_name(k));
    check_crc(path, optim_file_name(whole ? 0 : k, whole ? 1 : 2), whole ? 0 : k, s.crc);
    if (t >= 0 && s.t != t) throw std::runtime_error(path + ": AdamW step count differs between the shards");
    t = s.t;
    covered += s.kept_count;
  }
  if (covered != hi - lo)
    throw std::runtime_error(dir + ": the optimizer files cover " + std::to_string(covered) + " of this rank's " +
                             std::to_string(hi - lo) + " elements");

  LoadedCheckpoint c;
  c.saved = saved, c.step = step, c.data = data, c.t = t;
  c.params = std::move(p), c.m = std::move(m), c.v = std::move(v);
  return c;
}

void place_checkpoint(Trainer& tr, LoadedCheckpoint& c) {
  // Every check passed: only now does the trainer change.
  Params& params = tr.model().params;
  AdamW& opt = tr.optimizer();
  const Device d = params.device();
  params.load_host(c.params.data());  // f32 -> master (bf16: and the rounded bf16 parameters)
  std::vector<float>().swap(c.params);
  device_copy(opt.m(), d, c.m.data(), Device::cpu, c.m.size() * sizeof(float));
  device_copy(opt.v(), d, c.v.data(), Device::cpu, c.v.size() * sizeof(float));
  std::vector<float>().swap(c.m);
  std::vector<float>().swap(c.v);
  opt.set_t(int(c.t));
}

void finish_checkpoint(Trainer& tr, const LoadedCheckpoint& c) {
  // bf16: the weights as the run rounded them at step t (the file holds only the masters; with
  // sharded masters a collective, which is why a resume agrees on the load before this).
  tr.round_bf16_from_masters();
  tr.set_steps_done(c.step, c.data);
}

RunLayout load_checkpoint(Trainer& tr, const std::string& root, int step, const RollbackRecord* pending,
                          std::string* rope_before) {
  LoadedCheckpoint c = read_checkpoint(tr, root, step, pending, rope_before);
  place_checkpoint(tr, c);
  finish_checkpoint(tr, c);
  return c.saved;
}

}  // namespace ul
