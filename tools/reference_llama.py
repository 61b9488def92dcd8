#!/usr/bin/env python3
"""Independent float64 Llama reference for the C++ whole-model test of the llama architecture.

A small, self-contained PyTorch Llama: RMSNorm (eps 1e-5), rotate-half RoPE (theta configurable),
grouped-query attention (query head h reads kv head h // (H / KV)), SwiGLU MLP, no biases, an untied
output head, padded vocabulary rows that stay zero. Parameters are kept in ulysses' llama layout:
  wte (Vp,C), ln1w (L,C), qkvw (L,(H+2KV)*D,C) rows [q heads | k heads | v heads], attprojw (L,C,C),
  ln2w (L,C), fcw (L,2F,C) rows [gate | up], fcprojw (L,C,F), lnfw (C), lm_head (Vp,C).
Everything runs in float64 from fp32-exact parameters.

With --qwen, Qwen 2's two differences: a bias on the q/k/v projection, qkvb (L,(H+2KV)*D) after
qkvw (random, so that its gradient and its effect show), and RMSNorm eps 1e-6.

Writes tests/data/llama_tiny_ref.bin, or with --qwen tests/data/qwen_tiny_ref.bin
(run: python3 tools/reference_llama.py [--qwen]):
  header 256 x int32: [20261130, 1, B, T, L, C, H, KV, V, Vp, F, theta (as int), qkv bias (0/1),
                       k with eps = 10^-k (0: 5), 0...]
  params (fp32, the layout above), inputs (B*T int32), targets (B*T int32, -1 = ignored),
  loss (1 fp32: mean over valid targets), grads (fp32, same layout as params)
"""
import argparse
import math
import os

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
B, T, L, C, H, KV, V, Vp, F, THETA = 2, 12, 2, 32, 4, 2, 40, 64, 48, 10000
D = C // H
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
ORDER = ("wte", "ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcprojw", "lnfw", "lm_head")
QWEN_ORDER = ("wte", "ln1w", "qkvw", "qkvb", "attprojw", "ln2w", "fcw", "fcprojw", "lnfw", "lm_head")
EPS = 1e-5  # set by main: 1e-6 with --qwen


def init_params(gen):
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    p = {
        "wte": normal(Vp, C), "ln1w": 1 + normal(L, C, std=0.1), "qkvw": normal(L, (H + 2 * KV) * D, C, std=0.1),
        "attprojw": normal(L, C, C, std=0.05), "ln2w": 1 + normal(L, C, std=0.1), "fcw": normal(L, 2 * F, C, std=0.1),
        "fcprojw": normal(L, C, F, std=0.05), "lnfw": 1 + normal(C, std=0.1), "lm_head": normal(Vp, C, std=0.1),
    }
    p["wte"][V:] = 0
    p["lm_head"][V:] = 0
    return {k: v.float().double().requires_grad_(True) for k, v in p.items()}


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def rope(x, pos):  # x: (B, T, heads, D); rotate-half pairs (i, i + D/2)
    half = D // 2
    inv = THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / D)
    ang = pos[:, :, None, None].double() * inv  # (B, T, 1, half)
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def forward(p, idx, tgt):
    pos = torch.arange(T).expand(B, T)
    x = p["wte"][idx]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = rmsnorm(x, p["ln1w"][l])
        qkv = h @ p["qkvw"][l].T
        if "qkvb" in p:
            qkv = qkv + p["qkvb"][l]
        qkv = qkv.view(B, T, H + 2 * KV, D)
        q, k, v = qkv[:, :, :H], qkv[:, :, H:H + KV], qkv[:, :, H + KV:]
        q, k = rope(q, pos), rope(k, pos)
        rep = H // KV
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T
        h = rmsnorm(x, p["ln2w"][l])
        u = h @ p["fcw"][l].T
        gate, up = u[..., :F], u[..., F:]
        x = x + (torch.nn.functional.silu(gate) * up) @ p["fcprojw"][l].T
    logits = rmsnorm(x, p["lnfw"]) @ p["lm_head"][:V].T
    return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1), ignore_index=-1)


def main():
    global EPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen", action="store_true", help="q/k/v bias and RMSNorm eps 1e-6 (Qwen 2)")
    qwen = ap.parse_args().qwen
    EPS = 1e-6 if qwen else 1e-5
    out = os.path.join(DATA, "qwen_tiny_ref.bin" if qwen else "llama_tiny_ref.bin")
    order = QWEN_ORDER if qwen else ORDER
    gen = torch.Generator().manual_seed(20261130)
    p = init_params(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    tgt[0, 3] = tgt[1, 0] = tgt[1, 7] = -1
    if qwen:  # drawn last: the llama file's draws stay as they were
        p["qkvb"] = (torch.randn(L, (H + 2 * KV) * D, generator=gen) * 0.5).float().double().requires_grad_(True)
    loss = forward(p, idx, tgt)
    loss.backward()
    header = np.zeros(256, dtype=np.int32)
    header[:14] = [20261130, 1, B, T, L, C, H, KV, V, Vp, F, THETA, int(qwen), 6 if qwen else 0]
    with open(out, "wb") as f:
        f.write(header.tobytes())
        for name in order:
            f.write(p[name].detach().numpy().astype(np.float32).tobytes())
        f.write(idx.numpy().astype(np.int32).tobytes())
        f.write(tgt.numpy().astype(np.int32).tobytes())
        f.write(np.array([loss.item()], dtype=np.float32).tobytes())
        for name in order:
            f.write(p[name].grad.numpy().astype(np.float32).tobytes())
    print(f"wrote {out}: loss {loss.item():.9f}")


if __name__ == "__main__":
    main()
