// `train prepare --tokenizer` (data/prepare.h, data/tokenize_files.h): shards of GPT-2-style BPE
// tokens.
//   - the shards hold EOT + encode(file) per file, a large file cut for the threads encoding to the
//     same tokens as whole, the headers naming the tokenizer's vocab and EOT; they train;
//   - a vocabulary above 65536 writes uint32 shards (llm.c's llama-3 format) that read back;
//   - invalid UTF-8, a version 1 tokenizer, --eot beside --tokenizer: refused, nothing written.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/dataset.h"
#include "engine/tokenizer.h"
#include "run_cmd.h"
#include "temp_dir.h"
#include "tokenizer_file.h"

namespace fs = std::filesystem;
using ul_test::run_cmd;
using ul_test::TempDir;
using ul_test::train_cmd;

namespace {

const std::string kTok = ul_test::source_path("tests/data/bpe_tiny_tokenizer.bin");

// All tokens of the shards DIR/text_SPLIT_*.bin (width 2 or 4), checking each header.
std::vector<int32_t> split_tokens(const std::string& dir, int32_t magic, int32_t vocab, int32_t eot,
                                  const char* split, size_t* shards = nullptr) {
  std::vector<int32_t> all;
  for (int k = 0;; k++) {
    char name[32];
    std::snprintf(name, sizeof name, "/text_%s_%06d.bin", split, k);
    if (shards) *shards = size_t(k);
    std::ifstream f(dir + name, std::ios::binary);
    if (!f) break;
    const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    REQUIRE(b.size() >= 1024);
    int32_t h[6];
    std::memcpy(h, b.data(), sizeof h);
    CHECK(h[0] == magic);
    CHECK(h[4] == vocab);
    CHECK(h[5] == eot);
    const size_t width = magic == 20240520 ? 2 : 4;
    REQUIRE(b.size() == 1024 + size_t(h[2]) * width);
    for (size_t i = 0; i < size_t(h[2]); i++) {
      uint32_t t = 0;
      for (size_t j = 0; j < width; j++) t |= uint32_t(uint8_t(b[1024 + i * width + j])) << (8 * j);
      all.push_back(int32_t(t));
    }
  }
  return all;
}

std::vector<int32_t> train_tokens(const std::string& dir, int32_t magic, int32_t vocab, int32_t eot) {
  return split_tokens(dir, magic, vocab, eot, "train");
}

// Both splits' tokens, train then val: the stream prepare encoded. Checks the val split's size
// (the last round(frac x total) tokens) and that no shard holds more than per_shard tokens.
std::vector<int32_t> both_splits(const std::string& dir, int32_t magic, int32_t vocab, int32_t eot, double frac,
                                 size_t per_shard) {
  size_t n_train = 0, n_val = 0;
  std::vector<int32_t> all = split_tokens(dir, magic, vocab, eot, "train", &n_train);
  const std::vector<int32_t> val = split_tokens(dir, magic, vocab, eot, "val", &n_val);
  all.insert(all.end(), val.begin(), val.end());
  CHECK(int64_t(val.size()) == std::llround(frac * double(all.size())));
  CHECK(n_train == (all.size() - val.size() + per_shard - 1) / per_shard);
  CHECK(n_val == (val.size() + per_shard - 1) / per_shard);
  CHECK_FALSE(fs::exists(dir + "/text_tokens.bin.tmp"));
  return all;
}

}  // namespace

