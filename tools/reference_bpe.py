#!/usr/bin/env python3
"""Writes the byte-level BPE fixture the C++ tokenizer test compares against (tests/cpu/test_bpe.cpp):

  tests/data/bpe_tiny_tokenizer.bin  an llm.c tokenizer file (version 2): the 256 bytes in GPT-2's
                                     order, then 320 merges learned here, then <|endoftext|> (EOT)
  tests/data/bpe_tiny_cases.txt      one case a line: the text as UTF-8 hex ("-" when empty), a
                                     space, then its ids comma-separated ("-" when none)
  tests/data/bpe_tiny_gpt2.json      the same vocabulary and merges as a Hugging Face tokenizer.json
                                     (GPT-2's layout: ByteLevel with its regex, <|endoftext|>)
  tests/data/bpe_tiny_digits.json    ... with every digit apart first (Digits + ByteLevel)
  tests/data/bpe_tiny_llama3.json    ... in Llama 3's layout (its Split regex, then ByteLevel;
                                     ignore_merges; <|begin_of_text|>)
  tests/data/bpe_tiny_qwen2.json     ... in Qwen 2's (Qwen 2.5's): an NFC normalizer, then Llama 3's
                                     regex with single digits, then ByteLevel; <|endoftext|>, more
                                     special tokens, and added tokens that are not special, found in
                                     text (Qwen 2.5's <tool_call>, <|fim_prefix|>; one "normalized")
  tests/data/bpe_tiny_sp.json        a SentencePiece-style tokenizer.json as Hugging Face converts
                                     Llama 2's (Prepend + Replace "▁", no pre-tokenizer, merges over
                                     characters, byte fallback, <s>), learned here by tokenizers'
                                     trainer on the same corpus (split at spaces while learning)
  tests/data/bpe_tiny_{digits,llama3,sp}_cases.txt   the same texts, HF's ids in those layouts
                                     (in GPT-2's they are tiktoken's: checked here, not written twice)
  tests/data/bpe_tiny_qwen2_cases.txt  the same texts and more (text not in NFC: combining marks,
                                     Hangul jamo, exclusions; digits; added tokens), HF's ids

The merges are learned from a seeded pseudo-random corpus (a plain BPE trainer below), so ids are
merge ranks as in GPT-2's vocabulary. The expected ids come from tiktoken (pip install tiktoken
regex), given those ranks and GPT-2's split pattern, and from Hugging Face's tokenizers library
(pip install tokenizers) for the tokenizer.json files: implementations independent of ours. Special
tokens written in a text are encoded as plain text (tiktoken's encode_ordinary, tokenizers'
encode_special_tokens), as `train prepare` does.

Run from anywhere: python3 tools/reference_bpe.py
"""
import collections
import json
import os
import random
import struct

import regex
import tiktoken

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen 2's and Qwen 2.5's tokenizer.json
# Qwen 2.5's added tokens beyond the special ones: found in text, not normalized.
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>"]
QWEN_ADDED_NORMALIZED = "\u00e9t\u00e9!"  # not in Qwen's files: a "normalized" added token, matched after NFC
MERGES = 320
WORDS = ("the of and to in is was he that it for on as with his they at be this from I have or by "
         "one had not but what all were when we there can an your which their said if do will each "
         "about how up out them then she many some so these would other into has more her two like "
         "don't it's we're you've I'm they'll she'd 1999 2024 3.14 42 007 hello world tokenizer "
         "café naïve Ünïcödé Москва привет 東京 日本語 مرحبا שלום नमस्ते ½ ² Ⅻ 🙂 🚀 e\u0301").split()
PUNCT = [".", ",", "!", "?", ";", ":", "'", '"', "(", ")", "--", "...", "<|endoftext|>", "\n", "\n\n", "\t"]



