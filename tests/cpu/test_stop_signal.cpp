// A stop signal (engine/stop_signal.h) sent to a running `train`: it finishes the step, saves a
// checkpoint, logs the stop and exits 128 + the signal; --resume then continues bit-exactly (the
// losses after the stop are those of a run never stopped), also with ranks agreeing under sp 2.
// A second Ctrl-C ends the process at once; any other repeat is noted and the save goes on.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/run_log.h"
#include "engine/stop_signal.h"
#include "run_cmd.h"
#include "temp_dir.h"

using namespace ul;
namespace fs = std::filesystem;

namespace {

struct Stopped {
  int status = 0;   // waitpid's
  std::string out;  // stdout and stderr
};

// Runs train with `args`; once a line holding `after` is printed, sends it `sig`; with `second`,
// sends that signal `delay_ms` after train says it caught the first (two signals sent back to back
// would merge into one pending signal). Then reads the rest and waits for it. hold: ULYSSES_TEST_HOLD's points
// (engine/stop_signal.h), where train waits for the signal: it lands there however slow the
// machine is, not a step or a probe later.
// `sh -c cmd` in a child whose stdout and stderr are the returned stream; hold: as below.
std::pair<pid_t, FILE*> spawn_shell(const std::string& cmd, const std::string& hold = "") {
  int fd[2];
  REQUIRE(::pipe(fd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fd[1], STDOUT_FILENO);
    ::dup2(fd[1], STDERR_FILENO);
    ::close(fd[0]);
    ::close(fd[1]);
    if (!hold.empty()) ::setenv("ULYSSES_TEST_HOLD", hold.c_str(), 1);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fd[1]);
  return {pid, ::fdopen(fd[0], "r")};
}

Stopped run_and_signal(const std::string& args, const std::string& after, int sig, int second = 0,
                       const std::string& hold = "", int delay_ms = 0) {
  const auto [pid, f] = spawn_shell("exec " + ul_test::train_cmd(args), hold);
  Stopped r;
  bool sent = false, again = false;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) {
    r.out += line;
    if (!sent && r.out.find(after) != std::string::npos) {
      ::kill(pid, sig);
      sent = true;
    }
    if (second && sent && !again && r.out.find("again to stop now") != std::string::npos) {
      ::usleep(useconds_t(delay_ms) * 1000);
      ::kill(pid, second);  // it is still finishing its step, or saving (held there)
      again = true;
    }
  }
  std::fclose(f);
  ::waitpid(pid, &r.status, 0);
  CHECK(sent);
  return r;
}

// step -> the loss text of a run log's step records.
std::map<std::string, std::string> losses(const std::string& log) {
  std::map<std::string, std::string> out;
  for (const LogRecord& r : read_run_log(log))
    if (r.at("type") == "step") out[r.at("step")] = r.at("loss");
  return out;
}

}  // namespace

TEST_CASE("SIGTERM and SIGUSR1: the step ends, a checkpoint is saved, --resume goes on bit-exactly", "[stop][cli]") {
  struct Case { int sig; const char* name; std::string layout; };
  // (SIGINT: the next test case. Each case is three short runs, slow under the sanitizers.)
  for (const Case& k : {Case{SIGTERM, "SIGTERM", ""}, Case{SIGUSR1, "SIGUSR1", " --ranks 2 --sp 2"}}) {
    CAPTURE(k.name, k.layout);
    ul_test::TempDir dir;
    const std::string common = "--steps 24 --eval-every 0 --eval-batches 1 --threads 1 --batch 4 --seq 128" + k.layout;
    const ul_test::CmdResult whole = ul_test::run_cmd(ul_test::train_cmd(common + " --log " + dir / "whole.jsonl"));
    REQUIRE(whole.code == 0);
    const std::string save = " --save-dir " + dir / "run";
    const Stopped s = run_and_signal(common + save, "step     5/24", k.sig, 0, "step 5");
    INFO(s.out);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 128 + k.sig);
    const size_t at = s.out.find(std::string("stopped | ") + k.name + " after step ");
    REQUIRE(at != std::string::npos);
    const int step = std::stoi(s.out.substr(at + std::strlen("stopped | ") + std::strlen(k.name) + std::strlen(" after step ")));
    CHECK(step == 5);  // held there until the signal came
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step);
    CHECK(fs::exists(fs::path(dir / "run") / name / "COMPLETE"));
    CHECK(s.out.find("continue with --resume") != std::string::npos);
    CHECK(s.out.find("done |") == std::string::npos);
    const std::vector<LogRecord> log = read_run_log(dir / "run/log.jsonl");
    REQUIRE(!log.empty());
    CHECK(log.back().at("type") == "stop");
    CHECK(log.back().at("signal") == k.name);
    // Resumed, it finishes the run with the losses of the run never stopped, to the last digit.
    const ul_test::CmdResult rest = ul_test::run_cmd(ul_test::train_cmd(common + save + " --resume"));
    REQUIRE(rest.code == 0);
    CHECK(rest.out.find("/step_00000005: continuing after step 5 of 24") != std::string::npos);
    CHECK(losses(dir / "run/log.jsonl") == losses(dir / "whole.jsonl"));
  }
}

