#include "data/tokenize_files.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

#include "engine/file_io.h"
#include "engine/pretokenize.h"
#include "parallel/hosts.h"

namespace ul {

namespace {

constexpr size_t kPieceBytes = size_t(1) << 20;

// The text read and encoded at a time: 256 MiB (test hook: ULYSSES_TEST_PREPARE_BATCH_BYTES, so
// that a few small documents span several batches, a .jsonl file's lines among them).
size_t batch_bytes() {
  const char* v = std::getenv("ULYSSES_TEST_PREPARE_BATCH_BYTES");
  return v && *v ? size_t(std::strtoull(v, nullptr, 10)) : size_t(256) << 20;
}
// And at most this many documents: a batch of short .jsonl lines costs far more than its text in
// strings and work items (about 7x at 30 bytes a document).
constexpr size_t kBatchDocs = size_t(1) << 16;

struct Unit {
  size_t doc, begin, end;  // the text's bytes [begin, end)
  std::vector<int> ids;
  std::string error;
};

}  // namespace

void tokenize_files(const Tokenizer& tok, const std::vector<std::string>& files, const std::vector<JsonForm>& forms,
                    const std::string& json_key, size_t text_bytes, bool progress, std::vector<int64_t>& docs_per_file,
                    const DocumentSink& sink) {
  using clock = std::chrono::steady_clock;
  docs_per_file.assign(files.size(), 0);
  const size_t total = text_bytes;
  std::atomic<size_t> done{0};
  // The cores this process may run on (taskset, a cpuset, srun --cpus-per-task) and a cgroup's CPU
  // quota allows (docker --cpus), as train's threads.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  unsigned threads = sched_getaffinity(0, sizeof allowed, &allowed) == 0
                         ? std::max(1u, unsigned(CPU_COUNT(&allowed)))
                         : std::max(1u, std::thread::hardware_concurrency());
  if (const int quota = cpu_quota_here(); quota > 0) threads = std::min(threads, unsigned(quota));
  const auto start = clock::now();
  auto last = start;
  const size_t batch = batch_bytes();
  std::unique_ptr<JsonDocReader> json;  // the JSON input being read (it may span batches)
  for (size_t f = 0; f < files.size();) {
    std::vector<std::string> texts;
    std::vector<std::string> where;  // each text's file (and JSON line and element), for messages
    std::vector<size_t> doc_file;    // each text's input
    for (size_t bytes = 0; f < files.size() && (texts.empty() || (bytes < batch && texts.size() < kBatchDocs));) {
      if (forms[f] != JsonForm::none) {
        if (!json) json = std::make_unique<JsonDocReader>(files[f], json_key, forms[f]);
        std::string t;
        if (!json->next(t)) {
          json.reset();
          f++;
          continue;
        }
        texts.push_back(std::move(t));
        where.push_back(json->where() + " (its text)");
      } else {
        texts.push_back(read_whole_file(files[f]));
        where.push_back(files[f]);
      }
      docs_per_file[f]++;
      doc_file.push_back(f);
      bytes += texts.back().size();
      if (!json) f++;
    }
    std::vector<Unit> units;
    for (size_t d = 0; d < texts.size(); d++) {
      const std::string& t = texts[d];
      size_t begin = 0;
      do {
        size_t end = tok.cuts_at_words() ? std::min(t.size(), begin + kPieceBytes) : t.size();
        // The cut goes before a space after a letter, of any script (after ASCII ones only, a
        // Russian or Chinese text was one piece, on one thread, at 24-48 bytes a byte). That also
        // holds with an NFC normalizer (Qwen 2's): a space has class 0, has no decomposition and is
        // part of no composition, so NFC changes nothing across it and the normalized halves join
        // into the normalized whole; the letter before it stays a letter, so the pieces end there still.
        while (end < t.size() && !(t[end] == ' ' && ends_with_letter(std::string_view(t).substr(0, end)))) end++;
        units.push_back({d, begin, end, {}, {}});
        begin = end;
      } while (begin < t.size());
    }
    std::atomic<size_t> next{0};
    auto work = [&](bool reports) {
      for (size_t u; (u = next++) < units.size();) {
        Unit& x = units[u];
        try {
          // The view ends at the cut: the pieces before it are those of the whole text.
          tok.encode_into(std::string_view(texts[x.doc]).substr(0, x.end), x.ids, x.begin);
        } catch (const std::exception& e) {
          x.error = e.what();
        }
        done += x.end - x.begin;
        const auto now = clock::now();
        if (reports && progress && now - last > std::chrono::seconds(5)) {
          const double s = std::chrono::duration<double>(now - start).count();
          std::printf("prepare | encoded %.0f of %.0f MB (%.1f MB/s)\n", done / 1e6, total / 1e6, done / 1e6 / s);
          std::fflush(stdout);
          last = now;
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < std::min<size_t>(threads, units.size()); k++) pool.emplace_back(work, false);
    work(true);  // this thread also reports progress
    for (auto& t : pool) t.join();
    std::vector<std::string>().swap(texts);  // encoded: the text goes before its tokens are joined
    for (Unit& x : units)
      if (!x.error.empty()) throw std::runtime_error(where[x.doc] + ": " + x.error);
    // The pieces handed on in order, each freed once the sink has it: at the peak a batch's tokens
    // are held once (joining a document's pieces first could hold it twice, where the pieces'
    // memory stayed in the encoding threads' malloc arenas).
    for (size_t u = 0; u < units.size(); u++) {
      const bool first = u == 0 || units[u - 1].doc != units[u].doc;
      const bool last = u + 1 == units.size() || units[u + 1].doc != units[u].doc;
      sink(doc_file[units[u].doc], units[u].ids, first, last);
      std::vector<int>().swap(units[u].ids);
    }
  }
}

}  // namespace ul
