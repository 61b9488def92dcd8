// `train prepare`'s JSON document reader (data/json_documents.h) and its check of what an input is:
// any bytes, as a .jsonl file and as a .json one, either refuse cleanly, naming the file, or give
// documents in order (JSON Lines: from increasing lines; an array: from lines that never go back),
// their texts together no longer than the file.
#include "data/input_check.h"
#include "data/json_documents.h"
#include "fuzz_util.h"

#include <stdexcept>

namespace {

void read_all(const std::string& path, ul::JsonForm form, size_t size) {
  try {
    ul::JsonDocReader json(path, "text", form);
    std::string text;
    int64_t last = 0;
    size_t bytes = 0;
    while (json.next(text)) {
      FUZZ_CHECK(form == ul::JsonForm::lines ? json.line() > last : json.line() >= last);
      FUZZ_CHECK(json.line() >= 1);
      last = json.line();
      bytes += text.size();
      // An escape decodes to at most as many bytes as it is written with (\u0000 is 6 for 1;
      // a surrogate pair 12 for 4), so the texts never outgrow the file.
      FUZZ_CHECK(bytes <= size);
    }
  } catch (const std::exception& e) {
    FUZZ_CHECK(std::string(e.what()).compare(0, path.size(), path) == 0);  // the message names the file
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const char* name : {"docs.jsonl", "docs.json"}) {
    const std::string& path = fuzz::input_file(data, size, name);
    const std::string refused = ul::unreadable_input(path);
    FUZZ_CHECK(refused.empty() || refused.compare(0, path.size(), path) == 0);
    const bool lines = std::string(name).back() == 'l';  // by name alone
    const ul::JsonForm form = ul::json_form(path, false);
    FUZZ_CHECK(lines ? form == ul::JsonForm::lines : form != ul::JsonForm::lines);
    FUZZ_CHECK(ul::json_form(path, true) == (lines ? ul::JsonForm::lines : ul::JsonForm::none));  // --raw
    if (form != ul::JsonForm::none) read_all(path, form, size);
  }
  return 0;
}