TEST_CASE("a second stop signal ends train only as a later Ctrl-C: other repeats are noted", "[stop][cli]") {
  // The first signal lands at step 2 (train holds there for it), which makes train save; the save
  // holds until the second comes.
  const std::string args = "--steps 50 --eval-every 0 --threads 1 --batch 4 --seq 128 --save-dir ";
  {
    // Ctrl-C, then Ctrl-C again 2.2 s later: a person wants it now; it ends inside the save.
    ul_test::TempDir dir;
    const Stopped s = run_and_signal(args + dir / "run", "step     2/50", SIGINT, SIGINT, "step 2,save", 2200);
    INFO(s.out);
    REQUIRE(WIFSIGNALED(s.status));
    CHECK(WTERMSIG(s.status) == SIGINT);
    CHECK(s.out.find("stopped |") == std::string::npos);
    CHECK_FALSE(fs::exists(fs::path(dir / "run") / "step_00000002" / "COMPLETE"));
  }
  // A scheduler's repeats: SIGTERM twice, SIGUSR1's warning then SIGTERM at the time limit, one
  // Ctrl-C delivered twice (to train and through a launcher). Noted; the checkpoint completes.
  struct Case { int first, second, delay_ms; const char* first_name; const char* noted; };
  for (const Case& k : {Case{SIGTERM, SIGTERM, 0, "SIGTERM", "SIGTERM again: already stopping"},
                        Case{SIGUSR1, SIGTERM, 0, "SIGUSR1", "SIGTERM again: already stopping"},
                        Case{SIGINT, SIGINT, 0, "SIGINT", "SIGINT again: already stopping"}}) {
    CAPTURE(k.first_name, k.second);
    ul_test::TempDir dir;
    // A SIGINT's repeat counts as the same Ctrl-C for 60 s here, not 2: a loaded machine may take
    // that long to send it. Any other signal never stops it now, however late: for them the window
    // is taken as already past (0 ms).
    ::setenv("ULYSSES_TEST_REPEAT_MS", k.second == SIGINT ? "60000" : "0", 1);
    const Stopped s = run_and_signal(args + dir / "run", "step     2/50", k.first, k.second, "step 2,save", k.delay_ms);
    ::unsetenv("ULYSSES_TEST_REPEAT_MS");
    INFO(s.out);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 128 + k.first);
    CHECK(s.out.find(k.noted) != std::string::npos);
    CHECK(s.out.find(std::string("stopped | ") + k.first_name + " after step 2") != std::string::npos);
    CHECK(fs::exists(fs::path(dir / "run") / "step_00000002" / "COMPLETE"));
  }
}

