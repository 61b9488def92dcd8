#include "engine/probe_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/loss_plot.h"

namespace ul {

namespace {

// One table row: its label and its value at each probed length (NaN where it has none: a
// position band a shorter length does not reach).
struct Row {
  std::string label;
  std::vector<double> v;
};

double number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  return end && *end == 0 && !text.empty() ? v : NAN;
}

std::string fmt(const char* f, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// u in [0, 1] -> red (0), yellow (0.5), green (1), as "#rrggbb".
std::string colour(double u) {
  u = std::min(1.0, std::max(0.0, u));
  const double a[3] = {215, 48, 39}, m[3] = {254, 224, 139}, b[3] = {26, 152, 80};
  char buf[8];
  int c[3];
  for (int k = 0; k < 3; k++) c[k] = int(std::lround(u < 0.5 ? a[k] + (m[k] - a[k]) * u * 2 : m[k] + (b[k] - m[k]) * (u - 0.5) * 2));
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
  return buf;
}

}  // namespace

std::string probe_plot_path_for_log(const std::string& log_path) {
  const std::string svg = plot_path_for_log(log_path);  // DIR/log.svg
  return svg.substr(0, svg.size() - 4) + "_lengths.svg";
}

std::string probe_plot_svg(const std::vector<LogRecord>& records) {
  // The rows of the last step that was probed, by length; the title names that step, and the one
  // the run reached when it went on unprobed (a resume without --probe-lengths, a signal).
  double last = -1, trained = -1;
  for (const LogRecord& r : records) {
    if (r.count("type") && r.at("type") == "length" && r.count("step")) last = std::max(last, number(r.at("step")));
    if (r.count("type") && r.at("type") == "step" && r.count("step")) trained = std::max(trained, number(r.at("step")));
  }
  std::map<int, const LogRecord*> by_length;
  for (const LogRecord& r : records)
    if (r.count("type") && r.at("type") == "length" && r.count("step") && number(r.at("step")) == last && r.count("T"))
      by_length[int(number(r.at("T")))] = &r;
  if (by_length.empty()) throw std::runtime_error("the run log has no length row to draw");

  // Rows: accuracies (synthetic) in the order the first length lists them, or the val loss and
  // its bands by first position (text).
  const bool accuracy = by_length.begin()->second->count("acc_all") > 0;
  std::vector<std::string> keys;
  if (accuracy) {
    for (const auto& [key, value] : *by_length.begin()->second)
      if (key.rfind("acc_", 0) == 0) keys.push_back(key);
    std::sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
      if (a == "acc_all" || b == "acc_all") return a == "acc_all" && b != "acc_all";
      return a < b;  // "acc_depth_0" < "acc_depth_0.25" < ... < "acc_depth_1"
    });
  } else {
    std::map<int, std::string> bands;
    for (const auto& [T, rec] : by_length)
      for (const auto& [key, value] : *rec)
        if (key.rfind("val_loss_pos_", 0) == 0) bands[std::atoi(key.c_str() + 13)] = key;
    keys.push_back("val_loss");
    for (const auto& [first, key] : bands) keys.push_back(key);
  }
  std::vector<Row> rows;
  double lo = INFINITY, hi = -INFINITY;
  for (const std::string& key : keys) {
    Row row;
    if (accuracy) {
      row.label = key.substr(4);
      std::replace(row.label.begin(), row.label.end(), '_', ' ');
    } else {
      row.label = key == "val_loss" ? "all positions" : "from position " + key.substr(13);
    }
    for (const auto& [T, rec] : by_length) {
      const auto it = rec->find(key);
      const double v = it == rec->end() ? NAN : number(it->second);
      row.v.push_back(v);
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
    rows.push_back(row);
  }
  // Accuracy: 0 red, 1 green. Loss: the table's highest red, its lowest green.
  auto shade = [&](double v) { return accuracy ? v : hi > lo ? (hi - v) / (hi - lo) : 1.0; };

  const int cols = int(by_length.size()), nrows = int(rows.size());
  const std::string title = std::string(accuracy ? "retrieval accuracy by sequence length" : "val loss by sequence length") +
                            fmt(" at step %.0f", last) +
                            (trained > last ? fmt(" (the run went on to step %.0f)", trained) : "") + " (--probe-lengths)";
  // Wide enough for the title too (about 8 px a character at 15 px), with one or two lengths.
  const double L = 150, T = 76, cw = 92, ch = 30, H = T + ch * nrows + 48;
  const double W = std::max(L + cw * cols + 24, 24 + 8.0 * double(title.size()));
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" + fmt("%.0f", H) +
       "\" viewBox=\"0 0 " + fmt("%.0f", W) + " " + fmt("%.0f", H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"12\" y=\"24\" font-size=\"15\">" + title + "</text>\n";
  s += "<text x=\"" + fmt("%.2f", L + cw * cols / 2) + "\" y=\"" + fmt("%.2f", T - 26) +
       "\" text-anchor=\"middle\">sequence length</text>\n";
  int c = 0;
  for (const auto& [len, rec] : by_length)
    s += "<text x=\"" + fmt("%.2f", L + cw * (c++ + 0.5)) + "\" y=\"" + fmt("%.2f", T - 8) +
         "\" text-anchor=\"middle\" font-weight=\"bold\">" + std::to_string(len) + "</text>\n";
  s += "<g id=\"cells\" stroke=\"white\">\n";
  for (int r = 0; r < nrows; r++) {
    const double y = T + ch * r;
    s += "<text x=\"" + fmt("%.2f", L - 8) + "\" y=\"" + fmt("%.2f", y + ch / 2 + 4) + "\" text-anchor=\"end\" stroke=\"none\">" +
         rows[size_t(r)].label + "</text>\n";
    for (int k = 0; k < cols; k++) {
      const double v = rows[size_t(r)].v[size_t(k)], x = L + cw * k;
      const bool have = std::isfinite(v);
      s += "<rect x=\"" + fmt("%.2f", x) + "\" y=\"" + fmt("%.2f", y) + "\" width=\"" + fmt("%.2f", cw) +
           "\" height=\"" + fmt("%.2f", ch) + "\" fill=\"" + (have ? colour(shade(v)) : "#eeeeee") + "\"/>\n";
      s += "<text x=\"" + fmt("%.2f", x + cw / 2) + "\" y=\"" + fmt("%.2f", y + ch / 2 + 4) +
           "\" text-anchor=\"middle\" stroke=\"none\">" +
           (have ? (accuracy ? fmt("%.1f%%", 100 * v) : fmt("%.4f", v)) : "-") + "</text>\n";
    }
  }
  s += "</g>\n";
  s += "<text x=\"12\" y=\"" + fmt("%.2f", H - 16) + "\" fill=\"#555\">" +
       (accuracy ? std::string("red: 0%, green: 100% (accuracy over the scored answer tokens)")
                 : "green: the lowest loss in the table (" + fmt("%.4f", lo) + "), red: the highest (" + fmt("%.4f", hi) + ")") +
       "</text>\n</svg>\n";
  return s;
}

bool write_probe_plot(const std::string& log_path, const std::string& svg_path) {
  std::vector<LogRecord> records = read_run_log(log_path, nullptr, {{"length"}, {}});
  if (records.empty()) {  // none, or a rollback voided them: no table of a model that is gone
    std::error_code ec;
    std::filesystem::remove(svg_path, ec);
    return false;
  }
  // The step records' numbers alone (the title says how far the run went on past the rows' step):
  // read whole, a long run's steps held every field of every step.
  for (LogRecord& r : read_run_log(log_path, nullptr, {{"step"}, {"step"}})) records.push_back(std::move(r));
  write_file_atomic(svg_path, probe_plot_svg(records));
  return true;
}

std::vector<std::string> write_run_plots(const std::string& log_path, std::string& failed) {
  std::vector<std::string> written;
  failed.clear();
  try {
    const std::string svg = plot_path_for_log(log_path);
    if (write_loss_plot(log_path, svg)) written.push_back(svg);
    const std::string lengths_svg = probe_plot_path_for_log(log_path);
    if (write_probe_plot(log_path, lengths_svg)) written.push_back(lengths_svg);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  return written;
}

}  // namespace ul
