#!/usr/bin/env python3
"""Checks `train prepare --tokenizer` against a reference encoder on real text.

GPT-2 (default): writes GPT-2's vocabulary as an llm.c tokenizer file (ids = ranks, then
<|endoftext|> = 50256), runs `train prepare` with it on the given text files, and compares every
token of the shards with [50256] + tiktoken's encode_ordinary(text) for each file.
--hf tokenizer.json: runs `train prepare` with that file and compares with Hugging Face's tokenizers
(special tokens in the text encoded as text, as prepare does), each document opened by the EOT
ulysses picks (<|endoftext|>, else <|begin_of_text|>, else <s>).
Prints the files, tokens, mismatches (none, or the first with its context) and both encoders' times.

  python3 tools/check_bpe.py [--ranks gpt2.tiktoken | --hf tokenizer.json] [--train build/train]
                             [--write-tokenizer gpt2_tokenizer.bin] FILES...

--ranks reads a .tiktoken file (one "base64-token rank" a line) when tiktoken cannot download
GPT-2's; --write-tokenizer also keeps the llm.c tokenizer file. Needs: pip install tiktoken
(GPT-2) or tokenizers (--hf).
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
    ap.add_argument("--hf", help="a Hugging Face tokenizer.json to check instead of GPT-2's")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.hf:
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(a.hf)
        hf.encode_special_tokens = True
        vocab = hf.get_vocab(with_added_tokens=True)
        eot = vocab.get("<|endoftext|>", vocab.get("<|begin_of_text|>", vocab.get("<s>")))
        encode = lambda text: hf.encode(text, add_special_tokens=False).ids
        piece = lambda t: (hf.id_to_token(t) or "?").encode()
    else:
        enc = gpt2_encoding(a.ranks)
        eot, encode, piece = enc.eot_token, enc.encode_ordinary, enc.decode_single_token_bytes
    with tempfile.TemporaryDirectory() as tmp:
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
        for p in a.files:
            text = open(p, encoding="utf-8", newline="").read()  # the bytes as they are: no \r\n -> \n
            nbytes += len(text.encode())
            want += [eot] + encode(text)
        theirs = time.time() - t0
    print(f"{len(a.files)} file(s), {nbytes / 1e6:.2f} MB, {len(want)} tokens ({'tokenizers' if a.hf else 'tiktoken'}), {len(got)} (ours)")
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), n)
    if i < n or len(got) != len(want):
        show = lambda ids: repr(b"".join(piece(int(t)) for t in ids))
        print(f"MISMATCH at token {i}: ours {got[i:i + 8]} {show(got[i:i + 8])}\n"
              f"                   tiktoken {want[i:i + 8]} {show(want[i:i + 8])}")
        sys.exit(1)
    print(f"identical; train prepare {ours:.2f} s (whole command), {'tokenizers' if a.hf else 'tiktoken'} "
          f"{theirs:.2f} s")


if __name__ == "__main__":
    main()
