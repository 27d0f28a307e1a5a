"""Standard attention's forward variance on tokens behind a norm (|x|² = d exactly) against its map.

    OMP_NUM_THREADS=1 python bench/attention_normalized.py        # ~4 min

`sigprop.theory.moments.attention` derives its moments for Gaussian tokens x_j = m + s e_j: split along the logit
direction û, e_j = z_j û + e_j⊥ with e_j⊥ independent of the logits, so Σ_j a_j² |e_j⊥|² averages to (d − 1)R_s
(R_s = EΣa_j²). A token behind a LayerNorm has a fixed norm, and the part of its own fluctuation that the norm fixes
is the one that carries its logit: |e_j⊥|² = |e_j|² − z_j², so the same sum averages to d·R_s − Z2
(Z2 = EΣa_j²z_j², `softmax.row_functionals`), and the output variance is lower by s²σ_v²(Z2 − R_s) (per unit
output projection, no dropout). Z2 exceeds R_s since the weights tilt toward large logits (≈ R_s(1 + 4β²) for a
logit scale β²), so at r = 0 this is an O(β²/d) share of the variance, a few per cent at d = 64.

Monte Carlo: one layer (4 heads, fresh N(0, 1/d) Q/K/V/O weights per sample, float64), tokens √r c + √(1 − r) e_j
(c, e_j ~ N(0, I_d)) through a LayerNorm without affine, or the same tokens without it (Gaussian); 4000 samples per
point. Columns: the measured mean output variance, the map's (`Attention.fwd` with the norm's output moments), and
the map less s²σ_v²(Z2 − R_s)·dσ_o², each as an error against the measurement of LN-ed tokens; the last column, the
map against Gaussian tokens, for comparison. Then the backward: the same layer (bidirectional, or causal as the first
sublayer of a decoder) back-propagating a gradient drawn independently of the network, i.i.d. N(0, 1): the input
gradient's mean square measured on LN-ed and on Gaussian tokens, and the map's error on each (`Attention.bwd`, which
does not read the norm).
"""
from __future__ import annotations

import torch

from sigprop.console import progress
from sigprop.theory.moments import Attention, Moments

H, SAMPLES = 4, 4000
POINTS = [(64, 16, 0.0), (64, 16, 0.3), (64, 16, 0.6), (64, 64, 0.0), (128, 16, 0.0), (128, 64, 0.0),
          (256, 64, 0.0)]
BACKWARD = [(64, 16, False), (64, 16, True), (64, 64, True), (128, 64, True), (256, 64, True)]


def measured(d: int, T: int, r: float, normed: bool, seed: int = 0, causal: bool | None = None) -> float:
    """The output's mean square over ``SAMPLES`` layers, or with ``causal`` set, the input gradient's under an
    independent N(0, 1) output gradient (bidirectional or causal rows)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    total, chunk, dk = 0.0, 500, d // H

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(chunk, T, H, dk).transpose(1, 2)

    for _ in range(SAMPLES // chunk):
        x = r ** 0.5 * randn(chunk, 1, d) + (1 - r) ** 0.5 * randn(chunk, T, d)
        if normed:
            x = torch.nn.functional.layer_norm(x, (d,))
        x.requires_grad_(causal is not None)
        wq, wk, wv, wo = (randn(chunk, d, d) * d ** -0.5 for _ in range(4))
        logits = heads(x @ wq) @ heads(x @ wk).transpose(-1, -2) / dk ** 0.5
        if causal:
            logits = logits.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        o = (logits.softmax(-1) @ heads(x @ wv)).transpose(1, 2).reshape(chunk, T, d) @ wo
        if causal is None:
            total += float((o ** 2).mean()) * chunk
        else:
            (o * randn(chunk, T, d)).sum().backward()
            total += float((x.grad ** 2).mean()) * chunk
    return total / SAMPLES


def main() -> None:
    torch.set_num_threads(1)
    print("| d | T | r | measured (LN-ed tokens) | map | map − s²σ_v²(Z2 − R_s) | map on Gaussian tokens |")
    print("|---|---|---|---|---|---|---|")
    for d, T, r in progress(POINTS, "points"):
        att = Attention(d, H, T, 1 / d, 1 / d, 1 / d, 1 / d)
        m = Moments(0.0, 1.0, r, norm_disp=-2 / d)                  # a LayerNorm's output: |x|² = d exactly
        st = att._setup(m)
        var = att.fwd(m).var
        corrected = var - st.s2 * att.v_var * (st.rows["Z2"] - st.rows["F2"]) * att.d * att.o_var
        ln, gauss = measured(d, T, r, True), measured(d, T, r, False)
        print(f"| {d} | {T} | {r} | {ln:.4f} | {var / ln - 1:+.1%} | {corrected / ln - 1:+.1%} | "
              f"{var / gauss - 1:+.1%} |", flush=True)
    print("\n| d | T | rows | LN-ed tokens: measured | map | Gaussian tokens: measured | map |")
    print("|---|---|---|---|---|---|---|")
    for d, T, causal in progress(BACKWARD, "backward points"):
        att = Attention(d, H, T, 1 / d, 1 / d, 1 / d, 1 / d, causal=causal)
        g = Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=0.0)
        pred = att.bwd(Moments(0.0, 1.0, 0.0, norm_disp=-2 / d), g).grad_var
        ln, gauss = (measured(d, T, 0.0, normed, causal=causal) for normed in (True, False))
        print(f"| {d} | {T} | {'causal' if causal else 'all'} | {ln:.4f} | {pred / ln - 1:+.1%} | {gauss:.4f} | "
              f"{pred / gauss - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
