// `train prepare`: text files -> llm.c token shards (magic 20240520, version 1, uint16 tokens; magic
// 20240801, version 7, uint32 tokens for a vocabulary above 65536), so a corpus of plain files
// trains through shards:GLOB with the shuffle, the val split and --doc-mask.
//
// Each file is one document, or, for JSON Lines (.jsonl) and a .json array of objects
// (data/json_documents.h), each record's --json-key field; each document is written as the end-of-text id (EOT) then its tokens: llm.c's
// layout, where <|endoftext|> opens every document (data/packing.h). The tokens are
//  - by default the file's bytes (0..255), with EOT = 256: vocab 257. An EOT outside the byte range
//    is the clean choice: any file (binary, any encoding, NUL bytes included) is taken as is and
//    the EOT can never be confused with text; the price is one embedding row. Compressed data,
//    archives and tables are refused unless --raw (data/input_check.h): such bytes are seldom
//    meant. `--eot B` with
//    B < 256 is allowed (e.g. to match text:FILE runs with `--eot 0`), and then a file containing
//    byte B is refused, naming the file and offset;
//  - with --tokenizer FILE (an llm.c tokenizer such as gpt2_tokenizer.bin, or a Hugging Face
//    tokenizer.json of GPT-2's or Llama 3's layout), the byte-level BPE of the file's UTF-8 text
//    (engine/tokenizer.h), with that file's vocabulary and EOT (Llama 3: <|begin_of_text|>): the
//    shards llm.c's data scripts write, to fine-tune a GPT-2 or Llama 3 checkpoint on. A file that
//    is not valid UTF-8 is refused naming the byte offset. The encoding runs on all cores (a large file
//    is cut at word boundaries, which changes no token), a batch at a time, and the tokens wait in
//    a temporary file in DIR until the split is known (data/token_spill.h): memory is a batch's.
//
// The stream of all files, in the order given, is cut once: the last --val-frac of its tokens go
// to DIR/text_val_NNNNNN.bin, the rest to DIR/text_train_NNNNNN.bin, each split in shards of at
// most --shard-tokens tokens. Every shard is written atomically (NAME.tmp, fsync, rename), and
// nothing is written before every input has been checked. A DIR that already holds text_*.bin
// shards is refused (before any encoding), so that stale shards of an earlier run can never mix
// into the glob; a failed run leaves DIR as it was (one it created is removed again).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ul {

struct PrepareOptions {
  std::string out;
  double val_frac = 0.1;
  int64_t shard_tokens = 100000000;  // llm.c's shard size
  int eot = 256;
  std::string tokenizer;  // empty: byte tokens
  std::string json_key = "text";  // the field of each JSON record that holds the document
  std::vector<std::string> files;
  // --files-from LIST (repeatable): more inputs, one path a line, after those on the command line;
  // read by prepare_shards, not the parser: a corpus of more files than a command line holds.
  std::vector<std::string> files_from;
  bool raw = false;  // --raw: no refusal of compressed, archived or tabular inputs (data/input_check.h)
};

// Parses `prepare [flags] FILES...` (argv[0] is "prepare"); throws naming the flag.
PrepareOptions parse_prepare_options(int argc, char** argv);
const char* prepare_usage();

struct PrepareResult {
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> shards;  // the files written, train then val
  int vocab = 257;                  // max(256, eot + 1), or the tokenizer's
  int eot = 256;
  std::string encoding = "bytes";   // or "GPT-2 BPE of FILE" / "Llama 3 BPE of FILE"
  size_t inputs = 0;  // files read (those --files-from listed too)
  std::vector<std::pair<std::string, int>> repeated;  // inputs given more than once, and how often
  int64_t documents = 0;
  int cleared = 0;                  // shards of an interrupted run (kPrepareIncomplete) removed from --out
  std::vector<std::string> empty;   // inputs with no text: each only adds a document's EOT (a .jsonl: nothing)
  // .jsonl inputs with some empty documents: (file, empty, of how many)
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> empty_docs;
};
// Throws std::runtime_error naming the file and the problem; on error no shard has been written.
// `progress`: a line every few seconds while a tokenizer encodes.
PrepareResult prepare_shards(const PrepareOptions& o, bool progress = false);

// The `train prepare` subcommand: prints what it wrote and how to train on it. Returns the exit code.
int prepare_main(int argc, char** argv);

}  // namespace ul
