// llm.c token shards (data/shards.h): uint16 (magic 20240520) and uint32 (magic 20240801), opened
// and then read the way the trainer reads them: sequence counts and a few sequences.
#include "data/shards.h"
#include "fuzz_util.h"

#include <stdexcept>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "shard.bin");
  for (int vocab : {0, 300}) {  // the format's own vocab, and a small model's (ids past it throw)
    try {
      ul::ShardDataset ds(path, ul::Split::train, 1, vocab);
      for (int T : {1, 3, 64}) {
        const int64_t n = ds.num_sequences(T);
        FUZZ_CHECK(n >= 1);
        std::vector<int32_t> in(T), tg(T);
        for (int64_t i : {int64_t(0), n - 1, n, 3 * n + 1}) {
          ds.sequence(i, T, in.data(), tg.data());
          for (int t = 0; t < T; t++) FUZZ_CHECK(in[t] >= 0 && in[t] < ds.vocab() && tg[t] >= 0 && tg[t] < ds.vocab());
        }
      }
    } catch (const std::exception&) {
    }
  }
  return 0;
}
