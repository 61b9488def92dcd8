#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (causal), forward + backward, on the same shapes and with
the same FLOP convention as bench_attention: the baseline bench/gpu_check.sh divides by.
  python3 bench/sdpa_reference.py --seqs 4096,16384 --dims 64,128 --heads 16 --dtype bf16
Prints: T D fwd_ms fwd_bwd_ms TFLOP/s (one line per shape)."""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384,65536")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    for D in map(int, a.dims.split(",")):
        for T in map(int, a.seqs.split(",")):
            q, k, v = (torch.randn(1, a.heads, T, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
            best_f = best_fb = float("inf")
            for r in range(a.reps + 1):
                s, m, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                s.record()
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                m.record()
                o.backward(torch.ones_like(o))
                e.record()
                torch.cuda.synchronize()
                if r:
                    best_f, best_fb = min(best_f, s.elapsed_time(m)), min(best_fb, s.elapsed_time(e))
                q.grad = k.grad = v.grad = None
            flops = 4.0 * T * T * D * a.heads / 2 * 3.5
            print(f"{T} {D} {best_f:.3f} {best_fb:.3f} {flops / (best_fb / 1e3) / 1e12:.2f}")


if __name__ == "__main__":
    main()
