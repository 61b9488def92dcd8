#include "data/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <vector>

#include "data/rng.h"
#include "engine/file_io.h"

namespace ul {

namespace {

constexpr int32_t kMagicGpt2 = 20240520, kMagicLlama3 = 20240801;
constexpr int kDefaultVocabGpt2 = 50257, kDefaultVocabLlama3 = 128256;

std::runtime_error shard_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

std::string basename_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Sequences of T + 1 tokens (one shared with the next) that tokens [lo, hi) of one file hold.
int64_t sequences_in(int64_t lo, int64_t hi, int T) { return hi - lo > T ? (hi - lo - 1) / T : 0; }

}  // namespace

ShardDataset::Shard ShardDataset::read_header(const std::string& path) {
  Shard s;
  s.path = path;
  require_regular_file(path);
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw shard_error(path, std::string("cannot open shard: ") + std::strerror(errno));
  struct stat st{};
  fstat(fd, &st);
  const int64_t size = st.st_size;
  s.dev = uint64_t(st.st_dev), s.ino = uint64_t(st.st_ino);
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  int32_t header[256];
  const bool whole = size >= 1024 && ::pread(fd, header, 1024, 0) == 1024;
  ::close(fd);
  if (!whole) throw shard_error(path, "truncated shard: " + std::to_string(size) + " bytes, shorter than the 1024-byte header");
  auto fail = [&](const std::string& what) { return shard_error(path, what); };
  if (header[0] == kMagicGpt2) {
    if (header[1] != 1) throw fail("unsupported version " + std::to_string(header[1]) + " (magic 20240520 needs version 1)");
    s.width = 2;
  } else if (header[0] == kMagicLlama3) {
    if (header[1] != 7 && header[1] != 2)
      throw fail("unsupported version " + std::to_string(header[1]) + " (magic 20240801 needs version 7 or 2)");
    s.width = 4;
  } else {
    throw fail("bad magic " + std::to_string(header[0]) + " (expected 20240520 or 20240801, an llm.c token shard)");
  }
  if (header[3] == kShardTag) {  // the tokenizer named: vocab, end-of-text id
    const int64_t most = s.width == 2 ? 65536 : INT32_MAX;
    if (header[4] < 1 || header[4] > most || header[5] < 0 || header[5] >= header[4])
      throw fail("header names vocab " + std::to_string(header[4]) + " and end-of-text " + std::to_string(header[5]) +
                 " (need 1 <= vocab <= " + std::to_string(most) + ", 0 <= eot < vocab)");
    s.vocab = header[4], s.eot = header[5];
  }
  s.count = header[2];
  if (s.count <= 0) throw fail("header token count " + std::to_string(s.count) + " (must be > 0)");
  const int64_t want = 1024 + s.count * s.width;
  if (size != want)
    throw fail(std::string(size < want ? "truncated shard" : "trailing bytes") + ": " + std::to_string(size) +
               " bytes, but the header's " + std::to_string(s.count) + " tokens need " + std::to_string(want));
  return s;
}

std::string ShardDataset::Shard::kind() const {
  // The format's tokenizer when the header names none: llm.c's GPT-2 (uint16) or llama-3 (uint32).
  const int32_t v = vocab > 0 ? vocab : width == 2 ? kDefaultVocabGpt2 : kDefaultVocabLlama3;
  const int32_t e = effective_eot();
  return "vocab " + std::to_string(v) + ", end-of-text " + std::to_string(e);
}

bool token_kinds_agree(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty() || a == b) return true;
  // Shard::kind()'s words for vocab 256 (--eot B < 256) or 257 (the EOT 256 past the bytes).
  auto byte_shards = [](const std::string& k) { return k.rfind("vocab 256, ", 0) == 0 || k == "vocab 257, end-of-text 256"; };
  return (a == kTextBytes && byte_shards(b)) || (b == kTextBytes && byte_shards(a));
}

int token_kind_vocab(const std::string& kind) {
  if (kind == kTextBytes) return 256;
  int v = 0;
  return std::sscanf(kind.c_str(), "vocab %d,", &v) == 1 ? v : 0;
}

int32_t ShardDataset::Shard::effective_eot() const { return vocab > 0 ? eot : width == 2 ? 50256 : 128000; }

