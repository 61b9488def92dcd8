// What `train` does with the model besides training it: read a --checkpoint of any format (its
// shape, then its weights: checkpoint_model_config; a Hugging Face safetensors file's by name:
// load_hf_checkpoint), and at the end of the run write it out (--export-llmc, --export-safetensors)
// and sample from it (--sample). README: "Interop: llm.c and Hugging Face", "Sampling".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/llmc_format.h"
#include "engine/file_io.h"
#include "engine/options.h"
#include "engine/tokenizer.h"
#include "layers/transformer.h"

namespace ul {

class Comm;

// The GPT-2 an llm.c checkpoint header describes (heads = kv heads), not yet validated.
ModelConfig gpt2_config(const LlmcConfig& lc);

// --checkpoint FILE.safetensors or DIR/model.safetensors.index.json (a sharded checkpoint): the
// model config (our __metadata__, or the config.json beside the file); then the weights into an
// already built model, shard by shard (`say`: a line per shard, which may take a while).
bool is_hf_checkpoint_path(const std::string& path);
ModelConfig hf_checkpoint_config(const std::string& path);
void load_hf_checkpoint(const std::string& path, Transformer& model, bool say = false);

// --checkpoint FILE of any format (llm.c .bin, .safetensors, our model.bin): the model's shape,
// validated. An llm.c file's or a model.bin's f32 values go to `values`; a safetensors file's are
// imported by name once the model exists (load_hf_checkpoint), and `values` stays empty. Without
// `weights` (--plan, and the Trainer before its checks: the shape alone) only the header is read,
// and checked against the file's size; the payload's checksum is checked when the weights are read.
ModelConfig checkpoint_model_config(const std::string& path, std::vector<float>& values, bool weights = true);

// Throws naming `path`, the tensor and the element when a loaded weight is NaN or infinite.
void check_finite_weights(const std::string& path, const std::vector<ParamSpec>& specs, const float* host);

// Built on every rank before training, so that a bad flag combination, tokenizer file or prompt
// fails before any work; finish() runs on rank 0 after the last step.
class RunOutputs {
 public:
  // eot >= 0 (--doc-mask): the sample's prompt and continuation are split into documents at that
  // token, as the model was trained (KvDecoder::set_document_token).
  // `world`: the tokenizer and --prompt-file are read by its rank 0 and sent to the others (a pipe
  // can be read once); null: read here.
  // room: the host bytes rank 0's sampler may take beside what the run holds (Trainer::decoder_room;
  // SIZE_MAX: the machine's memory); weights_copy: it reads a host copy of the weights (a device run).
  RunOutputs(const Options& o, const ModelConfig& cfg, int32_t eot, Comm* world = nullptr, size_t room = SIZE_MAX,
             bool weights_copy = true);
  // Whether finish() has anything to do (an export or a sample): it then needs the weights.
  bool wants_params() const;
  // Writes the exports (atomically) and prints the sample, from `host` (the f32 values of every
  // parameter, laid out as `specs`). Returns nothing: errors throw.
  void finish(const float* host, const std::vector<ParamSpec>& specs) const;
  // --sample-every: the sample of the model at `step` of training, printed with the step.
  void sample(const float* host, const std::vector<ParamSpec>& specs, int step) const;
  // The positions a --sample runs the model at (0 without it): the prompt's and every new token's
  // but the last, which is drawn and never fed back.
  int64_t sample_positions() const { return o_.sample > 0 ? int64_t(prompt_.size()) + o_.sample - 1 : 0; }
  // A text prompt read as bytes (no --tokenizer) for a model of a tokenizer's ids (more than the
  // 256 bytes and an end-of-text): a note for the start of the run, "" when there is none.
  const std::string& prompt_note() const { return prompt_note_; }

 private:
  std::string decode(const std::vector<int>& ids) const;
  // Generates o.sample tokens after the prompt from `host` (f32 parameters laid out as `specs`)
  // and prints the sample line (with the training step, when step >= 0) and the text.
  void print_sample(const float* host, const std::vector<ParamSpec>& specs, int step) const;
  Options o_;
  ModelConfig cfg_;
  int32_t eot_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<int> prompt_;
  std::string prompt_note_;
  mutable MadeDirs made_;  // the export directories this run made, kept once finish() wrote there
};

// "ids:1,2,3" -> those ids; any other text -> encode_prompt's. Throws naming --prompt.
std::vector<int> parse_prompt(const std::string& text, int vocab, const Tokenizer* tok);
// Text -> its bytes as ids (or, with a tokenizer, its encoding, after <|begin_of_text|> when the
// tokenizer's texts open with it, as Llama 3's do). Every id must be < vocab. Throws naming `where`
// (the flag, or --prompt-file and its file).
std::vector<int> encode_prompt(const std::string& text, int vocab, const Tokenizer* tok, const std::string& where);

// text with its control characters but newline and tab (C0, DEL, and C1 U+0080-U+009F) and the
// bytes of no valid UTF-8 character written as \xNN: what a sample prints to a terminal.
std::string terminal_safe(const std::string& text);

}  // namespace ul
