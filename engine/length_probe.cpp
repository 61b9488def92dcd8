#include "engine/length_probe.h"

#include <stdexcept>

#include "engine/rng.h"
#include "engine/sample.h"

namespace ul {

void check_probe_lengths(const std::vector<int>& lengths, const Dataset& val, const ModelConfig& cfg) {
  if (lengths.empty()) return;
  if (!val.synthetic())
    throw std::runtime_error("--probe-lengths: " + val.describe() +
                             " is not a synthetic task; the grid needs scored answers (--data passkey or recall)");
  std::vector<int32_t> in, tgt;
  for (int T : lengths) {
    if (!cfg.is_llama() && T > cfg.max_seq)
      throw std::runtime_error("--probe-lengths: " + std::to_string(T) + " exceeds the model's max sequence " +
                               std::to_string(cfg.max_seq) + " (gpt2's positions are learned)");
    in.resize(size_t(T)), tgt.resize(size_t(T));
    try {
      val.sequence(0, T, in.data(), tgt.data());  // the task's own refusal of a length (passkey: too short)
    } catch (const std::exception& e) {
      throw std::runtime_error("--probe-lengths: " + std::string(e.what()));
    }
  }
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

LengthProbe probe_length(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const Dataset& val, int T, int n, const std::function<void(const std::string&)>& progress) {
  auto each = [&](const std::string& name) -> std::function<void(int)> {
    if (!progress) return {};
    return [&progress, name, n](int done) { progress(name + " " + std::to_string(done) + "/" + std::to_string(n) + " sequences"); };
  };
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