bool ShardDataset::is_val_name(const std::string& name_as_given) {
  // Case-blind: VAL_000.bin and Validation.bin are held out too (a training run that read them
  // would be evaluated on what it trained on).
  std::string name = name_as_given;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (size_t at = name.find("val"); at != std::string::npos; at = name.find("val", at + 1))
    if (at == 0 || !std::isalnum(static_cast<unsigned char>(name[at - 1]))) return true;
  return false;
}

ShardDataset::ShardDataset(const std::string& pattern, Split split, uint64_t seed, int model_vocab)
    : glob_(pattern), split_(split), seed_(seed) {
  glob_t g{};
  int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> train_files, val_files;
  if (rc == 0)
    for (size_t k = 0; k < g.gl_pathc; k++) {
      std::string p = g.gl_pathv[k];
      (is_val_name(basename_of(p)) ? val_files : train_files).push_back(p);
    }
  globfree(&g);
  if (train_files.empty() && val_files.empty()) throw std::runtime_error("shards:" + pattern + ": no file matches");
  for (const auto* list : {&train_files, &val_files})
    for (const std::string& p : *list) {
      const std::string marker = (std::filesystem::path(p).parent_path() / kPrepareIncomplete).string();
      if (std::filesystem::exists(marker))
        throw std::runtime_error("shards:" + pattern + ": " + marker + " is there: the `train prepare` that wrote " + p +
                                 " stopped while renaming its shards into place, so the set is partial; run the "
                                 "prepare again (it clears them)");
    }
  holdout_ = val_files.empty();
  const auto& files = (split == Split::val && !holdout_) ? val_files : train_files;
  if (files.empty())
    throw std::runtime_error("shards:" + pattern + ": no train file (every match is a val file: a word of its name starts "
                             "with \"val\"); to evaluate them, give the glob as --val-data");

  // Every file the glob matches, val and train, is read by one tokenizer: its headers must agree on
  // the vocabulary and end-of-text id (named, or the format's). A mix (GPT-2 and llama-3 shards,
  // byte shards beside BPE ones, val files of another tokenizer) once trained at the largest vocab.
  std::vector<std::string> everything = train_files;
  everything.insert(everything.end(), val_files.begin(), val_files.end());
  auto said = [](const Shard& s) { return s.kind() + (s.vocab > 0 ? "" : " (its format's: the header names none)"); };
  std::map<std::string, Shard> headers;  // each file read once
  for (const std::string& path : everything) {
    const Shard& s = headers.emplace(path, read_header(path)).first->second;
    const Shard& first = headers.at(everything.front());
    if (s.kind() != first.kind())
      throw std::runtime_error("shards:" + pattern + ": the files were written by different tokenizers (" + first.path +
                               ": " + said(first) + "; " + path + ": " + said(s) + "); give one tokenizer's files");
  }
  for (const std::string& path : files) shards_.push_back(headers.at(path));
  const int default_vocab = shards_.front().width == 2 ? kDefaultVocabGpt2 : kDefaultVocabLlama3;
  // The headers' vocab when every file names one (the largest, if they differ).
  int named = 0;
  for (const Shard& s : shards_) named = (s.vocab > 0 && named >= 0) ? std::max(named, s.vocab) : -1;
  // A model smaller than the vocabulary the files were written with is refused now, not at the
  // first token past it (which a large dataset might reach only hours into the run).
  if (model_vocab > 0 && named > model_vocab)
    throw std::runtime_error("shards:" + glob_ + ": the files' headers name a vocabulary of " + std::to_string(named) +
                             " tokens, larger than the model's " + std::to_string(model_vocab) +
                             " (token ids up to " + std::to_string(named - 1) + " may occur): a model of vocab " +
                             std::to_string(named) + " or more reads them (--vocab " + std::to_string(named) +
                             " on a fresh model; a --checkpoint's model keeps its own)" +
                             (named == 257 ? " (train prepare's byte shards: bytes and the end-of-text id 256)" : ""));
  vocab_ = model_vocab > 0 ? model_vocab : named > 0 ? named : default_vocab;
  spans_ = compute_spans();
}

ShardDataset::~ShardDataset() = default;

