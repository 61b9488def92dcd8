// engine/json.h: the strict parser every JSON reader shares (safetensors headers, config.json,
// tokenizer.json, .jsonl lines), with its one extension: Python's NaN and Infinity parse as numbers,
// which as_double and as_int refuse (so no setting can be NaN or infinite, 1e999 included).
#include <catch2/catch.hpp>

#include <string>

#include "engine/json.h"

using ul::JsonValue;
using ul::parse_json;

TEST_CASE("json: NaN and Infinity parse as numbers that no setting accepts", "[json]") {
  const JsonValue v = parse_json(R"({"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e999, "e": 2.5, "f": -7})", "t.json");
  for (const char* k : {"a", "b", "c"}) {
    INFO(k);
    REQUIRE(v.find(k));
    CHECK(v.find(k)->is(JsonValue::Kind::number));
    CHECK_THROWS_WITH(v.find(k)->as_double(std::string("t.json: ") + k),
                      Catch::Contains(std::string("t.json: ") + k + ": expected a finite number, got"));
    CHECK_THROWS_WITH(v.find(k)->as_int("x"), Catch::Contains("x: expected an integer"));
  }
  CHECK_THROWS_WITH(v.find("d")->as_double("d"), Catch::Contains("d: expected a finite number, got 1e999"));
  CHECK(v.find("e")->as_double("e") == 2.5);
  CHECK(v.find("f")->as_int("f") == -7);
}

TEST_CASE("json: still strict elsewhere, and an unexpected character is named", "[json]") {
  struct Case {
    const char *text, *message;
  };
  const Case cases[] = {
      {R"({"a": hello})", "t.json: invalid JSON at byte 6: unexpected character 'h'"},
      {"\xef\xbb\xbf{}", "t.json: invalid JSON at byte 0: unexpected byte 0xef"},
      {R"({"a": 1, "a": 2})", "duplicate key \"a\""},
      {R"({"a": 1,})", "expected a string key"},
      {R"([1, 2,])", "unexpected character ']'"},
      {R"({"a": nan})", "unexpected character 'n'"},
      {R"({"a": 01})", "byte 7: expected '}'"},
      {R"(1 2)", "unexpected text after the JSON value"},
      {R"("\ud800")", "unpaired surrogate"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    CHECK_THROWS_WITH(parse_json(c.text, "t.json"), Catch::Contains(c.message));
  }
}

TEST_CASE("json: as_bool takes true, false and null, nothing else", "[json]") {
  const JsonValue v = parse_json(R"({"t": true, "f": false, "n": null, "one": 1, "nan": NaN, "s": "true"})", "t.json");
  CHECK(v.find("t")->as_bool("t"));
  CHECK_FALSE(v.find("f")->as_bool("f"));
  CHECK_FALSE(v.find("n")->as_bool("n"));
  for (const char* k : {"one", "nan", "s"}) {
    INFO(k);
    CHECK_THROWS_WITH(v.find(k)->as_bool(std::string("t.json: ") + k),
                      Catch::Contains(std::string("t.json: ") + k + ": expected true or false"));
  }
}

TEST_CASE("json: only one field of an object kept, the others checked as strictly but not kept", "[json]") {
  // A .jsonl record's text beside a million token ids: the ids once cost ~112 bytes each (a 16 MB
  // line peaked near 1 GB); now none is kept, so max_values (which counts kept values) is not reached.
  std::string line = R"({"ids": [)";
  for (int i = 0; i < 1000000; i++) line += i ? ",0" : "0";
  line += R"(], "meta": {"a": [1, {"b": "c"}]}, "text": "hello"})";
  const std::string key = "text";
  const JsonValue v = parse_json(line, "t.jsonl", 16, &key);
  REQUIRE(v.find("text"));
  CHECK(v.find("text")->as_string("text") == "hello");
  REQUIRE(v.find("ids"));  // named (a message lists the fields), kept empty
  CHECK(v.find("ids")->is(JsonValue::Kind::array));
  CHECK(v.find("ids")->items.empty());
  CHECK(v.find("meta")->fields.empty());
  CHECK_THROWS_WITH(parse_json(line, "t.jsonl", 16), Catch::Contains("more values than a file of its kind holds"));
  // Left out, still strict: syntax and duplicate keys anywhere.
  for (const char* bad : {R"({"x": [1, 2,], "text": "t"})", R"({"x": {"a": 1, "a": 2}, "text": "t"})",
                          R"({"x": "a)" "\x01" R"(", "text": "t"})", R"({"text": "t", "text": "u"})"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_json(bad, "t.jsonl", SIZE_MAX, &key), ul::JsonSyntaxError);
  }
}
