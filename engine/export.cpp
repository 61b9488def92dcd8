#include "engine/export.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "engine/checkpoint_files.h"
#include "engine/device.h"
#include "engine/file_io.h"
#include "engine/heartbeat.h"
#include "engine/hf_format.h"
#include "engine/llmc_format.h"
#include "engine/safetensors.h"
#include "engine/sample.h"
#include "engine/planner.h"
#include "engine/trainer.h"  // now_ms; memory_limit (parallel/hosts.h)
#include "parallel/communicator.h"

namespace ul {

ModelConfig gpt2_config(const LlmcConfig& lc) {
  ModelConfig c;
  c.arch = "gpt2";
  c.layers = lc.layers;
  c.dim = lc.channels;
  c.heads = c.kv_heads = lc.heads;
  c.vocab = lc.vocab;
  c.padded_vocab = lc.padded_vocab;
  c.max_seq = lc.max_seq;
  return c;
}

bool is_hf_checkpoint_path(const std::string& path) {
  return is_safetensors_path(path) || is_safetensors_index_path(path);
}

ModelConfig hf_checkpoint_config(const std::string& path) {
  if (is_safetensors_index_path(path)) return hf_read_config(read_safetensors_index(path));
  const SafetensorsFile f(path, /*header_only=*/true);  // the weights are read once the model exists
  return hf_read_config(f);
}

void check_finite_weights(const std::string& path, const std::vector<ParamSpec>& specs, const float* host) {
  for (const ParamSpec& s : specs)
    for (size_t i = 0; i < size_t(s.shape.numel()); i++)
      if (!std::isfinite(host[s.offset + i]))
        throw std::runtime_error(path + ": tensor " + s.name + " holds a non-finite value (" +
                                 std::to_string(host[s.offset + i]) + " at element " + std::to_string(i) +
                                 "): the weights are damaged, not trainable");
}

ModelConfig checkpoint_model_config(const std::string& path, std::vector<float>& ckpt, bool weights) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)  // a name too long, a component not a directory
    throw std::runtime_error("--checkpoint " + path + ": " + ec.message());
  if (std::filesystem::is_directory(st))
    throw std::runtime_error("--checkpoint " + path + " is a directory; give a file: an llm.c .bin, a " +
                             "Hugging Face .safetensors (or a sharded checkpoint's model.safetensors.index.json), " +
                             "or a ulysses model.bin (DIR/step_NNNNNNNN/model.bin)");
  // Before a format is picked by the file's magic: a missing model.bin read as "an llm.c checkpoint".
  if (!std::filesystem::exists(st)) throw std::runtime_error("--checkpoint " + path + ": no such file");
  require_regular_file(path);  // its magic is read first: a pipe would block there
  if (is_hf_checkpoint_path(path)) return hf_checkpoint_config(path);
  // A ulysses model.bin starts a new run from a saved one's weights (--resume continues the run).
  ModelConfig cfg;
  uint64_t count = 0;  // the weights the file holds
  if (is_model_file(path)) {
    cfg = weights ? read_model_file(path, ckpt) : read_model_file(path, ckpt, nullptr, &count);
    if (weights) count = ckpt.size();
  } else {
    try {
      const LlmcConfig lc = read_llmc_checkpoint(path, ckpt, weights);
      count = weights ? ckpt.size() : llmc_gpt2_num_params(lc);
      cfg = gpt2_config(lc);
    } catch (const std::runtime_error& e) {  // no format's magic: say which files --checkpoint takes
      if (!std::strstr(e.what(), "bad magic")) throw;
      throw std::runtime_error(std::string(e.what()) + "; --checkpoint takes an llm.c GPT-2 .bin, a ulysses model.bin, " +
                               "a .safetensors file or a *.safetensors.index.json");
    }
  }
  try {
    cfg.validate();
  } catch (const std::runtime_error& e) {  // the shape is the file's: name it
    throw std::runtime_error(path + ": model config: " + e.what());
  }
  // Every weight of that shape, or the file is refused: a header whose count says 0 once passed as
  // "no weights here" and the run started from random ones.
  if (count != param_count(cfg))
    throw std::runtime_error(path + ": " + std::to_string(count) + " weights, but the model its header describes has " +
                             std::to_string(param_count(cfg)));
  return cfg;
}

