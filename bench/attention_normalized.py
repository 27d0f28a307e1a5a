"""Standard attention on tokens behind a norm (|x|² = d exactly) against its maps: forward and backward by path.

    OMP_NUM_THREADS=1 python bench/attention_normalized.py        # ~10 min

`sigprop.theory.moments.attention` derives its moments for Gaussian tokens x_j = m + s e_j: split along the logit
direction û, e_j = z_j û + e_j⊥ with e_j⊥ independent of the logits, so Σ_j a_j² |e_j⊥|² averages to (d − 1)R_s
(R_s = EΣa_j²). A token behind a LayerNorm has a fixed norm, and the part of its own fluctuation that the norm fixes
is the one that carries its logit: |e_j⊥|² = |e_j|² − z_j², so the same sum averages to d·R_s − Z2
(Z2 = EΣa_j²z_j², `softmax.row_functionals`), and the output variance is lower by s²σ_v²(Z2 − R_s) (per unit
output projection, no dropout). Z2 exceeds R_s since the weights tilt toward large logits (≈ R_s(1 + 4β²) for a
logit scale β²), so at r = 0 this is an O(β²/d) share of the variance, a few per cent at d = 64.

Backward by path. The query's gradient sums its keys, Σ_l dY_l x_l (dY = Q_S δ, Q_S = diag S − SSᵀ, δ_l ∝ w_l the
key's coordinate along the value-gradient direction); its part orthogonal to the logit and value-gradient
directions has E Σ_l dY_l²|e_l⊥|², which the map takes as (d − 2)·λB for Gaussian tokens (B = E tr Q_S²). Behind a
norm |e_l⊥|² = d − z_l² − w_l², and averaging w (E[(Q_S w)_l² w_l²] = (Q_S²)_ll + 2Q_S,ll²) gives
λ(d·B − Bzz − B − 2Bd), Bzz = EΣ_l (Q_S²)_ll z_l², Bd = EΣ_l Q_S,ll²: the Q path's (d_k − 1)-fold orthogonal term
moves by λ(B − Bzz − 2Bd), negative since Bzz ≈ 1.5–2.4 B. The key's gradient Σ_i dY_ij u_i reads w_l through
δ only: E[w_l² | z_l] = (d − z_l²)/(d − 1) behind a norm, so its size-biased trace wB becomes
wB − (wBzz − wB)/(d − 1). The V path reads no token. Neither term is in the maps (`norm_terms` computes them here,
at the map's logit scale and fluctuation nodes).

Monte Carlo: one layer (4 heads, fresh N(0, 1/d) Q/K/V/O weights per sample, float64), tokens √r c + √(1 − r) e_j
(c, e_j ~ N(0, I_d)) through a LayerNorm without affine, or the same tokens without it (Gaussian); 4000 samples per
point. The maps read the LN-ed tokens at the LayerNorm map's output moments (`normalized`), the Gaussian ones at
(0, 1, r). Three tables:

* forward variance (bidirectional rows): measured on LN-ed tokens, the map's error, the map's less
  s²σ_v²(Z2 − R_s)·dσ_o²; the map's error on Gaussian tokens;
* forward covariance of two positions (bidirectional and causal rows): the measured token correlation and the
  map's error in variance, covariance and correlation, on LN-ed and on Gaussian tokens;
* backward under an output gradient drawn independently of the network, i.i.d. N(0, 1), by path (each path alone:
  the other paths' inputs detached) and whole: the input gradient's mean square on LN-ed tokens, the map's error,
  the map's with the two terms above; on Gaussian tokens, the map's error.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from sigprop.console import progress
from sigprop.theory.moments import Attention, LayerNorm, Moments, softmax
from sigprop.theory.moments.attention import gamma_nodes
from sigprop.theory.moments.tables import key_counts

H, SAMPLES = 4, 4000
POINTS = [(64, 16, 0.0), (64, 16, 0.3), (64, 16, 0.6), (64, 64, 0.0), (128, 16, 0.0), (128, 64, 0.0),
          (256, 64, 0.0)]
BACKWARD = [(64, 16, False), (64, 16, True), (64, 64, True), (128, 64, True), (256, 64, True)]
COVARIANCE = [(64, 16, 0.0, False), (64, 16, 0.3, False), (64, 16, 0.6, False), (64, 16, 0.3, True),
              (64, 16, 0.6, True), (128, 16, 0.3, True)]
GRADIENT = Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=0.0)     # at the layer's output, independent of it


def attention(xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, weights: tuple[torch.Tensor, ...], heads: int,
              causal: bool) -> torch.Tensor:
    """Multi-head attention of (S, T, d) tokens with per-sample weights (S, d, d) ``weights`` = (W_q, W_k, W_v, W_o):
    queries from ``xq``, keys from ``xk``, values from ``xv`` (the same tensor, or detached copies to keep one
    path's gradient), logits over √d_k, causal rows masked; (S, T, d)."""
    s, t, d = xq.shape
    wq, wk, wv, wo = weights

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(s, t, heads, d // heads).transpose(1, 2)

    logits = split(xq @ wq) @ split(xk @ wk).transpose(-1, -2) / (d // heads) ** 0.5
    if causal:
        logits = logits.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return (logits.softmax(-1) @ split(xv @ wv)).transpose(1, 2).reshape(s, t, d) @ wo


@lru_cache(maxsize=None)
def measured(d: int, T: int, r: float, normed: bool, causal: bool = False, backward: bool = False, seed: int = 0
             ) -> dict[str, float]:
    """Over ``SAMPLES`` layers (bidirectional or causal rows): the output's mean square ("var") and the mean
    product of two positions' outputs ("cov"); with ``backward``, the input gradient's mean square under an
    independent N(0, 1) output gradient, whole ("all") and by path ("V", "Q", "K": the path's input alone carries
    the gradient, the others' detached). Cached: the forward table and the covariance table share three points."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    chunk = 500
    paths = ("all", "V", "Q", "K") if backward else ("all",)
    total = dict.fromkeys(("all", "V", "Q", "K") if backward else ("var", "cov"), 0.0)
    pairs = ~torch.eye(T, dtype=torch.bool)

    for _ in range(SAMPLES // chunk):
        x0 = r ** 0.5 * randn(chunk, 1, d) + (1 - r) ** 0.5 * randn(chunk, T, d)
        if normed:
            x0 = torch.nn.functional.layer_norm(x0, (d,))
        wq, wk, wv, wo = (randn(chunk, d, d) * d ** -0.5 for _ in range(4))
        g = randn(chunk, T, d) if backward else None
        for path in paths:
            x = x0.clone().requires_grad_(backward)
            xq, xk, xv = (x if path in ("all", p) else x.detach() for p in ("Q", "K", "V"))
            o = attention(xq, xk, xv, (wq, wk, wv, wo), H, causal)
            if g is None:
                gram = o @ o.transpose(-1, -2) / d
                total["var"] += float(gram.diagonal(dim1=-2, dim2=-1).mean()) * chunk
                total["cov"] += float(gram[:, pairs].mean()) * chunk
            else:
                (o * g).sum().backward()
                total[path] += float((x.grad ** 2).mean()) * chunk
    return {k: v / SAMPLES for k, v in total.items()}


def normalized(d: int, r: float) -> Moments:
    """The moments of the LN-ed tokens, as the maps read them: the LayerNorm map of the Gaussian ones (|x|² = d
    exactly, token correlation the normalized tokens' mean cosine, a little below r)."""
    return LayerNorm(d).fwd(Moments(0.0, 1.0, r))


def norm_terms(att: Attention, m: Moments) -> tuple[float, float]:
    """The Q and K paths' terms for tokens behind a norm (module docstring), at the map's logit scale and its
    fluctuation nodes: λ(B − Bzz − 2Bd) in the Q path's (d_k − 1)-fold orthogonal term, and the K path's factor
    1 − (wBzz − wB)/((d − 1)wB)."""
    st = att._setup(m)
    g = att.out_proj.bwd(att._mix_fwd(m), GRADIENT)
    w, t = gamma_nodes(att.kappa(m), 6)
    f = {"B": [], "Bd": [], "Bzz": []}
    for wi in w:
        s = softmax.RowSums(st.s2 * st.u2 * wi, key_counts(int(att.L), att.causal)[0])
        diagonal = s((2, 0)) - 2 * s((3, 0)) + s((4, 0))                    # Σ_l Q_ll² per key count
        for name, value in (("B", diagonal + s((2, 0), (2, 0))), ("Bd", diagonal),
                            ("Bzz", s((2, 2)) - 2 * s((3, 2)) + s((4, 2)) + s((2, 0), (2, 2)))):
            f[name].append(float(np.mean(value)))                            # the row average
    f = {k: np.array(v) for k, v in f.items()}
    b, bd, bzz = (float(t @ f[k]) for k in ("B", "Bd", "Bzz"))
    wb, wbzz = float(t @ (w * f["B"])), float(t @ (w * f["Bzz"]))
    d, dk = att.d, att.d_k
    q = att.n_heads * att.q_var * att.k_var * st.s2 * att._lam(st, g) / att.tau2 * (1 - 1 / d) * (dk - 1)
    return q * (b - bzz - 2 * bd), 1 - (wbzz - wb) / ((d - 1) * wb)


def main() -> None:
    torch.set_num_threads(1)
    print("| d | T | r | measured (LN-ed tokens) | map | map − s²σ_v²(Z2 − R_s) | map on Gaussian tokens |")
    print("|---|---|---|---|---|---|---|")
    for d, T, r in progress(POINTS, "points"):
        att = Attention(d, H, T, 1 / d, 1 / d, 1 / d, 1 / d)
        m = normalized(d, r)
        st = att._setup(m)
        var = att.fwd(m).var
        corrected = var - st.s2 * att.v_var * (st.rows["Z2"] - st.rows["F2"]) * att.d * att.o_var
        ln, gauss = (measured(d, T, r, normed)["var"] for normed in (True, False))
        print(f"| {d} | {T} | {r} | {ln:.4f} | {var / ln - 1:+.1%} | {corrected / ln - 1:+.1%} | "
              f"{att.fwd(Moments(0.0, 1.0, r)).var / gauss - 1:+.1%} |", flush=True)
    print("\n| d | T | r | rows | LN-ed tokens: measured corr | map: var | cov | corr | "
          "Gaussian tokens: measured corr | map: var | cov | corr |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d, T, r, causal in progress(COVARIANCE, "covariance points"):
        att = Attention(d, H, T, 1 / d, 1 / d, 1 / d, 1 / d, causal=causal)
        cells = []
        for normed in (True, False):
            out = att.fwd(normalized(d, r) if normed else Moments(0.0, 1.0, r))
            got = measured(d, T, r, normed, causal)
            cells += [f"{got['cov'] / got['var']:.4f}", f"{out.var / got['var'] - 1:+.1%}",
                      f"{out.var * out.corr / got['cov'] - 1:+.1%}", f"{out.corr - got['cov'] / got['var']:+.4f}"]
        print(f"| {d} | {T} | {r} | {'causal' if causal else 'all'} | " + " | ".join(cells) + " |", flush=True)
    print("\n| d | T | rows | path | LN-ed tokens: measured | map | map with the norm terms | "
          "Gaussian tokens: measured | map |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d, T, causal in progress(BACKWARD, "backward points"):
        att = Attention(d, H, T, 1 / d, 1 / d, 1 / d, 1 / d, causal=causal)
        m = normalized(d, 0.0)
        st = att._setup(m)
        g = att.out_proj.bwd(att._mix_fwd(m), GRADIENT)
        pred = {"V": att.value_path(st, g, T)[0], "Q": att.query_path(st, g)[0], "K": att.key_path(st, g, T)[0]}
        pred["all"] = sum(pred.values())
        dq, k_factor = norm_terms(att, m)
        terms = {"V": pred["V"], "Q": pred["Q"] + dq, "K": pred["K"] * k_factor}
        terms["all"] = sum(terms.values())
        ln, gauss = (measured(d, T, 0.0, normed, causal, backward=True) for normed in (True, False))
        for path in ("V", "Q", "K", "all"):
            print(f"| {d} | {T} | {'causal' if causal else 'all'} | {path} | {ln[path]:.4f} | "
                  f"{pred[path] / ln[path] - 1:+.1%} | {terms[path] / ln[path] - 1:+.1%} | {gauss[path]:.4f} | "
                  f"{pred[path] / gauss[path] - 1:+.1%} |", flush=True)

if __name__ == "__main__":
    main()
