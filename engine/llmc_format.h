// The llm.c file formats, so that models trained here and there are interchangeable and so that
// the whole model can be tested against an external reference state.
//
// GPT-2 checkpoint: header 256 x int32 = [20240326, version, maxT, V, L, H, C, Vp, 0...], then every
// parameter, in the order of llmc_gpt2_param_shapes: version 3 = fp32, version 5 = bf16 (read and
// written; read converts to fp32, write rounds to nearest even). Vp >= V is the vocab padded for efficient GEMMs; the pad rows of wte are zero.
//
// Debug state: header 256 x int32 = [20240327, 2, B, T, 0...], then inputs (B*T int32), targets
// (B*T int32, -1 = ignored), logits (B*T*V fp32, the UNPADDED vocab), loss (1 fp32, the mean over
// valid targets), then every parameter gradient in checkpoint order and shapes (wte padded to Vp).
//
// Every reader checks the exact file size and the header, and throws std::runtime_error naming the
// file and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ul {

struct LlmcConfig {
  int max_seq, vocab, padded_vocab, layers, heads, channels;
};

// Throws (prefixed with `where`) on nonsense: any value <= 0, vocab > padded_vocab, channels % heads.
void validate_llmc_config(const LlmcConfig& c, const std::string& where);

size_t llmc_gpt2_num_params(const LlmcConfig& c);
// (name, shape) of every parameter in file order: wte (Vp,C), wpe (maxT,C), ln1w (L,C), ln1b (L,C),
// qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb (L,C), ln2w (L,C), ln2b (L,C),
// fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C).
std::vector<std::pair<std::string, std::vector<int64_t>>> llmc_gpt2_param_shapes(const LlmcConfig& c);

// params is resized to llmc_gpt2_num_params(config); without `weights`, only the header is read
// (and the file's size checked against it): params stays empty.
LlmcConfig read_llmc_checkpoint(const std::string& path, std::vector<float>& params, bool weights = true);
// Writes version 3 (fp32) or 5 (bf16, round-to-nearest-even) atomically: path.tmp, fsync, rename —
// a crash never leaves a damaged file.
void write_llmc_checkpoint(const std::string& path, const LlmcConfig& c, const float* params, int version = 3);

struct DebugState {
  int B, T;
  std::vector<int32_t> inputs, targets;  // (B, T)
  std::vector<float> logits;             // (B, T, V)
  float loss;
  std::vector<float> grads;              // llmc_gpt2_num_params(cfg), checkpoint layout
};
// cfg (from the matching checkpoint) gives V and the gradient count.
DebugState read_debug_state(const std::string& path, const LlmcConfig& cfg);

}  // namespace ul