def qwen2_layout(tk):
    """Qwen 2's (and Qwen 2.5's) normalizer, pre-tokenizer and decoder, as its tokenizer.json has them."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()

def gpt2_byte_order():
    # GPT-2's first 256 ids: the printable bytes, then the rest (its bytes_to_unicode order).
    first = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    return first + [b for b in range(256) if b not in first]


def corpus(rng, n_words):
    out = []
    for _ in range(n_words):
        out.append(rng.choice(WORDS))
        out.append(rng.choice(PUNCT) if rng.random() < 0.15 else " ")
        if rng.random() < 0.05:
            out.append(" " * rng.randint(1, 4))
    return "".join(out)


def train(text):
    """Plain byte-level BPE: count adjacent pairs within GPT-2 pieces, merge the most frequent."""
    words = collections.Counter(tuple(bytes([b]) for b in p.encode()) for p in regex.findall(GPT2_PATTERN, text))
    ranks = {bytes([b]): i for i, b in enumerate(gpt2_byte_order())}
    merges = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        # Most frequent, ties broken by the bytes, so the result is deterministic.
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if a + b in ranks:  # the same bytes reached another way: no new token
            words = merge_words(words, a, b)
            continue
        ranks[a + b] = len(ranks)
        merges.append((a, b))
        words = merge_words(words, a, b)
    return ranks, merges


def merge_words(words, a, b):
    out = collections.Counter()
    for w, c in words.items():
        m, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                m.append(a + b)
                i += 2
            else:
                m.append(w[i])
                i += 1
        out[tuple(m)] += c
    return out


def cases(rng):
    fixed = [
        "", "a", " ", "  ", "hello world", "Hello  world", "hello   world  ", "don't we're you've I'm 'S 'sup",
        "they'll she'd '' 're", " 's", "?'s", "x\ny", "x\n\ny", "line\n  indented", "\t\ttabs\t",
        "trailing spaces   ", "3.14159 1,000,000 2024-12-01", "abc123def", "<|endoftext|>", "a<|endoftext|>b",
        "café naïve Ünïcödé", "Москва привет", "東京 日本語", "مرحبا", "שלום", "नमस्ते", "½ ² Ⅻ",
        "🙂🚀 🙂", "e\u0301 combining", "nbsp\u00a0here", "ideographic\u3000space", "line\u2028separator",
        "ctrl\x1c\x1f\x00chars", "\u0085next line", "a" * 1000, "the " * 200, "ab" * 300,
        " " * 50 + "x", "!!!???...", "  \n  \n", "\r\n\r\nwindows",
    ]
    alphabet = list("abcdefgh ABC 0123 .,'!\n\t") + ["é", "ж", "東", "🙂", "\u00a0", "½", "\u0301", " ", " "]
    rand = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(300)]
    return fixed + rand


def qwen2_cases(rng):
    """More texts for Qwen 2's layout: not in NFC, digits, contractions, scripts, added tokens."""
    fixed = [
        "e\u0301", "A\u030a", "\u1100\u1161\u11a8", "\u1100\u1161 \u1112\u1161\u11ab\uae00", "\uac00\u11a8",
        "a\u0301\u0323", "a\u0323\u0301 \u1e9b\u0323", "\u0958\u0959 \u2126 \u212b \u0344 \u0340",
        "\uf900 \U0001d15e", "caf\u00e9 cafe\u0301 CAFE\u0301S", "\u0b92\u0bd7 \u0bc6\u0bbe", "o\u031b\u0323\u0300",
        "12345", "abc 12345 x1y22 3.14159 1,000,000", "\u00bd\u2168 \u0661\u0662\u0663",
        "DON'T We'Re I'M THEY'LL she'D 'S it'\u017f x'\u017ft",
        "\u6771\u4eac\u30bf\u30ef\u30fc \u65e5\u672c\u8a9e\u30c6\u30ad\u30b9\u30c8",
        "\u4e2d\u6587\u5b57\u7b26\u548c\u6807\u70b9\u3002", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\U0001f642\U0001f680\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467",
        "<tool_call>x</tool_call>", "a<|fim_prefix|>b<|fim_suffix|>c<|fim_middle|>", "<|endoftext|><tool_call>",
        "<|im_start|>user\nhi<|im_end|>", "<tool_call>\u0338 <\u0338tool_call>", "<|im_start|>\u0338",
        "<tool_call><tool_call", "<|file_sep|>x.py\n", "d\u00e9j\u00e0 \u00e9t\u00e9! e\u0301te\u0301! \u00e9t\u00e9!!",
        "x\u00e9t\u00e9!\u0301", "  \u0301 leading mark", "\u0301", "1\u0301 2\u0323",
    ]
    alphabet = (list("abcAB 0129 .,'!\n\t<>") + ["\u0301", "\u0323", "\u0308", "\u0327", "\u0338", "\u1100", "\u1161",
                "\u11a8", "\uac00", "\u00e9", "\u2126", "\u0958", "\u6771", "\U0001f642", "<tool_call>", "<|im_end|>",
                "\u00e9t\u00e9!", "\u0663", "\u00bd"])
    rand = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(200)]
    return fixed + rand


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    rng = random.Random(20241201)
    ranks, merges = train(corpus(rng, 20000))
    eot = len(ranks)
    enc = tiktoken.Encoding("bpe_tiny", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": eot})
    tokens = sorted(ranks, key=ranks.get) + [b"<|endoftext|>"]
    with open(os.path.join(root, "tests", "data", "bpe_tiny_tokenizer.bin"), "wb") as f:
        f.write(struct.pack("<256I", 20240328, 2, len(tokens), eot, *([0] * 252)))
        for t in tokens:
            f.write(bytes([len(t)]) + t)
    texts = cases(rng)
    write_cases(os.path.join(root, "tests", "data", "bpe_tiny_cases.txt"), texts, enc.encode_ordinary)
    more = qwen2_cases(rng)
    for layout, special in (("gpt2", "<|endoftext|>"), ("digits", "<|endoftext|>"), ("llama3", "<|begin_of_text|>"),
                            ("qwen2", "<|endoftext|>")):
        hf = hf_tokenizer(ranks, merges, layout, special)
        hf.save(os.path.join(root, "tests", "data", f"bpe_tiny_{layout}.json"))
        hf.encode_special_tokens = True  # "<|endoftext|>" in a text is text (added tokens not special are not)
        ids = lambda t: hf.encode(t, add_special_tokens=False).ids
        if layout == "gpt2":
            assert all(ids(t) == enc.encode_ordinary(t) for t in texts), "HF and tiktoken disagree"
        else:
            write_cases(os.path.join(root, "tests", "data", f"bpe_tiny_{layout}_cases.txt"),
                        texts + (more if layout == "qwen2" else []), ids)
    sp = sentencepiece_style(corpus(random.Random(7), 20000))
    sp.save(os.path.join(root, "tests", "data", "bpe_tiny_sp.json"))
    sp.encode_special_tokens = True
    write_cases(os.path.join(root, "tests", "data", "bpe_tiny_sp_cases.txt"), texts,
                lambda t: sp.encode(t, add_special_tokens=False).ids)
    # The newer conversion's layout: no normalizer, a Metaspace pre-tokenizer that does not split
    # (it adds "▁" only before a text that does not start with a space). The test makes the file
    # from bpe_tiny_sp.json; its ids differ where a text starts with a space.
    from tokenizers import Tokenizer
    meta = json.loads(sp.to_str())
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    ms = Tokenizer.from_str(json.dumps(meta))
    ms.encode_special_tokens = True
    write_cases(os.path.join(root, "tests", "data", "bpe_tiny_sp_metaspace_cases.txt"), texts,
                lambda t: ms.encode(t, add_special_tokens=False).ids)
    print(f"vocab {len(tokens)} (EOT {eot}), {len(texts)} cases; SentencePiece-style vocab {sp.get_vocab_size()}")


def sentencepiece_style(text):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tk.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False))
    tk.pre_tokenizer = None  # as in the converted files: the normalizer alone makes the "▁"s
    return Tokenizer.from_str(tk.to_str())


