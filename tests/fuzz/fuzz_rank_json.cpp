// rank_R.json of our checkpoints: parse_flat_json (engine/file_io.h), which check_rank_file runs
// on the file's text. It takes the text in memory, so no scratch file is needed.
#include "engine/file_io.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto fields = ul::parse_flat_json(text, "rank_0.json");
    // Whatever was read survives a write and a second read unchanged: every value re-quoted as a
    // JSON string (JsonLine escapes it), parsed again, gives back the same text.
    ul::JsonLine line;
    for (const auto& kv : fields) line.add(kv.first, kv.second);
    FUZZ_CHECK(ul::parse_flat_json(line.str(), "round trip") == fields);
  } catch (const std::exception&) {
  }
  return 0;
}
