// --probe-lengths: how a run's model fares at sequence lengths other than the one it trained at.
// On a synthetic task (passkey, recall): the needle-in-a-haystack grid of long-context work,
// accuracy by (length, needle depth): does retrieval hold past the training length? On text: the
// val loss at each length, overall and by position band: does the loss keep falling as the
// context grows, or blow up past the trained positions (and does --rope-scaling help)?
//
// It runs on every rank, each decoding a share of the windows, from a host copy of the weights,
// through sampling's KV-cache decoder (engine/sample.h), not the training forward: a length longer
// than --seq needs neither a larger activation arena nor a sequence divisible by --sp. Synthetic: each sequence is prefilled up to
// its first scored position, then stepped token by token (teacher forced: the next input is the
// data's, not the prediction); a scored target counts as correct when the logits' argmax (lowest
// id on ties) is it, the rule of the eval's accuracy. Text: every row's -log p(target), chunk by
// chunk (KvDecoder::score), over windows of T + 1 tokens cut from the val split's own tokens as
// the run reads them at --seq (val_runs), so a long window never reaches into the training text
// nor across the gap between two of the split's files. With
// --doc-mask the decoder splits windows into documents as the eval does (attention within each,
// positions and bands from its start). At T = --seq both equal the eval's, up to the rounding of
// the decoder's other summation order (tests hold them to it).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/params.h"
#include "engine/trainer.h"
#include "layers/transformer.h"
#include "parallel/communicator.h"

namespace ul {

struct LengthProbe {
  int T = 0;
  int64_t answers = 0;  // scored targets (per cell, on a synthetic task)
  // Synthetic: the val data's whole answers all right (EvalResult's), and how many there were.
  double whole_accuracy = 0;
  int64_t whole_answers = 0;
  // Synthetic: "all" (the val data), then its probes ("depth 0.25", ...).
  std::vector<std::pair<std::string, double>> accuracy;
  // The mean -log p over every target (synthetic: of the val data's scored ones, as the eval's val
  // loss); text also by position_bands(T).
  double loss = 0;
  std::vector<PositionLoss> by_position;
};

// Refuses, naming --probe-lengths, before any training: a length a gpt2 model's learned positions
// do not reach, one too short for the task or longer than the val split holds, or one whose
// decoder would not fit `room`, the host bytes a rank's decoder may take beside what the run holds
// while every rank decodes (Trainer::decoder_room(true); SIZE_MAX: the machine's memory). seq: the
// run's --seq. weights_copy: each decoder reads a host copy of the weights (a device run).
void check_probe_lengths(const std::vector<int>& lengths, const Dataset& val, const ModelConfig& cfg, int seq,
                         size_t room = SIZE_MAX, bool weights_copy = true);

// The val split's tokens read through its sequences at the run's length seq, as stretches of
// text: consecutive sequences that continue each other (Dataset::continues) join into one (their
// inputs, then the last one's final target); a new stretch starts where one does not (another
// shard file). Read until the stretches hold `windows` windows of T + 1 tokens (each within one
// stretch), or to the split's end.
std::vector<std::vector<int32_t>> val_runs(const Dataset& val, int seq, int T, int windows);

// The fraction of the scored targets of data's sequences [0, n) at length T that the model
// (host: its f32 parameters, laid out as specs) predicts; *answers: how many were scored; *whole
// (when given): the fraction of whole answers (runs of consecutive scored targets) all right.
// progress, if given, is called after each sequence with the number done.
double decoded_accuracy(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                        const Dataset& data, int T, int n, int64_t* answers,
                        const std::function<void(int)>& progress = {}, double* whole = nullptr);

// The mean -log p of every target of the first n windows of T + 1 tokens of `stream` (as many as
// it holds, at least one), overall and by position_bands(T); progress as decoded_accuracy's.
// eot >= 0: packed documents opened by that token (--doc-mask): attention stays in each, positions
// and bands count from its start.
LengthProbe decoded_loss(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const std::vector<int32_t>& stream, int T, int n, int32_t eot = -1,
                         const std::function<void(int)>& progress = {});

// One row at length T: synthetic, the accuracy of the val data itself ("all") and of each of its
// probes; text, decoded_loss. progress, if given, hears "all 3/64 sequences" (or "depth 0.25 ...")
// as it goes: train's --heartbeat.
// seq: the run's --seq (text reads val_runs(val, seq, ...), windows within each stretch); eot:
// decoded_loss's. world: when given, collective: the ranks take the windows in turn (a passkey
// row's cells one after another, each going on from the rank the one before stopped at, so no rank
// takes the extra window of every cell), and the counts are all-reduced, so every rank returns the
// whole row. widest: text's bands are position_bands(T, widest) (train passes the longest length
// probed, so every row's bands line up).
LengthProbe probe_length(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, const float* host,
                         const Dataset& val, int seq, int T, int n, int32_t eot = -1, Comm* world = nullptr,
                         const std::function<void(const std::string&)>& progress = {}, int widest = 0);

}  // namespace ul
