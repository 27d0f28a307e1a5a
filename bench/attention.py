"""Fused shaped attention vs explicit-matrix shaped attention vs plain causal SDPA.

d_model 256, 4 heads, batch 8, causal, forward + backward, sequence 256 → 4096 (or --seqs).
Each (method, seq) runs in its own subprocess, so the peak resident memory it reports is that
case's alone (peak RSS minus RSS after building the inputs). Methods alternate within each
length, so the time ratios are measured side by side under the same machine load.

    python bench/attention.py [--seqs 256 512 1024 2048 4096] [--repeats 3] [--dtype float32] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

METHODS = ("sdpa", "shaped_fused", "shaped_explicit")


def rss_mib() -> float:
    """Current resident set size in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


def run_one(method: str, seq: int, repeats: int, dtype: torch.dtype, device: str) -> dict:
    """Median forward+backward seconds and peak extra memory for one case."""
    from sigprop.nn import Attention, ShapedAttention

    torch.manual_seed(0)
    d, h, b = 256, 4, 8
    attn = (Attention(d, h, causal=True) if method == "sdpa" else ShapedAttention(d, h, causal=True))
    attn = attn.to(device=device, dtype=dtype)
    x = torch.randn(b, seq, d, device=device, dtype=dtype, requires_grad=True)

    def step() -> None:
        if method == "shaped_explicit":
            a = attn.attention_matrix(x)                                      # (B, H, T, T)
            _, _, v = attn.qkv(x)
            y = attn.o_proj((a @ v).transpose(1, 2).reshape(b, seq, d))
        else:
            y = attn(x)
        y.float().square().mean().backward()

    step()                                                                    # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = rss_mib()
    peak_rss = 0.0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peak_rss = max(peak_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if device == "cuda":
        mem = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        mem = max(0.0, peak_rss - base)
    return {"method": method, "seq": seq, "seconds": sorted(times)[len(times) // 2], "peak_mib": mem}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--skip-explicit-above", type=int, default=1 << 30,
                   help="skip the explicit matrix above this length (it needs B·H·T² memory)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    p.add_argument("--one", nargs=2, metavar=("METHOD", "SEQ"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        res = run_one(args.one[0], int(args.one[1]), args.repeats, getattr(torch, args.dtype), args.device)
        print(json.dumps(res))
        return
    print(f"device {args.device}, dtype {args.dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'seq':>6} | {'sdpa s':>8} {'fused s':>8} {'explicit s':>10} | {'fused/sdpa':>10} "
          f"{'explicit/fused':>14} | {'sdpa MiB':>9} {'fused MiB':>9} {'explicit MiB':>12}")
    for seq in args.seqs:
        row = {}
        for method in METHODS:
            if method == "shaped_explicit" and seq > args.skip_explicit_above:
                continue
            out = subprocess.run([sys.executable, __file__, "--one", method, str(seq), "--repeats",
                                  str(args.repeats), "--dtype", args.dtype, "--device", args.device,
                                  "--threads", str(args.threads)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{method} at seq {seq} failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            row[method] = json.loads(out.stdout.strip().splitlines()[-1])
        s, f, e = (row.get(m, {}) for m in METHODS)
        nan = float("nan")
        print(f"{seq:6d} | {s.get('seconds', nan):8.3f} {f.get('seconds', nan):8.3f} {e.get('seconds', nan):10.3f} | "
              f"{f.get('seconds', nan) / s.get('seconds', nan):10.2f} "
              f"{e.get('seconds', nan) / f.get('seconds', nan):14.2f} | "
              f"{s.get('peak_mib', nan):9.0f} {f.get('peak_mib', nan):9.0f} {e.get('peak_mib', nan):12.0f}", flush=True)


if __name__ == "__main__":
    main()