TEST_CASE("prepare --tokenizer: shards of EOT + BPE tokens per file, cut files encoded as whole", "[prepare]") {
  TempDir d;
  std::string a, b = "café naïve — Москва 東京 🙂\n\ndon't stop   here\t\tplease";
  // Over 2 MiB, so tokenize_files cuts it into pieces that threads encode.
  for (int i = 0; i < 170000; i++) a += "the word " + std::to_string(i % 1000) + (i % 7 ? " " : ",\n");
  REQUIRE(a.size() > (size_t(2) << 20));
  std::ofstream(d / "a.txt", std::ios::binary) << a;
  std::ofstream(d / "b.txt", std::ios::binary) << b;
  const std::string out = d / "shards";
  auto r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --val-frac 0 --out " + out + " " + (d / "a.txt") + " " +
                             (d / "b.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(GPT-2 BPE of " + kTok + ", vocab 577, EOT 576)") != std::string::npos);

  ul::Tokenizer tok(kTok);
  std::vector<int32_t> want{576};
  for (int id : tok.encode(a)) want.push_back(id);
  want.push_back(576);
  for (int id : tok.encode(b)) want.push_back(id);
  CHECK(want.size() < a.size() * 3 / 4);  // merges happened
  CHECK(train_tokens(out, 20240520, 577, 576) == want);
  // Many shards, each split's last one partial: cut from the token file's end, last shard first,
  // they still hold the stream in order.
  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --val-frac 0.3 --shard-tokens 10007 --out " + (d / "cut") +
                        " " + (d / "a.txt") + " " + (d / "b.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(both_splits(d / "cut", 20240520, 577, 576, 0.3, 10007) == want);

  r = run_cmd(train_cmd("--data 'shards:" + out + "/text_*.bin' --doc-mask --seq 32 --batch 2 --steps 2 "
                        "--eval-batches 1 --threads 1"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("vocab=577") != std::string::npos);
  CHECK(r.out.find("--doc-mask: documents start at token 576") != std::string::npos);
}

TEST_CASE("prepare --tokenizer: a vocabulary above 65536 writes uint32 shards that read back", "[prepare]") {
  TempDir d;
  // 256 bytes, 65400 unreachable 4-byte tokens, then the merge "ab" (id 65656 > 65535), then the EOT.
  std::vector<std::string> more;
  for (int k = 0; k < 65400; k++) more.push_back(std::string("\x01\x02", 2) + char(k & 255) + char(k >> 8));
  more.push_back("ab");
  more.push_back("<|eot|>");
  const std::vector<std::string> toks = ul_test::byte_tokens(more);
  std::ofstream(d / "tok.bin", std::ios::binary) << ul_test::tok_file(20240328, 2, uint32_t(toks.size()), 65657, toks);
  std::ofstream(d / "a.txt", std::ios::binary) << "ab abc cab ab";
  auto r = run_cmd(train_cmd("prepare --tokenizer " + (d / "tok.bin") + " --val-frac 0 --out " + (d / "s") + " " +
                             (d / "a.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::vector<int32_t> want{65657, 65656, ' ', 65656, 'c', ' ', 'c', 65656, ' ', 65656};
  CHECK(train_tokens(d / "s", 20240801, 65658, 65657) == want);
  r = run_cmd(train_cmd("prepare --tokenizer " + (d / "tok.bin") + " --val-frac 0.3 --shard-tokens 3 --out " +
                        (d / "cut") + " " + (d / "a.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(both_splits(d / "cut", 20240801, 65658, 65657, 0.3, 3) == want);  // 3 + 3 + 1 train, 3 val
  auto ds = ul::open_dataset("shards:" + (d / "s") + "/text_*.bin", ul::Split::train, 1, 0);
  CHECK(ds->vocab() == 65658);
  CHECK(ds->eot() == 65657);
}

TEST_CASE("prepare --tokenizer refuses invalid UTF-8, version 1 files and --eot, writing nothing", "[prepare]") {
  TempDir d;
  std::ofstream(d / "ok.txt", std::ios::binary) << "fine text";
  std::ofstream(d / "bad.txt", std::ios::binary) << "caf\xe9 latin-1";
  auto r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "s") + " " + (d / "ok.txt") + " " +
                             (d / "bad.txt")));
  CHECK(r.code != 0);
  CHECK(r.out.find((d / "bad.txt") + ": invalid UTF-8 at byte 3") != std::string::npos);
  CHECK((!fs::exists(d / "s") || fs::is_empty(d / "s")));

  const std::vector<std::string> toks = ul_test::byte_tokens();
  std::ofstream(d / "v1.bin", std::ios::binary) << ul_test::tok_file(20240328, 1, 256, 0, toks);
  r = run_cmd(train_cmd("prepare --tokenizer " + (d / "v1.bin") + " --out " + (d / "s") + " " + (d / "ok.txt")));
  CHECK(r.code != 0);
  CHECK(r.out.find((d / "v1.bin") + ": the tokenizer names no end-of-text token") != std::string::npos);

  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --eot 3 --out " + (d / "s") + " " + (d / "ok.txt")));
  CHECK(r.code != 0);
  CHECK(r.out.find("--eot with --tokenizer") != std::string::npos);
  r = run_cmd(train_cmd("prepare --tokenizer " + (d / "missing.bin") + " --out " + (d / "s") + " " + (d / "ok.txt")));
  CHECK(r.code != 0);
  CHECK(r.out.find(d / "missing.bin") != std::string::npos);
  CHECK((!fs::exists(d / "s") || fs::is_empty(d / "s")));

  // UTF-8 is checked as the inputs are read through, before any is encoded, at its byte in the
  // file: read in 1 MiB chunks, a character the chunk's end cuts is completed by the next (valid),
  // and one the file's end cuts is not; a JSON document's text is checked as it is read.
  const std::string mib(1 << 20, 'a');
  std::ofstream(d / "straddle.txt", std::ios::binary) << mib.substr(1) << "\xc3\xa9 and on";
  std::ofstream(d / "cut.txt", std::ios::binary) << mib.substr(1) << "\xc3";
  std::ofstream(d / "bad.jsonl", std::ios::binary) << "{\"text\":\"fine\"}\n{\"text\":\"ok\xff\"}\n";
  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --val-frac 0 --out " + (d / "st") + " " + (d / "straddle.txt")));
  CHECK(r.code == 0);
  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "s") + " " + (d / "cut.txt")));
  CHECK(r.code == 1);
  CHECK(r.out.find((d / "cut.txt") + ": invalid UTF-8 at byte 1048575 (the sequence is cut off by the end") !=
        std::string::npos);
  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "s") + " " + (d / "bad.jsonl")));
  CHECK(r.code == 1);
  CHECK(r.out.find((d / "bad.jsonl") + " line 2 (its text): invalid UTF-8 at byte 2") != std::string::npos);
  CHECK((!fs::exists(d / "s") || fs::is_empty(d / "s")));
}

