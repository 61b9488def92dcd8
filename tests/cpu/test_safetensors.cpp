// The safetensors file format (reader, writer, and every refusal of a corrupt file) and the bf16
// rounding that it and llm.c's version 5 checkpoints share.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/llmc_format.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "temp_dir.h"

using namespace ul;
namespace fs = std::filesystem;

namespace {

using ul_test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A raw safetensors file from a header text and a data section.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; k++) s[size_t(k)] = char((uint64_t(header.size()) >> (8 * k)) & 0xFF);
  return s + header + data;
}

void check_refused(const std::string& path, const std::string& bytes, const std::string& words) {
  write_bytes(path, bytes);
  CAPTURE(words);
  REQUIRE_THROWS_WITH(SafetensorsFile(path), Catch::Contains(path) && Catch::Contains(words));
}

}  // namespace

TEST_CASE("safetensors round-trips F32 exactly and BF16 with round-to-nearest-even", "[interop]") {
  TempDir d;
  const float tie_down = 1.0f + 0x1.0p-8f, tie_up = 1.0f + 3 * 0x1.0p-8f;  // exactly halfway: ties go to even
  std::vector<SafeTensorOut> ts = {{"a", {2, 3}, {1, -2, 3.5f, tie_down, tie_up, 1e-20f}}, {"s", {}, {7}}, {"e", {0}, {}}};
  write_safetensors(d / "f.safetensors", ts, {{"format", "pt"}, {"k\"ey", "v\\al\n"}}, "F32");
  SafetensorsFile f(d / "f.safetensors");
  CHECK(f.metadata().at("k\"ey") == "v\\al\n");
  REQUIRE(f.find("a"));
  CHECK(f.find("a")->shape == std::vector<int64_t>{2, 3});
  CHECK(f.to_f32(*f.find("a")) == ts[0].data);
  CHECK(f.to_f32(*f.find("s")) == std::vector<float>{7});
  CHECK(f.find("e")->numel() == 0);
  write_safetensors(d / "b.safetensors", ts, {}, "BF16");
  SafetensorsFile b(d / "b.safetensors");
  CHECK(b.find("a")->dtype == "BF16");
  const std::vector<float> r = b.to_f32(*b.find("a"));
  CHECK(r[0] == 1.0f);
  CHECK(r[3] == 1.0f);                    // 1 + 2^-8 -> 1 (even)
  CHECK(r[4] == 1.0f + 0x1.0p-6f);        // 1 + 3 * 2^-8 -> 1 + 2^-6 (even)
  CHECK(bf16_from_f32(-0.0f) == 0x8000);
  CHECK(std::isnan(f32_from_bf16(bf16_from_f32(NAN))));
  // The data starts 8-byte aligned (8-byte length + the header padded with spaces), as the format
  // asks and readers that map the file rely on, in both files.
  for (const char* name : {"f.safetensors", "b.safetensors"}) {
    std::ifstream in(d / name, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    CAPTURE(name, header);
    CHECK((8 + header) % 8 == 0);
    std::string text(size_t(header), '\0');
    in.read(&text[0], std::streamsize(header));
    CHECK(text.find_last_not_of(' ') == text.rfind('}'));  // padded with spaces after the JSON
  }
  // Header only: the same metadata and tensors without the data, which it refuses to convert.
  SafetensorsFile h(d / "f.safetensors", true);
  CHECK(h.metadata() == f.metadata());
  REQUIRE(h.tensors().size() == f.tensors().size());
  CHECK(h.find("a")->shape == f.find("a")->shape);
  CHECK_THROWS_WITH(h.to_f32(*h.find("a")), Catch::Contains("header only"));
}

TEST_CASE("safetensors refuses corrupt files naming the file and the problem", "[interop]") {
  TempDir d;
  const std::string p = d / "bad.safetensors", z8(8, '\0');
  auto one = [](const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offs) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" + offs + "]}";
  };
  const std::string ok = "{" + one("t", "F32", "2", "0,8") + "}";
  write_bytes(p, raw_file(ok, z8));
  CHECK_NOTHROW(SafetensorsFile(p));
  write_bytes(p, raw_file("{\"__metadata__\":null," + ok.substr(1), z8));  // the reference's "none"
  CHECK(SafetensorsFile(p).metadata().empty());
  // The limit is the reference's 100,000,000 bytes (not 100 MiB): a header just past it is refused
  // before anything is read (the file need not even hold it).
  std::string past = raw_file(ok, z8);
  const uint64_t n = 100000001;
  for (int i = 0; i < 8; i++) past[size_t(i)] = char((n >> (8 * i)) & 0xff);
  write_bytes(p, past);
  CHECK_THROWS_WITH(SafetensorsFile(p), Catch::Contains("100 MB"));
  std::string huge = raw_file(ok, z8);
  huge[6] = 1;  // a header length of 2^48 bytes
  const std::pair<std::string, std::string> bad[] = {
      {"abc", "truncated"},
      {raw_file(ok, "").substr(0, 20), "truncated"},
      {huge, "100 MB"},
      {raw_file(ok, std::string(4, '\0')), "larger than the file's 4 data bytes"},
      {raw_file(ok, std::string(12, '\0')), "trailing"},
      {raw_file("{" + one("t", "F32", "2", "0,8") + ",}", z8), "invalid JSON"},
      {raw_file(ok + " x", z8), "invalid JSON"},
      {raw_file("[1]", ""), "not a JSON object"},
      {raw_file("{" + one("t", "Q7", "2", "0,8") + "}", z8), "unknown dtype"},
      {raw_file("{" + one("t", "F32", "1", "0,8") + "}", z8), "span"},
      {raw_file("{" + one("t", "F32", "3", "0,8") + "}", z8), "larger than the file"},
      {raw_file("{" + one("t", "F32", "-2", "0,8") + "}", z8), "negative"},
      // 2^62 floats would be 2^64 bytes, wrapping to 0 (and a tied llama's lm_head read before its shape)
      {raw_file("{" + one("t", "F32", "4611686018427387904", "0,0") + "}", ""), "larger than the file"},
      {raw_file("{" + one("t", "F64", "2305843009213693952,2", "0,0") + "}", ""), "larger than the file"},
      {raw_file("{" + one("t", "F32", "2.5", "0,8") + "}", z8), "expected an integer"},
      {raw_file("{" + one("t", "F32", "2", "8,0") + "}", z8), "outside"},
      {raw_file(R"({"t":{"dtype":"F32","shape":[2]}})", z8), "data_offsets"},
      {raw_file("{" + one("t", "F32", "2", "0,8") + "," + one("u", "F32", "1", "4,8") + "}", z8), "overlaps"},
      {raw_file("{" + one("t", "F32", "1", "4,8") + "}", z8), "unused bytes"},
      {raw_file("{" + one("t", "F32", "2", "0,8") + "," + one("t", "F32", "2", "0,8") + "}", z8), "duplicate key"},
      {raw_file(R"({"__metadata__":{"a":1}})", ""), "not a string"},
      // "0,0,0,...": 2 bytes a value in the file, about 112 in memory: refused by the count, not
      // parsed into 56 times the header's size (a 100 MB header reached gigabytes).
      {raw_file("{\"a\":[0" + [] { std::string s; for (int i = 0; i < 200000; i++) s += ",0"; return s; }() + "]}", ""),
       "more values than a file of its kind holds"},
  };
  // An empty tensor holds no bytes, whatever its other dimensions.
  write_bytes(p, raw_file("{" + one("t", "F32", "1000,0", "0,0") + "}", ""));
  CHECK_NOTHROW(SafetensorsFile(p));
  for (const auto& [bytes, words] : bad) {
    check_refused(p, bytes, words);
    // Reading only the header finds the same problems: the offsets are checked against the file's size.
    CAPTURE(words);
    CHECK_THROWS_WITH(SafetensorsFile(p, true), Catch::Contains(p) && Catch::Contains(words));
  }
}

TEST_CASE("llm.c checkpoints export as version 5 (bf16, nearest even) and read back", "[interop]") {
  const LlmcConfig lc{16, 50, 64, 2, 4, 32};
  std::vector<float> p(llmc_gpt2_num_params(lc));
  Rng rng(5);
  for (float& v : p) v = float(rng.normal());
  TempDir d;
  write_llmc_checkpoint(d / "m5.bin", lc, p.data(), 5);
  CHECK(fs::file_size(d / "m5.bin") == 1024 + 2 * p.size());
  std::vector<float> back;
  read_llmc_checkpoint(d / "m5.bin", back);
  bool all_rounded = back.size() == p.size();
  for (size_t i = 0; all_rounded && i < p.size(); i++) all_rounded = back[i] == f32_from_bf16(bf16_from_f32(p[i]));
  CHECK(all_rounded);
  write_llmc_checkpoint(d / "m3.bin", lc, p.data(), 3);
  read_llmc_checkpoint(d / "m3.bin", back);
  CHECK(back == p);
  CHECK_THROWS_WITH(write_llmc_checkpoint(d / "m4.bin", lc, p.data(), 4), Catch::Contains("version 4"));
}

