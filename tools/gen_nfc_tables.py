#!/usr/bin/env python3
"""Writes the data of Unicode NFC normalization (engine/nfc.h) from Python's unicodedata:

  engine/nfc_tables.inc    the tables engine/nfc.cpp searches (data only; the lookups are in nfc.cpp):
    kNfcProps          ranges {first, last, ccc, qc} of every code point that is not an NFC boundary
                       (a boundary: canonical combining class 0, NFC_Quick_Check Yes): its combining
                       class and quick check (0 Yes, 1 Maybe, 2 No). Below the first range all is
                       boundary (U+0300 on).
    kDecompositions    {code point, first, second}: each canonical decomposition, one level (second 0
                       for a singleton); nfc.cpp applies them recursively. Hangul syllables are left
                       to the algorithm.
    kCompositions      {first, second, composite}, sorted by the pair: the primary composites, those
                       whose decomposition NFC puts back together (composition exclusions, singletons
                       and non-starter decompositions left out).
  tests/data/nfc_cases.txt one case a line: a text as UTF-8 hex, a space, its NFC form as UTF-8 hex
                       ("-" when empty), as Hugging Face's tokenizers normalizes it (its NFC
                       normalizer, the reference: a model saw its tokens): fixed cases, every code
                       point of the tables in contexts, and seeded random mixes of starters,
                       combining marks of many classes (those encoded after Unicode 9.0 too), Hangul
                       jamo and exclusions.

tokenizers' NFC is Unicode 9.0's: to it a code point encoded since is an ordinary starter, so the 98
combining marks added after 9.0 (U+07FD, U+0898..., U+1E2EC...) have class 0 and nothing is
reordered across them, and the few later canonical decompositions (U+11938, Unicode 13) neither
decompose nor compose. The tables are Python's unicodedata with the code points newer than 9.0 left
out that way (normalization data never changes for a code point once encoded, so this is 9.0's),
which needs each code point's age: pip install unicodedataplus tokenizers.

NFC_Quick_Check is derived as the Unicode data files derive it: No for the code points NFC never
leaves (Full_Composition_Exclusion: NFC of the code point alone differs from it), Maybe for the
second code point of a primary composite (and Hangul's medial vowels and final consonants).

Run from anywhere: python3 tools/gen_nfc_tables.py
"""
import os
import random
import sys
import unicodedata as ud

import unicodedataplus
from tokenizers.normalizers import NFC as HfNfc

N = 0x110000
SURROGATES = range(0xD800, 0xE000)
HANGUL_V, HANGUL_T = range(0x1161, 0x1176), range(0x11A8, 0x11C3)


def newer_than_9(c):
    a = unicodedataplus.age(chr(c))  # "9.0", or "NA" / "Unassigned"
    return a[0].isdigit() and tuple(int(x) for x in a.split(".")) > (9, 0)


# The code points tokenizers does not know (see above): starters, never decomposed or composed.
NEWER = {c for c in range(N) if c not in SURROGATES and newer_than_9(c)}
HF_STARTERS = {c for c in NEWER if ud.combining(chr(c))}


def combining(c):
    return 0 if c in NEWER else ud.combining(chr(c))


def hf_nfc(s, normalizer=HfNfc()):
    return normalizer.normalize_str(s)


def canonical(c):
    d = ud.decomposition(chr(c))
    return None if not d or d.startswith("<") else [int(x, 16) for x in d.split()]


def nfc(s):
    return ud.normalize("NFC", s)


def tables():
    decomp, comp = {}, {}
    for c in range(N):
        if c in SURROGATES:
            continue
        d = canonical(c) if c not in NEWER else None
        if d:
            decomp[c] = d
            if len(d) == 2 and nfc(chr(c)) == chr(c):
                comp[(d[0], d[1])] = c
    no = {c for c in decomp if nfc(chr(c)) != chr(c)}
    maybe = {b for _, b in comp} | set(HANGUL_V) | set(HANGUL_T)
    assert not no & maybe

    def full(c):
        return [y for x in decomp[c] for y in full(x)] if c in decomp else [c]

    props = []
    for c in range(N):
        if c in SURROGATES:
            continue
        cc, qc = combining(c), 2 if c in no else 1 if c in maybe else 0
        if cc == 0 and qc == 0:
            # A boundary: text before it normalizes apart from text after it (engine/nfc.cpp). That
            # needs its decomposition to start with a starter that composes with nothing before it.
            f = full(c)
            assert combining(f[0]) == 0 and f[0] not in maybe, hex(c)
            continue
        if props and props[-1][1] == c - 1 and props[-1][2:] == [cc, qc]:
            props[-1][1] = c
        else:
            props.append([c, c, cc, qc])
    # A space (where data/tokenize_files.cpp cuts text) is a boundary and composes with nothing.
    assert not any(0x20 in pair for pair in comp) and props[0][0] > 0x20
    return props, decomp, comp, no, maybe


def rows(items, width=100):
    lines, line = [], "   "
    for r in items:
        if len(line) + 1 + len(r) > width:
            lines.append(line)
            line = "   "
        line += " " + r
    lines.append(line)
    return "\n".join(lines)