TEST_CASE("a stop signal during start-up stops the run before its first step, also a resume's", "[stop][cli]") {
  // SIGUSR1 ended train by its default action while a large checkpoint loaded.
  ul_test::TempDir dir;
  const std::string args = "--steps 4 --eval-every 0 --threads 1 --batch 4 --seq 128 --save-dir " + dir / "run";
  for (const int sig : {SIGUSR1, SIGTERM}) {
    CAPTURE(sig);
    const Stopped s = run_and_signal(args, "test hold | start-up", sig, 0, "start-up");
    INFO(s.out);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 128 + sig);
    CHECK(s.out.find(std::string("stopped | ") + stop_signal_name(sig) + " during start-up, before step 1 | nothing trained") !=
          std::string::npos);
    CHECK(s.out.find("step     1/4") == std::string::npos);
    CHECK(s.out.find(std::string(stop_signal_name(sig)) + ": stopping once start-up is done, before any step") !=
          std::string::npos);
    CHECK_FALSE(fs::exists(fs::path(dir / "run") / "step_00000001"));
  }
  // A resume: its checkpoint stays as it was, and the next resume goes on from it.
  REQUIRE(ul_test::run_cmd(ul_test::train_cmd(args + " --stop-after 2")).code == 0);
  const Stopped s = run_and_signal(args + " --resume", "test hold | start-up", SIGTERM, 0, "start-up");
  INFO(s.out);
  REQUIRE(WIFEXITED(s.status));
  CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
  CHECK(s.out.find("during start-up, before step 3 | nothing trained | checkpoint " + dir / "run/step_00000002" +
                   " as it was: continue with --resume") != std::string::npos);
  CHECK(s.out.find("memory  |") == std::string::npos);  // no arena was used: no high-water to compare
  const ul_test::CmdResult r = ul_test::run_cmd(ul_test::train_cmd(args + " --resume"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("step     4/4") != std::string::npos);
  // --steps 0 (an eval of a checkpoint): the eval is not run either, and the line says what it skipped.
  const Stopped e = run_and_signal("--steps 0 --eval-batches 2 --threads 1 --batch 4 --seq 128", "test hold | start-up",
                                   SIGTERM, 0, "start-up");
  INFO(e.out);
  REQUIRE(WIFEXITED(e.status));
  CHECK(WEXITSTATUS(e.status) == 128 + SIGTERM);
  CHECK(e.out.find("stopped | SIGTERM during start-up; skipped: the final eval") != std::string::npos);
  CHECK(e.out.find("eval      0") == std::string::npos);
}

TEST_CASE("a stop signal during a periodic save stops once that save is done, not a step and a save later", "[stop][cli]") {
  ul_test::TempDir dir;
  const Stopped s = run_and_signal("--steps 50 --eval-every 0 --threads 1 --batch 4 --seq 128 --save-every 2 --save-dir " +
                                       dir / "run", "test hold | save", SIGTERM, 0, "save");
  INFO(s.out);
  REQUIRE(WIFEXITED(s.status));
  CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
  CHECK(s.out.find("stopped | SIGTERM after step 2") != std::string::npos);
  CHECK(s.out.find("step     3/50") == std::string::npos);
  CHECK(fs::exists(fs::path(dir / "run") / "step_00000002" / "COMPLETE"));
  CHECK_FALSE(fs::exists(fs::path(dir / "run") / "step_00000004"));
}

// step -> the val loss text of a run log's eval records.
static std::map<std::string, std::string> val_losses(const std::string& log) {
  std::map<std::string, std::string> out;
  for (const LogRecord& r : read_run_log(log))
    if (r.at("type") == "eval") out[r.at("step")] = r.at("val_loss");
  return out;
}

