#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (causal), forward + backward, on the same shapes and with
the same FLOP convention as bench_attention: the baseline bench/gpu_check.sh divides by.
  python3 bench/sdpa_reference.py --seqs 4096,16384 --dims 64,128 --heads 16 --dtype bf16
Each shape is timed with PyTorch's own choice of kernel ("default"), then with each backend forced
(flash: FlashAttention-2; cudnn: cuDNN's fused attention; efficient: memory-efficient), so the
ratio can be read against a known kernel. A backend that refuses the shape prints n/a.
Prints: T D fwd_ms fwd_bwd_ms TFLOP/s backend (one line per shape and backend)."""
import argparse

import torch


def backends():
    """(name, context manager factory or None for PyTorch's choice), the ones this PyTorch has."""
    out = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older PyTorch: only its own choice
        return out
    for name, attr in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")):
        if hasattr(SDPBackend, attr):
            out.append((name, lambda b=getattr(SDPBackend, attr): sdpa_kernel(b)))
    return out


def time_shape(T, D, heads, dt, reps, ctx):
    """Best forward and forward + backward ms over `reps` timed runs after one warm-up."""
    q, k, v = (torch.randn(1, heads, T, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    # The output's gradient: random, made once outside the timing (as bench_attention's).
    do = torch.randn(1, heads, T, D, device="cuda", dtype=dt)
    best_f = best_fb = float("inf")
    for r in range(reps + 1):
        s, m, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with ctx() if ctx else torch.enable_grad():
            s.record()
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            m.record()
            o.backward(do)
            e.record()
        torch.cuda.synchronize()
        if r:
            best_f, best_fb = min(best_f, s.elapsed_time(m)), min(best_fb, s.elapsed_time(e))
        q.grad = k.grad = v.grad = None
    return best_f, best_fb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384,65536")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for D in map(int, a.dims.split(",")):
        for T in map(int, a.seqs.split(",")):
            flops = 4.0 * T * T * D * a.heads / 2 * 3.5
            for name, ctx in backends():
                try:
                    f, fb = time_shape(T, D, a.heads, dt, a.reps, ctx)
                    print(f"{T} {D} {f:.3f} {fb:.3f} {flops / (fb / 1e3) / 1e12:.2f} {name}", flush=True)
                except RuntimeError as err:  # this backend does not take the shape (or ran out of memory)
                    print(f"{T} {D} n/a n/a n/a {name}  # {str(err).splitlines()[0][:100]}", flush=True)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
