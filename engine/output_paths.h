// The files a run will write (the log, its plots, the exports), checked before it starts: an
// output that is a directory or a pipe, in a directory that cannot be written, or that names one
// of the run's inputs or another output is refused, naming both flags. Otherwise the run would
// find out after its training (the exports), hang (a log on a pipe is read back for the plot) or
// destroy an input (the log opened over the training text).
#pragma once
#include "engine/options.h"

namespace ul {

// Throws std::runtime_error naming the flag(s) and the path. Reads only; writes nothing.
void check_output_paths(const Options& o);

// Whether two data specs read the same files (text:./a.txt and text:a.txt, a hard link; shards:
// patterns matching the same files); false for the synthetic tasks.
bool same_data_files(const std::string& a, const std::string& b);

}  // namespace ul
