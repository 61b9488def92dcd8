// `train prepare`'s JSON Lines reader (data/jsonl.h) and its check of what an input is: any bytes
// as a .jsonl file either refuse cleanly, naming the file, or give documents from increasing line
// numbers, none more than its line holds.
#include "data/input_check.h"
#include "data/jsonl.h"
#include "fuzz_util.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::input_file(data, size, "docs.jsonl");
  const std::string refused = ul::unreadable_input(path);
  FUZZ_CHECK(refused.empty() || refused.compare(0, path.size(), path) == 0);
  try {
    ul::JsonlReader lines(path, "text");
    std::string text;
    int64_t last = 0;
    size_t bytes = 0;
    while (lines.next(text)) {
      FUZZ_CHECK(lines.line() > last);
      last = lines.line();
      bytes += text.size();
      // An escape decodes to at most as many bytes as it is written with (\u0000 is 6 for 1;
      // a surrogate pair 12 for 4), so the texts never outgrow the file.
      FUZZ_CHECK(bytes <= size);
    }
  } catch (const std::exception& e) {
    FUZZ_CHECK(std::string(e.what()).compare(0, path.size(), path) == 0);  // the message names the file
  }
  return 0;
}
