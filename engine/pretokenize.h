// GPT-2's pre-tokenization: before any BPE merge, the text is cut into pieces by the regex
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// (first alternative that matches wins), and merges never cross a piece boundary. So a word keeps
// its leading space (" world"), runs of letters, of digits and of other symbols are separate pieces,
// and a run of white space leaves its last character to the word after it ("  x" -> " ", " x").
// Written out here as a scanner over UTF-8 (no regex engine): gpt2_piece_end(text, i) is where the
// piece starting at byte i ends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ul {

// The code point at text[i] (i < text.size()) and its length in bytes. Throws std::invalid_argument
// naming byte offset i when the bytes there are not valid UTF-8 (a stray continuation byte, a
// truncated sequence, an overlong form, a surrogate, or a value above U+10FFFF).
uint32_t decode_utf8(std::string_view text, size_t i, size_t& len);

// Whether text's last character is a letter (\p{L}, any script); false for an empty text or one
// that does not end in a whole, valid UTF-8 character. Where a letter is followed by a space every
// pre-tokenizer here ends a piece: data/tokenize_files.cpp cuts large texts there.
bool ends_with_letter(std::string_view text);

// The end (exclusive byte offset) of the piece that starts at byte i < text.size().
size_t gpt2_piece_end(std::string_view text, size_t i);

// GPT-2's pattern with every number (\p{N}) a piece of its own, the pattern applied to the
// stretches between them (a Digits pre-tokenizer with individual_digits before GPT-2's ByteLevel,
// as StarCoder 2's and SmolLM's tokenizer.json have it): "x  12" -> "x", "  ", "1", "2".
size_t gpt2_digits_piece_end(std::string_view text, size_t i);

// Llama 3's pre-tokenization (its tokenizer.json Split regex), the same way:
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// Unlike GPT-2's: contractions in any case (U+017F, long s, is an s then), a word takes any one
// non-letter, non-digit character before it ("(word", "\tword") but no newline, digits go in runs
// of at most three, symbols keep the newlines after them, and white space up to its last newline
// is one piece.
size_t llama3_piece_end(std::string_view text, size_t i);

// Qwen 2's (and Qwen 2.5's) Split regex: Llama 3's with every number (\p{N}) a piece of its own,
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// so "12345" is five pieces. (Its tokenizer.json runs an NFC normalizer first: engine/nfc.h.)
size_t qwen2_piece_end(std::string_view text, size_t i);

}  // namespace ul