def write_inc(path, props, decomp, comp):
    with open(path, "w") as f:
        f.write(f"// Generated by tools/gen_nfc_tables.py from Python's unicodedata (Unicode {ud.unidata_version}, the "
                "marks encoded after 9.0\n// of class 0, as Hugging Face's tokenizers has them); do not edit.\n"
                "// Included by engine/nfc.cpp, which holds the lookups.\n\n")
        f.write("// {first, last, canonical combining class, NFC_Quick_Check (0 Yes, 1 Maybe, 2 No)} of the code\n"
                "// points that are not boundaries (class 0 and Yes), ascending.\n")
        f.write("const NfcProps kNfcProps[] = {\n" +
                rows(f"{{0x{a:X}, 0x{b:X}, {cc}, {qc}}}," for a, b, cc, qc in props) + "\n};\n\n")
        f.write("// {code point, first, second}: canonical decompositions, one level (second 0: a singleton).\n")
        f.write("const Decomposition kDecompositions[] = {\n" +
                rows(f"{{0x{c:X}, 0x{d[0]:X}, 0x{d[1] if len(d) > 1 else 0:X}}}," for c, d in sorted(decomp.items()))
                + "\n};\n\n")
        f.write("// {first, second, composite}: the primary composites, sorted by (first, second).\n")
        f.write("const Composition kCompositions[] = {\n" +
                rows(f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for (a, b), c in sorted(comp.items())) + "\n};\n")


def cases(rng, props, decomp, comp, no, maybe):
    fixed = [
        "", "plain ASCII text, unchanged", "e\u0301", "A\u030a", "\u212b", "\u2126", "\u0958", "\u1100\u1161\u11a8",
        "\u1100\u1161", "\uac00\u11a8", "\uac01\u11a8", "\u1100\u1161\u1161", "\u1100\u0301\u1161", "\u11a8\u1100",
        "a\u0301\u0323", "a\u0323\u0301", "\u00e9\u0323", "\u1e9b\u0323", "\u0344", "\u0340\u0341", "\u0301a",
        "\uf900\uf901", "\U0001d15e\U0001d160", "\u2adc", "\u0b92\u0bd7", "\u0bc6\u0bbe", "\u0b95\u0bbe",
        "\u0bc6\u0301\u0bbe", "\u1025\u102e", "<\u0338 >\u0338 =\u0338", "o\u031b\u0323\u0300", "\u05d0\u05b7\u05bc",
        "\u0915\u093c\u094d", "\u304b\u3099 \u30cf\u309a", "\u1f80\u0345", "\u03b1\u0345\u0313\u0300",
        "caf\u00e9 cafe\u0301", "\u0041\u0308\u0304", "\u0041\u0304\u0308", "\u0073\u0323\u0307", "\u0073\u0307\u0323",
        "\u0627\u0653", "\u00c5\u0328", "12345", "\U0001f642\u0301",
    ]
    fixed += ["a\u07fd\u0323", "a\u0323\u07fd", "a\u1ac0\u0301\u0316", "\U00011935\U00011930"]  # HF's own rules
    out = [(t, hf_nfc(t)) for t in fixed]
    marks = sorted(c for c in range(0x300, N) if c not in SURROGATES and ud.combining(chr(c)))
    by_class = {}
    for m in marks:
        by_class.setdefault(ud.combining(chr(m)), []).append(m)
    some_marks = [ms[0] for ms in by_class.values()] + [0x301, 0x323, 0x308, 0x327, 0x345, 0x31b, 0x338]
    some_marks += sorted(HF_STARTERS)[::10]
    starters = [0x61, 0x45, 0x6f, 0x3b1, 0x3c9, 0x435, 0x5d0, 0x627, 0x915, 0x4e00, 0x304b, 0xac00, 0x1100, 0xe9]

    def group(items, k=10):
        for i in range(0, len(items), k):
            t = " ".join(items[i:i + k])
            out.append((t, hf_nfc(t)))

    # Every decomposition alone, 500 with marks after them; every other code point of kNfcProps
    # between marks (its class decides the order); every primary composite's pair adjacent, 300
    # with a mark between.
    group([chr(c) for c in sorted(decomp)])
    group([chr(c) + chr(rng.choice(some_marks)) + chr(rng.choice(some_marks)) for c in rng.sample(sorted(decomp), 500)])
    nonboundary = [c for a, b, _, _ in props for c in range(a, b + 1) if c not in decomp]
    group([chr(rng.choice(starters)) + chr(rng.choice(some_marks)) + chr(c) + chr(rng.choice(some_marks))
           for c in nonboundary])
    group([chr(a) + chr(b) for a, b in sorted(comp)])
    group([chr(a) + chr(rng.choice(some_marks)) + chr(b) for a, b in rng.sample(sorted(comp), 300)])
    # Random mixes.
    pool = (starters + some_marks + list(HANGUL_V) + list(HANGUL_T) + [0x1100, 0x1112, 0xac00, 0xd7a3, 0x20, 0x41]
            + sorted(no)[:40] + sorted(maybe) + [b for a, b in sorted(comp)][:60] + [a for a, b in sorted(comp)][:60])
    for _ in range(300):
        t = "".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 24)))
        out.append((t, hf_nfc(t)))
    return out


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    props, decomp, comp, no, maybe = tables()
    write_inc(os.path.join(root, "engine", "nfc_tables.inc"), props, decomp, comp)
    cs = cases(random.Random(20250101), props, decomp, comp, no, maybe)
    with open(os.path.join(root, "tests", "data", "nfc_cases.txt"), "w") as f:
        for t, n in cs:
            f.write((t.encode().hex() or "-") + " " + (n.encode().hex() or "-") + "\n")
    print(f"Unicode {ud.unidata_version}: {len(props)} property ranges, {len(decomp)} decompositions, "
          f"{len(comp)} compositions; {len(cs)} cases ({sum(t != n for t, n in cs)} change)", file=sys.stderr)


if __name__ == "__main__":
    main()
