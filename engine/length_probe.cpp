#include "engine/length_probe.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <stdexcept>

#include "data/packing.h"
#include "engine/ranks_agree.h"
#include "engine/rng.h"
#include "engine/sample.h"
#include "parallel/communicator.h"
#include "parallel/hosts.h"

namespace ul {

void check_probe_lengths(const std::vector<int>& lengths, const Dataset& val, const ModelConfig& cfg, int seq,
                         size_t room, bool weights_copy) {
  const bool beside = room != SIZE_MAX;
  if (!beside) room = memory_limit();
  if (lengths.empty()) return;
  std::vector<int32_t> in, tgt;
  for (int T : lengths) {
    const std::string where = "--probe-lengths " + std::to_string(T) + ": ";
    if (!cfg.is_llama() && T > cfg.max_seq)
      throw std::runtime_error(where + "longer than the model's max sequence " + std::to_string(cfg.max_seq) +
                               " (gpt2's positions are learned)");
    // Each decoder: its KV cache, buffers, score()'s logits and weights, and a window's tokens,
    // layout and losses (5 values a position). Checked before anything of length T is allocated.
    const size_t one = KvDecoder::host_bytes(cfg, T, true, KvDecoder::kDefaultChunk, weights_copy) + size_t(T) * 5 * 4;
    if (one > room)
      throw std::runtime_error(where + "the KV-cache decoder needs " + std::to_string(one >> 20) + " MiB a rank, but " +
                               (beside ? "beside what the run holds " : "") + "this machine has " +
                               std::to_string(room >> 20) + " MiB a rank");
    if (!val.synthetic()) {
      size_t held = 0;  // the longest stretch: a window lies in one
      try {
        for (const std::vector<int32_t>& run : val_runs(val, seq, T, 1)) held = std::max(held, run.size());
      } catch (const std::exception& e) {
        throw std::runtime_error(where + e.what());
      }
      if (held < size_t(T) + 1)
        throw std::runtime_error(where + "the val split (" + val.describe() + ") holds " + std::to_string(held) +
                                 " tokens in a row at --seq " + std::to_string(seq) + "; a window needs " +
                                 std::to_string(T + 1));
      continue;
    }
    in.resize(size_t(T)), tgt.resize(size_t(T));
    try {
      val.sequence(0, T, in.data(), tgt.data());  // the task's own refusal of a length (passkey: too short)
    } catch (const std::exception& e) {
      throw std::runtime_error(where + e.what());
    }
  }
}

std::vector<std::vector<int32_t>> val_runs(const Dataset& val, int seq, int T, int windows) {
  const int64_t n = val.num_sequences(seq);
  std::vector<std::vector<int32_t>> runs;
  std::vector<int32_t> in(static_cast<size_t>(seq)), tgt(static_cast<size_t>(seq));
  int64_t done = 0;   // windows of T + 1 tokens in the stretches closed so far
  bool open = false;  // the last stretch goes on with the next sequence
  for (int64_t i = 0; i < n && done < windows; i++) {
    val.sequence(i, seq, in.data(), tgt.data());
    if (!open) runs.emplace_back();
    std::vector<int32_t>& run = runs.back();
    run.insert(run.end(), in.begin(), in.end());
    open = val.continues(i, seq);
    // With its last target the stretch so far gives (size + 1 - 1) / T windows.
    const bool enough = done + int64_t(run.size()) / T >= windows;
    if (!open || enough) {  // the stretch ends (or is long enough) with this sequence's last target
      run.push_back(tgt.back());
      done += (int64_t(run.size()) - 1) / T;
      open = false;
    }
  }
  return runs;
}

namespace {

// progress(windows done, rows of the next one run so far): 0 rows as each window ends, and at
// each prefill or scoring chunk of 256 rows inside one (a 64K window of a large model is minutes).
using Progress = std::function<void(int, int)>;
// A caller's progress(windows done), heard as each window ends.
Progress windows_done(const std::function<void(int)>& progress) {
  if (!progress) return {};
  return [&progress](int done, int rows) {
    if (rows == 0) progress(done);
  };
}

// The windows [0, n) one rank takes: (first + i) % parts == part. A passkey probe's cells (all,
// then each depth) go on where the one before stopped (first += n): with n not a multiple of the
// ranks (n = dp windows at --batch 1 --eval-batches 1, sp ranks idle) the same ranks would take
// the extra window in every cell, and the rest wait in the all-reduce for six of them.
struct Share {
  int part = 0, parts = 1;
  int64_t first = 0;
  bool mine(int i) const { return (first + i) % parts == part; }
  int count(int n) const { return int(upto(first + n) - upto(first)); }
  Share after(int n) const { return {part, parts, first + n}; }