def write_cases(path, texts, encode):
    with open(path, "w") as f:
        for text in texts:
            ids = encode(text)
            f.write((text.encode().hex() or "-") + " " + (",".join(map(str, ids)) or "-") + "\n")


def hf_tokenizer(ranks, merges, layout, special):
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    order = gpt2_byte_order()
    # GPT-2's byte -> printable character map (tokenizer.json stores tokens in it).
    chars = {b: chr(b) if b in order[:188] else chr(256 + order[188:].index(b)) for b in range(256)}
    text = lambda bs: "".join(chars[b] for b in bs)
    vocab = {text(t): r for t, r in ranks.items()}
    bpe = models.BPE(vocab=vocab, merges=[(text(a), text(b)) for a, b in merges], ignore_merges=layout == "llama3")
    tk = Tokenizer(bpe)
    if layout == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif layout == "digits":  # StarCoder 2's and SmolLM's: every digit apart, then GPT-2's
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif layout == "llama3":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    else:  # Qwen 2's, as its tokenizer.json has it
        qwen2_layout(tk)
        tk.add_special_tokens(QWEN_SPECIAL)
        tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN_ADDED] +
                      [AddedToken(QWEN_ADDED_NORMALIZED, normalized=True, special=False)])
        return tk
    tk.add_special_tokens([special])
    return tk


if __name__ == "__main__":
    main()