TEST_CASE("prepare --tokenizer: the tokens wait on disk, not in memory: a failure part way leaves no directory, "
          "no temporary", "[prepare]") {
  TempDir d;
  // Batches of 8 bytes: the documents before bad.txt are encoded and written to the temporary
  // token file before bad.txt's "z" is found to have no token in this vocabulary (every byte but
  // "z": an encoding failure, which no read-through catches first).
  const std::string small = "ULYSSES_TEST_PREPARE_BATCH_BYTES=8 ";
  std::vector<std::string> no_z = ul_test::byte_tokens({"<|endoftext|>"});
  no_z.erase(no_z.begin() + 'z');
  std::ofstream(d / "no_z.bin", std::ios::binary) << ul_test::tok_file(20240328, 2, uint32_t(no_z.size()), 255, no_z);
  const std::string kTok = d / "no_z.bin";
  std::string files;
  for (int i = 0; i < 5; i++) {
    std::ofstream(d / ("ok" + std::to_string(i) + ".txt"), std::ios::binary) << "fine text number " << i;
    files += " " + (d / ("ok" + std::to_string(i) + ".txt"));
  }
  std::ofstream(d / "bad.txt", std::ios::binary) << "fizz";
  // --out's missing parents are created, and removed again.
  auto r = run_cmd(small + train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "new/deeper/s") + files + " " +
                                     (d / "bad.txt")));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find((d / "bad.txt") + ": ") != std::string::npos);
  CHECK(r.out.find("has no token in the tokenizer") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "new"));
  // A directory that was there stays, with what it held, and without the temporary.
  fs::create_directories(d / "kept");
  std::ofstream(d / "kept/notes.txt") << "mine";
  r = run_cmd(small + train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "kept") + files + " " + (d / "bad.txt")));
  CHECK(r.code == 1);
  CHECK(fs::exists(d / "kept/notes.txt"));
  CHECK_FALSE(fs::exists(d / "kept/text_tokens.bin.tmp"));
  CHECK(std::distance(fs::directory_iterator(d / "kept"), fs::directory_iterator()) == 1);
  // An --out that holds shards is refused before any encoding: before bad.txt's error is found.
  r = run_cmd(small + train_cmd("prepare --tokenizer " + kTok + " --val-frac 0 --out " + (d / "kept") + files));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_FALSE(fs::exists(d / "kept/text_tokens.bin.tmp"));
  r = run_cmd(small + train_cmd("prepare --tokenizer " + kTok + " --out " + (d / "kept") + files + " " + (d / "bad.txt")));
  CHECK(r.code == 1);
  CHECK(r.out.find("already holds shard text_train_000000.bin") != std::string::npos);
  // Batches of 8 bytes give the shards one batch of all the text gives.
  r = run_cmd(train_cmd("prepare --tokenizer " + kTok + " --val-frac 0 --out " + (d / "whole") + files));
  REQUIRE(r.code == 0);
  CHECK(train_tokens(d / "kept", 20240520, 256, 255) == train_tokens(d / "whole", 20240520, 256, 255));
}

