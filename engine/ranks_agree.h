// Every rank of a run must run the same job: the same flags, model and data files. Each rank reads
// its own command line and lists its own files, so a node whose view differs (a copy of the data on
// node-local disk that is incomplete, an NFS directory listing that lags a `train prepare` just
// run, a job script that sets a flag per node) would train an sp group on slices of different
// sequences, or a dp replica on another schedule, and nothing would fail. Checked once at start-up:
// one all-gather of a CRC-32 per field: what a checkpoint records (model, data files, schedule), the
// val files, the layout, and last the whole command line but --threads and --quiet. The weights
// are compared once loaded (check_same_weights): the same --checkpoint or --save-dir path may hold
// other bytes on another node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint_files.h"
#include "parallel/communicator.h"

namespace ul {

// Collective. Throws on every rank, naming the first rank and field (and the flag that sets it)
// where a rank differs from rank 0, with this rank's own value; every rank must pass the same keys.
void check_ranks_agree(Comm& world, const std::vector<RunField>& fields);

// The reason for check_same_weights' refusal after loading a file that every node must hold alike.
inline constexpr const char* kSameFile =
    "every node must read the same bytes there (a node's own stale copy, a file rewritten while the job started?)";

// Collective. Throws on every rank when a rank's weights, once made (`source`: "loading PATH",
// "initializing them from --seed N"), differ from rank 0's (Params::fingerprint: a sample), with
// `cause`, what to look at. dp replicas that start apart never meet again: the all-reduced
// gradients keep them apart.
void check_same_weights(Comm& world, uint32_t fingerprint, const std::string& source, const std::string& cause);

// Collective: every rank's error ("" for none) gathered; if any has one, every rank throws the same
// JobError (the first failing rank's, "rank R: " before another's), so that a rank that failed
// alone neither leaves the others waiting nor ends an MPI job by MPI_Abort. For a step every rank
// takes at the same place: a save's writes, a resume's load, a length probe's reads.
void agree_on_errors(Comm& world, const std::string& mine);
// A caught exception's text for agree_on_errors: never "" (which would say the rank succeeded).
std::string failure_text(const std::exception& e);

}  // namespace ul
