"""Benchmark `sigprop.models.predict` at 48, 192 and 1000 layers, seq_len 32 and 128.

    OMP_NUM_THREADS=1 python bench/predict.py            # prints the tables of bench/RESULTS.md
    OMP_NUM_THREADS=1 python bench/predict.py --rounds 3 # each timing the least of 3 fresh processes
    OMP_NUM_THREADS=1 python bench/predict.py --gram     # where one DSLM Gram sample's time goes

Cold = a fresh process (imports excluded): the model built on the meta device, the scheme's init rule
(DSLM's Gram recursion over the blocks, its attention Gram sampled every ⌊0.01/β²⌋ blocks: every block up to 192,
every 10th at 1000), the softmax-functional table for (seq_len, causal), the maps and, in a causal stack, the
per-position backward; warm = the same call again in that process (tables and the scheme's per-config recursion
cached, per-input caches cleared); each as wall time and as the process's CPU time (single-threaded: the wall time
less the waiting for a core on a shared machine). Also: one attention map by the exact quadrature vs the table, the
table build per (L, causal), and the table's accuracy; and, for the 1000-layer configs, where a cold call's CPU
time goes (`phases`). With ``--rounds R`` every timed figure is the least over R fresh processes (other jobs on a
shared machine only ever add time).
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

CONFIGS = [("preln", None), ("postln", None), ("dslm", "pre"), ("dslm", "post")]
LAYERS, SEQS = (48, 192, 1000), (32, 128)
SIZE = {"arch": "decoder", "d_model": 256, "n_heads": 4, "max_seq_len": 128, "vocab_size": 50257}


def one(scheme: str, placement: str | None, layers: int, seq: int) -> tuple[float, float, float, float]:
    """Wall and CPU seconds of this process for a first and a second predict: (cold wall, warm wall, cold CPU,
    warm CPU). On a shared machine the wall time includes waiting for a core; the CPU time does not."""
    from sigprop.models import ModelConfig, predict
    cfg = ModelConfig(scheme=scheme, norm_placement=placement, n_layers=layers, **SIZE)
    wall, cpu = [], []
    for _ in range(2):
        t, c = time.perf_counter(), time.process_time()
        predict(cfg, seq_len=seq)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        clear_input_caches()
    return wall[0], wall[1], cpu[0], cpu[1]


def phases(scheme: str, placement: str | None, layers: int, seq: int) -> list[float]:
    """CPU seconds of the parts of a cold call, in this process, in the order `predict` takes them: the scheme's init
    rule (DSLM's Gram recursion, which `build_model` would otherwise run; 0 for the others), the meta-device build,
    the softmax-functional table for (seq, causal), the chain of maps, the forward and backward through it (for a
    Pre-LN stack the forward per pair of positions)."""
    from sigprop.models import ModelConfig, build_model
    from sigprop.models.build import gc_paused
    from sigprop.models.predict import model_chain, trace
    from sigprop.schemes import dslm
    from sigprop.theory.moments.tables import functional_table
    cfg = ModelConfig(scheme=scheme, norm_placement=placement, n_layers=layers, **SIZE)
    marks = [time.process_time()]
    with gc_paused():
        if scheme == "dslm":
            dslm.block_correlations(cfg, "dec")
        marks.append(time.process_time())
        model = build_model(cfg, device="meta")
        marks.append(time.process_time())
        functional_table(seq, True)
        marks.append(time.process_time())
        _, chain = model_chain(model, seq)
        marks.append(time.process_time())
        trace(chain, model.stack.placement, True, seq)
        marks.append(time.process_time())
    return [b - a for a, b in zip(marks, marks[1:])]


def clear_input_caches() -> None:
    """Forget every per-input result (the softmax-functional tables stay)."""
    from sigprop.theory.moments import attention, blocks
    for cached in (attention._functionals, blocks._forward_states, attention.row_profiles):
        cached.cache_clear()


def fresh(mode: str, scheme: str, placement: str | None, layers: int, seq: int, rounds: int) -> list[float]:
    """`one` or `phases` (``mode``) in ``rounds`` fresh processes, each figure the least over them."""
    runs = [[float(x) for x in subprocess.run([sys.executable, __file__, mode, scheme, str(placement), str(layers),
                                               str(seq)], check=True, capture_output=True, text=True).stdout.split()]
            for _ in range(rounds)]
    return [min(column) for column in zip(*runs)]


def gram_parts(repeats: int = 20) -> None:
    """Where one DSLM Gram sample's time goes: `sigprop.theory.dslm.attention_gram` at the 1000-layer configs' size
    (8 sequences × 2 heads of 128 tokens, width 256, 4 heads, causal, float32), whole and its steps one by one (each
    the least of ``repeats`` calls, ms, this process's threads)."""
    import math

    import torch

    from sigprop.theory.dslm import _cholesky, attention_gram

    s, t, d, heads, draws = 8, 128, 256, 4, 2
    dk, gen = d // heads, torch.Generator().manual_seed(0)
    vhat = (0.5 * torch.eye(t, dtype=torch.float64) + 0.5)[None].repeat(s, 1, 1)
    chol = _cholesky(vhat).to(torch.float32)[:, None]
    z = torch.randn(s, draws, t, d, generator=gen)
    x = chol @ z
    w = torch.randn(s, draws, d, dk, generator=gen) / math.sqrt(d)
    q = x @ w
    logits = q @ q.transpose(-1, -2) / math.sqrt(dk)
    mask = ~torch.ones(t, t, dtype=torch.bool).tril()
    a = logits.masked_fill(mask, float("-inf")).softmax(-1)
    ax = a @ x
    parts = {
        "whole sample": lambda: attention_gram(vhat, d, heads, True, draws, gen),
        "Gaussians: tokens": lambda: torch.randn(s, draws, t, d, generator=gen),
        "Gaussians: query and key weights": lambda: [torch.randn(s, draws, d, dk, generator=gen) for _ in range(2)],
        "Cholesky factors (float64)": lambda: _cholesky(vhat),
        "tokens L Z": lambda: chol @ z,
        "row norms": lambda: x * (math.sqrt(d) / x.norm(dim=-1, keepdim=True)),
        "queries and keys": lambda: [x @ w for _ in range(2)],
        "logits": lambda: q @ q.transpose(-1, -2) / math.sqrt(dk),
        "mask and softmax": lambda: logits.masked_fill(mask, float("-inf")).softmax(-1),
        "A X": lambda: a @ x,
        "Gram of A X": lambda: (ax @ ax.transpose(-1, -2) / d).mean(1).to(torch.float64),
    }
    print("| one DSLM Gram sample | ms |\n|---|---|")
    for name, run in parts.items():
        run()
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        print(f"| {name} | {1e3 * best:.2f} |")


def main(rounds: int = 1) -> None:
    from sigprop.theory.moments import Attention, Moments, attention
    from sigprop.theory.moments.tables import BETA_MAX, PAIR_KEYS, ROW_KEYS, FunctionalTable, exact_pairs, exact_rows

    print("| config (decoder, d 256) | layers | seq_len | cold s | warm s | cold CPU s | warm CPU s |"
          "\n|---|---|---|---|---|---|---|")
    for scheme, placement in CONFIGS:
        for layers in LAYERS:
            for seq in SEQS:
                out = fresh("--one", scheme, placement, layers, seq, rounds)
                print(f"| {scheme} {placement or ''} | {layers} | {seq} | " + " | ".join(f"{x:.2f}" for x in out)
                      + " |", flush=True)

    print("\n| cold CPU s, decoder d 256 | layers | seq_len | init rule | meta build | table | maps | forward and "
          "backward | total |\n|---|---|---|---|---|---|---|---|---|")
    for scheme, placement in CONFIGS:
        for seq in SEQS:
            out = fresh("--phases", scheme, placement, LAYERS[-1], seq, rounds)
            print(f"| {scheme} {placement or ''} | {LAYERS[-1]} | {seq} | " + " | ".join(f"{x:.2f}" for x in out)
                  + f" | {sum(out):.2f} |", flush=True)

    print("\n| one causal attention map, L | exact s | table s (warm) | table build s |\n|---|---|---|---|")
    for L in (64, 128):
        m, kw = Moments(0.0, 1.0, 0.3), {"d": 256, "n_heads": 4, "L": L, "q_var": 1 / 256, "k_var": 1 / 256,
                                          "v_var": 1 / 256, "o_var": 1 / 256, "causal": True}
        t = time.perf_counter()
        Attention(**kw, exact=True).fwd(m)
        exact = time.perf_counter() - t
        t = time.perf_counter()
        FunctionalTable(L, True)
        build = time.perf_counter() - t
        Attention(**kw).fwd(m)
        attention._functionals.cache_clear()
        t = time.perf_counter()
        Attention(**kw).fwd(Moments(0.0, 1.0, 0.31))
        print(f"| {L} | {exact:.3f} | {time.perf_counter() - t:.5f} | {build:.2f} |")

    print("\n| table (L, causal) | max rel err rows | max rel err K1, CK | max err K2 / max abs K2 |"
          "\n|---|---|---|---|")
    rng = np.random.default_rng(0)
    for L, causal in [(8, True), (64, True), (128, True), (128, False)]:
        table, b2, rho = FunctionalTable(L, causal), rng.uniform(0, BETA_MAX, 40) ** 2, rng.uniform(-1, 1, 40)
        rows, pairs = table.rows(b2), table.pairs(b2, rho)
        er = np.array([[exact_rows(b, L, causal)[k] for k in ROW_KEYS] for b in b2])
        ep = np.array([[exact_pairs(b, r, L, causal)[k] for k in PAIR_KEYS] for b, r in zip(b2, rho)])
        fr = np.stack([rows[k] for k in ROW_KEYS], 1)
        fp = np.stack([pairs[k] for k in PAIR_KEYS], 1)
        rel_p = np.abs(fp / ep - 1)
        print(f"| {L}, {causal} | {np.abs(fr / er - 1).max():.1e} | {rel_p[:, 0].max():.1e}, {rel_p[:, 2].max():.1e} "
              f"| {np.abs(fp[:, 1] - ep[:, 1]).max() / np.abs(ep[:, 1]).max():.1e} |")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] in ("--one", "--phases"):
        run = one if sys.argv[1] == "--one" else phases
        print(*run(sys.argv[2], None if sys.argv[3] == "None" else sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    elif "--gram" in sys.argv:
        gram_parts()
    else:
        main(int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 1)
