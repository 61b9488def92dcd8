#include "engine/nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "engine/pretokenize.h"

namespace ul {

namespace {

struct NfcProps {
  uint32_t first, last;
  uint8_t ccc, qc;  // canonical combining class; NFC_Quick_Check: 0 Yes, 1 Maybe, 2 No
};
struct Decomposition {
  uint32_t cp, first, second;  // second 0: a singleton
};
struct Composition {
  uint32_t first, second, composite;
};

#include "engine/nfc_tables.inc"  // kNfcProps, kDecompositions, kCompositions

// Hangul syllables: S = SBase + (L * VCount + V) * TCount + T, from the jamo L = LBase + l, V = VBase +
// v and, when T > 0, T = TBase + t (Unicode's chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = kLCount * kVCount * kTCount;

// The properties of cp, or null for a boundary (class 0, quick check Yes): all below U+0300.
const NfcProps* props_of(uint32_t cp) {
  if (cp < kNfcProps[0].first) return nullptr;
  const NfcProps* r = std::lower_bound(std::begin(kNfcProps), std::end(kNfcProps), cp,
                                       [](const NfcProps& x, uint32_t c) { return x.last < c; });
  return r != std::end(kNfcProps) && r->first <= cp ? r : nullptr;
}

uint8_t class_of(uint32_t cp) {
  const NfcProps* p = props_of(cp);
  return p ? p->ccc : 0;
}

struct Mark {
  uint32_t cp;
  uint8_t ccc;
};

void decompose(uint32_t cp, std::vector<Mark>& out) {
  if (cp - kSBase < kSCount) {
    const uint32_t s = cp - kSBase, t = s % kTCount;
    out.push_back({kLBase + s / (kVCount * kTCount), 0});
    out.push_back({kVBase + s % (kVCount * kTCount) / kTCount, 0});
    if (t) out.push_back({kTBase + t, 0});
    return;
  }
  if (cp >= kDecompositions[0].cp) {
    const Decomposition* d = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                              [](const Decomposition& x, uint32_t c) { return x.cp < c; });
    if (d != std::end(kDecompositions) && d->cp == cp) {
      decompose(d->first, out);
      if (d->second) decompose(d->second, out);
      return;
    }
  }
  out.push_back({cp, class_of(cp)});
}

// The primary composite of a and b, 0 when there is none.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a - kLBase < kLCount && b - kVBase < kVCount) return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b - kTBase - 1 < kTCount - 1) return a + (b - kTBase);
  const Composition* c = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                                          [](const Composition& x, const std::pair<uint32_t, uint32_t>& k) {
                                            return x.first != k.first ? x.first < k.first : x.second < k.second;
                                          });
  return c != std::end(kCompositions) && c->first == a && c->second == b ? c->composite : 0;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | cp >> 6), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | cp >> 12), out += char(0x80 | (cp >> 6 & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | cp >> 18), out += char(0x80 | (cp >> 12 & 0x3F)), out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Appends the NFC form of s (valid UTF-8: the caller has decoded it) to out.
void normalize(std::string_view s, std::string& out) {
  thread_local std::vector<Mark> buf;
  buf.clear();
  for (size_t i = 0, len = 0; i < s.size(); i += len) decompose(decode_utf8(s, i, len), buf);
  // Canonical ordering: each run of marks (between starters, class 0) sorted by class, equal
  // classes keeping their order. A stable sort per run, not insertion: a run can be a whole
  // stretch of hostile text (marks of two classes alternating), and moving each mark past all
  // the earlier ones was quadratic in it.
  for (size_t i = 0; i < buf.size();) {
    if (buf[i].ccc == 0) {
      i++;
      continue;
    }
    size_t end = i;
    while (end < buf.size() && buf[end].ccc != 0) end++;
    std::stable_sort(buf.begin() + long(i), buf.begin() + long(end),
                     [](const Mark& a, const Mark& b) { return a.ccc < b.ccc; });
    i = end;
  }
  // Canonical composition, in place: buf[0, w) is the result so far, `starter` its last starter.
  // A code point joins the starter when nothing stands between them, or when what stands between
  // (marks only, in ascending class: the last kept one has the highest) has a lower class than its
  // own; a starter joins only an adjacent one (Hangul jamo, some vowel signs).
  size_t starter = SIZE_MAX, w = 0;
  for (size_t i = 0; i < buf.size(); i++) {
    const Mark m = buf[i];
    if (starter != SIZE_MAX && (w == starter + 1 || (buf[w - 1].ccc != 0 && buf[w - 1].ccc < m.ccc))) {
      if (const uint32_t c = compose(buf[starter].cp, m.cp)) {
        buf[starter].cp = c;
        continue;
      }
    }
    if (m.ccc == 0) starter = w;
    buf[w++] = m;
  }
  for (size_t i = 0; i < w; i++) append_utf8(buf[i].cp, out);
}

}  // namespace

std::string_view to_nfc(std::string_view text, std::string& scratch, size_t from) {
  // The text is scanned as stretches, each opening with a boundary code point (or the start); a
  // stretch that may change (`dirty`) is normalized alone. Once one changes, `scratch` holds the
  // result for text[from, done).
  thread_local std::string stretch;
  bool copying = false, dirty = false;
  size_t done = from, open = from;  // `open`: where the current stretch starts
  uint8_t last_ccc = 0;
  auto close = [&](size_t end) {  // the stretch [open, end) ends
    if (!dirty) return;
    dirty = false;
    const std::string_view was = text.substr(open, end - open);
    stretch.clear();
    normalize(was, stretch);
    if (stretch == was) return;  // a quick check Maybe that stays
    if (!copying) scratch.assign(text.data() + from, open - from), copying = true;
    else scratch.append(text.data() + done, open - done);
    scratch += stretch;
    done = end;
  };
  for (size_t i = from, len = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII: all boundaries
      close(i);
      size_t j = i + 1;
      while (j < text.size() && static_cast<unsigned char>(text[j]) < 0x80) j++;
      open = j - 1, last_ccc = 0, i = j;
      continue;
    }
    const NfcProps* p = props_of(decode_utf8(text, i, len));
    if (!p) {
      close(i);
      open = i, last_ccc = 0;
    } else {
      // UAX #15's quick check: a Maybe or No, or a mark after one of a higher class.
      if (p->qc != 0 || (p->ccc != 0 && p->ccc < last_ccc)) dirty = true;
      last_ccc = p->ccc;
    }
    i += len;
  }
  close(text.size());
  if (!copying) return text.substr(from);
  scratch.append(text.data() + done, text.size() - done);
  return scratch;
}

std::string nfc(std::string_view text) {
  std::string scratch;
  return std::string(to_nfc(text, scratch));
}

}  // namespace ul