void load_hf_checkpoint(const std::string& path, Transformer& model, bool say) {
  std::vector<float> host(model.params.numel());
  if (is_safetensors_index_path(path)) {
    hf_import(read_safetensors_index(path), model.cfg, model.params.specs(), host.data(),
              [say](size_t i, size_t n, const std::string& file) {
                if (say) std::printf("load    | shard %zu/%zu: %s\n", i + 1, n, file.c_str()), std::fflush(stdout);
              });
  } else {
    SafetensorsFile f(path);
    hf_import(f, model.cfg, model.params.specs(), host.data());  // refuses a non-finite weight, naming its tensor
  }
  model.params.load_host(host.data());  // the f32 values (a bf16 model's master copy, and its rounding)
}

namespace {

void check_ids(const std::vector<int>& ids, int vocab, const std::string& where, const char* hint) {
  for (int id : ids)
    if (id < 0 || id >= vocab)
      throw std::runtime_error(where + ": token " + std::to_string(id) + " is outside the model's vocab of " +
                               std::to_string(vocab) + hint);
}

}  // namespace

std::vector<int> encode_prompt(const std::string& text, int vocab, const Tokenizer* tok, const std::string& where) {
  std::vector<int> ids;
  if (tok) {
    try {
      ids = tok->encode(text);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
    if (tok->eot_opens_text()) ids.insert(ids.begin(), tok->eot());  // Llama's <|begin_of_text|> / <s> first
  } else {
    for (unsigned char c : text) ids.push_back(int(c));
  }
  check_ids(ids, vocab, where, tok ? "" : " (text is read as bytes; give --tokenizer, or --prompt ids:1,2,3)");
  return ids;
}

std::vector<int> parse_prompt(const std::string& text, int vocab, const Tokenizer* tok) {
  if (text.rfind("ids:", 0) != 0) return encode_prompt(text, vocab, tok, "--prompt");
  std::vector<int> ids;
  size_t at = 4;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(item.c_str(), &end, 10);
    // an integer as typed: strtol would also take ' 3' and '+3' (a '-' is read, then refused as out of range)
    if (item.empty() || !(std::isdigit(static_cast<unsigned char>(item[0])) || item[0] == '-') || *end)
      throw std::runtime_error("--prompt: '" + item + "' is not a token id (ids:1,2,3)");
    if (errno == ERANGE || v < 0 || v >= vocab)
      throw std::runtime_error("--prompt: token " + item + " is outside the model's vocab of " + std::to_string(vocab));
    ids.push_back(int(v));
    at = comma + 1;
  }
  return ids;
}