void ShardDataset::read_tokens(const Shard& s, int64_t off, int n, uint8_t* out) {
  const size_t want = size_t(n) * size_t(s.width);
  const int64_t bytes = 1024 + s.count * s.width;  // what the file held when the run opened it
  const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw shard_error(s.path, std::string("cannot open it again while the run reads it: ") + std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_size != bytes || uint64_t(st.st_dev) != s.dev || uint64_t(st.st_ino) != s.ino ||
      int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec != s.mtime_ns) {
    ::close(fd);
    // (another file renamed over it, even of the same size: rsync, a shard written again; one
    // written in place at its size is told by its mtime alone, which a coarse kernel clock may
    // leave as it was within a tick of the open, and a tool may set back)
    throw shard_error(s.path, (st.st_size != bytes ? "now " + std::to_string(int64_t(st.st_size)) + " bytes, not the " +
                                                         std::to_string(bytes) + " its header counted when the run opened it"
                                                   : std::string("another file than the one the run opened, or "
                                                                 "written again since")) +
                                  ": the file was cut or rewritten while the run read it (restore it, or write new "
                                  "shards to another directory)");
  }
  size_t got = 0;
  int err = 0;
  while (got < want) {
    const ssize_t r = ::pread(fd, out + got, want - got, off_t(1024 + off * s.width) + off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r < 0 ? errno : 0;
      break;
    }
    got += size_t(r);
  }
  ::close(fd);
  if (got < want)
    throw shard_error(s.path, err ? std::string("read error: ") + std::strerror(err)
                                  : "ends before its header's count (cut while the run read it)");
}

std::vector<std::pair<int64_t, int64_t>> ShardDataset::compute_spans() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t total = 0;
  for (const Shard& s : shards_) total += s.count;
  const int64_t cut = holdout_ ? holdout_start(total) : total;  // a global token index
  int64_t g0 = 0;  // where this shard starts in the stream
  for (const Shard& s : shards_) {
    int64_t lo = 0, hi = s.count;
    if (holdout_ && split_ == Split::train) hi = std::clamp<int64_t>(cut + 1 - g0, 0, s.count);  // tokens [0, cut]
    if (holdout_ && split_ == Split::val) lo = std::clamp<int64_t>(cut - g0, 0, s.count);        // tokens [cut, end)
    out.emplace_back(lo, hi);
    g0 += s.count;
  }
  return out;
}

int64_t ShardDataset::count_sequences(int T) const {
  if (T < 1) throw std::runtime_error("shards:" + glob_ + ": sequence length must be >= 1");
  int64_t n = 0;
  for (auto [lo, hi] : spans_) n += sequences_in(lo, hi, T);
  if (n < 1) {
    // A sequence is T + 1 tokens (inputs and shifted targets) inside one shard.
    int64_t tokens = 0, largest = 0;
    for (auto [lo, hi] : spans_) tokens += hi - lo, largest = std::max(largest, hi - lo);
    throw std::runtime_error(
        "shards:" + glob_ + ": the " + split_name(split_) + " split has no sequence of length " + std::to_string(T) +
        " (its " + (holdout_ ? std::string(split_ == Split::val ? "last 10% of the" : "first 90% of the") + " " : "") +
        std::to_string(shards_.size()) + " file(s) hold" + (holdout_ ? "s " : " ") + std::to_string(tokens) +
        " tokens, the largest piece " + std::to_string(largest) + ", and a sequence needs T + 1 = " +
        std::to_string(int64_t(T) + 1) + " in one file): use a smaller --seq" +
        (split_ == Split::val ? (holdout_ ? ", give --val-data, or write *val* files (train prepare --val-frac)"
                                          : ", or a larger --val-frac in train prepare")
                              : ""));
  }
  return n;
}

int32_t ShardDataset::eot() const { return shards_.front().effective_eot(); }  // every file's (the constructor)

int64_t ShardDataset::num_sequences(int T) const { return count_sequences(T); }

bool ShardDataset::continues(int64_t i, int T) const {
  if (split_ == Split::train || i + 1 >= count_sequences(T)) return false;
  int64_t g = i;
  for (auto [lo, hi] : spans_) {
    const int64_t ns = sequences_in(lo, hi, T);
    if (g < ns) return g + 1 < ns;
    g -= ns;
  }
  return false;
}

