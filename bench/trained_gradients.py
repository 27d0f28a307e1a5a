"""Where a trained run's gradient goes through depth, and what subnormal floats cost on the CPU.

For each run folder (a `sigprop train` or sweep point with a checkpoint): one batch of 8 × seq_len random
tokens (seed 0), cross-entropy on the tokens themselves, one backward pass, in float32; prints, every
L/8 blocks, the largest |gradient| entry of the block's parameters, for a fresh initialization of the run's
config (seed 100) and for its newest checkpoint, and the number of gradient entries of the checkpoint that
are subnormal (0 < |g| < 1.2e-38). Then the forward + backward time of the checkpoint with
`torch.set_flush_denormal` off, on, and off again (best of 3, one thread), which shows whether those
entries slow its steps down.

For a Post-LN stack (standard, DSLM, Admin), also the shortcut factors: a sublayer y = N(α⊙x + βf(x)) passes
its output gradient to x, along the shortcut, times s = rms(α⊙x)/rms(α⊙x + βf(x)) (the norm divides by the
sum's scale; Admin's ω is α), so the gradient of block b relative to the top block falls like the product of
s over the sublayers above b, printed (log10) at the same blocks for the fresh and the trained model: the
branches that grow during training (βf against α⊙x) make each s < 1, and over hundreds of sublayers the
product vanishes.

    OMP_NUM_THREADS=1 python bench/trained_gradients.py RUN_DIR [RUN_DIR ...]
"""
from __future__ import annotations

import argparse
import math
import re
import time

import torch
from torch import nn

from sigprop.diagnostics.shortcut import post_sublayers, shortcut_factors
from sigprop.models import build_model
from sigprop.train.run import load_run, seed_everything

TINY = torch.finfo(torch.float32).tiny


def block_gradients(model: nn.Module, ids: torch.Tensor) -> tuple[dict[int, float], int]:
    """(block index → largest |grad| entry of its parameters, count of subnormal gradient entries)."""
    model.zero_grad()
    out = model(ids)
    logits = out if torch.is_tensor(out) else out[0]
    nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1)).backward()
    largest: dict[int, float] = {}
    subnormal = 0
    for name, p in model.named_parameters():
        m = re.search(r"blocks\.(\d+)\.", name)
        if p.grad is None:
            continue
        subnormal += int(((p.grad != 0) & (p.grad.abs() < TINY)).sum())
        if m:
            b = int(m.group(1))
            largest[b] = max(largest.get(b, 0.0), p.grad.abs().max().item())
    return largest, subnormal


def block_shortcut_factors(model: nn.Module, ids: torch.Tensor) -> list[tuple[int, float]]:
    """(block index, s) for every Post-LN sublayer in forward order (`sigprop.diagnostics.shortcut`), on ``ids``."""
    names = {id(m): n for n, m in model.named_modules()}
    blocks = [int(re.search(r"blocks\.(\d+)\.", names[id(s)] + ".").group(1)) for s in post_sublayers(model)]
    with torch.no_grad(), shortcut_factors(model) as found:
        model(ids)
    return list(zip(blocks, found))


def attenuation(factors: list[tuple[int, float]]) -> dict[int, float]:
    """Block → log10 of the product of the shortcut factors of the sublayers above it (its own included)."""
    out, total = {}, 0.0
    for block, s in reversed(factors):
        total += math.log10(s)
        out[block] = total
    return out


def step_time(model: nn.Module, ids: torch.Tensor, repeats: int = 3) -> float:
    """Best forward + backward wall time of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        block_gradients(model, ids)
        best = min(best, time.perf_counter() - start)
    return best


def row(largest: dict[int, float]) -> str:
    n = max(largest) + 1
    return "  ".join(f"{b}: {largest[b]:.1e}" for b in range(0, n, max(1, n // 8)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run folders with a checkpoint")
    args = p.parse_args()
    torch.set_num_threads(1)
    for run in args.runs:
        cfg, trained, ckpt = load_run(run)
        ids = torch.randint(0, cfg.model.vocab_size, (8, cfg.data.seq_len), generator=torch.Generator().manual_seed(0))
        seed_everything(100)
        fresh = build_model(cfg.model).train()
        trained.train()
        m = cfg.model
        print(f"== {run}: {m.scheme} {m.norm_placement}, {m.n_layers} × {m.d_model}, lr {cfg.optim.lr:g}, {ckpt.name}")
        print(f"init     max |grad| by block: {row(block_gradients(fresh, ids)[0])}")
        largest, subnormal = block_gradients(trained, ids)
        print(f"trained  max |grad| by block: {row(largest)}   subnormal entries: {subnormal}")
        for label, model in (("init", fresh), ("trained", trained)):
            factors = block_shortcut_factors(model, ids)
            if factors:                                                     # a Post-LN stack
                att = attenuation(factors)
                n = max(att) + 1
                print(f"{label:8s} log10 Π s above block: " + "  ".join(f"{b}: {att[b]:+.1f}"
                                                                         for b in range(0, n, max(1, n // 8))))
        times = []
        for flush in (False, True, False):
            torch.set_flush_denormal(flush)
            times.append(step_time(trained, ids))
        torch.set_flush_denormal(False)
        print(f"trained  forward + backward s: flush off {times[0]:.2f}, on {times[1]:.2f}, off {times[2]:.2f}")


if __name__ == "__main__":
    main()
