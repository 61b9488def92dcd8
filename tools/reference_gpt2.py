#!/usr/bin/env python3
"""Independent float64 GPT-2 reference: writes the llm.c-format files the C++ tests compare against.

A small, self-contained PyTorch GPT-2 (LayerNorm eps 1e-5, tanh GELU, learned positions, biases,
tied wte / lm_head, causal attention scaled by 1/sqrt(D)), with parameters kept directly in llm.c's
stacked layout so that the files need no renaming. Everything runs in float64 from fp32-exact
parameters, so the files hold the true values for the fp32 checkpoint up to one final rounding.

Writes into tests/data/ (run from anywhere: python3 tools/reference_gpt2.py):
  gpt2_tiny_model.bin  version 3 checkpoint, maxT=16 V=50 Vp=64 L=2 H=4 C=32
  gpt2_tiny_state.bin  debug state: B=2 T=8 inputs/targets (a few targets -1), logits, loss, grads
  gpt2_tiny_steps.txt  the loss before each of 5 AdamW updates on that same batch
With --head-dim-32 it writes gpt2_d32_model.bin and gpt2_d32_state.bin instead (C=64, H=2: head
dim 32, which the CUDA attention kernels support), for --check-state on the CUDA backend.
"""
import math
import os
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
maxT, V, Vp, L, H, C = 16, 50, 64, 2, 4, 32
NAME = "gpt2_tiny"
if "--head-dim-32" in sys.argv[1:]:
    H, C, NAME = 2, 64, "gpt2_d32"
B, T = 2, 8
LR, BETA1, BETA2, EPS, WD, STEPS = 1e-3, 0.9, 0.95, 1e-8, 0.1, 5
MATRICES = ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw")  # the only weight-decayed params
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")


def init_params(gen):
    """GPT-2 init: N(0, 0.02) matrices, residual projections N(0, 0.02/sqrt(2L)), zero biases, unit
    LayerNorm weights. Then every bias and LayerNorm parameter gets a small random offset: with the
    textbook zeros and ones, a forward that dropped a bias or swapped LayerNorm's weight and bias
    would still match the reference."""
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    proj_std = 0.02 / math.sqrt(2 * L)
    p = {
        "wte": normal(V, C), "wpe": normal(maxT, C),
        "ln1w": torch.ones(L, C), "ln1b": torch.zeros(L, C),
        "qkvw": normal(L, 3 * C, C), "qkvb": torch.zeros(L, 3 * C),
        "attprojw": normal(L, C, C, std=proj_std), "attprojb": torch.zeros(L, C),
        "ln2w": torch.ones(L, C), "ln2b": torch.zeros(L, C),
        "fcw": normal(L, 4 * C, C), "fcb": torch.zeros(L, 4 * C),
        "fcprojw": normal(L, C, 4 * C, std=proj_std), "fcprojb": torch.zeros(L, C),
        "lnfw": torch.ones(C), "lnfb": torch.zeros(C),
    }
    for name in p:
        if name not in MATRICES:
            p[name] = p[name] + normal(*p[name].shape, std=0.1)
    # Round to fp32 and back: the float64 model is then exact for the fp32 checkpoint.
    return {k: v.float().double().requires_grad_(True) for k, v in p.items()}


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as in GPT-2
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, idx, tgt):
    """idx, tgt: (B, T) int64; returns logits (B, T, V) and the mean loss over targets != -1."""
    Bn, Tn = idx.shape
    D = C // H
    x = p["wte"][idx] + p["wpe"][:Tn]                             # (B, T, C)
    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]                   # (B, T, 3C): q | k | v
        q, k, v = (t.view(Bn, Tn, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))  # (B, H, T, D)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)           # (B, H, T, T)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu(h @ p["fcw"][l].T + p["fcb"][l])                 # (B, T, 4C)
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].T                                       # tied lm_head, (B, T, V)
    valid = tgt != -1
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    loss = nll[valid].sum() / valid.sum()
    return logits, loss


def padded(name, t):
    """The llm.c layout: wte has Vp rows, the pad rows zero."""
    t = t.detach()
    if name == "wte":
        t = torch.cat([t, torch.zeros(Vp - V, C)])
    return t.numpy().astype("<f4").ravel()


def header(*values):
    h = np.zeros(256, dtype="<i4")
    h[: len(values)] = values
    return h


def main():
    gen = torch.Generator().manual_seed(20240326)
    p = init_params(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    tgt[0, 2] = tgt[1, 0] = tgt[1, 5] = -1  # ignored targets must drop out of the loss and its mean

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, NAME + "_model.bin"), "wb") as f:
        header(20240326, 3, maxT, V, L, H, C, Vp).tofile(f)
        for name, t in p.items():
            padded(name, t).tofile(f)

    logits, loss = forward(p, idx, tgt)
    loss.backward()
    with open(os.path.join(OUT, NAME + "_state.bin"), "wb") as f:
        header(20240327, 2, B, T).tofile(f)
        idx.numpy().astype("<i4").tofile(f)
        tgt.numpy().astype("<i4").tofile(f)
        logits.detach().numpy().astype("<f4").tofile(f)
        np.array([loss.item()], dtype="<f4").tofile(f)
        for name, t in p.items():
            padded(name, t.grad).tofile(f)

    if NAME != "gpt2_tiny":
        return
    # AdamW: bias-corrected moments, decoupled weight decay on the matrices only, constant lr.
    m = {k: torch.zeros_like(t) for k, t in p.items()}
    v = {k: torch.zeros_like(t) for k, t in p.items()}
    losses = []
    for step in range(1, STEPS + 1):
        for t in p.values():
            t.grad = None
        _, loss = forward(p, idx, tgt)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for k, t in p.items():
                g = t.grad
                m[k].mul_(BETA1).add_((1 - BETA1) * g)
                v[k].mul_(BETA2).add_((1 - BETA2) * g * g)
                mhat = m[k] / (1 - BETA1 ** step)
                vhat = v[k] / (1 - BETA2 ** step)
                decay = WD * t if k in MATRICES else 0.0
                t.sub_(LR * (mhat / (vhat.sqrt() + EPS) + decay))
    with open(os.path.join(OUT, "gpt2_tiny_steps.txt"), "w") as f:
        f.write(f"# loss before each of {STEPS} AdamW updates on the state's batch: lr {LR} constant, "
                f"betas {BETA1}/{BETA2}, eps {EPS}, weight decay {WD} decoupled on {'/'.join(MATRICES)} only, "
                "bias-corrected, no clipping\n")
        for x in losses:
            f.write(f"{x:.9f}\n")
    print("loss", losses[0], "->", losses[-1])


if __name__ == "__main__":
    main()
