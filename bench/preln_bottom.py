"""Where a standard Pre-LN decoder's bottom gradient leaves `sigprop.models.predict`.

A standard Pre-LN stack starts from an embedding of variance 2/d, so the first sublayers' norms multiply the
gradient by ~d/2; an error of a few per cent in those sublayers' backward gains then shows in every point below
them, while the median over the stack's sublayers stays small. Three measurements (float64, uniform random token
ids, vocab 256, 64 tokens, 4 heads, network s seeded with s, one sequence each):

* ``stack``: a deep decoder (``--layers``, width ``--width``) measured with `sigprop.diagnostics.measure` (its
  random-projection loss) against `predict`: the median error over sublayers and the error at the bottom ones,
  with each point's Monte-Carlo standard error; beside it, the prediction with two causal rows' same-key excess
  c put on every pair of keys they read (c·Uᵀ G_off U instead of `causal._shared_keys`, whose distinct keys
  carry −c/(n − 1) as each row's sum to 1 requires);
* ``local``: each bottom sublayer's backward map fed the measured per-position gradient covariance at its output
  (`sigprop.theory.moments.causal.position_bwd`), against the measured covariance at its input: the error of the
  sublayer's own map, without what the maps above it miss;
* ``first``: the first attention sublayer of a one-block decoder alone, back-propagating a gradient drawn
  independently of the network (i.i.d. N(0, 1) per position and feature, so the maps' gradient-independence
  assumption holds exactly), at widths 64, 128 and 256: the error of its backward gain, and the alignment
  a = E[(g·û)²]·k/E|g|² of the gradient entering its norm with the norm's output direction û (k = d − 1; the
  norm's map takes a = 1: it passes a share 1 − a/k of |g|²).

    OMP_NUM_THREADS=1 python bench/preln_bottom.py [--layers 48 --width 128 --networks 64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sigprop.console import progress
from sigprop.diagnostics import measure
from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.diagnostics.measure import random_projection_loss
from sigprop.models import ModelConfig, build_model, predict
from sigprop.models.predict import model_chain
from sigprop.nn import Sublayer
from sigprop.theory.moments import Moments, causal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import shared_keys_on_every_pair  # noqa: E402

L, VOCAB, BOTTOM = 64, 256, 6


def config(layers: int, width: int) -> ModelConfig:
    return ModelConfig(scheme="preln", arch="decoder", d_model=width, n_heads=4, n_layers=layers, max_seq_len=L,
                       vocab_size=VOCAB)


def tokens(cfg: ModelConfig, seed: int) -> torch.Tensor:
    return random_batch(cfg, DiagnoseConfig(seq_len=L, batch=1, seed=seed))


def stack(layers: int, width: int, networks: int) -> None:
    """Measured against predicted gradient variance at every sublayer output."""
    cfg = config(layers, width)
    pred = [r.grad_var for r in predict(cfg, seq_len=L, token_collision=1 / VOCAB)]
    shared_keys = causal._shared_keys
    causal._shared_keys = shared_keys_on_every_pair
    try:
        every_pair = [r.grad_var for r in predict(cfg, seq_len=L, token_collision=1 / VOCAB)]
    finally:
        causal._shared_keys = shared_keys
    grads, labels = [], []
    for s in progress(range(networks), desc="stack"):
        torch.manual_seed(s)
        records = measure(build_model(cfg).double(), tokens(cfg, s), seed=s, attention_stats=False)
        grads.append([r.grad_var for r in records])
        labels = [f"{r.layer} {r.sublayer}" for r in records]
    g = np.array(grads)
    mean, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(networks) / g.mean(0)
    err, err_every = np.array(pred) / mean - 1, np.array(every_pair) / mean - 1
    print(f"\nstack: {layers} layers, width {width}, {networks} networks; median |error| over the {len(pred)} points "
          f"{np.median(np.abs(err)):.1%} ({np.median(np.abs(err_every)):.1%} with the excess on every pair of keys)"
          "\n\n| point | gradient error | s.e. | with the excess on every pair of keys |\n|---|---|---|---|")
    for lab, e, s, e_every in list(zip(labels, err, se, err_every))[:2 * BOTTOM + 1]:
        print(f"| {lab} | {e:+.1%} | {s:.1%} | {e_every:+.1%} |")


def _covariances(model: torch.nn.Module, batch: torch.Tensor, seed: int, width: int) -> np.ndarray:
    """(points, L, L): the gradient's covariance over positions (mean over features) at the embedding output and
    every sublayer output, under `measure`'s random-projection loss."""
    outs: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.retain_grad()
        outs.append(out)
    hooks = [model.embed.register_forward_hook(keep)]
    hooks += [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, Sublayer)]
    random_projection_loss(model(batch), seed).backward()
    for h in hooks:
        h.remove()
    return np.stack([(o.grad[0] @ o.grad[0].T / width).numpy() for o in outs])