 private:
  int64_t upto(int64_t m) const { return m / parts + (part < m % parts ? 1 : 0); }  // of [0, m)
};

// {correct, valid, sum of -log p, whole answers right, whole answers} over this share of data's
// sequences [0, n) at length T (a whole answer: a run of consecutive scored targets, right when
// all its targets are, as Trainer::evaluate counts them).
std::vector<double> accuracy_counts(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                                    const Dataset& data, int T, int n, int32_t eot, Share share, const Progress& progress) {
  KvDecoder dec(cfg, specs, host, T);
  dec.set_document_token(eot);
  std::vector<int32_t> in(static_cast<size_t>(T)), tgt(static_cast<size_t>(T));
  std::vector<int> tokens(static_cast<size_t>(T));
  Rng unused(0);  // greedy draws nothing
  int64_t valid = 0, correct = 0, whole = 0, whole_right = 0;
  double nll = 0;  // -log p of the scored targets, as the eval's loss
  int done = 0;
  for (int i = 0; i < n; i++) {
    if (!share.mine(i)) continue;
    data.sequence(i, T, in.data(), tgt.data());
    int first = 0, last = T - 1;
    while (first < T && tgt[size_t(first)] < 0) first++;
    while (last >= first && tgt[size_t(last)] < 0) last--;
    if (first <= last) {  // else nothing is scored in this one
      tokens.assign(in.begin(), in.end());
      dec.reset();
      const std::vector<float>* logits =
          &dec.prefill(tokens.data(), first + 1, [&](int rows) { if (progress) progress(done, rows); });
      bool run_right = true;  // the whole answer in progress
      for (int t = first; t <= last; t++) {
        if (tgt[size_t(t)] >= 0) {
          valid++;
          // Logits that are not finite (weights whose outputs overflow) make this rank's loss NaN
          // instead of throwing here: the all-reduce then hands every rank the NaN, and all fail
          // together (a rank throwing alone would leave the others in that all-reduce).
          if (!std::all_of(logits->begin(), logits->end(), [](float z) { return std::isfinite(z); }))
            return {double(correct), double(valid), std::nan(""), double(whole_right), double(whole)};
          const bool hit = sample_token(*logits, 0.0f, 0, unused) == tgt[size_t(t)];
          correct += hit;
          nll += token_nll(logits->data(), int(logits->size()), tgt[size_t(t)]);
          if (t == first || tgt[size_t(t - 1)] < 0) whole++, run_right = true;
          run_right = run_right && hit;
          if (t == last || tgt[size_t(t + 1)] < 0) whole_right += run_right;
        }
        if (t < last) logits = &dec.step(tokens[size_t(t + 1)]);
      }
    }
    if (progress) progress(++done, 0);
  }
  return {double(correct), double(valid), nll, double(whole_right), double(whole)};
}

// {sum of -log p, count} per position_bands(T, widest) band over this share of the stream's windows. eot
// >= 0: packed documents (--doc-mask): each window is split at that token, as the eval splits its
// sequences (data/packing.h), and a target's band is its position in its document.
std::vector<double> loss_sums(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                              const std::vector<const int32_t*>& windows, int T, int widest, int32_t eot,
                              Share share, const Progress& progress) {
  KvDecoder dec(cfg, specs, host, T);
  dec.set_document_token(eot);
  std::vector<float> nll(static_cast<size_t>(T));
  std::vector<int32_t> doc(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  const std::vector<std::pair<int, int>> bands = position_bands(T, widest);
  std::vector<int> band_of(static_cast<size_t>(T));
  for (size_t k = 0; k < bands.size(); k++)
    std::fill(band_of.begin() + bands[k].first, band_of.begin() + bands[k].second, int(k));
  std::vector<double> sums(2 * bands.size(), 0.0);
  int done = 0;
  for (int i = 0; i < int(windows.size()); i++) {
    if (!share.mine(i)) continue;
    const int32_t* w = windows[size_t(i)];  // inputs w[0, T), targets w[1, T]
    const std::vector<int> tokens(w, w + T);
    dec.reset();
    dec.score(tokens.data(), w + 1, T, nll.data(), [&](int rows) { if (progress) progress(done, rows); });
    document_layout(w, T, eot, doc.data(), pos.data());  // pos: t, or the position in its document
    for (int t = 0; t < T; t++) {
      if (w[t + 1] < 0) continue;
      const int k = band_of[size_t(pos[size_t(t)])];
      sums[2 * size_t(k)] += nll[size_t(t)], sums[2 * size_t(k) + 1] += 1;
    }
    if (progress) progress(++done, 0);
  }
  return sums;
}

// The first n windows of T + 1 tokens (where each starts), run by run: stride T within a run, as
// the run's sequences at length T would tile it; none crosses from one run to the next.
std::vector<const int32_t*> windows_in(const std::vector<std::vector<int32_t>>& runs, int T, int n) {
  std::vector<const int32_t*> w;
  for (const std::vector<int32_t>& run : runs)
    for (int64_t at = 0; at + T < int64_t(run.size()) && int(w.size()) < n; at += T) w.push_back(run.data() + at);
  if (w.empty()) throw std::runtime_error("--probe-lengths " + std::to_string(T) + ": the val text is too short");
  return w;
}

LengthProbe loss_probe(int T, int widest, const std::vector<double>& sums) {
  const std::vector<std::pair<int, int>> bands = position_bands(T, widest);
  LengthProbe p;
  p.T = T;
  double total = 0;
  for (size_t k = 0; k < bands.size(); k++) {
    const double sum = sums[2 * k], count = sums[2 * k + 1];
    total += sum, p.answers += int64_t(count);
    p.by_position.push_back({bands[k].first, bands[k].second, count > 0 ? sum / count : 0.0, int64_t(count)});
  }
  p.loss = p.answers ? total / double(p.answers) : 0.0;
  // As the eval refuses it: every rank has the same sums, so all fail together.
  if (!std::isfinite(total))
    throw JobError("--probe-lengths " + std::to_string(T) + ": the val loss is not finite (" + std::to_string(p.loss) +
                   " over " + std::to_string(p.answers) + " targets): the weights' outputs overflow");
  return p;
}

}  // namespace

double decoded_accuracy(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                        const Dataset& data, int T, int n, int64_t* answers,
                        const std::function<void(int)>& progress, double* whole) {
  const std::vector<double> c = accuracy_counts(cfg, specs, host, data, T, n, -1, Share{}, windows_done(progress));
  *answers = int64_t(c[1]);
  if (whole) *whole = c[4] > 0 ? c[3] / c[4] : 0.0;
  return c[1] > 0 ? c[0] / c[1] : 0.0;
}

LengthProbe decoded_loss(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const std::vector<int32_t>& stream, int T, int n, int32_t eot,
                         const std::function<void(int)>& progress) {
  return loss_probe(T, T,
                    loss_sums(cfg, specs, host, windows_in({stream}, T, n), T, T, eot, Share{}, windows_done(progress)));
}

LengthProbe probe_length(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const Dataset& val, int seq, int T, int n, int32_t eot, Comm* world,
                         const std::function<void(const std::string&)>& progress, int widest) {
  const Share share{world ? world->rank() : 0, world ? world->size() : 1};
  // "all 3/64 sequences", and inside a long window where it got: "..., position 4096/65536".
  auto each = [&](const std::string& name, int total, const Share& mine) -> Progress {
    if (!progress) return {};
    const std::string of = "/" + std::to_string(mine.count(total)) + " sequences" +
                           (mine.parts > 1 ? " (this rank's share)" : "");
    return [&progress, name, of, T](int done, int rows) {
      progress(name + " " + std::to_string(done) + of +
               (rows > 0 ? ", position " + std::to_string(rows) + "/" + std::to_string(T) + " of the next" : ""));
    };
  };
  // Each rank decodes its share of the windows; the sums of every cell meet in one all-reduce.
  auto sum_over_ranks = [&](std::vector<double>& v) {
    if (share.parts > 1) world->all_reduce(v.data(), v.size(), DType::f64, ReduceOp::sum);
  };
  if (!val.synthetic()) {
    std::vector<std::vector<int32_t>> runs;
    // Every rank reads these same runs: a bad token id fails them all, but a file cut or gone on one
    // node, or its memory short, fails that rank alone; agreed on, so no rank is left in the
    // all-reduce below and the failing rank's reason is said.
    std::string failed;
    try {
      runs = val_runs(val, seq, T, n);
    } catch (const std::bad_alloc&) {
      failed = "out of host memory reading the val windows of length " + std::to_string(T);
    } catch (const std::exception& e) {
      failed = failure_text(e);
    }
    if (world) agree_on_errors(*world, failed);
    else if (!failed.empty()) throw JobError(failed);
    const std::vector<const int32_t*> windows = windows_in(runs, T, n);
    std::vector<double> sums =
        loss_sums(cfg, specs, host, windows, T, widest, eot, share, each("all", int(windows.size()), share));
    sum_over_ranks(sums);
    return loss_probe(T, widest, sums);
  }
  std::vector<std::pair<std::string, const Dataset*>> cells = {{"all", &val}};
  const auto probes = val.probes();
  for (const auto& [name, data] : probes) cells.emplace_back(name, data.get());
  constexpr size_t kCell = 5;  // accuracy_counts' numbers
  std::vector<double> counts;  // kCell per cell
  Share cell_share = share;
  for (size_t k = 0; k < cells.size(); k++) {
    const auto& [name, data] = cells[k];
    // (named with its place among the cells: "depth 0.25 (3/6) 5/16 sequences"; each cell counts its
    // sequences from 0, and "all 15/16" read as nearly done with five cells to go)
    const std::string at = cells.size() > 1 ? " (" + std::to_string(k + 1) + "/" + std::to_string(cells.size()) + ")" : "";
    const std::vector<double> c =
        accuracy_counts(cfg, specs, host, *data, T, n, eot, cell_share, each(name + at, n, cell_share));
    counts.insert(counts.end(), c.begin(), c.end());
    cell_share = cell_share.after(n);
  }
  sum_over_ranks(counts);
  for (size_t k = 0; k < cells.size(); k++)  // the same sums on every rank: all fail together
    if (!std::isfinite(counts[kCell * k + 2]))
      throw JobError("--probe-lengths " + std::to_string(T) + ": the model's logits are not finite (" +
                     cells[k].first + "): the weights' outputs overflow");
  LengthProbe p;
  p.T = T;
  p.answers = int64_t(counts[1]);
  p.loss = counts[1] > 0 ? counts[2] / counts[1] : 0.0;  // the val data's ("all")
  p.whole_answers = int64_t(counts[4]);
  p.whole_accuracy = counts[4] > 0 ? counts[3] / counts[4] : 0.0;
  for (size_t k = 0; k < cells.size(); k++)
    p.accuracy.emplace_back(cells[k].first,
                            counts[kCell * k + 1] > 0 ? counts[kCell * k] / counts[kCell * k + 1] : 0.0);
  return p;
}

}  // namespace ul
