#!/usr/bin/env python3
"""Checks `train prepare --tokenizer` against tiktoken's GPT-2 encoding on real text.

Writes GPT-2's vocabulary as an llm.c tokenizer file (ids = ranks, then <|endoftext|> = 50256),
runs `train prepare` with it on the given text files, and compares every token of the shards with
[50256] + tiktoken's encode_ordinary(text) for each file. Prints the files, tokens, mismatches
(none, or the first with its context) and both encoders' times.

  python3 tools/check_gpt2_bpe.py [--ranks gpt2.tiktoken] [--train build/train]
                                  [--write-tokenizer gpt2_tokenizer.bin] FILES...

--ranks reads a .tiktoken file (one "base64-token rank" a line) when tiktoken cannot download
GPT-2's; --write-tokenizer also keeps the llm.c tokenizer file. Needs: pip install tiktoken.
"""
import argparse
import array
import base64
import glob
import os
import struct
import subprocess
import sys
import tempfile
import time

import tiktoken

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_encoding(ranks_file):
    if not ranks_file:
        return tiktoken.get_encoding("gpt2")
    ranks = {}
    with open(ranks_file, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


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
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    enc = gpt2_encoding(a.ranks)
    with tempfile.TemporaryDirectory() as tmp:
        tok = a.write_tokenizer or os.path.join(tmp, "gpt2_tokenizer.bin")
        write_llmc_tokenizer(enc, tok)
        t0 = time.time()
        r = subprocess.run([a.train, "prepare", "--tokenizer", tok, "--val-frac", "0", "--out", os.path.join(tmp, "out")]
                           + a.files, capture_output=True, text=True)
        ours = time.time() - t0
        if r.returncode != 0:
            sys.exit("train prepare failed:\n" + r.stdout + r.stderr)
        got = array.array("H")
        for p in sorted(glob.glob(os.path.join(tmp, "out", "text_train_*.bin"))):
            with open(p, "rb") as f:
                got.frombytes(f.read()[1024:])
        if sys.byteorder == "big":
            got.byteswap()
        got = got.tolist()
        t0 = time.time()
        want, nbytes = [], 0
        for p in a.files:
            text = open(p, encoding="utf-8", newline="").read()  # the bytes as they are: no \r\n -> \n
            nbytes += len(text.encode())
            want += [enc.eot_token] + enc.encode_ordinary(text)
        theirs = time.time() - t0
    print(f"{len(a.files)} file(s), {nbytes / 1e6:.2f} MB, {len(want)} tokens (tiktoken), {len(got)} (ours)")
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), n)
    if i < n or len(got) != len(want):
        show = lambda ids: repr(b"".join(enc.decode_single_token_bytes(int(t)) for t in ids))
        print(f"MISMATCH at token {i}: ours {got[i:i + 8]} {show(got[i:i + 8])}\n"
              f"                   tiktoken {want[i:i + 8]} {show(want[i:i + 8])}")
        sys.exit(1)
    print(f"identical; train prepare {ours:.2f} s (whole command), tiktoken encode_ordinary {theirs:.2f} s")


if __name__ == "__main__":
    main()