namespace {

// What rank 0 alone does (read a file, make a directory), its text sent to the others; an error
// there fails every rank, with rank 0's message.
std::string on_rank0(Comm* world, const std::function<std::string()>& work) {
  if (!world || world->size() == 1) return work();
  std::string text, error;
  if (world->rank() == 0) {
    try {
      text = work();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // [failed, bytes] (f64: exact to 2^53), then the text or the error's message as int32 words.
  const std::string& sent = error.empty() ? text : error;
  double head[2] = {error.empty() ? 0.0 : 1.0, double(sent.size())};
  world->broadcast(head, 2, DType::f64, 0);
  const size_t n = size_t(head[1]);
  std::vector<int32_t> words((n + 3) / 4);
  if (world->rank() == 0 && n) std::memcpy(words.data(), sent.data(), n);
  world->broadcast(words.data(), words.size(), DType::i32, 0);
  const std::string got(reinterpret_cast<const char*>(words.data()), n);
  if (head[0] != 0) throw std::runtime_error(got);
  return got;
}

// A file every rank reads, read by rank 0 alone and sent to the others: a pipe (--prompt-file
// /dev/stdin) gives its bytes once, and under mpirun only rank 0 has the job's stdin.
// allow_pipe: --prompt-file (a tokenizer is read again by other tools: a file).
std::string read_once(const std::string& path, Comm* world, bool allow_pipe) {
  return on_rank0(world, [&] { return read_whole_file(path, allow_pipe); });
}

}  // namespace

RunOutputs::RunOutputs(const Options& o, const ModelConfig& cfg, int32_t eot, Comm* world, size_t room,
                       bool weights_copy)
    : o_(o), cfg_(cfg), eot_(eot) {
  // The export directories are made now, so that a path that cannot be written fails before
  // training; a run that ends without writing the exports (refused later at start-up, failed, or
  // stopped) removes the ones it made (made_). Rank 0 writes the exports, so it alone makes them
  // and takes them back (when every rank made them, the one that came first kept them, unowned).
  on_rank0(world, [&] {
    for (const std::string& path : {o.export_llmc, o.export_safetensors}) {
      const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      if (path.empty() || dir.empty()) continue;
      if (const std::string why = made_.make(dir.string()); !why.empty())
        throw std::runtime_error(path + ": cannot create the directory " + dir.string() + ": " + why);
    }
    return std::string();
  });
  if (!o.export_llmc.empty() && cfg.is_llama())
    throw std::runtime_error("--export-llmc: llm.c's checkpoint format holds gpt2 models only; use --export-safetensors");
  if (o.sample <= 0) return;
  // A tokenizer may have a few fewer tokens than the model has ids (Qwen 2.5: 151665 for 151936,
  // the rest padding): the sampler then draws among the tokenizer's ids alone (print_sample). Far
  // fewer is another model's tokenizer (GPT-2's 50257 for Llama 3's 128256): refused.
  constexpr int kUnnamedIds = 1024;
  if (!o.tokenizer.empty()) {
    std::string bytes;
    try {
      bytes = read_once(o.tokenizer, world, /*allow_pipe=*/false);
    } catch (const CommError& e) {  // (the other ranks' wait for rank 0's read, not a read of theirs)
      throw CommError("--tokenizer: " + std::string(e.what()) + " (rank 0 reads the file for every rank)");
    } catch (const std::exception& e) {
      throw std::runtime_error("--tokenizer: " + std::string(e.what()));
    }
    tok_ = std::make_unique<Tokenizer>(o.tokenizer, bytes);
    if (tok_->vocab() > cfg.vocab)  // its ids past the model's could never be drawn, and the rest mean other text
      throw std::runtime_error(o.tokenizer + ": the tokenizer has " + std::to_string(tok_->vocab()) +
                               " tokens, more than the model's vocab " + std::to_string(cfg.vocab) +
                               ": not this model's tokenizer");
    if (tok_->vocab() < cfg.vocab - kUnnamedIds)
      throw std::runtime_error(o.tokenizer + ": the tokenizer has " + std::to_string(tok_->vocab()) +
                               " tokens, the model's vocab " + std::to_string(cfg.vocab) +
                               ": not this model's tokenizer (at most " + std::to_string(kUnnamedIds) +
                               " of the model's ids may be past it)");
  }
  if (!o.prompt_file.empty()) {
    const std::string where = "--prompt-file " + o.prompt_file;
    std::string text;
    try {
      // "-": standard input, as `train prepare --files-from -` reads it
      text = read_once(o.prompt_file == "-" ? "/dev/stdin" : o.prompt_file, world, /*allow_pipe=*/true);
    } catch (const CommError& e) {  // another rank's wait for rank 0's read (a slow pipe), not a bad input
      throw CommError(where + ": " + e.what() + " (rank 0 reads it for every rank)");
    } catch (const std::exception& e) {
      if (o.prompt_file == "-")
        throw std::runtime_error("--prompt-file -: standard input cannot be read as a prompt (" +
                                 std::string(e.what()) + "): pipe the prompt in or redirect a file (< prompt.txt)");
      throw std::runtime_error("--prompt-file: " + std::string(e.what()));
    }
    if (text.empty()) throw std::runtime_error(where + ": the file is empty");
    prompt_ = encode_prompt(text, cfg.vocab, tok_.get(), where);
  } else if (!o.prompt.empty()) {
    prompt_ = parse_prompt(o.prompt, cfg.vocab, tok_.get());
  } else if (tok_ && tok_->eot() >= 0 && tok_->eot() < cfg.vocab) prompt_ = {tok_->eot()};  // llm.c starts from <|endoftext|>
  else throw std::runtime_error("--sample needs --prompt (text, or ids:1,2,3) or --prompt-file");
  // Documented, and right for a byte-level model, but a GPT-2's ids 72 105 are not "Hi": said once.
  const bool text_prompt = !o.prompt_file.empty() || (!o.prompt.empty() && o.prompt.rfind("ids:", 0) != 0);
  if (!tok_ && text_prompt && cfg.vocab > 257)
    prompt_note_ = std::string(o.prompt_file.empty() ? "--prompt" : "--prompt-file") + " is read as bytes (no "
                   "--tokenizer), but the model has " + std::to_string(cfg.vocab) + " token ids: if they are a "
                   "tokenizer's, give --tokenizer FILE (its BPE encoding) or --prompt ids:1,2,3";
  // An ids: prompt past the tokenizer would be decoded for the output only after the training.
  if (tok_)
    for (int id : prompt_)
      if (id >= tok_->vocab())
        throw std::runtime_error("--prompt: token " + std::to_string(id) + " is outside the tokenizer's vocab of " +
                                 std::to_string(tok_->vocab()) + " (" + o.tokenizer + ")");
  const int64_t need = sample_positions();
  if (!cfg.is_llama() && need > cfg.max_seq)
    throw std::runtime_error("--sample: the prompt (" + std::to_string(prompt_.size()) + " tokens) plus " +
                             std::to_string(o.sample) + " new tokens run the model at " + std::to_string(need) +
                             " positions, past the model's max sequence " + std::to_string(cfg.max_seq) +
                             " (gpt2 has learned positions)");
  if (need > INT32_MAX)
    throw std::runtime_error("--sample: the prompt (" + std::to_string(prompt_.size()) + " tokens) plus " +
                             std::to_string(o.sample) + " new tokens exceed 2^31 - 1 positions");
  // The sampler's memory, next to the run's: refused now rather than by the kernel's OOM killer
  // after the training (Linux grants the memory, then kills the process that touches it).
  // The drawn ids are kept, and their text made, whole: a windowed model's KV cache is a ring of
  // fixed size, but --sample 2000000000 still holds 2e9 ids and their text (16 bytes each, ample
  // for a decoded token or an "ids:" number).
  const size_t out_bytes = size_t(need + 1) * (sizeof(int) + 16);
  const size_t bytes = KvDecoder::host_bytes(cfg, int(need), false, KvDecoder::kDefaultChunk, weights_copy) + out_bytes;
  const bool beside = room != SIZE_MAX;
  if (!beside) room = memory_limit();
  if (bytes > room)
    throw std::runtime_error("--sample: the prompt (" + std::to_string(prompt_.size()) + " tokens) plus " +
                             std::to_string(o.sample) + " new tokens need " + std::to_string(bytes >> 20) +
                             (weights_copy ? " MiB for the KV cache, a host copy of the weights" : " MiB for the KV cache") +
                             " and the tokens' ids and text" +
                             ", but " + (beside ? "beside what the run holds " : "") + "this machine has " +
                             std::to_string(room >> 20) + " MiB" +
                             (o.prompt_file.empty() ? "" : ": shorten --prompt-file " + o.prompt_file));
}

std::string RunOutputs::decode(const std::vector<int>& ids) const {
  std::string s;
  if (tok_) {
    for (int id : ids) s += tok_->decode(id);
  } else if (cfg_.vocab == 256 || cfg_.vocab == 257) {
    // Byte-level data: text:FILE (256), or `train prepare`'s byte shards (257: the EOT is 256).
    for (int id : ids) s += id < 256 ? std::string(1, char(id)) : std::string("<|endoftext|>");
  } else {
    for (int id : ids) s += (s.empty() ? "ids: " : " ") + std::to_string(id);
  }
  return s;
}

bool RunOutputs::wants_params() const {
  return !o_.export_llmc.empty() || !o_.export_safetensors.empty() || o_.sample > 0;
}

void RunOutputs::finish(const float* host, const std::vector<ParamSpec>& specs) const {
  if (!wants_params()) return;
  const bool say = !o_.quiet;
  // A large model's export takes a while (the safetensors file 2 bytes or 4 a weight): said first,
  // each line flushed as it comes (a batch job's log is a file, which buffers).
  auto starting = [&](const std::string& path, int bytes, const char* kind) {
    const double gib = double(param_count(cfg_)) * bytes / double(1 << 30);
    if (say && gib >= 1) std::printf("export  | writing %s (%.1f GiB of %s weights) ...\n", path.c_str(), gib, kind);
    std::fflush(stdout);
  };
  Heartbeat beat(say ? o_.heartbeat : 0);  // a file of GiBs: "  ...   export PATH | 3.20 GiB written | 30.0 s"
  if (!o_.export_llmc.empty()) {
    const bool bf16 = o_.export_llmc_version == 5;
    starting(o_.export_llmc, bf16 ? 2 : 4, bf16 ? "bf16" : "f32");
    const LlmcConfig lc{cfg_.max_seq, cfg_.vocab, cfg_.padded_vocab, cfg_.layers, cfg_.heads, cfg_.dim};
    {
      Heartbeat::Phase phase = beat.begin("export " + o_.export_llmc, Heartbeat::bytes_written_from_now());
      write_llmc_checkpoint(o_.export_llmc, lc, host, o_.export_llmc_version);
    }
    if (say) std::printf("export  | %s (llm.c GPT-2 checkpoint version %d, %s)\n", o_.export_llmc.c_str(),
                         o_.export_llmc_version, o_.export_llmc_version == 5 ? "bf16" : "fp32");
    std::fflush(stdout);
  }
  if (!o_.export_safetensors.empty()) {
    const std::string dtype = o_.export_dtype == "bf16" ? "BF16" : "F32";
    starting(o_.export_safetensors, dtype == "BF16" ? 2 : 4, dtype == "BF16" ? "bf16" : "f32");
    {
      Heartbeat::Phase phase = beat.begin("export " + o_.export_safetensors, Heartbeat::bytes_written_from_now());
      export_safetensors(o_.export_safetensors, cfg_, specs, host, dtype);
    }
    if (say) std::printf("export  | %s (safetensors %s, Hugging Face names) + config.json\n", o_.export_safetensors.c_str(),
                         dtype.c_str());
    // A YaRN model's max_position_embeddings is factor x orig (hf_max_position_embeddings), which
    // transformers 4.51 to 4.55 read the factor back from: where the product is not whole, the
    // rounded one gives them another factor.
    // (compared as the float the factor is: 1.1 x 1000 is 1100 whatever 1.1's last bits)
    const RopeScaling& rs = cfg_.rope_scaling;
    if (say && cfg_.is_llama() && rs.kind == RopeScaling::kYarn) {
      const int mpe = hf_max_position_embeddings(cfg_);
      const double product = double(rs.factor) * double(rs.original_max_pos), read = double(mpe) / rs.original_max_pos;
      if (!(product >= 1 && product < 2147483648.0))
        std::printf("note    | yarn's factor x orig (%s x %d) is past an int: config.json's max_position_embeddings is "
                    "the model's max_seq, %d, and transformers 4.51 to 4.55 take the factor from it, %.6g\n",
                    float_text(rs.factor).c_str(), rs.original_max_pos, mpe, read);
      else if (float(read) != rs.factor)
        std::printf("note    | config.json's max_position_embeddings %d is yarn's factor x orig (%s x %d) rounded: "
                    "transformers 4.51 to 4.55 take the factor from it, %.6g, not %s (a factor that makes the product "
                    "whole avoids it)\n", mpe, float_text(rs.factor).c_str(), rs.original_max_pos, read,
                    float_text(rs.factor).c_str());
      // truncate false (gpt-oss's) keeps the ramp's ends unrounded; the transformers before its key
      // existed warn of an unknown key and round them: another model there.
      if (!rs.truncate)
        std::printf("note    | yarn truncate=0 is written as \"truncate\": false; transformers versions that predate "
                    "the key (it came with gpt-oss) ignore it and round the ramp's ends: they run another model\n");
    }
    std::fflush(stdout);
  }
  made_.keep();  // the exports are in place
  if (o_.sample > 0) print_sample(host, specs, -1);
  std::fflush(stdout);
}

void RunOutputs::sample(const float* host, const std::vector<ParamSpec>& specs, int step) const {
  print_sample(host, specs, step);
  std::fflush(stdout);
}

void RunOutputs::print_sample(const float* host, const std::vector<ParamSpec>& specs, int step) const {
  const bool say = !o_.quiet;
  SampleSettings s{o_.sample, o_.temperature, o_.top_k, o_.seed, o_.top_p};
  if (tok_ && tok_->vocab() < cfg_.vocab) s.vocab = tok_->vocab();  // ids it can decode
  KvDecoder dec(cfg_, specs, host, int(sample_positions()));
  dec.set_document_token(eot_);  // -1: one document
  // A book-length prompt takes minutes to prefill on a CPU: --heartbeat lines say how far it got.
  const int n = int(prompt_.size());
  const double start = now_ms();
  double prefilled = start, last_beat = start;
  const std::vector<int> out = generate(dec, prompt_, s, [&](int done) {
    const double t = now_ms();
    if (done == n) prefilled = t;
    if (say && o_.heartbeat > 0 && done != n && t - last_beat >= o_.heartbeat * 1000) {
      last_beat = t;
      if (done < n) std::printf("  ...   prefill | %d/%d prompt tokens done | %.1f s\n", done, n, (t - start) / 1000);
      else std::printf("  ...   decode | %d/%d new tokens done | %.1f s\n", done - n, o_.sample, (t - start) / 1000);
      std::fflush(stdout);
    }
  });
  const double decode_s = (now_ms() - prefilled) / 1000;  // o_.sample - 1 forwards: the last token needs none
  if (say) {
    const std::string at = step >= 0 ? " step " + std::to_string(step) + " |" : "";
    std::printf("sample  |%s %d prompt + %d new tokens | temperature %g | top-k %d | top-p %g | seed %llu | prefill %.0f tok/s",
                at.c_str(), n, o_.sample, double(o_.temperature), o_.top_k, double(o_.top_p), (unsigned long long)o_.seed,
                n / std::max(1e-6, (prefilled - start) / 1000));
    if (o_.sample > 1) std::printf(" | decode %.1f tok/s", (o_.sample - 1) / std::max(1e-6, decode_s));
    std::printf("\n");
  } else if (step >= 0) {
    std::printf("sample  | step %d\n", step);  // --quiet: which step a --sample-every sample is of
  }
  // Written as bytes: a byte-level model may well produce a NUL, which "%s" would stop at. A
  // --prompt-file prompt (a book, perhaps) is not echoed: only what follows it.
  const std::string head = o_.prompt_file.empty() ? decode(prompt_) + (tok_ || cfg_.vocab == 256 || cfg_.vocab == 257 ? "" : " | ") : "";
  std::string text = head + decode(out) + "\n";
  // To a terminal, control bytes (an undertrained byte model's ESC or NUL) are shown as \xNN, not
  // sent (an ESC sequence would drive the terminal); to a file or a pipe, the bytes as they are.
  if (::isatty(STDOUT_FILENO)) text = terminal_safe(text);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

std::string terminal_safe(const std::string& text) {
  std::string safe;
  safe.reserve(text.size());
  auto hex = [&](size_t at, size_t n) {
    for (size_t k = at; k < at + n; k++) {
      char h[8];
      std::snprintf(h, sizeof h, "\\x%02X", unsigned(static_cast<unsigned char>(text[k])));
      safe += h;
    }
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {  // C0 controls and DEL shown, newline and tab kept
      if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) hex(i, 1);
      else safe += char(b);
      i++;
      continue;
    }
    // A whole UTF-8 character as it is, but the C1 controls (U+0080-U+009F: U+009B is a CSI that
    // terminals act on); a byte that starts no valid character, shown.
    size_t n = 0;
    uint32_t cp = 0;
    if (b >= 0xC2 && b <= 0xDF) n = 2, cp = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, cp = b & 0x0F;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, cp = b & 0x07;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; k++) {
      const unsigned char c = static_cast<unsigned char>(text[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = cp << 6 | (c & 0x3F);
    }
    // (no overlong 3-byte form, no surrogate, nothing past U+10FFFF)
    ok = ok && !(n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) &&
         !(n == 4 && (cp < 0x10000 || cp > 0x10FFFF));
    if (!ok) {
      hex(i, 1);
      i++;
    } else {
      if (cp >= 0x80 && cp <= 0x9F) hex(i, n);
      else safe.append(text, i, n);
      i += n;
    }
  }
  return safe;
}

}  // namespace ul
