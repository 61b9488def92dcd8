// `train prepare` on JSON Lines (data/json_documents.h): each line of a .jsonl input is one document, its
// --json-key field (decoded JSON: escapes, \u with surrogate pairs). Checked by equivalence: the
// shards are byte for byte those of the same documents given as files of their own, for byte tokens
// and for BPE, also when the documents span several of the encoder's batches; and bad lines,
// compressed inputs and a --json-key nothing reads are refused, naming the file and line, with
// nothing written.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/json_documents.h"
#include "prepare_files.h"
#include "run_cmd.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using ul_test::run_cmd;
using ul_test::shards_in;
using ul_test::TempDir;
using ul_test::train_cmd;
using ul_test::write_file;

TEST_CASE("prepare: a .jsonl input is one document a line, the same shards as those documents in files", "[prepare]") {
  TempDir d;
  // The documents, as the JSON lines will decode them: escapes, a non-ASCII letter and an emoji
  // (\u00e9, a surrogate pair), an empty one, words for the BPE to merge; the file starts with a
  // UTF-8 byte-order mark, and a field the documents do not read holds Python's NaN.
  const std::vector<std::string> texts = {
      "Hello\nworld \"quoted\" back\\slash \xc3\xa9\xf0\x9f\x98\x80 tab\there",
      "",
      "the second document, with the same words: hello world hello world",
      "third"};
  write_file(d.file("docs.jsonl"),
        "\xef\xbb\xbf{\"id\": 1, \"score\": NaN, \"text\": \"Hello\\nworld \\\"quoted\\\" back\\\\slash \\u00e9\\ud83d\\ude00 tab\\there\"}\n"
        "\n"                                                          // blank: skipped
        "{\"meta\": {\"n\": [1, 2]}, \"text\": \"\"}\r\n"             // CRLF, a nested field, no text
        "{\"text\": \"the second document, with the same words: hello world hello world\"}\n"
        "  {\"text\":\"third\"}");                                    // no newline at the end
  write_file(d.file("content.jsonl"), "{\"content\": \"the second document, with the same words: hello world hello world\"}\n");
  write_file(d.file("plain.txt"), "a plain file between them: one document");
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); i++) {
    files.push_back(d.file("doc" + std::to_string(i) + ".txt"));
    write_file(files.back(), texts[i]);
  }
  const std::string gpt2 = " --tokenizer " + ul_test::source_path("tests/data/bpe_tiny_gpt2.json");
  for (const std::string& tok : {std::string(), gpt2}) {
    for (const char* batch : {"", "40"}) {  // 40 bytes: the encoder's batches end inside the .jsonl
      if (tok.empty() && *batch) continue;  // byte tokens have no batches
      INFO("tokenizer '" << tok << "', batch '" << batch << "'");
      const std::string tag = std::string(tok.empty() ? "bytes" : "bpe") + batch;
      const std::string env = *batch ? std::string("ULYSSES_TEST_PREPARE_BATCH_BYTES=") + batch + " " : "";
      const std::string a = d.file("jsonl_" + tag), b = d.file("files_" + tag);
      auto r = run_cmd(env + train_cmd("prepare --val-frac 0.3 --shard-tokens 40 --out " + a + tok + " " +
                                       d.file("docs.jsonl") + " " + d.file("plain.txt") + " " + d.file("content.jsonl") +
                                       " --json-key text"));
      INFO(r.out);
      // --json-key applies to every .jsonl: content.jsonl has no "text" field.
      CHECK(r.code == 1);
      CHECK(r.out.find("content.jsonl line 1: no \"text\" field (it has \"content\"); --json-key names the field") !=
            std::string::npos);
      CHECK(!fs::exists(a));
      r = run_cmd(env + train_cmd("prepare --val-frac 0.3 --shard-tokens 40 --out " + a + tok + " " +
                                  d.file("docs.jsonl") + " " + d.file("plain.txt")));
      INFO(r.out);
      REQUIRE(r.code == 0);
      CHECK(r.out.find("prepare | 2 file(s), 5 document(s) -> ") != std::string::npos);
      CHECK(r.out.find("docs.jsonl: empty documents: 1 of 4 (each adds nothing but a document boundary)") !=
            std::string::npos);
      r = run_cmd(train_cmd("prepare --val-frac 0.3 --shard-tokens 40 --out " + b + tok + " " + files[0] + " " +
                            files[1] + " " + files[2] + " " + files[3] + " " + d.file("plain.txt")));
      INFO(r.out);
      REQUIRE(r.code == 0);
      const auto want = shards_in(b);
      CHECK(want.size() >= 3);  // a few train shards and a val one: the cut falls inside the documents
      CHECK(shards_in(a) == want);

      // Another field name, read by --json-key: document 3 alone, as its own file gives it.
      const std::string c = d.file("content_" + tag), e = d.file("file3_" + tag);
      REQUIRE(run_cmd(train_cmd("prepare --val-frac 0 --out " + c + tok + " --json-key content " +
                                d.file("content.jsonl"))).code == 0);
      REQUIRE(run_cmd(train_cmd("prepare --val-frac 0 --out " + e + tok + " " + files[2])).code == 0);
      CHECK(shards_in(c) == shards_in(e));
    }
  }
}

