#!/usr/bin/env python3
"""Checks ulysses' Hugging Face interop against transformers itself. A tool, not a CI test: it needs
torch and transformers (pip install torch transformers safetensors), which CI does not have.

usage: python3 tools/check_hf_interop.py [--train build/train] [--keep DIR] [--archs gpt2,mistral,...]

ulysses -> HF, for gpt2, llama, llama shaped like Llama 3.2 (RoPE scaling, tied embeddings), llama
with YaRN, Qwen 2 (q/k/v bias, RMSNorm eps 1e-6, tied, YaRN; Qwen2ForCausalLM), llama with a
sliding window of 8 keys (MistralForCausalLM) and Qwen 2 with that window on every layer: train a
tiny model for a few steps on a text file, export it with
  --export-safetensors DIR/model.safetensors, load DIR with AutoModelForCausalLM.from_pretrained and
  1. greedy continuation: ulysses' --sample (KV cache) must equal argmax over HF's full-forward logits;
  2. gpt2: logits, loss and every gradient: HF computes them on a batch and writes an llm.c debug state,
     which `train --checkpoint (the same run's --export-llmc file) --check-state` compares (PASS/FAIL).
HF -> ulysses, for the same seven: a randomly initialised HF model saved with save_pretrained loads with
  `train --checkpoint DIR/model.safetensors` (its config.json read, no ulysses metadata), and greedy
  continuations agree; the qwen2 one also saved in shards (max_shard_size) and loaded through
  DIR/model.safetensors.index.json.
The window (8) is shorter than the 32 positions of a greedy run, so it matters: with a window both
ways the greedy tokens must also DIFFER when ulysses samples with `--sliding-window 0` (the check
would otherwise pass with the window ignored).
Exit code 0 when every check passes.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MinistralConfig, MistralConfig, Qwen2Config

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PROMPT = [104, 101, 108, 108, 111, 32, 116, 104]  # "hello th"
NEW = 24
LLAMA3_SPEC = "llama3:factor=4,low=1,high=4,orig=16"
LLAMA3_HF = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 16}
# YaRN (head dim 16, theta 500, original context 16): pair 0 kept, pair 1 on the ramp, the rest
# divided by the factor; q and k scaled by the attention factor 0.1 ln 64 + 1 = 1.42 (a factor
# this large so that the check can fail: with attn=1, or truncate=0, ulysses' greedy tokens
# differed from HF's both ways; with factor 4 an attention factor of 1 went unnoticed).
YARN_SPEC = "yarn:factor=64,orig=16,beta_fast=8,beta_slow=1"
YARN_HF = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 16, "beta_fast": 8.0, "beta_slow": 1.0}
SCALED = {"llama3": (LLAMA3_SPEC, LLAMA3_HF), "yarn": (YARN_SPEC, YARN_HF)}
WINDOW = 8  # keys per query (itself included), shorter than the prompt + continuation (32 positions)
WINDOWED = ("mistral", "qwen2_swa", "ministral")
ARCHS = ("gpt2", "llama", "llama3", "yarn", "qwen2") + WINDOWED


def run(train, args):
    r = subprocess.run([train, "--threads", "1", "--quiet"] + args, capture_output=True)
    if r.returncode != 0:
        sys.exit("train failed: " + " ".join(args) + "\n" + r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace"))
    return r.stdout


def ours_greedy(train, data, ckpt, extra=()):
    out = run(train, ["--data", "text:" + data, "--steps", "0", "--seq", "32", "--batch", "1", "--checkpoint", ckpt, "--sample", str(NEW),
                      "--prompt", "ids:" + ",".join(map(str, PROMPT)), "--temperature", "0"] + list(extra))
    # vocab 256 prints one byte per token: the prompt, the continuation, a newline (at the very end)
    tail = list(out[-(len(PROMPT) + NEW + 1):-1])
    assert tail[:len(PROMPT)] == PROMPT, out
    return tail


def hf_greedy(model):
    ids, gaps = list(PROMPT), []
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            ids.append(int(logits.argmax()))
    return ids, min(gaps)


def compare_greedy(name, train, data, ckpt, model, windowed=False):
    ref, gap = hf_greedy(model)
    got = ours_greedy(train, data, ckpt)
    ok = got == ref
    print(f"{name}: greedy {NEW} tokens {'EQUAL' if ok else 'DIFFER'} (smallest top-2 logit gap {gap:.2e})")
    if not ok:
        print("  ulysses:", got, "\n  HF:     ", ref)
    if windowed:  # the control: the same model attending to every earlier token must not match
        unwindowed = ours_greedy(train, data, ckpt, ["--sliding-window", "0"])
        print(f"{name}: with --sliding-window 0, greedy tokens {'EQUAL (the window went unnoticed)' if unwindowed == ref else 'DIFFER, as they must'}")
        ok &= unwindowed != ref
    return ok


def gpt2_debug_state(model, path, B=2, T=16, seed=0):
    """An llm.c debug state (README: --check-state) computed by HF: logits, loss, grads."""
    cfg = model.config
    V, C, L = cfg.vocab_size, cfg.n_embd, cfg.n_layer
    Vp = (V + 127) // 128 * 128
    g = np.random.default_rng(seed)
    toks = g.integers(0, V, size=(B, T + 1))
    x, y = torch.tensor(toks[:, :T]), torch.tensor(toks[:, 1:])
    model.zero_grad()
    logits = model(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    loss.backward()
    p = dict(model.named_parameters())

    def grad(n, transpose=False):
        t = p["transformer." + n].grad
        return (t.T if transpose else t).detach().numpy()

    def stack(n, transpose=False):
        return np.stack([grad(f"h.{l}.{n}", transpose) for l in range(L)])

    wte = np.zeros((Vp, C), np.float32)
    wte[:V] = grad("wte.weight")
    grads = [wte, grad("wpe.weight"), stack("ln_1.weight"), stack("ln_1.bias"), stack("attn.c_attn.weight", True),
             stack("attn.c_attn.bias"), stack("attn.c_proj.weight", True), stack("attn.c_proj.bias"), stack("ln_2.weight"),
             stack("ln_2.bias"), stack("mlp.c_fc.weight", True), stack("mlp.c_fc.bias"), stack("mlp.c_proj.weight", True),
             stack("mlp.c_proj.bias"), grad("ln_f.weight"), grad("ln_f.bias")]
    header = np.zeros(256, np.int32)
    header[:4] = [20240327, 2, B, T]
    with open(path, "wb") as f:
        for a in [header, x.numpy().astype(np.int32), y.numpy().astype(np.int32), logits.detach().numpy().astype(np.float32),
                  np.array([loss.item()], np.float32)] + grads:
            f.write(np.ascontiguousarray(a, dtype=a.dtype if a.dtype == np.int32 else np.float32).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "train"))
    ap.add_argument("--keep", help="work in this directory and keep it")
    ap.add_argument("--archs", default=",".join(ARCHS), help="a comma-separated subset of " + ",".join(ARCHS))
    a = ap.parse_args()
    archs = a.archs.split(",")
    if not archs or any(x not in ARCHS for x in archs):
        sys.exit("--archs: expected names from " + ",".join(ARCHS) + ", got " + a.archs)
    torch.manual_seed(0)
    work = a.keep or tempfile.mkdtemp(prefix="ul_hf_")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "text.txt")
    with open(data, "w") as f:
        f.write("hello there, the quick brown fox jumps over the lazy dog. " * 400)
    ok = True
    # llama3: llama with Llama 3.1's RoPE scaling, its bands set so that the 32 positions see all
    # three (head dim 16, theta 500: one pair kept-to-smoothed, the rest divided by the factor).
    # yarn: llama with YaRN. qwen2: Qwen 2's attention (q/k/v bias), RMSNorm eps 1e-6, tied, YaRN.
    # mistral: llama with a sliding window (exported as MistralForCausalLM); qwen2_swa: Qwen 2 with
    # that window on every layer (use_sliding_window, max_window_layers 0, layer_types); ministral:
    # the window on one layer of two (hybrid local/global; MinistralForCausalLM with layer_types).
    for arch in archs:  # ulysses -> HF
        d = os.path.join(work, "ours_" + arch)
        # a non-default rope theta: a config key that HF ignored would show up as different tokens
        extra = ["--export-llmc", os.path.join(d, "model.bin")] if arch == "gpt2" else ["--rope-theta", "500"]
        if arch == "llama3":  # shaped like Llama 3.2: scaled RoPE, tied embeddings
            extra += ["--rope-scaling", LLAMA3_SPEC, "--tie-embeddings"]
        if arch == "yarn":
            extra += ["--rope-scaling", YARN_SPEC]
        if arch == "qwen2":
            extra += ["--rope-scaling", YARN_SPEC, "--qkv-bias", "--norm-eps", "1e-6", "--tie-embeddings"]
        if arch in WINDOWED:
            extra += ["--sliding-window", str(WINDOW), "--norm-eps", "1e-6"]
        if arch == "qwen2_swa":
            extra += ["--qkv-bias"]
        if arch == "ministral":  # layer 1 without the window
            extra += ["--full-attention-every", "2"]
        run(a.train, ["--model", "gpt2" if arch == "gpt2" else "llama", "--data", "text:" + data, "--steps", "30", "--seq", "64", "--batch", "4",
                      "--lr", "1e-2", "--eval-batches", "1", "--export-safetensors", os.path.join(d, "model.safetensors")] + extra)
        model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").float()
        print(f"ulysses -> HF {arch}: loaded as {type(model).__name__}")
        ok &= compare_greedy(f"ulysses -> HF {arch}", a.train, data, os.path.join(d, "model.safetensors"), model,
                             arch in WINDOWED)
        if arch == "gpt2":
            state = os.path.join(d, "state.bin")
            gpt2_debug_state(model, state)
            r = subprocess.run([a.train, "--threads", "1", "--checkpoint", os.path.join(d, "model.bin"),
                                "--check-state", state, "--check-tol", "1e-4"], capture_output=True, text=True)
            print("ulysses -> HF gpt2: logits / loss / gradients vs HF (llm.c debug state, rel tol 1e-4):")
            print("  " + "\n  ".join(r.stdout.strip().splitlines()[-6:]))
            ok &= r.returncode == 0 and "PASS" in r.stdout
    for arch in archs:  # HF -> ulysses
        d = os.path.join(work, "hf_" + arch)
        if arch == "gpt2":
            cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, initializer_range=0.2,
                             bos_token_id=None, eos_token_id=None)
        elif arch == "qwen2":  # random q/k/v biases (HF initialises them to zero, which would test nothing)
            cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=500.0,
                              initializer_range=0.2, tie_word_embeddings=True, rope_scaling=YARN_HF)
        elif arch == "qwen2_swa":  # every layer slides: layers from max_window_layers (0) on
            cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=500.0,
                              initializer_range=0.2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0)
        elif arch == "ministral":  # layer 0 without the window (MinistralConfig leaves head_dim None)
            cfg = MinistralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  head_dim=16, rms_norm_eps=1e-6, rope_theta=500.0, initializer_range=0.2, sliding_window=WINDOW,
                                  layer_types=["full_attention", "sliding_attention"])
        elif arch == "mistral":
            cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=500.0,
                                initializer_range=0.2, sliding_window=WINDOW)
        else:
            cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500.0,
                              initializer_range=0.2, tie_word_embeddings=arch == "llama3",  # as Llama 3.2
                              rope_scaling=SCALED[arch][1] if arch in SCALED else None)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        if arch in ("qwen2", "qwen2_swa"):
            with torch.no_grad():
                for n, t in model.named_parameters():
                    if n.endswith("_proj.bias"):
                        t.normal_(0, 0.5)
        model.save_pretrained(d)
        ok &= compare_greedy(f"HF -> ulysses {arch}", a.train, data, os.path.join(d, "model.safetensors"), model,
                             arch in WINDOWED)
        if arch == "qwen2":  # the same model as a sharded checkpoint, as large models come
            model.save_pretrained(d + "_sharded", max_shard_size="40KB")
            shards = [f for f in os.listdir(d + "_sharded") if f.endswith(".safetensors")]
            ok &= compare_greedy(f"HF -> ulysses {arch}, {len(shards)} shards + index", a.train, data,
                                 os.path.join(d + "_sharded", "model.safetensors.index.json"), model)
    print("ALL PASS" if ok else "SOME CHECKS FAILED", "| work dir:", work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
