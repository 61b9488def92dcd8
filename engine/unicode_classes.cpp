#include "engine/unicode_classes.h"

#include <algorithm>
#include <cstddef>
#include <iterator>

namespace ul {

namespace {

struct Range {
  uint32_t first, last;
};

#include "engine/unicode_tables.inc"  // kLetters, kNumbers, kSpaces

template <size_t N>
bool in(const Range (&table)[N], uint32_t cp) {
  // The first range whose last code point is >= cp: cp is in the class when that range starts at
  // or before it.
  const Range* r = std::lower_bound(std::begin(table), std::end(table), cp,
                                    [](const Range& x, uint32_t c) { return x.last < c; });
  return r != std::end(table) && r->first <= cp;
}

}  // namespace

bool is_unicode_letter(uint32_t cp) { return in(kLetters, cp); }
bool is_unicode_number(uint32_t cp) { return in(kNumbers, cp); }
bool is_unicode_space(uint32_t cp) { return in(kSpaces, cp); }

}  // namespace ul
