"""Each attention sublayer of a small Pre-LN decoder against its maps, fed the Gram matrix measured at its input.

    OMP_NUM_THREADS=1 python bench/attention_in_stack.py [--networks 512] [--d-model 64]     # ~3 min

The decoder of tests/test_predict_knobs.py (`BASE`: 3 blocks, 4 heads, 16 tokens, vocab 64, random token ids),
float64, ``networks`` independently initialized networks of 4 sequences each. At every attention sublayer the
hooks take the norm's output X (the branch's input) and the attention's output Y (before the residual add), and
average their Gram matrices XXᵀ/d and YYᵀ/d over sequences and networks. The branch's maps are then fed that
measured input: the exchangeable map (`Attention.fwd`) at its mean variance and mean token correlation, and the
per-pair map that `predict` traces causal stacks with (`sigprop.theory.moments.causal`, the mixing of a
covariance over positions) at the whole measured Gram. Errors are of the mean variance and the mean covariance of
two positions, relative to the measured ones; "s.e.": the relative standard error of the measured mean covariance
over networks; "input corr s.d.": the spread over networks of their mean input correlation, which the maps, reading
one Gram, do not follow; "each network": the per-pair map fed each network's own input Gram, its outputs averaged
(what the spread adds). So an error here is the branch map's own, not one carried up from the blocks below.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from sigprop.console import progress
from sigprop.diagnostics.commands import DiagnoseConfig, random_batch
from sigprop.models import ModelConfig, build_model
from sigprop.models.predict import model_chain
from sigprop.theory.moments import Attention, Moments
from sigprop.theory.moments.causal import _attention_pairs

BASE = dict(arch="decoder", scheme="preln", vocab_size=64, n_heads=4, n_layers=3, max_seq_len=16)
SEQUENCES = 4


def grams(cfg: ModelConfig, networks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, networks, T, T) mean Gram matrices of each attention sublayer's input and output per network, and
    (blocks, networks) each network's mean input correlation."""
    T, d = cfg.max_seq_len, cfg.d_model
    ins, outs = [], []
    got: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for seed in progress(range(networks), "networks"):
        torch.manual_seed(seed)
        model = build_model(cfg).double()
        batch = random_batch(cfg, DiagnoseConfig(seq_len=T, batch=SEQUENCES, seed=seed))
        got.clear()
        hooks = [block.attn.fn.register_forward_hook(
            lambda mod, inp, out, b=b: got.__setitem__(b, (inp[0].detach(), out.detach())))
            for b, block in enumerate(model.stack.blocks)]
        with torch.no_grad():
            model(batch)
        for h in hooks:
            h.remove()
        ins.append([(x @ x.transpose(-1, -2) / d).mean(0).numpy() for x, _ in (got[b] for b in sorted(got))])
        outs.append([(y @ y.transpose(-1, -2) / d).mean(0).numpy() for _, y in (got[b] for b in sorted(got))])
    cin, cout = np.array(ins).transpose(1, 0, 2, 3), np.array(outs).transpose(1, 0, 2, 3)
    off = ~np.eye(T, dtype=bool)
    corr = cin[..., off].mean(-1) / np.diagonal(cin, axis1=-2, axis2=-1).mean(-1)
    return cin, cout, corr


def per_pair(att: Attention, c: np.ndarray) -> tuple[Moments, np.ndarray]:
    """The moments a LayerNorm-ed input of Gram ``c`` gives the maps (its mean variance and token correlation,
    clipped at 0 where one network's is below), and the output Gram of the per-pair map on ``c``."""
    off = ~np.eye(len(c), dtype=bool)
    var = float(np.diagonal(c).mean())
    m = Moments(0.0, var, max(float(c[off].mean()) / var, 0.0), norm_disp=-2 / att.d)
    return m, _attention_pairs(att, m, c, att.fwd(m))[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--networks", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(**BASE, d_model=args.d_model)
    T, d = cfg.max_seq_len, cfg.d_model
    cin, cout, corr = grams(cfg, args.networks)
    labels, chain = model_chain(build_model(cfg, device="meta"), T, 1 / cfg.vocab_size)
    attentions = [c.branch.components[1] for lab, c in zip(labels, chain) if lab is not None and lab[1] == "attn"]
    off = ~np.eye(T, dtype=bool)
    print(f"d_model {d}, {args.networks} networks × {SEQUENCES} sequences\n")
    print("| block | input corr | input corr s.d. | measured var | measured cov (s.e.) | exchangeable: var | cov | "
          "per pair: var | cov | per pair, each network: var | cov |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b, att in enumerate(attentions):
        c_in, c_out = cin[b].mean(0), cout[b].mean(0)
        m, pairs = per_pair(att, c_in)
        out = att.fwd(m)
        each = np.mean([per_pair(att, c)[1] for c in cin[b]], 0)
        mv, mc = float(np.diagonal(c_out).mean()), float(c_out[off].mean())
        se = float(cout[b][:, off].mean(-1).std(ddof=1)) / np.sqrt(args.networks) / mc
        print(f"| {b + 1} | {m.corr:.3f} | {corr[b].std(ddof=1):.3f} | {mv:.4f} | {mc:.4f} ({se:.1%}) | "
              f"{out.var / mv - 1:+.1%} | {out.var * out.corr / mc - 1:+.1%} | "
              f"{float(np.diagonal(pairs).mean()) / mv - 1:+.1%} | {float(pairs[off].mean()) / mc - 1:+.1%} | "
              f"{float(np.diagonal(each).mean()) / mv - 1:+.1%} | {float(each[off].mean()) / mc - 1:+.1%} |")


if __name__ == "__main__":
    main()