TEST_CASE("a stop signal during an eval cuts it short: saved, not logged, and the resume runs it in full", "[stop][cli]") {
  // An eval of many long sequences can outlast a scheduler's grace period. Held before the eval's
  // second of 3 micro-batches at step 2 (at sp 2 the ranks are threads that share the signal; the
  // mpi test mpi_train_eval_cut signals one process alone). At the last step the cut eval is the
  // final one: the training is done, and a resume with no step left runs it.
  struct Case { const char* layout; int steps; const char* said; };
  for (const Case& k : {Case{"", 4, "stopped | SIGTERM after step 2 of 4 | checkpoint "},
                        Case{" --ranks 2 --sp 2", 2, "stopped | SIGTERM after the last step (2) | checkpoint "},
                        // what follows the training, skipped, is the resume's to make (--steps 0
                        // --checkpoint, once named here, rounds a bf16 run's weights otherwise)
                        Case{" --ranks 2 --sp 2", 2, "step_00000002: the training is done; skipped: the final eval "
                                                     "(--resume runs them)\n"}}) {
    CAPTURE(k.layout);
    ul_test::TempDir dir;
    const std::string common = "--steps " + std::to_string(k.steps) +
                               " --eval-every 2 --eval-batches 3 --threads 1 --batch 2 --seq 128" + k.layout;
    const ul_test::CmdResult whole = ul_test::run_cmd(ul_test::train_cmd(common + " --log " + dir / "whole.jsonl"));
    REQUIRE(whole.code == 0);
    const std::string save = " --save-dir " + dir / "run";
    const Stopped s = run_and_signal(common + save, "test hold | eval batch 2", SIGTERM, 0, "eval batch 2");
    INFO(s.out);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
    CHECK(s.out.find("eval      2 | cut short by SIGTERM before batch 2 of 3 | not logged (a --resume runs it)") !=
          std::string::npos);
    CHECK(s.out.find("eval      2 | val loss") == std::string::npos);
    CHECK(s.out.find(k.said) != std::string::npos);
    CHECK(fs::exists(fs::path(dir / "run") / "step_00000002" / "COMPLETE"));
    CHECK(val_losses(dir / "run/log.jsonl").empty());
    const std::vector<LogRecord> log = read_run_log(dir / "run/log.jsonl");
    REQUIRE(!log.empty());
    CHECK(log.back().at("type") == "stop");
    CHECK(log.back().at("step") == "2");
    // The resume makes the eval first, then trains on: the val history of the run never stopped.
    const ul_test::CmdResult rest = ul_test::run_cmd(ul_test::train_cmd(common + save + " --resume"));
    INFO(rest.out);
    REQUIRE(rest.code == 0);
    CHECK(rest.out.find("eval      2 | val loss") != std::string::npos);
    const std::map<std::string, std::string> want = val_losses(dir / "whole.jsonl");
    CHECK(want.size() == size_t(k.steps / 2));
    CHECK(val_losses(dir / "run/log.jsonl") == want);
  }
}

TEST_CASE("a cut eval: no --sample-every sample before the save, and a cut made-up eval claims nothing made", "[stop][cli]") {
  ul_test::TempDir dir;
  const std::string sample = "--steps 4 --eval-every 2 --eval-batches 3 --threads 1 --batch 2 --seq 128 --sample-every 2"
                             " --sample 4 --prompt ids:1,2,3 --save-dir " + dir / "a";
  const Stopped s = run_and_signal(sample, "test hold | eval batch 2", SIGTERM, 0, "eval batch 2");
  INFO(s.out);
  CHECK(s.out.find("eval      2 | cut short by SIGTERM") != std::string::npos);
  CHECK(s.out.find("sample  | step 2") == std::string::npos);
  CHECK(fs::exists(fs::path(dir / "a") / "step_00000002" / "COMPLETE"));
  // Resumed, its made-up eval cut too: nothing trained, so no arena high-water to report.
  const Stopped made_up = run_and_signal(sample + " --resume", "test hold | eval batch 2", SIGTERM, 0, "eval batch 2");
  INFO(made_up.out);
  CHECK(made_up.out.find("stopped | SIGTERM after step 2 of 4") != std::string::npos);
  CHECK(made_up.out.find("step     3/4") == std::string::npos);
  CHECK(made_up.out.find("memory  |") == std::string::npos);
  // The final eval cut, then the resume's made-up eval cut too: stopped, not "done".
  const std::string last = "--steps 2 --eval-every 0 --eval-batches 3 --threads 1 --batch 2 --seq 128 --save-dir " + dir / "b";
  REQUIRE(WIFEXITED(run_and_signal(last, "test hold | eval batch 2", SIGTERM, 0, "eval batch 2").status));
  const Stopped again = run_and_signal(last + " --resume", "test hold | eval batch 2", SIGTERM, 0, "eval batch 2");
  INFO(again.out);
  REQUIRE(WIFEXITED(again.status));
  CHECK(WEXITSTATUS(again.status) == 128 + SIGTERM);
  CHECK(again.out.find("done |") == std::string::npos);
  CHECK(again.out.find("stopped | SIGTERM after the last step (2)") != std::string::npos);
  const ul_test::CmdResult made = ul_test::run_cmd(ul_test::train_cmd(last + " --resume"));
  INFO(made.out);
  CHECK(made.code == 0);
  CHECK(made.out.find("done | no step left, its missing eval made") != std::string::npos);
  CHECK(val_losses(dir / "b/log.jsonl").size() == 1);
}