TEST_CASE("prepare --tokenizer takes a Hugging Face tokenizer.json, Llama 3's layout opening documents with BOS",
          "[prepare]") {
  TempDir d;
  const std::string a = "Don'T stop (me) now: 12345 birds\n\n  flew\r\nby 🙂", b = "second document";
  std::ofstream(d / "a.txt", std::ios::binary) << a;
  std::ofstream(d / "b.txt", std::ios::binary) << b;
  const std::string json = ul_test::source_path("tests/data/bpe_tiny_llama3.json");
  auto r = run_cmd(train_cmd("prepare --tokenizer " + json + " --val-frac 0 --out " + (d / "s") + " " + (d / "a.txt") +
                             " " + (d / "b.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(Llama 3 BPE of " + json + ", vocab 577, EOT 576)") != std::string::npos);
  ul::Tokenizer tok(json);
  CHECK(tok.decode(576) == "<|begin_of_text|>");
  std::vector<int32_t> want{576};
  for (int id : tok.encode(a)) want.push_back(id);
  want.push_back(576);
  for (int id : tok.encode(b)) want.push_back(id);
  CHECK(train_tokens(d / "s", 20240520, 577, 576) == want);

  // SentencePiece-style (Llama 2, TinyLlama): <s> (id 1) opens each document, and a document over
  // 1 MiB is cut for the threads only where no token can join two words.
  const std::string sp = ul_test::source_path("tests/data/bpe_tiny_sp.json");
  std::string big;
  for (int i = 0; i < 140000; i++) big += "word " + std::to_string(i % 97) + (i % 9 ? " " : "\n");
  REQUIRE(big.size() > (size_t(1) << 20));
  std::ofstream(d / "big.txt", std::ios::binary) << big;
  r = run_cmd(train_cmd("prepare --tokenizer " + sp + " --val-frac 0 --out " + (d / "s2") + " " + (d / "a.txt") + " " +
                        (d / "big.txt")));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("(SentencePiece-style BPE of " + sp + ", vocab 600, EOT 1)") != std::string::npos);
  ul::Tokenizer spt(sp);
  REQUIRE(spt.cuts_at_words());
  std::vector<int32_t> want_sp{1};
  for (int id : spt.encode(a)) want_sp.push_back(id);
  want_sp.push_back(1);
  for (int id : spt.encode(big)) want_sp.push_back(id);
  CHECK(train_tokens(d / "s2", 20240520, 600, 1) == want_sp);
}
