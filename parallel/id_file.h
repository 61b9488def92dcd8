// The NCCL bootstrap without MPI (--nccl-id-file): rank 0 writes the communicator's id to a file on
// a filesystem every node shares, the others wait for it. Written apart from NCCL (the id is bytes
// here) so that the CPU tests check it.
//
// The file starts with the job's token, a line every rank of one job computes alike and no other
// job shares: a file a dead run left behind (a requeue, a node failure mid-init) or another job's
// is not joined, since a rank joining a root that is gone waits out --comm-timeout.
#pragma once
#include <string>

namespace ul {

// "SLURM_JOB_ID=123.0 slurm restart 1", "TORCHELASTIC_RUN_ID=abc torchrun restart 0", "ULYSSES_JOB_ID=x", or ""
// when none is set. The restart counts tell a requeued job (same job id) from its dead first run.
std::string id_file_job_token();
// Whether the token tells this job from others: not "" (nothing set) nor torchrun's default
// run id "none", which every job launched without --rdzv-id shares.
bool id_file_token_unique(const std::string& token);

// Rank 0: the token and the id, through a temporary of this process's own (PATH.tmp.HOST.PID: two
// jobs given one path do not write one temporary) renamed into place.
void write_id_file(const std::string& path, const std::string& token, const std::string& id);
// The others: the id of `bytes` bytes once PATH holds this token; throws after timeout_s.
std::string wait_for_id_file(const std::string& path, const std::string& token, size_t bytes, double timeout_s);
// Rank 0, once every rank has joined: removes PATH if it still holds this id (another job given
// the same path may have replaced it since: that one is left for its ranks).
void remove_id_file_if_ours(const std::string& path, const std::string& token, const std::string& id);

}  // namespace ul
