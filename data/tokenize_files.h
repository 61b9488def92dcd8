// `train prepare --tokenizer`: the BPE encoding of whole text files, on all cores.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/json_documents.h"
#include "engine/tokenizer.h"

namespace ul {

// Each document's tokens (without any EOT), in input order, handed to sink(f, tokens, first, last)
// a piece at a time as a batch is done (so the corpus is never held whole, nor a document twice:
// the sink may take the vector; first: the piece opens its document, last: it ends it; an empty
// document is one empty piece, both): a file is one
// document, or with forms[f] lines or array its JSON documents (their `json_key` field,
// data/json_documents.h); docs_per_file gets each input's count; text_bytes (the documents'
// bytes, for the progress line) is what the caller counted reading them first. Documents are read
// in batches of about 256 MiB of text (at most 65536 documents), and one above 1 MiB is cut into
// pieces at word boundaries when the tokenizer allows it (Tokenizer::cuts_at_words: a letter
// followed by a space, where every byte-level pattern ends a piece and NFC changes nothing, so the
// cut changes no token); the pieces of a batch are encoded in parallel. Prints progress every few
// seconds when `progress` is set. Throws std::runtime_error naming the file (the document's line,
// for JSON, and the byte offset in the text) of the first problem in input order, after the
// documents before its batch went to the sink (JSON inputs must be sound: the caller reads them
// through first).
using DocumentSink = std::function<void(size_t file, std::vector<int32_t>& tokens, bool first, bool last)>;
void tokenize_files(const Tokenizer& tok, const std::vector<std::string>& files, const std::vector<JsonForm>& forms,
                    const std::string& json_key, size_t text_bytes, bool progress, std::vector<int64_t>& docs_per_file,
                    const DocumentSink& sink);

}  // namespace ul
