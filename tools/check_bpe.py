#!/usr/bin/env python3
"""Checks `train prepare --tokenizer` against a reference encoder on real text.

GPT-2 (default): writes GPT-2's vocabulary as an llm.c tokenizer file (ids = ranks, then
<|endoftext|> = 50256), runs `train prepare` with it on the given text files, and compares every
token of the shards with [50256] + tiktoken's encode_ordinary(text) for each file.
--hf tokenizer.json: runs `train prepare` with that file and compares with Hugging Face's tokenizers
(special tokens in the text encoded as text, as prepare does; added tokens that are not special
found in it, as both do), each document opened by the EOT ulysses picks (<|endoftext|>, else
<|begin_of_text|>, else <s>).
--qwen2 qwen.tiktoken: as --hf, with a tokenizer.json in Qwen 2.5's layout written from Qwen's
tiktoken ranks (151643 tokens; the file Qwen's own tiktoken-based tokenizer reads, shipped for
example in the dashscope package): its NFC normalizer, Split regex and ByteLevel, the merges each
token's BPE reaches it by, and Qwen 2.5's added tokens (14 special, 8 found in text). --write-tokenizer
keeps that file.
A .jsonl or .ndjson input is one document a line, its "text" field, and a .json array of objects
one an element, as `train prepare` reads them.
Prints the files, tokens, mismatches (none, or the first with its context) and both encoders' times.

  python3 tools/check_bpe.py [--ranks gpt2.tiktoken | --hf tokenizer.json | --qwen2 qwen.tiktoken]
                             [--train build/train] [--write-tokenizer FILE] FILES...

--ranks reads a .tiktoken file (one "base64-token rank" a line) when tiktoken cannot download
GPT-2's; --write-tokenizer also keeps the llm.c tokenizer file. Needs: pip install tiktoken
(GPT-2) or tokenizers (--hf, --qwen2).
"""
import argparse
import array
import base64
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_bpe import qwen2_layout  # noqa: E402 (the tools' shared definition of Qwen 2's layout)

def json_array(path):
    """Whether prepare reads the file as a JSON array of documents: a .json opening with '[' and '{'."""
    if not path.lower().endswith(".json"):
        return False
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    head = head.lstrip(b" \t\r\n")
    return head.startswith(b"[") and head[1:].lstrip(b" \t\r\n").startswith(b"{")


def documents(files):
    """Each document's text, as `train prepare` takes them: a file whole, JSON a record at a time."""
    for p in files:
        if json_array(p):
            with open(p, encoding="utf-8-sig") as f:
                yield from (element["text"] for element in json.load(f))
            continue
        if not p.lower().endswith((".jsonl", ".ndjson")):
            yield open(p, encoding="utf-8", newline="").read()  # the bytes as they are: no \r\n -> \n
            continue
        with open(p, "rb") as f:
            for k, line in enumerate(f.read().split(b"\n")):
                if k == 0 and line.startswith(b"\xef\xbb\xbf"):
                    line = line[3:]
                if line.strip(b" \t\r"):
                    yield json.loads(line)["text"]


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"]


def gpt2_encoding(ranks_file):
    import tiktoken  # only the GPT-2 comparison needs it (--hf and --qwen2 use tokenizers)
    if not ranks_file:
        return tiktoken.get_encoding("gpt2")
    ranks = read_ranks(ranks_file)
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def qwen2_tokenizer(ranks_file, path):
    """Writes Qwen 2.5's tokenizer.json layout for the ranks to path."""
    from tokenizers import AddedToken, Tokenizer, models
    ranks = read_ranks(ranks_file)
    # GPT-2's byte -> character map, in which tokenizer.json stores byte-level tokens.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + k) for k, b in enumerate(b for b in range(256) if b not in chars)})
    text = lambda bs: "".join(chars[b] for b in bs)
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = [bytes([b]) for b in tok]  # BPE with the lower ranks ends in the token's two halves
        while len(parts) > 2:
            r, i = min((ranks.get(parts[i] + parts[i + 1], 1 << 62), i) for i in range(len(parts) - 1))
            if r >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, tok
        merges.append((text(parts[0]), text(parts[1])))
    tk = Tokenizer(models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges, ignore_merges=False))
    qwen2_layout(tk)
    tk.add_special_tokens(QWEN_SPECIAL)
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN_ADDED])
    assert tk.token_to_id("<|endoftext|>") == len(ranks)
    tk.save(path)


