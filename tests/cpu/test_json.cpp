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
