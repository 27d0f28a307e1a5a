"""Each attention sublayer of a small Pre-LN decoder against its map, fed the Gram matrix measured at its input.

    OMP_NUM_THREADS=1 python bench/attention_in_stack.py [--networks 512] [--d-model 64] [--samples 16000]

The decoder of tests/test_predict_knobs.py (`BASE`: 3 blocks, 4 heads, 16 tokens, vocab 64, random token ids),
float64, ``networks`` independently initialized networks of 4 sequences each. At every attention sublayer the
hooks take the norm's output X (the branch's input) and the attention's output Y (before the residual add), and
average their Gram matrices XXᵀ/d and YYᵀ/d over sequences and networks. The per-pair map that `predict` traces
causal stacks with (`sigprop.theory.moments.causal`, the mixing of a covariance over positions) is then fed that
measured input Gram, and its output compared with three references: the measured output Gram; one causal attention
layer with the same weight variances (fresh weights per sample) on Gaussian tokens of the measured input Gram; the
same tokens behind a LayerNorm (`one_layer`). Errors are of the mean variance and the mean covariance of two
positions, relative to each reference; "s.e.": the relative standard error of a reference's mean covariance (over
networks, or over chunks of samples); "input corr s.d.": the spread over networks of their mean input correlation,
which the map, reading one Gram, does not follow; "each network": the map fed each network's own input Gram, its
outputs averaged (what the spread adds). So an error here is the branch map's own, not one carried up from the
blocks below, and the two one-layer references split it into the per-pair mixing's (Gaussian tokens) and the
normalized tokens' (behind a LayerNorm).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from attention_normalized import attention
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


def one_layer(att: Attention, c: np.ndarray, normed: bool, samples: int, seed: int = 0
              ) -> tuple[float, float, float]:
    """One causal attention layer with ``att``'s weight variances (fresh weights per sample) on Gaussian tokens of
    Gram ``c`` (X = L Z, L Lᵀ = c), or on the same tokens behind a LayerNorm: the output's mean variance, mean
    covariance of two positions, and that covariance's relative standard error over chunks of 500 samples."""
    T, d, H = len(c), att.d, att.n_heads
    gen = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(torch.from_numpy(c) + 1e-9 * torch.eye(T, dtype=torch.float64))
    chunk, pairs = 500, ~torch.eye(T, dtype=torch.bool)
    var, covs = 0.0, []
    for _ in range(samples // chunk):
        x = chol @ torch.randn(chunk, T, d, generator=gen, dtype=torch.float64)
        if normed:
            x = torch.nn.functional.layer_norm(x, (d,))
        weights = tuple(torch.randn(chunk, d, d, generator=gen, dtype=torch.float64) * v ** 0.5
                        for v in (att.q_var, att.k_var, att.v_var, att.o_var))
        y = attention(x, x, x, weights, H, causal=True)
        gram = y @ y.transpose(-1, -2) / d
        var += float(gram.diagonal(dim1=-2, dim2=-1).mean())
        covs.append(float(gram[:, pairs].mean()))
    cov = float(np.mean(covs))
    return var / len(covs), cov, float(np.std(covs, ddof=1)) / np.sqrt(len(covs)) / cov


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--networks", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(**BASE, d_model=args.d_model)
    T, d = cfg.max_seq_len, cfg.d_model
    cin, cout, corr = grams(cfg, args.networks)
    labels, chain = model_chain(build_model(cfg, device="meta"), T, 1 / cfg.vocab_size)
    attentions = [c.branch.components[1] for lab, c in zip(labels, chain) if lab is not None and lab[1] == "attn"]
    off = ~np.eye(T, dtype=bool)
    print(f"d_model {d}, {args.networks} networks × {SEQUENCES} sequences; one layer: {args.samples} samples\n")
    print("| block | input corr | input corr s.d. | measured var | measured cov (s.e.) | per-pair map: var | cov | "
          "each network: var | cov | one layer, Gaussian tokens: var | cov (s.e.) | behind a LayerNorm: var | "
          "cov (s.e.) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, att in enumerate(progress(attentions, "attention sublayers")):
        c_in, c_out = cin[b].mean(0), cout[b].mean(0)
        m, pairs = per_pair(att, c_in)
        each = np.mean([per_pair(att, c)[1] for c in cin[b]], 0)
        pv, pc = float(np.diagonal(pairs).mean()), float(pairs[off].mean())
        mv, mc = float(np.diagonal(c_out).mean()), float(c_out[off].mean())
        se = float(cout[b][:, off].mean(-1).std(ddof=1)) / np.sqrt(args.networks) / mc
        cells = [f"{b + 1}", f"{m.corr:.3f}", f"{corr[b].std(ddof=1):.3f}", f"{mv:.4f}", f"{mc:.4f} ({se:.1%})",
                 f"{pv / mv - 1:+.1%}", f"{pc / mc - 1:+.1%}", f"{float(np.diagonal(each).mean()) / mv - 1:+.1%}",
                 f"{float(each[off].mean()) / mc - 1:+.1%}"]
        for normed in (False, True):
            v, c, c_se = one_layer(att, c_in, normed, args.samples)
            cells += [f"{pv / v - 1:+.1%}", f"{pc / c - 1:+.1%} ({c_se:.1%})"]
        print("| " + " | ".join(cells) + " |", flush=True)

if __name__ == "__main__":
    main()
