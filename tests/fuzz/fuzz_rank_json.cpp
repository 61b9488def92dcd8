// rank_R.json of our checkpoints: parse_flat_json (engine/file_io.h), which check_rank_file runs
// on the file's text. It takes the text in memory, so no scratch file is needed.
#include "engine/file_io.h"
#include "fuzz_util.h"

#include <map>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> fields;
  try {
    fields = ul::parse_flat_json(text, "rank_0.json");
  } catch (const std::exception&) {
    return 0;  // refused: what a damaged file must get
  }
  // Whatever was read survives a write and a second read unchanged: every value re-quoted as a
  // JSON string (JsonLine escapes it), parsed again, gives back the same text. Outside the try: a
  // writer whose text does not parse back throws, and that is a finding, not a refusal.
  ul::JsonLine line;
  for (const auto& kv : fields) line.add(kv.first, kv.second);
  FUZZ_CHECK(ul::parse_flat_json(line.str(), "round trip") == fields);
  return 0;
}
