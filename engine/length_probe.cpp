#include "engine/length_probe.h"

#include <algorithm>
#include <stdexcept>

#include "engine/rng.h"
#include "engine/sample.h"

namespace ul {

void check_probe_lengths(const std::vector<int>& lengths, const Dataset& val, const ModelConfig& cfg, bool doc_mask,
                         int seq) {
  if (lengths.empty()) return;
  if (!val.synthetic() && doc_mask)
    throw std::runtime_error("--probe-lengths: the decoder attends across documents, so it cannot probe a "
                             "--doc-mask run's text (drop one of the two)");
  std::vector<int32_t> in, tgt;
  for (int T : lengths) {
    const std::string where = "--probe-lengths " + std::to_string(T) + ": ";
    if (!cfg.is_llama() && T > cfg.max_seq)
      throw std::runtime_error(where + "longer than the model's max sequence " + std::to_string(cfg.max_seq) +
                               " (gpt2's positions are learned)");
    if (!val.synthetic()) {
      const size_t held = val_stream(val, seq, int64_t(T) + 1).size();
      if (held < size_t(T) + 1)
        throw std::runtime_error(where + "the val split (" + val.describe() + ") holds " + std::to_string(held) +
                                 " tokens at --seq " + std::to_string(seq) + "; a window needs " + std::to_string(T + 1));
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

std::vector<int32_t> val_stream(const Dataset& val, int seq, int64_t tokens) {
  const int64_t n = std::min<int64_t>(val.num_sequences(seq), (tokens + seq - 1) / seq);
  std::vector<int32_t> out, in(static_cast<size_t>(seq)), tgt(static_cast<size_t>(seq));
  for (int64_t i = 0; i < n; i++) {
    val.sequence(i, seq, in.data(), tgt.data());
    out.insert(out.end(), in.begin(), in.end());
    if (i + 1 == n) out.push_back(tgt.back());
  }
  if (int64_t(out.size()) > tokens) out.resize(size_t(tokens));
  return out;
}

double decoded_accuracy(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                        const Dataset& data, int T, int n, int64_t* answers,
                        const std::function<void(int)>& progress) {
  KvDecoder dec(cfg, specs, host, T);
  std::vector<int32_t> in(static_cast<size_t>(T)), tgt(static_cast<size_t>(T));
  std::vector<int> tokens(static_cast<size_t>(T));
  Rng unused(0);  // greedy draws nothing
  int64_t valid = 0, correct = 0;
  for (int i = 0; i < n; i++) {
    data.sequence(i, T, in.data(), tgt.data());
    int first = 0, last = T - 1;
    while (first < T && tgt[size_t(first)] < 0) first++;
    while (last >= first && tgt[size_t(last)] < 0) last--;
    if (first > last) continue;  // nothing scored in this one
    tokens.assign(in.begin(), in.end());
    dec.reset();
    const std::vector<float>* logits = &dec.prefill(tokens.data(), first + 1);
    for (int t = first; t <= last; t++) {
      if (tgt[size_t(t)] >= 0) {
        valid++;
        correct += sample_token(*logits, 0.0f, 0, unused) == tgt[size_t(t)];
      }
      if (t < last) logits = &dec.step(tokens[size_t(t + 1)]);
    }
    if (progress) progress(i + 1);
  }
  *answers = valid;
  return valid ? double(correct) / double(valid) : 0.0;
}

LengthProbe decoded_loss(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const std::vector<int32_t>& stream, int T, int n, const std::function<void(int)>& progress) {
  const int windows = int(std::min<int64_t>(n, (int64_t(stream.size()) - 1) / T));
  if (windows < 1) throw std::runtime_error("--probe-lengths " + std::to_string(T) + ": the val text is too short");
  KvDecoder dec(cfg, specs, host, T);
  std::vector<float> nll(static_cast<size_t>(T));
  const std::vector<std::pair<int, int>> bands = position_bands(T);
  std::vector<double> sum(bands.size(), 0.0);
  std::vector<int64_t> count(bands.size(), 0);
  for (int i = 0; i < windows; i++) {
    const int32_t* w = stream.data() + int64_t(i) * T;  // inputs w[0, T), targets w[1, T]
    const std::vector<int> tokens(w, w + T);
    dec.reset();
    dec.score(tokens.data(), w + 1, T, nll.data());
    for (size_t k = 0; k < bands.size(); k++)
      for (int t = bands[k].first; t < bands[k].second; t++)
        if (w[t + 1] >= 0) sum[k] += nll[size_t(t)], count[k]++;
    if (progress) progress(i + 1);
  }
  LengthProbe p;
  p.T = T;
  double total = 0;
  for (size_t k = 0; k < bands.size(); k++) {
    total += sum[k], p.answers += count[k];
    p.by_position.push_back({bands[k].first, bands[k].second, count[k] ? sum[k] / double(count[k]) : 0.0, count[k]});
  }
  p.loss = p.answers ? total / double(p.answers) : 0.0;
  return p;
}

LengthProbe probe_length(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const Dataset& val, int seq, int T, int n,
                         const std::function<void(const std::string&)>& progress) {
  auto each = [&](const std::string& name) -> std::function<void(int)> {
    if (!progress) return {};
    return [&progress, name, n](int done) { progress(name + " " + std::to_string(done) + "/" + std::to_string(n) + " sequences"); };
  };
  if (!val.synthetic()) return decoded_loss(cfg, specs, host, val_stream(val, seq, int64_t(n) * T + 1), T, n, each("all"));
  LengthProbe p;
  p.T = T;
  p.accuracy.emplace_back("all", decoded_accuracy(cfg, specs, host, val, T, n, &p.answers, each("all")));
  for (const auto& [name, data] : val.probes()) {
    int64_t answers = 0;
    p.accuracy.emplace_back(name, decoded_accuracy(cfg, specs, host, *data, T, n, &answers, each(name)));
  }
  return p;
}

}  // namespace ul
