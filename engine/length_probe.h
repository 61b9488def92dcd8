// --probe-lengths: how a run's synthetic task (passkey, recall) fares at sequence lengths other than
// the one it trained at: the needle-in-a-haystack grid of long-context work, accuracy by (length,
// needle depth). Does retrieval hold past the training length, and does --rope-scaling help?
//
// It runs on rank 0 from a host copy of the weights, through sampling's KV-cache decoder
// (engine/sample.h), not the training forward: a length longer than --seq needs neither a larger
// activation arena nor a sequence divisible by --sp. Each sequence is prefilled up to its first
// scored position, then stepped token by token (teacher forced: the next input is the data's, not
// the prediction); a scored target counts as correct when the logits' argmax (lowest id on ties)
// is it, the rule of the eval's accuracy, so at T = --seq both agree up to the rounding of nearly
// tied logits (the decoder's sums run in another order).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/params.h"
#include "layers/transformer.h"

namespace ul {

struct LengthProbe {
  int T = 0;
  int64_t answers = 0;  // scored targets per cell
  std::vector<std::pair<std::string, double>> accuracy;  // "all" (the val data), then its probes ("depth 0.25", ...)
};

// Refuses, naming --probe-lengths, before any training: a task that is not synthetic, a length a
// gpt2 model's learned positions do not reach, or one too short for the task.
void check_probe_lengths(const std::vector<int>& lengths, const Dataset& val, const ModelConfig& cfg);

// The fraction of the scored targets of data's sequences [0, n) at length T that the model
// (host: its f32 parameters, laid out as specs) predicts; *answers: how many were scored.
// progress, if given, is called after each sequence with the number done.
double decoded_accuracy(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                        const Dataset& data, int T, int n, int64_t* answers,
                        const std::function<void(int)>& progress = {});

// One row of the grid: the val data itself ("all") and each of its probes at length T. progress,
// if given, hears "all 3/64 sequences" (or "depth 0.25 ...") as it goes: train's --heartbeat.
LengthProbe probe_length(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const Dataset& val, int T, int n, const std::function<void(const std::string&)>& progress = {});

}  // namespace ul