int64_t ShardDataset::permute(int64_t j, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  // Feistel network on 2h bits (2^2h >= n, < 4n); cycle walking maps it onto [0, n).
  int bits = 0;
  while ((int64_t(1) << bits) < n) bits++;
  const int h = (bits + 1) / 2;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  uint64_t x = uint64_t(j);
  do {
    uint64_t l = x >> h, r = x & mask;
    for (int round = 0; round < 4; round++) {
      uint64_t f = mix64(r ^ mix64(key + uint64_t(round))) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << h) | r;
  } while (x >= uint64_t(n));
  return int64_t(x);
}

void ShardDataset::sequence(int64_t i, int T, int32_t* inputs, int32_t* targets) const {
  const int64_t n = count_sequences(T);
  int64_t j = i % n;
  if (split_ == Split::train) j = permute(j, n, mix64(seed_) ^ mix64(uint64_t(i / n) + 0x5eed));
  int64_t g = j;
  const std::vector<std::pair<int64_t, int64_t>>& span = spans_;
  for (size_t k = 0; k < shards_.size(); k++) {
    const Shard& s = shards_[k];
    const auto [lo, hi] = span[k];
    const int64_t ns = sequences_in(lo, hi, T);
    if (g >= ns) {
      g -= ns;
      continue;
    }
    const int64_t off = lo + g * T;
    // Read, not mapped: a file cut while a run maps it kills the run with SIGBUS at the next
    // read, and every mapping counts against vm.max_map_count (65530: 70,000 shards failed).
    std::vector<uint8_t> bytes(size_t(T + 1) * size_t(s.width));
    read_tokens(s, off, T + 1, bytes.data());
    // An id past the vocabulary the file's header names is as damaged as one past the model's.
    const uint32_t limit = uint32_t(s.vocab > 0 ? std::min(s.vocab, vocab_) : vocab_);
    for (int t = 0; t <= T; t++) {
      uint32_t id;
      if (s.width == 2) {
        uint16_t v;
        std::memcpy(&v, bytes.data() + size_t(t) * 2, 2);
        id = v;
      } else {
        std::memcpy(&id, bytes.data() + size_t(t) * 4, 4);
      }
      if (id >= limit)
        throw BadTokenError(s.path + ": token id " + std::to_string(id) + " at token offset " + std::to_string(off + t) + " is >= " +
                                      (limit == uint32_t(vocab_) ? "the model vocab " : "the vocab its header names, ") +
                                      std::to_string(limit));
      if (t < T) inputs[t] = int32_t(id);
      if (t > 0) targets[t - 1] = int32_t(id);
    }
    return;
  }
}

std::vector<Dataset::FileSpan> ShardDataset::file_spans() const {
  std::vector<FileSpan> out;
  for (size_t k = 0; k < shards_.size(); k++)
    if (spans_[k].second > spans_[k].first) out.push_back({shards_[k].path, spans_[k].first, spans_[k].second});
  return out;
}

int64_t ShardDataset::held_out_tokens() const {
  if (!holdout_) return 0;
  int64_t total = 0;
  for (const Shard& s : shards_) total += s.count;
  return total - holdout_start(total);
}

std::string ShardDataset::identity() const {
  uint64_t h = mix64(holdout_ ? 1 : 2);
  int64_t tokens = 0;
  auto add = [&h](uint64_t x) { h = mix64(h ^ mix64(x)); };
  for (const Shard& s : shards_) {
    for (unsigned char c : basename_of(s.path)) add(c);
    add(uint64_t(s.count)), add(uint64_t(s.width)), add(uint64_t(uint32_t(s.vocab))), add(uint64_t(uint32_t(s.eot)));
    tokens += s.count;
  }
  char digest[24];
  std::snprintf(digest, sizeof digest, "%016llx", (unsigned long long)h);
  return std::to_string(shards_.size()) + " file(s), " + std::to_string(tokens) + " tokens" +
         (holdout_ ? " (the last 10% held out)" : "") + ", digest " + digest;
}

std::string ShardDataset::describe() const {
  int64_t tokens = 0;
  for (const Shard& s : shards_) tokens += s.count;
  return "shards:" + glob_ + " (" + split_name(split_) + (holdout_ ? ", last 10% of train held out" : "") + "): " +
         std::to_string(shards_.size()) + " file(s), " + std::to_string(tokens) + " tokens, vocab " +
         std::to_string(vocab_);
}

}  // namespace ul