TEST_CASE("a stop signal at the last step or during the probes: the checkpoint is kept, the rest skipped", "[stop][cli]") {
  // The signal goes out when the last step's line is printed (it lands at the step boundary, before
  // the final eval) or the first length probe's (it lands before the six others): train holds at
  // either point until it comes.
  const std::string lengths = "256,384,512,640,768,896,1024";
  struct Case { const char* after; const char* said; const char* hold; };
  for (const Case& k : {Case{"step     6/6", "stopped | SIGTERM after the last step (6) | checkpoint ", "step 6"},
                        Case{"length    256", "stopped | SIGTERM during the final evals and probes (step 6)", "length 256"}}) {
    CAPTURE(k.after);
    ul_test::TempDir dir;
    const Stopped s = run_and_signal("--steps 6 --eval-every 0 --eval-batches 1 --threads 1 --batch 4 --seq 128 --probe-lengths " +
                                         lengths + " --save-dir " + dir / "run" + " --export-safetensors " + dir / "m/model.safetensors",
                                     k.after, SIGTERM, 0, k.hold);
    INFO(s.out);
    REQUIRE(WIFEXITED(s.status));
    CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
    CHECK(s.out.find(k.said) != std::string::npos);
    CHECK(s.out.find("done |") == std::string::npos);
    CHECK(fs::exists(fs::path(dir / "run") / "step_00000006" / "COMPLETE"));
    CHECK_FALSE(fs::exists(fs::path(dir / "m/model.safetensors")));  // the export is not started
    size_t probed = 0;
    for (size_t at = s.out.find("\nlength "); at != std::string::npos; at = s.out.find("\nlength ", at + 1)) probed++;
    CHECK(probed == (k.hold == std::string("step 6") ? 0 : 1));
    const std::vector<LogRecord> log = read_run_log(dir / "run/log.jsonl");
    REQUIRE(!log.empty());
    CHECK(log.back().at("type") == "stop");
    CHECK(log.back().at("step") == "6");
    if (k.hold != std::string("length 256")) continue;
    // Resumed, the probes go on from the length the stop left: 256 is not probed, nor logged, twice.
    const ul_test::CmdResult rest =
        ul_test::run_cmd(ul_test::train_cmd("--steps 6 --eval-every 0 --eval-batches 1 --threads 1 --batch 4 --seq 128"
                                            " --probe-lengths " + lengths + " --save-dir " + dir / "run" + " --resume"));
    INFO(rest.out);
    REQUIRE(rest.code == 0);
    CHECK(rest.out.find("length    256 | logged already at step 6") != std::string::npos);
    std::map<std::string, int> rows;
    for (const LogRecord& rec : read_run_log(dir / "run/log.jsonl"))
      if (rec.at("type") == "length") rows[rec.at("T")]++;
    CHECK(rows.size() == 7);
    for (const auto& [T, count] : rows) CHECK(count == 1);
  }
}

TEST_CASE("a stop during the probes of a resume with no step left skips only what it skipped", "[stop][cli]") {
  // The run's final eval is logged already: the stop line must not list it as skipped.
  ul_test::TempDir dir;
  const std::string args = "--steps 4 --eval-every 0 --eval-batches 1 --threads 1 --batch 2 --seq 96 --save-dir " +
                           dir / "run";
  REQUIRE(ul_test::run_cmd(ul_test::train_cmd(args)).code == 0);
  const Stopped s = run_and_signal(args + " --resume --probe-lengths 96,64", "test hold | length 96", SIGTERM, 0,
                                   "length 96");
  INFO(s.out);
  REQUIRE(WIFEXITED(s.status));
  CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
  CHECK(s.out.find("stopped | SIGTERM during the final evals and probes (step 4); skipped: the rest of --probe-lengths\n") !=
        std::string::npos);
  // The first line says what this phase does (it once promised "after this step" here).
  CHECK(s.out.find("train: SIGTERM: stopping before the final eval's next batch, or after the length probe in flight") !=
        std::string::npos);
  // During the last length, which then finishes (its row printed and logged): nothing skipped.
  const Stopped last = run_and_signal(args + " --resume --probe-lengths 96,64", "test hold | length 64", SIGTERM, 0,
                                      "length 64");
  INFO(last.out);
  REQUIRE(WIFEXITED(last.status));
  CHECK(WEXITSTATUS(last.status) == 128 + SIGTERM);
  CHECK(last.out.find("length     64 | all: ") != std::string::npos);
  CHECK(last.out.find("stopped | SIGTERM during the final evals and probes (step 4)\n") != std::string::npos);
}

