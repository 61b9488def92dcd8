// Unicode Normalization Form C (UAX #15) of UTF-8 text: what a tokenizer.json "NFC" normalizer (Qwen 2's)
// does to a text before it is cut into pieces. Canonical decomposition (applied recursively; Hangul
// syllables by the algorithm), canonical ordering of the combining marks by their class (stable),
// then canonical composition: a mark joins the last starter unless a mark of the same or a higher
// class, or another starter, stands between them; composition exclusions never come back.
//
// Most text is already in NFC, so the common case costs a scan: ASCII bytes pass untouched, and
// other code points are looked up once (NFC_Quick_Check and class). Only the stretches around a
// code point that may change (a quick check No or Maybe, or marks out of order) are normalized, each
// from the boundary before it (a class-0, quick-check-Yes code point, before which NFC never changes
// anything) to the next; a stretch that comes out the same leaves the text as it is.
//
// This is NFC as Hugging Face's tokenizers computes it, which is Unicode 9.0's: a code point encoded
// since is an ordinary starter to it (the 98 combining marks added after 9.0 have class 0, and the
// one later canonical decomposition, U+11938, neither decomposes nor composes). The tables
// (engine/nfc_tables.inc) are Python's unicodedata (14.0 with Python 3.11) with those code points
// left out, by tools/gen_nfc_tables.py; the tests hold the result to tokenizers' own.
#pragma once
#include <string>
#include <string_view>

namespace ul {

// The NFC form of text[from, size): a view of text itself when that is already in NFC, else of
// `scratch`, which then holds it. Throws std::invalid_argument naming the byte offset (in text) of
// invalid UTF-8, as decode_utf8 (engine/pretokenize.h) does.
std::string_view to_nfc(std::string_view text, std::string& scratch, size_t from = 0);

// The NFC form of text, as a string.
std::string nfc(std::string_view text);

}  // namespace ul
