// Stopping a run cleanly when the scheduler asks: SIGTERM (what SLURM and Kubernetes send before
// they kill a job), SIGINT (Ctrl-C) or SIGUSR1 (SLURM's `--signal=USR1@120`, a warning ahead of
// the time limit). The first one only sets a flag: the step in flight finishes (an eval stops
// before its next batch), every rank agrees
// at the step boundary (a one-int all-reduce, so a signal that reached some ranks only stops them
// all at the same step), a checkpoint is saved when there is a --save-dir, and train exits with
// 128 + the signal's number, as a shell reports a process the signal ended. A second SIGINT
// (Ctrl-C) two seconds or more after the first ends the process at once (the checkpoint files are
// written atomically, so none is left half-done); any other repeat is noted and changes nothing:
// schedulers and launchers deliver one signal twice, or SIGTERM at the time limit after an early
// SIGUSR1, and ending then would lose the checkpoint the stop is for.
#pragma once
#include <string>

namespace ul {

// Also stops the run the same way: SIGHUP (the terminal closed) and SIGPIPE (the reader of train's
// output is gone: `train | tee` after a Ctrl-C that reached tee first), which by default ended the
// process before the save. SIGINT, SIGHUP and SIGPIPE that the parent ignores stay ignored (a
// shell's background job, nohup, Python's os.system and systemd's services).
//
// Installs the handlers (again at each call: train does before MPI starts and after). What a
// first signal's line promises follows the run's phase: before started_training(), a stop before
// its first step; then after the step in flight; after started_final(), the final eval or length
// probe in flight finishes and the rest are skipped; after started_outputs(), the exports and
// the sample finish first.
void install_stop_handlers();
// One of several processes (--comm mpi or nccl over 2+ ranks): a first SIGTERM's line adds that a
// launcher also sends it to end the job when another process failed (Open MPI's mpirun after an
// MPI_Abort, srun after a task exited non-zero), so its "stopping after this step" is not taken
// for the cause: that process's error is; and every first line says to stop with SIGUSR1 (a
// launcher kills the job soon after a SIGTERM or a Ctrl-C, which it turns into SIGTERMs), not
// "Ctrl-C again". Only the lead (rank 0) prints them: every process got the signal (rank 0 names
// one that reached another rank alone when the ranks agree to stop).
void in_multi_process_job(bool lead);
void started_training();
void started_final();
void started_outputs();
// First thing in main: descriptors 0-2 that the caller closed are opened on /dev/null (else the
// first file train opens would take one and receive its printed lines), and SIGXFSZ is ignored (a
// file-size limit then fails a write with EFBIG, reported with the file's name).
void guard_process();
// The first of those signals received so far, 0 when none.
int stop_signal();
// How many SIGTERMs came so far (a launcher's, ending the job after another process failed, is one
// that comes after the failure: train.cpp's after_mpi_start compares the counts).
int sigterms_so_far();
// "SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGPIPE" (else "a signal").
const char* stop_signal_name(int sig);

// TEST HOOK: with ULYSSES_TEST_HOLD=P1,P2,... train waits at each named point until a stop signal
// has arrived (at most 60 s), so a test's signal lands there and nowhere else, however loaded the
// machine: "start-up" (rank 0, before anything is loaded), "step N" (after step N's line), "eval
// batch N" (every rank, before an eval's micro-batch N, 1-based), "length T" (after that probe
// row), "save" (inside a checkpoint's save: one a first signal made waits for a second, which ends
// the process or is noted and the save goes on; a periodic save waits for a first). Each wait is
// announced on stderr ("test hold | POINT"), for a test to send its signal on. Unset in normal use:
// then a call costs one string compare.
void test_hold(const std::string& point);

}  // namespace ul