TEST_CASE("a stop during the exports and the sample lets them finish, and says so first", "[stop][cli]") {
  ul_test::TempDir dir;
  const std::string args = "--steps 2 --eval-every 0 --eval-batches 1 --threads 1 --batch 2 --seq 64 --sample 8 "
                           "--prompt ids:1,2 --export-safetensors " + dir / "x/m.safetensors";
  const Stopped s = run_and_signal(args, "test hold | outputs", SIGTERM, 0, "outputs");
  INFO(s.out);
  REQUIRE(WIFEXITED(s.status));
  CHECK(WEXITSTATUS(s.status) == 128 + SIGTERM);
  CHECK(s.out.find("train: SIGTERM: the run is ending: what it writes now (plots, exports, the sample) finishes first, "
                   "then it stops") != std::string::npos);
  CHECK(s.out.find("sample  | 2 prompt + 8 new tokens") != std::string::npos);
  CHECK(fs::exists(fs::path(dir / "x") / "m.safetensors"));
  CHECK(s.out.find("stopped | SIGTERM during the exports and the sample, which finished") != std::string::npos);
}

TEST_CASE("SIGHUP stops a run as SIGTERM does, unless the parent ignored it (nohup), as it may SIGINT", "[stop][cli]") {
  ul_test::TempDir dir;
  const std::string common = "--steps 24 --eval-every 0 --eval-batches 1 --threads 1 --batch 4 --seq 128";
  const Stopped s = run_and_signal(common + " --save-dir " + dir / "hup", "step     5/24", SIGHUP, 0, "step 5");
  INFO(s.out);
  REQUIRE(WIFEXITED(s.status));
  CHECK(WEXITSTATUS(s.status) == 128 + SIGHUP);
  CHECK(s.out.find("stopped | SIGHUP after step 5") != std::string::npos);
  CHECK(fs::exists(fs::path(dir / "hup") / "step_00000005" / "COMPLETE"));
  CHECK(read_run_log(dir / "hup/log.jsonl").back().at("signal") == "SIGHUP");

  // Started with SIGINT and SIGHUP ignored (a shell's background job, nohup): both stay ignored,
  // and the SIGTERM sent after them is the run's stop.
  const auto [pid, f] = spawn_shell("trap '' INT HUP; exec " +
                                    ul_test::train_cmd("--steps 1000000 --eval-every 0 --eval-batches 1 --threads 1 "
                                                       "--seq 32 --save-dir " + dir / "ign"));
  std::string out;
  char line[4096];
  bool sent = false;
  while (std::fgets(line, sizeof line, f)) {
    out += line;
    if (!sent && out.find("step     3/1000000") != std::string::npos) {
      ::kill(pid, SIGINT);
      ::kill(pid, SIGHUP);
      ::usleep(300 * 1000);
      ::kill(pid, SIGTERM);
      sent = true;
    }
  }
  std::fclose(f);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(out.substr(out.size() > 3000 ? out.size() - 3000 : 0));
  REQUIRE(sent);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(out.find("train: SIGINT") == std::string::npos);
  CHECK(out.find("train: SIGHUP") == std::string::npos);
  CHECK(out.find("; SIGKILL to stop now") != std::string::npos);  // a Ctrl-C cannot: SIGINT stays ignored
  CHECK(out.find("Ctrl-C again") == std::string::npos);
  CHECK(read_run_log(dir / "ign/log.jsonl").back().at("signal") == "SIGTERM");
}

