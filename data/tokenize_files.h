// `train prepare --tokenizer`: the BPE encoding of whole text files, on all cores.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer.h"

namespace ul {

// Each file's tokens (without any EOT). Files are read in batches of about 256 MiB of text, and a
// file above 1 MiB is cut into pieces at word boundaries when the tokenizer allows it
// (Tokenizer::cuts_at_words: a letter followed by a space, where every byte-level pattern ends a
// piece and NFC changes nothing, so the cut changes no token); the pieces of a batch are encoded
// in parallel. Prints progress every few seconds when `progress` is set. Throws
// std::runtime_error naming the file (and the byte offset) of the first problem in file order.
std::vector<std::vector<int32_t>> tokenize_files(const Tokenizer& tok, const std::vector<std::string>& files,
                                                 bool progress);

}  // namespace ul
