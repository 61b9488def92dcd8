// `train prepare` on a .json array of objects (data/json_documents.h): each element is one
// document, its --json-key field. Checked as JSON Lines are: the shards are byte for byte those of
// the same documents given as files of their own (bytes and BPE, the encoder's batches ending
// inside the array), and a broken array is refused naming the file, the element and its line, with
// nothing written.
#include <catch2/catch.hpp>

#include <filesystem>
#include <utility>

#include "prepare_files.h"
#include "run_cmd.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using ul_test::run_cmd;
using ul_test::shards_in;
using ul_test::TempDir;
using ul_test::train_cmd;
using ul_test::write_file;

TEST_CASE("prepare: a .json array is one document an element, the same shards as those documents in files",
          "[prepare]") {
  TempDir d;
  // Strings holding the characters the element scanner counts ({ } [ ] " \), other fields that
  // nest both ways, an empty document; a byte-order mark, pretty-printed and minified forms.
  // (a brace right after an escaped quote: a scanner that took the quote as the string's end
  // would count it)
  const std::vector<std::string> texts = {"an open { brace, a \"quote}]\" and a back\\slash\\",
                                          "", "caf\xc3\xa9 \xf0\x9f\x98\x80 hello world hello world", "last"};
  const std::string pretty =
      "\xef\xbb\xbf  [\n"
      "  {\"id\": 1, \"text\": \"an open { brace, a \\\"quote}]\\\" and a back\\\\slash\\\\\"},\n"
      "  {\n    \"meta\": {\"tags\": [\"a\", {\"b\": []}]},\n    \"text\": \"\"\n  }\r\n"
      "  ,{\"text\": \"caf\\u00e9 \\ud83d\\ude00 hello world hello world\", \"score\": NaN}\n"
      "]\n";
  write_file(d / "pretty.json", pretty);
  write_file(d / "MINI.JSON", "[{\"text\":\"last\"}]");
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); i++) {
    files.push_back(d / ("doc" + std::to_string(i) + ".txt"));
    write_file(files.back(), texts[i]);
  }
  const std::string gpt2 = " --tokenizer " + ul_test::source_path("tests/data/bpe_tiny_gpt2.json");
  for (const std::string& tok : {std::string(), gpt2})
    for (const char* batch : {"", "30"}) {  // 30 bytes: the encoder's batches end inside the array
      if (tok.empty() && *batch) continue;  // byte tokens have no batches
      INFO("tokenizer '" << tok << "', batch '" << batch << "'");
      const std::string tag = std::string(tok.empty() ? "bytes" : "bpe") + batch;
      const std::string env = *batch ? std::string("ULYSSES_TEST_PREPARE_BATCH_BYTES=") + batch + " " : "";
      const std::string a = d / ("array_" + tag), b = d / ("files_" + tag);
      auto r = run_cmd(env + train_cmd("prepare --val-frac 0.3 --shard-tokens 20 --out " + a + tok + " " +
                                       (d / "pretty.json") + " " + (d / "MINI.JSON")));
      INFO(r.out);
      REQUIRE(r.code == 0);
      CHECK(r.out.find("prepare | 2 file(s), 4 document(s) -> ") != std::string::npos);
      CHECK(r.out.find("pretty.json: empty documents: 1 of 3") != std::string::npos);
      r = run_cmd(train_cmd("prepare --val-frac 0.3 --shard-tokens 20 --out " + b + tok + " " + files[0] + " " +
                            files[1] + " " + files[2] + " " + files[3]));
      INFO(r.out);
      REQUIRE(r.code == 0);
      const auto want = shards_in(b);
      CHECK(want.size() >= 3);
      CHECK(shards_in(a) == want);
    }
  // --json-key reads another field of each element; --raw takes the array whole, as text.
  write_file(d / "alpaca.json", "[{\"instruction\": \"say hi\", \"output\": \"hi\"},\n {\"instruction\": \"x\", \"output\": \"y\"}]");
  auto r = run_cmd(train_cmd("prepare --val-frac 0 --out " + (d / "key") + " --json-key output " + (d / "alpaca.json")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("prepare | 1 file(s), 2 document(s) -> 5 train + 0 val tokens") != std::string::npos);
  r = run_cmd(train_cmd("prepare --val-frac 0 --out " + (d / "raw") + " --raw " + (d / "alpaca.json")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("prepare | 1 file(s), 1 document(s) -> 82 train + 0 val tokens") != std::string::npos);
  // An array of anything but objects, or an empty one, is a .json file as any other: one document.
  write_file(d / "numbers.json", "[1, 2, 3]");
  write_file(d / "empty.json", "[ ]");
  r = run_cmd(train_cmd("prepare --val-frac 0 --out " + (d / "other") + " " + (d / "numbers.json") + " " +
                        (d / "empty.json")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("prepare | 2 file(s), 2 document(s) -> 14 train + 0 val tokens") != std::string::npos);
}

TEST_CASE("prepare refuses a broken .json array, naming the file, the element and its line, writing nothing",
          "[prepare]") {
  TempDir d;
  write_file(d / "ok.txt", "some text for a shard, long enough for both splits");
  struct Case {
    std::string name, content, message;
  };
  const Case cases[] = {
      {"comma.json", "[{\"text\": \"a\"},\n{\"text\": \"b\"},\n]", "comma.json line 3: a ',' after element 2 and then the array's end"},
      {"nocomma.json", "[{\"text\": \"a\"}\n {\"text\": \"b\"}]", "nocomma.json line 2: after element 1 comes '{' where a ','"},
      {"cut.json", "[{\"text\": \"a\"},\n{\"text\": \"b", "cut.json element 2 (line 2): the file ends inside it"},
      {"open.json", "[{\"text\": \"a\"},\n{\"text\": \"b\"}\n", "open.json: ends after element 2 without the array's closing ']'"},
      {"string.json", "[{\"text\": \"a\"},\n\n \"b\"]", "string.json element 2 (line 3): not a JSON object"},
      {"key.json", "[{\"text\": \"a\"}, {\"body\": \"b\"}]",
       "key.json element 2 (line 1): no \"text\" field (it has \"body\"); --json-key names the field that holds the "
       "text (--raw reads a .json file whole, as text)"},
      {"number.json", "[{\"text\": 7}]", "number.json element 1 (line 1): its \"text\" field is not a string"},
      {"after.json", "[{\"text\": \"a\"}] x", "after.json line 1: more after the array's closing ']'"},
      {"syntax.json", "[\n{\"text\": \"a\",}]", "syntax.json element 1 (line 2): invalid JSON on line 2: expected a string key"},
      // The line of a fault inside an element that spans lines, not a byte of the element.
      {"pretty.json", "[\n {\"text\": \"a\"},\n {\n  \"text\": \"b\",\n  \"meta\": {\"z\": 3,}\n }\n]",
       "pretty.json element 2 (line 3): invalid JSON on line 5: expected a string key"},
      {"comma_end.json", "[{\"text\": \"a\"},\n\n", "comma_end.json: ends after element 1 and a ',' without the array's closing ']'"},
      {"nul.json", std::string("[{\"text\": \"a\"}\0,{\"text\": \"b\"}]", 30),
       "nul.json line 1: after element 1 comes byte 0x00 where a ',' or the closing ']' should"},
      // A quote not escaped: the scan stops at the line break the string cannot hold, not at the file's end.
      {"quote.json", "[{\"text\": \"a\"},\n {\"text\": \"say \"hi now\"},\n {\"text\": \"c\"}\n]",
       "quote.json element 2 (line 2): a raw control byte 0x0a inside a string, on line 2"},
      {"two.json", "[{\"text\": \"a\"}]\n[{\"text\": \"b\"}]",
       "two.json line 2: more after the array's closing ']' (arrays one after another are not one JSON document"},
      {"newline.json", "[{\"text\": \"one line\"}, {\"text\": \"two\\nlines\"}]",
       "newline.json element 2 (line 1) (its text): byte 10 at offset 3 is the end-of-text id"},
  };
  const std::string out = d / "out";
  // --json-key is checked after each input is found to be a file: a pipe named .json is refused
  // (not opened, which would wait for a writer), a missing one named.
  fs::create_directory(d / "dir.json");
  for (const auto& [input, message] : {std::pair<std::string, std::string>{"missing.json", "missing.json: cannot open input file"},
                                       {"dir.json", "dir.json: a directory; to prepare the files under it: find "}}) {
    auto r = run_cmd(train_cmd("prepare --out " + out + " --json-key output " + (d / input)));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(message) != std::string::npos);
  }
  REQUIRE(run_cmd("mkfifo " + (d / "fifo.json")).code == 0);
  auto fifo = run_cmd("timeout 60 " + train_cmd("prepare --out " + out + " --json-key output " + (d / "fifo.json")));
  CHECK(fifo.code == 1);
  CHECK(fifo.out.find("fifo.json: not a regular file (a pipe)") != std::string::npos);
  for (const Case& c : cases) {
    write_file(d / c.name, c.content);
    const std::string eot = c.name == "newline.json" ? " --eot 10" : "";
    auto r = run_cmd(train_cmd("prepare --out " + out + eot + " " + (d / "ok.txt") + " " + (d / c.name)));
    INFO(c.name << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(c.message) != std::string::npos);
    CHECK((!fs::exists(out) || fs::is_empty(out)));
  }
}
