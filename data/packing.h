// Packing with document masking: a training window cut from a token stream usually holds the end
// of one document and the starts of others. With --doc-mask, the end-of-text token (EOT) splits the
// window into documents: attention stays inside each document and positions restart at 0 at each
// document start, so a packed window trains exactly like its documents run one by one.
//
// The EOT belongs to the document it OPENS: llm.c's shard writers put <|endoftext|> at the start of
// every document, so a document is "EOT, its tokens". The EOT gets position 0 and the next
// document's id; the last token of a document still predicts the EOT that follows it (its target
// is not masked), which is how the model learns where documents end.
// A window that starts inside a document treats that tail as document 0 with positions from 0.
#pragma once
#include <cstdint>

namespace ul {

// tokens (T) -> doc (T): 0 for the window's first document, +1 at every EOT after position 0;
// pos (T): the position within its document. eot < 0: one document, pos = t (no masking).
void document_layout(const int32_t* tokens, int T, int32_t eot, int32_t* doc, int32_t* pos);

}  // namespace ul
