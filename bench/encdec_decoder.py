"""An encoder–decoder's decoder: traced per pair of positions through its cross-attention sublayers, or with one
correlation for every pair, against measurement; and one Post-LN cross-attention sublayer alone.

    OMP_NUM_THREADS=1 python bench/encdec_decoder.py            # 3 configs × 256 networks, then the sublayer, ~2 min

Cross-attention reads each decoder position's own query and the memory, so `sigprop.theory.moments.causal` takes it
as a tokenwise map in the forward per pair of positions, and the decoder of an encoder–decoder is traced as a plain
decoder's (per pair forward, per position backward). The configs, networks and inputs of tests/test_predict_archs.py
(width 64, 4 (+4) layers, 16 tokens, float64, network s seeded with s). Per decoder record: the measured gradient
variance and token correlation (mean over the networks), and the error of `predict` beside that of the decoder traced
with the exchangeable forward (one correlation for all pairs of positions) and the per-position backward on it (a
Post-LN decoder short of collapse would take the exchangeable backward, `postnorm.trace_bwd`).

The sublayer: y = LN(x + Cross(x, memory)) at the first decoder block's state of the Post-LN config (input token
correlation and memory correlation as the maps trace them, Gaussian tokens behind a LayerNorm, the weights' stds of
the model), the upstream gradient independent N(0, 1) made ⊥ {1, y_i} and rescaled to unit variance, as a next
Post-LN sublayer sends it: its mean input gradient variance over 4000 samples against the exchangeable and the
per-position map. Then the same sublayer inside the model (`cross_in_stack`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from sigprop.console import progress
from sigprop.diagnostics import measure
from sigprop.diagnostics.measure import random_projection_loss
from sigprop.models import build_model, predict
from sigprop.models.predict import COLLAPSED_CORR, encoder_chain, model_chain
from sigprop.theory.moments import Dropout, Moments, PostNormResidual, causal, serial
from sigprop.theory.moments.cross_attention import QueryView
from sigprop.theory.moments.postnorm import trace_bwd
from sigprop.theory.moments.state import replace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_predict_archs import SEEDS, config, model_input  # noqa: E402

START = Moments(0.0, 1.0, 0.0)
SAMPLES = 4000


def decoder_chain(cfg):
    """The decoder's labels and chain on the memory the encoder's maps trace, and its exchangeable forward."""
    model = build_model(cfg, device="meta")
    L, collision = cfg.max_seq_len, 1 / cfg.vocab_size
    memory = serial(*encoder_chain(model, L, collision)[1]).trace(START)[-1]
    labels, chain = model_chain(model, L, collision, memory)
    return labels, chain, serial(*chain).trace(START)


def exchangeable(cfg, chain, states) -> list[Moments]:
    """The decoder traced with one correlation for every pair of positions: the per-position backward on the
    exchangeable forward, or, for a Post-LN decoder short of collapse, the exchangeable backward (as `predict`
    chooses for a chain the forward per pair does not cover)."""
    g_out = replace(START, grad_var=1.0, grad_corr=0.0)
    if cfg.scheme == "postln" and max(m.corr for m in states) < COLLAPSED_CORR:
        return trace_bwd(chain, states, g_out)
    return causal.position_trace(chain, states, g_out, cfg.max_seq_len, pairs=False)


def decoder_table(name: str) -> None:
    cfg = config("encdec", name)
    labels, chain, states = decoder_chain(cfg)
    flat = [m for lab, m in zip(labels, exchangeable(cfg, chain, states)[1:]) if lab is not None]
    pred = [r for r in predict(cfg, token_collision=1 / cfg.vocab_size) if r.stack == "dec"]
    runs = []
    for seed in progress(range(SEEDS["encdec"]), f"{name} networks"):
        torch.manual_seed(seed)
        records = measure(build_model(cfg).double(), model_input(cfg), seed=seed, attention_stats=False)
        runs.append([(r.grad_var, r.token_corr) for r in records if r.stack == "dec"])
    grad, corr = np.array(runs).mean(0).T
    print(f"\n{name}: decoder records, {SEEDS['encdec']} networks\n")
    print("| record | gradient | per pair | one correlation | token corr | per pair | one correlation |")
    print("|---|---|---|---|---|---|---|")
    for r, f, g, c in zip(pred, flat, grad, corr):
        print(f"| {r.layer} {r.sublayer} | {g:.4g} | {r.grad_var / g - 1:+.1%} | {f.grad_var / g - 1:+.1%} | {c:.3f} | "
              f"{r.token_corr - c:+.3f} | {f.corr - c:+.3f} |")


def cross_sublayer() -> None:
    cfg = config("encdec", "postln")
    labels, chain, states = decoder_chain(cfg)
    i = labels.index((1, "cross"))
    sub, m = chain[i], states[i]
    view = causal.parts(sub.branch)[0]
    att, rm = view.attention, view.memory.corr
    d, H, L, S, n = att.d, att.n_heads, att.T, att.S, SAMPLES
    gen = torch.Generator().manual_seed(3)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)      # noqa: E731
    ln = lambda t: torch.nn.functional.layer_norm(t, (d,))                     # noqa: E731
    x = ln(m.corr ** 0.5 * randn(n, 1, d) + (1 - m.corr) ** 0.5 * randn(n, L, d)).requires_grad_(True)
    mem = ln(rm ** 0.5 * randn(n, 1, d) + (1 - rm) ** 0.5 * randn(n, S, d))
    wq, wk, wv, wo = (randn(n, d, d) * v ** 0.5 for v in (att.q_var, att.k_var, att.v_var, att.o_var))
    heads = lambda t, k: t.view(n, k, H, d // H).transpose(1, 2)                # noqa: E731
    logits = heads(x @ wq, L) @ heads(mem @ wk, S).transpose(-1, -2) / (d // H) ** 0.5
    y = ln(x + (logits.softmax(-1) @ heads(mem @ wv, S)).transpose(1, 2).reshape(n, L, d) @ wo)
    g = randn(n, L, d)
    g = g - g.mean(-1, keepdim=True)
    yd = y.detach()
    g = (g - (g * yd).sum(-1, keepdim=True) * yd / (yd * yd).sum(-1, keepdim=True)) * (d / (d - 2)) ** 0.5
    (y * g).sum().backward()
    per = (x.grad ** 2).mean((1, 2))
    emp, se = float(per.mean()), float(per.std()) / n ** 0.5
    alone = PostNormResidual(sub.alpha, sub.beta, serial(QueryView(att, view.memory), Dropout(0.0)), d)
    ex = alone.bwd(replace(m, var=1.0), replace(m, var=1.0, grad_var=1.0, grad_corr=0.0)).grad_var
    pos = float(np.trace(causal.position_bwd(alone, replace(m, var=1.0), np.eye(L), np.ones(L)))) / L
    print(f"\nOne Post-LN cross sublayer (first decoder block: token corr {m.corr:.3f}, memory corr {rm:.3f}), "
          f"{n} samples\n")
    print("| input gradient variance | value | error |\n|---|---|---|")
    print(f"| measured | {emp:.4f} (s.e. {se:.4f}) | |")
    print(f"| exchangeable map | {ex:.4f} | {ex / emp - 1:+.1%} |")
    print(f"| per-position map | {pos:.4f} | {pos / emp - 1:+.1%} |")


def cross_in_stack() -> None:
    """The first block's Post-LN cross sublayer inside the model: its map fed the measured gradient covariance at
    its output, against the measured one at its input, and its norm's input K_i = |P(x_i + f_i)|²/d beside the
    map's (E K and E[1/K]·E K, which its gain reads)."""
    cfg = config("encdec", "postln")
    labels, chain, _ = decoder_chain(cfg)
    states, _, inner, spreads = causal.pair_forward(chain, START, cfg.max_seq_len)
    i = labels.index((1, "cross"))
    sub, m = chain[i], states[i]
    f = sub.branch.trace(m)[-1]
    ek, _, v, _, _ = sub._stats(m, f.var, f.corr)
    g_in, g_out, ks, mem_corr, f_var = [], [], [], [], []
    for seed in progress(range(SEEDS["encdec"]), "cross sublayer networks"):
        torch.manual_seed(seed)
        model = build_model(cfg).double()
        keep: dict[str, torch.Tensor] = {}
        site = model.decoder.blocks[0].cross

        def enter(module, args, kwargs, keep=keep):
            args[0].retain_grad()
            keep.update(x=args[0], memory=kwargs["kv"].detach())

        def leave(module, args, out, keep=keep):
            out.retain_grad()
            keep["y"] = out
        site.register_forward_pre_hook(enter, with_kwargs=True)
        site.register_forward_hook(leave)
        site.fn.register_forward_hook(lambda module, args, out, keep=keep: keep.update(f=out.detach()))
        random_projection_loss(model(*model_input(cfg)), seed).backward()
        gx, gy = keep["x"].grad[0], keep["y"].grad[0]
        g_in.append((gx @ gx.T).numpy() / cfg.d_model)
        g_out.append((gy @ gy.T).numpy() / cfg.d_model)
        z = keep["x"].detach()[0] + keep["f"][0]
        ks.append(((z - z.mean(-1, keepdim=True)) ** 2).mean(-1).numpy())
        mem = keep["memory"][0] - keep["memory"][0].mean()
        gram = mem @ mem.T
        mem_corr.append(float((gram.sum() - gram.trace()) / gram.trace() / (len(gram) - 1)))
        f_var.append(float((keep["f"][0] ** 2).mean()))
    G_in, G_out, K = np.mean(g_in, 0), np.mean(g_out, 0), np.array(ks)
    mapped = causal.position_bwd(sub, m, G_out, None, inner[i], spreads[i])
    print(f"\nThe first block's Post-LN cross sublayer in the model, {SEEDS['encdec']} networks: its map fed the "
          "measured output gradient covariance\n")
    print("| quantity | measured | map | error |\n|---|---|---|---|")
    gain, gain_map = np.trace(G_in) / np.trace(G_out), np.trace(mapped) / np.trace(G_out)
    print(f"| gradient gain (input over output) | {gain:.4f} | {gain_map:.4f} | {gain_map / gain - 1:+.1%} |")
    print(f"| branch variance | {np.mean(f_var):.4f} | {f.var:.4f} | {f.var / np.mean(f_var) - 1:+.1%} |")
    print(f"| norm input E K | {K.mean():.4f} | {ek:.4f} | {ek / K.mean() - 1:+.1%} |")
    print(f"| norm input E[1/K]·E K | {(1 / K).mean() * K.mean():.4f} | {1 + v:.4f} | |")
    print(f"| memory token correlation (s.d. over networks) | {np.mean(mem_corr):.3f} ({np.std(mem_corr):.3f}) | "
          f"{sub.branch.components[0].memory.corr:.3f} | |")


def main() -> None:
    torch.set_num_threads(1)
    for name in ("preln", "postln", "dslm-preln"):
        decoder_table(name)
    cross_sublayer()
    cross_in_stack()


if __name__ == "__main__":
    main()
