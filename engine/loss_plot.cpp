#include "engine/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "engine/file_io.h"

namespace ul {

namespace {

struct Series {
  std::vector<double> x, y;
};

// The value of a record's field, when it is a finite number.
bool number(const LogRecord& r, const char* key, double& v) {
  auto it = r.find(key);
  if (it == r.end()) return false;
  char* end = nullptr;
  v = std::strtod(it->second.c_str(), &end);
  return end && *end == 0 && !it->second.empty() && std::isfinite(v);
}

// A tick spacing of 1, 2 or 5 times a power of ten that gives about `target` ticks over `span`.
double nice_step(double span, int target) {
  const double raw = span / target, p = std::pow(10.0, std::floor(std::log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

std::string label(double v, double step) {
  const int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < step * 1e-6 ? 0.0 : v);
  return buf;
}

std::string f2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// Means of consecutive groups, so a long run's polyline stays a few thousand points (one per
// pixel or so) instead of one per step.
Series thin(const Series& s, size_t max_points) {
  if (s.x.size() <= max_points) return s;
  const size_t k = (s.x.size() + max_points - 1) / max_points;
  Series t;
  for (size_t i = 0; i < s.x.size(); i += k) {
    const size_t e = std::min(s.x.size(), i + k);
    double sx = 0, sy = 0;
    for (size_t j = i; j < e; j++) sx += s.x[j], sy += s.y[j];
    t.x.push_back(sx / double(e - i));
    t.y.push_back(sy / double(e - i));
  }
  return t;
}

}  // namespace

std::string plot_path_for_log(const std::string& log_path) {
  const std::string ext = ".jsonl";
  if (log_path.size() > ext.size() && log_path.compare(log_path.size() - ext.size(), ext.size(), ext) == 0)
    return log_path.substr(0, log_path.size() - ext.size()) + ".svg";
  return log_path + ".svg";
}

std::string loss_plot_svg(const std::vector<LogRecord>& records) {
  Series train, val;
  for (const LogRecord& r : records) {
    double step, y;
    auto type = r.find("type");
    if (type == r.end() || !number(r, "step", step)) continue;
    if (type->second == "step" && number(r, "loss", y)) train.x.push_back(step), train.y.push_back(y);
    if (type->second == "eval" && number(r, "val_loss", y)) val.x.push_back(step), val.y.push_back(y);
  }
  if (train.x.empty()) throw std::runtime_error("the run log has no step record to plot");

  // Data ranges: x spans every step; y is widened to whole ticks.
  double x0 = train.x[0], x1 = x0, y0 = train.y[0], y1 = y0;
  for (const Series* s : {&train, &val})
    for (size_t i = 0; i < s->x.size(); i++) {
      x0 = std::min(x0, s->x[i]), x1 = std::max(x1, s->x[i]);
      y0 = std::min(y0, s->y[i]), y1 = std::max(y1, s->y[i]);
    }
  if (x1 - x0 < 1) x0 -= 0.5, x1 += 0.5;
  if (y1 - y0 < 1e-9 * std::max(1.0, std::abs(y1))) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.03 * (y1 - y0);  // no point sits on the frame
  const bool positive = y0 >= 0;         // losses: the axis stops at 0, not below it
  y0 -= pad, y1 += pad;
  const double xs = std::max(1.0, nice_step(x1 - x0, 8)), ys = nice_step(y1 - y0, 6);
  y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
  if (positive) y0 = std::max(0.0, y0);

  const double W = 800, H = 480, L = 72, R = 24, T = 40, B = 56, pw = W - L - R, ph = H - T - B;
  auto px = [&](double x) { return f2(L + (x - x0) / (x1 - x0) * pw); };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * ph; };
  auto py = [&](double y) { return f2(Y(y)); };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"480\" viewBox=\"0 0 800 480\" "
       "font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"800\" height=\"480\" fill=\"white\"/>\n";
  s += "<text x=\"" + f2(L) + "\" y=\"24\" font-size=\"15\">training loss</text>\n";
  // Grid lines and tick labels.
  s += "<g stroke=\"#e6e6e6\">\n";
  std::string labels;
  for (double y = y0; y <= y1 + ys * 1e-6; y += ys) {
    s += "<line x1=\"" + f2(L) + "\" x2=\"" + f2(L + pw) + "\" y1=\"" + py(y) + "\" y2=\"" + py(y) + "\"/>\n";
    labels += "<text x=\"" + f2(L - 6) + "\" y=\"" + f2(Y(y) + 4) + "\" text-anchor=\"end\">" +
              label(y, ys) + "</text>\n";
  }
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
    s += "<line x1=\"" + px(x) + "\" x2=\"" + px(x) + "\" y1=\"" + f2(T) + "\" y2=\"" + f2(T + ph) + "\"/>\n";
    labels += "<text x=\"" + px(x) + "\" y=\"" + f2(T + ph + 18) + "\" text-anchor=\"middle\">" + label(x, xs) +
              "</text>\n";
  }
  s += "</g>\n" + labels;
  s += "<rect x=\"" + f2(L) + "\" y=\"" + f2(T) + "\" width=\"" + f2(pw) + "\" height=\"" + f2(ph) +
       "\" fill=\"none\" stroke=\"#333\"/>\n";
  s += "<text x=\"" + f2(L + pw / 2) + "\" y=\"" + f2(H - 14) + "\" text-anchor=\"middle\">step</text>\n";
  s += "<text transform=\"translate(20," + f2(T + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">loss</text>\n";

  // The series: train light and thin (it is noisy), val bold with a marker per eval.
  auto polyline = [&](const Series& d, const char* id, const char* color, const char* width) {
    std::string pts;
    for (size_t i = 0; i < d.x.size(); i++) pts += (i ? " " : "") + px(d.x[i]) + "," + py(d.y[i]);
    return "<polyline id=\"" + std::string(id) + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" + width +
           "\" stroke-linejoin=\"round\" points=\"" + pts + "\"/>\n";
  };
  s += polyline(thin(train, 2000), "train-loss", "#6baed6", "1.2");
  if (train.x.size() == 1)  // a one-step run: a polyline of one point draws nothing
    s += "<circle id=\"train-point\" fill=\"#6baed6\" cx=\"" + px(train.x[0]) + "\" cy=\"" + py(train.y[0]) +
         "\" r=\"2.5\"/>\n";
  if (!val.x.empty()) {
    // Thinned like train (--eval-every 1 over a long run once drew a million markers: a 56 MB
    // file); a marker per eval while they stay apart.
    const Series v = thin(val, 2000);
    s += polyline(v, "val-loss", "#d62728", "1.8");
    if (v.x.size() <= 400) {
      s += "<g id=\"val-markers\" fill=\"#d62728\">\n";
      for (size_t i = 0; i < v.x.size(); i++) s += "<circle cx=\"" + px(v.x[i]) + "\" cy=\"" + py(v.y[i]) + "\" r=\"3.5\"/>\n";
      s += "</g>\n";
    }
  }
  // Legend in the top margin, right-aligned, so it never hides data.
  const double lx = L + pw - (val.x.empty() ? 100 : 210), ly = 24;
  s += "<g id=\"legend\">\n<line x1=\"" + f2(lx) + "\" x2=\"" + f2(lx + 26) + "\" y1=\"" + f2(ly - 4) + "\" y2=\"" +
       f2(ly - 4) + "\" stroke=\"#6baed6\" stroke-width=\"2\"/><text x=\"" + f2(lx + 32) + "\" y=\"" + f2(ly) +
       "\">train loss</text>\n";
  if (!val.x.empty())
    s += "<line x1=\"" + f2(lx + 110) + "\" x2=\"" + f2(lx + 136) + "\" y1=\"" + f2(ly - 4) + "\" y2=\"" + f2(ly - 4) +
         "\" stroke=\"#d62728\" stroke-width=\"1.8\"/><circle cx=\"" + f2(lx + 123) + "\" cy=\"" + f2(ly - 4) +
         "\" r=\"3.5\" fill=\"#d62728\"/><text x=\"" + f2(lx + 142) + "\" y=\"" + f2(ly) + "\">val loss</text>\n";
  s += "</g>\n</svg>\n";
  return s;
}

bool write_log_plot(const std::string& log_path, const std::string& svg_path, const char* type,
                    std::string (*draw)(const std::vector<LogRecord>&), const LogFilter& keep) {
  const std::vector<LogRecord> records = read_run_log(log_path, nullptr, keep);
  const bool any = std::any_of(records.begin(), records.end(), [type](const LogRecord& r) {
    auto t = r.find("type");
    return t != r.end() && t->second == type;
  });
  if (any) {
    write_file_atomic(svg_path, draw(records));
  } else {
    // A plot of records the log no longer holds (a rollback voided them) would show a model that
    // is gone: removed, not left as it was.
    std::error_code ec;
    std::filesystem::remove(svg_path, ec);
  }
  return any;
}

bool write_loss_plot(const std::string& log_path, const std::string& svg_path) {
  return write_log_plot(log_path, svg_path, "step", loss_plot_svg, {{"step", "eval"}, {"loss", "val_loss"}});
}

}  // namespace ul
