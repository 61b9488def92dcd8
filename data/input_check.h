// What `train prepare` refuses to take as text before reading it: each would otherwise become
// tokens of its bytes (or, with a tokenizer, an invalid-UTF-8 error at some offset), a corpus
// trained on as noise without a word.
//   - compressed data and archives, by their first bytes (gzip, zstd, xz, bzip2, lz4, zip, 7-Zip,
//     tar: every signature holds bytes no text starts with) or, failing that, their name;
//   - Parquet and Arrow tables, by name;
//   - a .json file whose first two lines are each one JSON object: JSON Lines under C4's and
//     Dolma's name for it (read whole it would be one document of JSON syntax). A pretty-printed
//     .json (a package.json in a code corpus: its first line is "{") or a minified one-line one
//     is text.
// --raw skips the check: such bytes trained on on purpose.
#pragma once
#include <string>

namespace ul {

// "" when the input may be read as text, else the message, naming the file and what to do.
std::string unreadable_input(const std::string& path);

// `word` as one word for a shell, whatever it holds (spaces, quotes): single-quoted, a quote in it
// written '\''. For the commands the messages suggest.
std::string shell_quote(const std::string& word);

}  // namespace ul