def _bottom_maps(cfg: ModelConfig) -> tuple[list, Callable[[int, np.ndarray], np.ndarray]]:
    """The labels of the sublayers from the first one up, and backward(j, G): the (j + 1)-th sublayer's map of the
    gradient covariance G over positions at its output to that at its input (`causal.position_bwd` on the forward
    per pair of positions)."""
    labels, chain = model_chain(build_model(cfg, device="meta"), L, 1 / VOCAB)
    states, per, inner, spreads = causal.position_forward(chain, [Moments(0.0, 1.0, 0.0)], L)
    first = next(i for i, lab in enumerate(labels) if lab is not None and lab[0] == 1)

    def backward(j: int, G: np.ndarray) -> np.ndarray:
        k = first + j
        return causal.position_bwd(chain[k], states[k], G, per[k], inner[k], spreads[k])
    return labels[first:], backward


def local(layers: int, width: int, networks: int) -> None:
    """Each bottom sublayer's map fed the measured gradient covariance at its output."""
    cfg = config(layers, width)
    G = 0.0
    for s in progress(range(networks), desc="local"):
        torch.manual_seed(s)
        G = G + _covariances(build_model(cfg).double(), tokens(cfg, s), s, width) / networks
    labels, backward = _bottom_maps(cfg)
    print(f"\nlocal: {layers} layers, width {width}, {networks} networks\n\n"
          "| sublayer | gain measured | gain of its map | error |\n|---|---|---|---|")
    for j in range(1, 2 * BOTTOM + 1):
        g_in = backward(j - 1, G[j])
        measured, mapped = np.trace(G[j - 1]) / np.trace(G[j]), np.trace(g_in) / np.trace(G[j])
        layer, sublayer = labels[j - 1]
        print(f"| {layer} {sublayer} | {measured:.3f} | {mapped:.3f} | {mapped / measured - 1:+.1%} |")


def _first_pass(cfg: ModelConfig, seed: int) -> tuple[np.ndarray, float]:
    """One network's first attention sublayer back-propagating an independent N(0, 1) gradient: the gradient's
    covariance over positions at the embedding output, and its alignment a with the norm's output direction."""
    torch.manual_seed(seed)
    model = build_model(cfg).double()
    seen: dict[str, torch.Tensor] = {}
    sub = next(m for m in model.modules() if isinstance(m, Sublayer))

    def grab(name: str):
        def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
            out.retain_grad()
            seen[name] = out
        return hook

    def grab_input(module: torch.nn.Module, args: tuple) -> None:
        args[0].retain_grad()
        seen["normed"] = args[0]
    hooks = [model.embed.register_forward_hook(grab("embedding")), sub.register_forward_hook(grab("out")),
             sub.fn.register_forward_pre_hook(grab_input)]
    model(tokens(cfg, seed))
    for h in hooks:
        h.remove()
    noise = torch.randn(seen["out"].shape, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    (seen["out"] * noise).sum().backward()
    d = cfg.d_model
    ge = seen["embedding"].grad[0]
    g, y = seen["normed"].grad[0], seen["normed"][0].detach()
    u = y - y.mean(-1, keepdim=True)
    u = u / u.norm(dim=-1, keepdim=True)
    return (ge @ ge.T / d).numpy(), float(((g * u).sum(-1) ** 2).sum() / ((g.norm(dim=-1) ** 2).sum() / (d - 1)))


def first(widths: tuple[int, ...], networks: int) -> None:
    """The first attention sublayer alone, fed an independent gradient."""
    print("\nfirst: one block, its attention sublayer back-propagating an independent N(0, 1) gradient, "
          f"{networks} networks\n\n| width | gain measured | gain of its map | error | alignment a (s.e.) |\n"
          "|---|---|---|---|---|")
    for width in widths:
        cfg = config(1, width)
        runs = [_first_pass(cfg, s) for s in progress(range(networks), desc=f"first, width {width}")]
        measured = float(np.mean([np.trace(g) for g, _ in runs])) / L
        align = np.array([a for _, a in runs])
        mapped = np.trace(_bottom_maps(cfg)[1](0, np.eye(L))) / L
        print(f"| {width} | {measured:.2f} | {mapped:.2f} | {mapped / measured - 1:+.1%} | {align.mean():.2f} "
              f"({align.std(ddof=1) / np.sqrt(networks):.2f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--networks", type=int, default=64)
    args = parser.parse_args()
    stack(args.layers, args.width, args.networks)
    local(args.layers, args.width, args.networks)
    first((64, 128, 256), 2 * args.networks)


if __name__ == "__main__":
    main()