def write_llmc_tokenizer(enc, path):
    eot = enc.eot_token
    with open(path, "wb") as f:
        f.write(struct.pack("<256I", 20240328, 2, enc.n_vocab, eot, *([0] * 252)))
        for i in range(enc.n_vocab):
            t = enc.decode_single_token_bytes(i)
            f.write(bytes([len(t)]) + t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks")
    ap.add_argument("--train", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "train"))
    ap.add_argument("--write-tokenizer")
    ap.add_argument("--hf", help="a Hugging Face tokenizer.json to check instead of GPT-2's")
    ap.add_argument("--qwen2", help="Qwen's tiktoken ranks (qwen.tiktoken): check Qwen 2.5's layout made from them")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.qwen2:
            a.hf = a.write_tokenizer or os.path.join(tmp, "tokenizer.json")
            t0 = time.time()
            qwen2_tokenizer(a.qwen2, a.hf)
            print(f"wrote Qwen 2.5's layout for {a.qwen2} to {a.hf} ({time.time() - t0:.1f} s)")
        if a.hf:
            from tokenizers import Tokenizer
            hf = Tokenizer.from_file(a.hf)
            hf.encode_special_tokens = True
            # Among the added tokens only, as ulysses picks it (a plain vocabulary entry named
            # <|endoftext|>, as a SentencePiece-style file may hold, is no EOT there).
            added = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}
            eot = added.get("<|endoftext|>", added.get("<|begin_of_text|>", added.get("<s>")))
            encode = lambda text: hf.encode(text, add_special_tokens=False).ids
            piece = lambda t: (hf.id_to_token(t) or "?").encode()
        else:
            enc = gpt2_encoding(a.ranks)
            eot, encode, piece = enc.eot_token, enc.encode_ordinary, enc.decode_single_token_bytes
        reference = "tokenizers" if a.hf else "tiktoken"
        tok = a.hf or a.write_tokenizer or os.path.join(tmp, "gpt2_tokenizer.bin")
        if not a.hf:
            write_llmc_tokenizer(enc, tok)
        t0 = time.time()
        r = subprocess.run([a.train, "prepare", "--tokenizer", tok, "--val-frac", "0", "--out", os.path.join(tmp, "out")]
                           + a.files, capture_output=True, text=True)
        ours = time.time() - t0
        if r.returncode != 0:
            sys.exit("train prepare failed:\n" + r.stdout + r.stderr)
        got = None
        for p in sorted(glob.glob(os.path.join(tmp, "out", "text_train_*.bin"))):
            with open(p, "rb") as f:
                b = f.read()
            if got is None:  # uint16 shards (magic 20240520) or uint32 (20240801)
                got = array.array("H" if struct.unpack("<i", b[:4])[0] == 20240520 else "I")
            got.frombytes(b[1024:])
        if sys.byteorder == "big":
            got.byteswap()
        got = got.tolist()
        t0 = time.time()
        want, nbytes = [], 0
        for text in documents(a.files):
            nbytes += len(text.encode())
            want += [eot] + encode(text)
        theirs = time.time() - t0
    print(f"{len(a.files)} file(s), {nbytes / 1e6:.2f} MB, {len(want)} tokens ({reference}), {len(got)} (ours)")
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), n)
    if i < n or len(got) != len(want):
        show = lambda ids: repr(b"".join(piece(int(t)) for t in ids))
        print(f"MISMATCH at token {i}: ours {got[i:i + 8]} {show(got[i:i + 8])}\n"
              f"{reference:>{len('MISMATCH at token') + len(str(i)) + 2}} {want[i:i + 8]} {show(want[i:i + 8])}")
        sys.exit(1)
    print(f"identical; train prepare {ours:.2f} s (whole command), {reference} {theirs:.2f} s")


if __name__ == "__main__":
    main()