TEST_CASE("the reader of train's output gone (SIGPIPE) stops the run with its checkpoint, not before the save",
          "[stop][cli]") {
  ul_test::TempDir dir;
  // sed reads up to the first step line and exits: train's next line meets a closed pipe.
  const std::string cmd = "{ ( " + ul_test::train_cmd("--steps 1000000 --eval-every 0 --eval-batches 1 --threads 1 "
                                                    "--seq 32 --save-dir " + dir / "run") +
                          "; echo $? > " + dir / "rc" + " ) | sed '/^step /q' > /dev/null; }";  // (stderr: to r.out)
  const ul_test::CmdResult r = ul_test::run_cmd(cmd);
  INFO(r.out);
  CHECK(r.out.find("train: SIGPIPE (a write to a closed pipe or socket: the reader of train's output is gone?): "
                   "stopping after this step") !=
        std::string::npos);
  std::FILE* rc = std::fopen((dir / "rc").c_str(), "r");
  REQUIRE(rc);
  int code = -1;
  CHECK(std::fscanf(rc, "%d", &code) == 1);
  std::fclose(rc);
  CHECK(code == 128 + SIGPIPE);
  const std::vector<LogRecord> log = read_run_log(dir / "run/log.jsonl");
  REQUIRE(!log.empty());
  CHECK(log.back().at("type") == "stop");
  CHECK(log.back().at("signal") == "SIGPIPE");
  const std::string step = log.back().at("step");
  CHECK(std::stoi(step) >= 1);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", std::stoi(step));
  CHECK(fs::exists(fs::path(dir / "run") / name / "COMPLETE"));
  // Started with SIGPIPE ignored (Python's subprocesses, systemd's services): it stays so, the
  // writes to the closed pipe fail, and the run goes on to its end, as it did before SIGPIPE stopped runs.
  const std::string ignored = "{ ( trap '' PIPE; " +
                              ul_test::train_cmd("--steps 40 --eval-every 0 --eval-batches 1 --threads 1 --seq 32 "
                                                 "--save-dir " + dir / "ign") +
                              "; echo $? > " + dir / "rc2" + " ) | sed '/^step /q' > /dev/null; }";
  const ul_test::CmdResult r2 = ul_test::run_cmd(ignored);
  INFO(r2.out);
  CHECK(r2.out.find("SIGPIPE") == std::string::npos);
  std::FILE* rc2 = std::fopen((dir / "rc2").c_str(), "r");
  REQUIRE(rc2);
  CHECK(std::fscanf(rc2, "%d", &code) == 1);
  std::fclose(rc2);
  CHECK(code == 0);
  CHECK(fs::exists(fs::path(dir / "ign") / "step_00000040" / "COMPLETE"));
}

TEST_CASE("closed standard streams are not taken by train's files, and a file-size limit is a named write error",
          "[stop][cli]") {
  ul_test::TempDir dir;
  const std::string args = "--steps 5 --eval-every 0 --eval-batches 1 --threads 1 --seq 32 --log " + dir / "l.jsonl";
  ul_test::CmdResult r = ul_test::run_cmd("( " + ul_test::train_cmd(args) + " >&- 2>&- )");
  CHECK(r.code == 0);
  const std::string log = [&] {
    std::FILE* f = std::fopen((dir / "l.jsonl").c_str(), "r");
    std::string t;
    char b[4096];
    size_t n;
    while (f && (n = std::fread(b, 1, sizeof b, f)) > 0) t.append(b, n);
    if (f) std::fclose(f);
    return t;
  }();
  CHECK(log.find("step     1/5") == std::string::npos);  // the step lines went nowhere, not here
  CHECK(read_run_log(dir / "l.jsonl").size() >= 5);
  // 150 KiB: the log fits, a checkpoint's files do not.
  r = ul_test::run_cmd("ulimit -c 0; ulimit -f 300; " +
                       ul_test::train_cmd("--steps 2 --eval-every 0 --eval-batches 1 --threads 1 --seq 32 --quiet "
                                          "--save-dir " + dir / "run"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("train: error: " + dir / "run/step_00000002/") != std::string::npos);
  CHECK(r.out.find("File too large") != std::string::npos);
}
