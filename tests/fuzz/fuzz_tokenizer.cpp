// llm.c tokenizer files (engine/tokenizer.h): read, then every token decoded and a text encoded.
#include "engine/tokenizer.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "tokenizer.bin");
  try {
    ul::Tokenizer tok(path);
    FUZZ_CHECK(tok.vocab() > 0 && tok.eot() < tok.vocab());
    std::string all;
    for (int id = 0; id < tok.vocab(); id++) all += tok.decode(id);
    std::vector<int> ids = tok.encode(all.substr(0, 256));
    for (int id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab());
  } catch (const std::exception&) {
  }
  return 0;
}
