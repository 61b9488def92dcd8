// The picture of --probe-lengths (engine/length_probe.h), written next to the loss plot when the
// log holds length rows: a table of coloured cells, one column per probed length, one row per
// cell of the row (synthetic: "all" and each needle depth, the needle-in-a-haystack heatmap,
// accuracy from red at 0 to green at 1; text: the val loss over all positions and in each position
// band, green for the lowest loss of the table and red for the highest). Hand-written SVG, drawn
// from the log read back (the rows of its last probed step).
#pragma once
#include <string>
#include <vector>

#include "engine/run_log.h"

namespace ul {

// "<log without .jsonl>_lengths.svg": DIR/log.jsonl -> DIR/log_lengths.svg.
std::string probe_plot_path_for_log(const std::string& log_path);

// The SVG of the log's length rows as text; throws when there is none.
std::string probe_plot_svg(const std::vector<LogRecord>& records);

// Reads the log, draws its length rows and writes svg_path atomically; false (and nothing
// written) when the log has none.
bool write_probe_plot(const std::string& log_path, const std::string& svg_path);

// Both pictures of a run's log at its end: the loss plot, and this table where the log has length
// rows. Returns the paths written. A failure (the log removed or unreadable, a full disk) is put in
// `failed` instead of thrown: drawing comes after the training, and must not cost the run its
// exports, its sample or its exit status.
std::vector<std::string> write_run_plots(const std::string& log_path, std::string& failed);

}  // namespace ul
