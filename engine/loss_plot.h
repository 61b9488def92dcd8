// The loss plot of a run that keeps a log (drawn at its first eval, then at most once a minute of
// evals and saves, and at the end: engine/train_loop.cpp): hand-written SVG (no library) with
// the train loss of every step (a light line), the val loss of every eval (a line with markers),
// both against the step, with ticked and labelled axes and a legend. It is drawn from the log
// read back (engine/run_log.h), so a resumed run's plot covers the whole run.
#pragma once
#include <string>
#include <vector>

#include "engine/run_log.h"

namespace ul {

// "<log without .jsonl>.svg": DIR/log.jsonl -> DIR/log.svg; other names get ".svg" appended.
std::string plot_path_for_log(const std::string& log_path);

// The SVG of a run's records as text; throws when there is no step record to draw.
std::string loss_plot_svg(const std::vector<LogRecord>& records);

// Reads the log, draws it and writes svg_path atomically; false (and nothing written) when the
// log holds no step to draw.
bool write_loss_plot(const std::string& log_path, const std::string& svg_path);

// The same for any drawing: when the log holds a record of type `type`, draw(records) is written
// to svg_path atomically and true returned; else nothing is written. `keep`: what draw reads.
bool write_log_plot(const std::string& log_path, const std::string& svg_path, const char* type,
                    std::string (*draw)(const std::vector<LogRecord>&), const LogFilter& keep);

}  // namespace ul
