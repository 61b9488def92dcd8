#include "data/dataset.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

#include "data/shards.h"
#include "data/synthetic.h"
#include "data/text.h"

namespace ul {

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

int64_t sequence_at_length(const Dataset& d, int64_t next, int T_from, int T_to) {
  const int64_t n_from = d.num_sequences(T_from), n_to = d.num_sequences(T_to);
  if (n_from < 0 || next < 0) return next;  // synthetic
  const int64_t epoch = next / n_from, done = next % n_from;  // sequences of T_from read in the epoch
  // (128-bit: a trillion-token epoch of short sequences has ~2^40 of them, squared past 64 bits)
  const int64_t at = d.shuffled() ? int64_t((__int128(done) * n_to + n_from - 1) / n_from)  // its share
                                  : (done * T_from + T_to - 1) / T_to;  // its tokens, in sequences of T_to
  return at < n_to ? epoch * n_to + at : (epoch + 1) * n_to;
}

namespace {

// "key=value,key=value" after a task's name (e.g. "passkey:depth=0.9,digits=7") into numbers,
// refusing unknown keys and malformed values with the spec in the message. counts: the keys whose
// values count something, written as integers (1e1 and 16.0 are refused, as --seq 1e3 is).
std::map<std::string, double> task_args(const std::string& spec, const std::string& list,
                                        std::initializer_list<const char*> allowed,
                                        std::initializer_list<const char*> counts) {
  std::map<std::string, double> out;
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? list.size() : comma + 1;
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    bool known = false;
    std::string valid;
    for (const char* a : allowed) {
      known = known || key == a;
      valid += std::string(valid.empty() ? "" : ", ") + a;
    }
    if (!known) throw std::runtime_error(spec + ": unknown setting '" + key + "' (valid: " + valid + ")");
    char* end = nullptr;
    const char* v = eq == std::string::npos ? "" : item.c_str() + eq + 1;
    double x = std::strtod(v, &end);
    // decimal as written, as the flags are: strtod would also read leading blanks and hex ('0x3')
    if (!*v || std::isspace(static_cast<unsigned char>(*v)) || std::strpbrk(v, "xX") || *end) throw std::runtime_error(spec + ": '" + key + "' needs a number, got '" + v + "'");
    const std::string text = v;
    for (const char* c : counts)
      if (key == c && (text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) != std::string::npos ||
                       text == "-"))
        throw std::runtime_error(spec + ": '" + key + "' counts something: a whole number as written, got '" +
                                 text + "'");
    if (!out.emplace(key, x).second) throw std::runtime_error(spec + ": '" + key + "' is given twice");
  }
  return out;
}

void require(bool ok, const std::string& spec, const std::string& what) {
  if (!ok) throw std::runtime_error(spec + ": " + what);
}

// A setting that counts something: a whole number an int holds (checked before the cast, which
// is undefined past int's range).
int whole(const std::string& spec, const std::string& key, double v) {
  require(v == std::floor(v), spec, key + " must be an integer");
  require(v >= -2147483648.0 && v <= 2147483647.0, spec, key + " is past an int's range (2147483647)");
  return int(v);
}

RecallConfig recall_config(const std::string& spec, const std::string& list) {
  RecallConfig c;
  for (auto& [k, v] : task_args(spec, list, {"pairs", "gap", "queries", "keys", "values"},
                                {"pairs", "gap", "queries", "keys", "values"})) {
    const int n = whole(spec, k, v);
    if (k == "pairs") c.pairs = n;
    if (k == "gap") c.gap = n;
    if (k == "queries") c.queries = n;
    if (k == "keys") c.num_keys = n;
    if (k == "values") c.num_values = n;
  }
  require(c.pairs >= 1 && c.num_keys >= 1 && c.num_values >= 2, spec, "pairs, keys >= 1 and values >= 2");
  require(c.pairs <= c.num_keys, spec,
          "pairs " + std::to_string(c.pairs) + " > keys " + std::to_string(c.num_keys) + " (each pair has its own key)");
  require(c.gap >= -1 && c.queries >= -1, spec, "gap and queries are >= 0 (or -1: fill)");
  return c;
}

PasskeyConfig passkey_config(const std::string& spec, const std::string& list) {
  PasskeyConfig c;
  for (auto& [k, v] : task_args(spec, list, {"digits", "depth", "filler"}, {"digits", "filler"})) {
    if (k == "depth") c.depth = v;
    if (k == "digits") c.digits = whole(spec, k, v);
    if (k == "filler") c.filler_words = whole(spec, k, v);
  }
  require(c.digits >= 1, spec, "digits must be >= 1");
  require(c.filler_words >= 1, spec, "filler must be >= 1");
  require(c.depth == -1 || (c.depth >= 0 && c.depth <= 1), spec, "depth is a fraction in [0, 1] (or -1: random per sequence)");
  return c;
}

}  // namespace

bool synthetic_spec(const std::string& spec) {
  for (const char* task : {"passkey", "recall"})
    if (spec == task || spec.rfind(std::string(task) + ":", 0) == 0) return true;
  return false;
}

std::unique_ptr<Dataset> open_dataset(const std::string& spec, Split split, uint64_t seed, int model_vocab) {
  std::unique_ptr<Dataset> ds;
  auto arg = [&](const char* prefix) -> const char* {
    size_t n = std::char_traits<char>::length(prefix);
    return spec.compare(0, n, prefix) == 0 ? spec.c_str() + n : nullptr;
  };
  if (spec == "recall" || arg("recall:")) {
    ds = std::make_unique<RecallDataset>(split, seed, recall_config(spec, spec.size() > 7 ? spec.substr(7) : ""));
  } else if (spec == "passkey" || arg("passkey:")) {
    ds = std::make_unique<PasskeyDataset>(split, seed, passkey_config(spec, spec.size() > 8 ? spec.substr(8) : ""));
  } else if (const char* file = arg("text:"); file && *file) {
    return std::make_unique<TextDataset>(file, split, model_vocab);  // checks its bytes itself
  } else if (const char* pattern = arg("shards:"); pattern && *pattern) {
    return std::make_unique<ShardDataset>(pattern, split, seed, model_vocab);  // checks ids when read
  } else {
    throw std::runtime_error("unknown dataset \"" + spec +
                             "\": expected one of passkey[:digits=N,depth=X,filler=N], recall[:pairs=N,gap=N,queries=N,keys=N,values=N], "
                             "text:FILE, shards:GLOB");
  }
  // Synthetic tasks use their whole vocabulary, so the model must cover it.
  if (model_vocab > 0 && ds->vocab() > model_vocab)
    throw std::runtime_error(spec + ": the task's vocab " + std::to_string(ds->vocab()) +
                             " exceeds the model vocab " + std::to_string(model_vocab));
  return ds;
}

}  // namespace ul