TEST_CASE("prepare refuses a bad .jsonl line (naming the file and line) and a compressed input, writing nothing",
          "[prepare]") {
  TempDir d;
  write_file(d.file("ok.jsonl"), "{\"text\": \"some text for a shard, long enough for both splits\"}\n");
  write_file(d.file("ok.txt"), "some text for a shard, long enough for both splits\n");
  write_file(d.file("syntax.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"cut off\n");
  write_file(d.file("array.jsonl"), "{\"text\": \"fine\"}\n\n[\"text\", \"x\"]\n");
  write_file(d.file("number.jsonl"), "{\"text\": 12}\n");
  {  // a text field of 70,000 numbers: refused at the bound on what a record keeps, not parsed whole
    std::string big = "{\"text\": [0";
    for (int k = 1; k < 70000; k++) big += ",0";
    write_file(d.file("big_array.jsonl"), big + "]}\n");
  }
  write_file(d.file("newline.jsonl"), "{\"text\": \"one line\"}\n{\"text\": \"two\\nlines\"}\n");
  write_file(d.file("dup.jsonl"), "{\"text\": \"a\", \"text\": \"b\"}\n");
  write_file(d.file("corpus.jsonl.gz"), std::string("\x1f\x8b\x08\x00", 4));
  write_file(d.file("gzip.jsonl"), std::string("\x1f\x8b\x08\x00", 4));  // by content, whatever the name
  write_file(d.file("c4.json.gz"), std::string("\x1f\x8b\x08\x00", 4));
  write_file(d.file("notes.TXT.GZ"), "plain text, but named as compressed");
  write_file(d.file("zstd.txt"), std::string("\x28\xb5\x2f\xfd\x00", 5));
  write_file(d.file("bzip2.txt"), "BZh91AY&SY and then the compressed blocks");
  write_file(d.file("bzip2_1.txt"), "BZh11AY&SY blocks of 100k (bzip2 -1)");
  // JSON Lines named .json led by a byte-order mark, or a first line longer than the look ahead
  write_file(d.file("bom.json"), "\xef\xbb\xbf{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
  write_file(d.file("long.json"), "{\"text\": \"" + std::string(size_t(3) << 20, 'a') + "\"}\n{\"text\": \"two\"}\n");
  std::string tar(600, '\0');
  tar.replace(0, 8, "docs.txt");
  tar.replace(257, 5, "ustar");
  write_file(d.file("docs.tar.txt"), tar);
  write_file(d.file("c4.json"), "{\"text\": \"JSON Lines in a file named .json\"}\n{\"text\": \"line two\"}\n");
  // JSON Lines by shape, whether or not the strict parser takes its lines (an unpaired surrogate).
  write_file(d.file("surrogate.json"), "{\"text\": \"a\\ud800\"}\n\n{\"text\": \"b\"}");
  write_file(d.file("bare.jsonl"), "{\"text\": hello}\n");
  write_file(d.file("latin1.jsonl"), "{\"text\": \"caf\xe9\"}\n");  // not UTF-8: bytes as they are, refused by BPE
  write_file(d.file("corpus.parquet"), "PAR1");
  const std::string out = d.file("out");
  struct Case {
    std::string args, message;
    bool bpe_only = false;
  };
  const Case cases[] = {
      {d.file("ok.jsonl") + " " + d.file("syntax.jsonl"), "syntax.jsonl line 2: invalid JSON at byte"},
      {d.file("bare.jsonl"), "bare.jsonl line 1: invalid JSON at byte 9: unexpected character 'h'"},
      {d.file("latin1.jsonl"), "latin1.jsonl line 1 (its text): ", true},
      {d.file("gzip.jsonl"), "gzip.jsonl: gzip-compressed (prepare reads plain text and JSON Lines): unpack it first"},
      // The command that unpacks it, into the name that reads it as it should: C4's .json.gz -> .jsonl.
      {d.file("c4.json.gz"), "unpack it first: gzip -dc '" + d.file("c4.json.gz") + "' > '" + d.file("c4.jsonl") + "'"},
      {d.file("gzip.jsonl"), "gzip -dc '" + d.file("gzip.jsonl") + "' > '" + d.file("unpacked_gzip.jsonl") + "' (--raw"},
      {d.file("notes.TXT.GZ"), "notes.TXT.GZ: named as a compressed file or an archive"},
      {d.file("zstd.txt"), "zstd.txt: zstd-compressed"},
      {d.file("bzip2.txt"), "bzip2.txt: bzip2-compressed"},
      {d.file("bzip2_1.txt"), "bzip2_1.txt: bzip2-compressed"},
      {d.file("bom.json"), "bom.json: a .json file of one JSON object a line"},
      {d.file("long.json"), "long.json: a .json file of one JSON object a line"},
      {d.file("docs.tar.txt"), "docs.tar.txt: a tar archive"},
      {d.file("c4.json"), "c4.json: a .json file of one JSON object a line: JSON Lines, as C4 and Dolma name it"},
      {d.file("surrogate.json"), "surrogate.json: a .json file of one JSON object a line"},
      {"--out --raw " + d.file("ok.txt"), "--out: missing value (the next argument, --raw, is a flag; a value spelled like a flag goes as --out=--raw)"},
      // numbers as train's flags read them: decimal, as written (strtod took hex and leading blanks)
      {"--val-frac 0x1p-3 " + d.file("ok.txt"), "prepare: --val-frac: expected a number, got '0x1p-3'"},
      {"--shard-tokens ' 50000' " + d.file("ok.txt"), "prepare: --shard-tokens: expected an integer, got ' 50000'"},
      {"--eot 99999999999999999999 " + d.file("ok.txt"), "prepare: --eot: 99999999999999999999 is out of range"},
      {d.file("array.jsonl"), "array.jsonl line 3: not a JSON object"},
      {d.file("number.jsonl"), "number.jsonl line 1: its \"text\" field is not a string"},
      {d.file("big_array.jsonl"), "big_array.jsonl line 1: more than 65536 values in its \"text\" field and the other "
                                  "fields' names: not a document (its \"text\" must be a string)"},
      {d.file("dup.jsonl"), "dup.jsonl line 1: "},
      {"--eot 10 " + d.file("newline.jsonl"), "newline.jsonl line 2 (its text): byte 10 at offset 3 is the end-of-text id"},
      {"--json-key body " + d.file("ok.jsonl"), "ok.jsonl line 1: no \"body\" field (it has \"text\")"},
      {"--json-key body " + d.file("ok.txt"), "--json-key body: no input is read as JSON documents"},
      {"--json-key '' " + d.file("ok.jsonl"), "--json-key: empty field name"},
      {d.file("ok.txt") + " " + d.file("corpus.jsonl.gz"), "corpus.jsonl.gz: gzip-compressed"},
      {d.file("corpus.parquet"), "corpus.parquet: a Parquet table"},
  };
  for (const std::string& tok : {std::string(), " --tokenizer " + ul_test::source_path("tests/data/bpe_tiny_gpt2.json")})
    for (const Case& c : cases) {
      if (!tok.empty() && c.args.rfind("--eot", 0) == 0) continue;  // a tokenizer names its own EOT
      if (tok.empty() && c.bpe_only) continue;
      auto r = run_cmd(train_cmd("prepare --out " + out + tok + " " + c.args));
      INFO(c.args << tok << "\n" << r.out);
      CHECK(r.code == 1);
      CHECK(r.out.find(c.message) != std::string::npos);
      CHECK((!fs::exists(out) || fs::is_empty(out)));
    }
  // A pretty-printed .json (a code corpus' package.json) and a minified one-line one are text, one
  // document each; --raw takes a compressed file as its bytes, and a JSON Lines .json as one
  // document of JSON.
  write_file(d.file("package.json"), "{\n  \"name\": \"x\",\n  \"version\": \"1.0.0\"\n}\n");
  write_file(d.file("tsconfig.json"), "{\"compilerOptions\": {\"strict\": true}}\n");
  for (const std::string& args : {d.file("package.json") + " " + d.file("tsconfig.json"),
                                  "--raw " + d.file("corpus.jsonl.gz") + " " + d.file("c4.json")}) {
    const std::string o = d.file("raw" + std::to_string(args.size()));
    auto ok = run_cmd(train_cmd("prepare --val-frac 0 --out " + o + " " + d.file("ok.txt") + " " + args));
    INFO(args << "\n" << ok.out);
    CHECK(ok.code == 0);
    CHECK(ok.out.find("prepare | 3 file(s), 3 document(s) -> ") != std::string::npos);
  }
  // The unpack command takes a name that starts with '-' as a file, not an option.
  write_file(d.file("-x.txt.gz"), std::string("\x1f\x8b\x08\x00", 4));
  auto dash = run_cmd("cd " + d.path.string() + " && " + train_cmd("prepare --out o -x.txt.gz"));
  CHECK(dash.code == 1);
  CHECK(dash.out.find("gzip -dc './-x.txt.gz' > './-x.txt'") != std::string::npos);
  // Latin-1 inside a JSON string is taken as the bytes it is without a tokenizer (as a file's would be).
  REQUIRE(run_cmd(train_cmd("prepare --val-frac 0 --out " + d.file("latin1") + " " + d.file("ok.txt") + " " +
                            d.file("latin1.jsonl"))).code == 0);
  // JSON Lines by name in any case, or .ndjson.
  write_file(d.file("UPPER.JSONL"), "{\"text\": \"one\"}\n{\"text\": \"two\"}\n");
  write_file(d.file("lines.ndjson"), "{\"text\": \"three\"}\n");
  auto r = run_cmd(train_cmd("prepare --val-frac 0 --out " + d.file("named") + " " + d.file("UPPER.JSONL") + " " +
                             d.file("lines.ndjson")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("prepare | 2 file(s), 3 document(s) -> 14 train + 0 val tokens") != std::string::npos);
  // A .jsonl without a line of text adds nothing, and says so.
  write_file(d.file("blank.jsonl"), "\n  \n");
  r = run_cmd(train_cmd("prepare --val-frac 0 --out " + out + " " + d.file("ok.txt") + " " + d.file("blank.jsonl")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("blank.jsonl holds no document (no line that is not blank): it adds nothing") != std::string::npos);
  CHECK(r.out.find("prepare | 2 file(s), 1 document(s) -> ") != std::string::npos);
}

TEST_CASE("prepare --files-from: the inputs a list names, after those given, as if named in order", "[prepare]") {
  TempDir d;
  write_file(d.file("a.txt"), "the first document, named on the command line");
  write_file(d.file("b.txt"), "the second, listed");
  write_file(d.file("c.jsonl"), "{\"text\": \"a third\"}\n{\"text\": \"and a fourth, also listed\"}\n");
  write_file(d.file("list"), d.file("b.txt") + "\r\n\n  \n" + d.file("c.jsonl") + "\n");  // CRLF, blank lines
  write_file(d.file("list_b"), d.file("b.txt") + "\n");
  write_file(d.file("list_c"), "\xef\xbb\xbf" + d.file("c.jsonl"));                      // a BOM, no newline
  write_file(d.file("list0"), d.file("b.txt") + std::string(1, '\0') + d.file("c.jsonl") + std::string(1, '\0'));
  const std::string named = d.file("named"), listed = d.file("listed"), piped = d.file("piped");
  auto r = run_cmd(train_cmd("prepare --val-frac 0.2 --out " + named + " " + d.file("a.txt") + " " + d.file("b.txt") + " " +
                             d.file("c.jsonl")));
  REQUIRE(r.code == 0);
  r = run_cmd(train_cmd("prepare --val-frac 0.2 --out " + listed + " " + d.file("a.txt") + " --files-from " + d.file("list")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("prepare | 3 file(s), 4 document(s) -> ") != std::string::npos);
  CHECK(shards_in(listed) == shards_in(named));
  r = run_cmd("printf '%s\\n' " + d.file("a.txt") + " " + d.file("b.txt") + " " + d.file("c.jsonl") + " | " +
              train_cmd("prepare --val-frac 0.2 --out " + piped + " --files-from -"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(shards_in(piped) == shards_in(named));
  // Two lists, one after the other; a NUL-separated one (find -print0).
  const std::string two = d.file("two"), nul = d.file("nul");
  REQUIRE(run_cmd(train_cmd("prepare --val-frac 0.2 --out " + two + " " + d.file("a.txt") + " --files-from " +
                            d.file("list_b") + " --files-from " + d.file("list_c"))).code == 0);
  CHECK(shards_in(two) == shards_in(named));
  REQUIRE(run_cmd(train_cmd("prepare --val-frac 0.2 --out " + nul + " " + d.file("a.txt") + " --files-from " +
                            d.file("list0"))).code == 0);
  CHECK(shards_in(nul) == shards_in(named));
  // A file given twice (overlapping lists, or another path to it) is taken twice, and said.
  r = run_cmd(train_cmd("prepare --val-frac 0 --out " + d.file("twice") + " " + d.file("a.txt") + " " + d.file("b.txt") +
                        " --files-from " + d.file("list_b")));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("note    | " + d.file("b.txt") + " is given 2 times") != std::string::npos);
  CHECK(r.out.find(d.file("a.txt") + " is given") == std::string::npos);

  // Refused, with nothing written: a list that is not there, one that lists nothing, a listed file
  // that is not there, and --json-key with no .jsonl among the inputs.
  write_file(d.file("empty"), "\n\n");
  write_file(d.file("missing"), d.file("nowhere.txt") + "\n");
  write_file(d.file("texts"), d.file("a.txt") + "\n");
  write_file(d.file("cr0"), d.file("b.txt") + "\r" + std::string(1, '\0'));  // NUL-separated: the \r is the name's
  write_file(d.file("utf16"), "\xff\xfe" "a");
  const std::string out = d.file("out");
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--files-from " + d.file("no_list"), "prepare: --files-from: " + d.file("no_list") + ": cannot open"},
      {"--files-from " + d.file("empty"), "--files-from " + d.file("empty") + " lists no file (and no input is named"},
      {"--files-from - < /dev/null", "--files-from - (standard input) lists no file"},
      {"--files-from " + d.file("missing"), "--files-from " + d.file("missing") + " line 1: '" + d.file("nowhere.txt") +
                                                "' does not exist (a listed path is relative to the working directory)"},
      {"--json-key body --files-from " + d.file("texts"), "--json-key body: no input is read as JSON documents"},
      {"--files-from ''", "--files-from: empty path"},
      {"--files-from " + d.file("cr0"), "entry 1: '" + d.file("b.txt") + "\\r' does not exist"},
      {"--files-from " + d.file("utf16"), "UTF-16 text (as PowerShell's > writes): write the list as UTF-8"},
  };
  for (const Case& c : cases) {
    r = run_cmd(train_cmd("prepare --out " + out + " " + c.args));
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK(r.out.find(c.message) != std::string::npos);
    CHECK(!fs::exists(out));
  }
}

TEST_CASE("a .jsonl line is read whole at any length around the reader's 64 KiB chunks, the last without its newline",
          "[prepare]") {
  // Lines are read a chunk at a time (so a file of one huge line is refused at 1 GiB, not read
  // whole first): each line, whatever its length against the chunk, is one document, exactly.
  TempDir d;
  const std::string path = d.file("docs.jsonl");
  const std::string head = R"({"text": ")", tail = R"("})";
  std::vector<std::string> texts;
  {
    std::ofstream f(path, std::ios::binary);
    const size_t lines[] = {65534, 65535, 65536, 65537, 131071, 131072, 131073, 12, 200000};
    for (size_t k = 0; k < std::size(lines); k++) {
      const size_t n = lines[k] - head.size() - tail.size();  // the line's bytes, without its '\n'
      texts.push_back(std::string(n, char('a' + k)));
      f << head << texts.back() << tail << (k + 1 < std::size(lines) ? "\n" : "");
      if (k == 2) f << "\n";  // a blank line between: skipped
    }
  }
  ul::JsonDocReader r(path, "text", ul::JsonForm::lines);
  std::string text;
  for (const std::string& want : texts) {
    REQUIRE(r.next(text));
    CHECK(text.size() == want.size());
    CHECK(text == want);
  }
  CHECK_FALSE(r.next(text));
}
