r"""The angle and gradient exponents λ_a, λ_g of a model at init, from its moment maps and from the finite network.

Cowsik et al. 2024 (geometric dynamics of signal propagation): through depth, a small angle θ between two
tokens' representations grows or shrinks per block by a factor e^{λ_a}, and the norm of the gradient by
e^{λ_g} (read from the output down). Trainability needs both near 0: λ_a < 0 is order (tokens collapse onto
one direction, rank collapse), λ_a > 0 chaos; λ_g > 0 exploding, λ_g < 0 vanishing gradients toward the input.

Derivation from the moment maps. A map carries (var σ², token correlation ρ); two tokens at angle θ have
cos θ = ρ, so 1 − ρ = θ²/2 + O(θ⁴) and log θ_out/θ_in = ½ log[(1 − ρ_out)/(1 − ρ_in)] + O(θ²). Tracing the
chain of the stack from the embedding's variance and ρ = 1 − δ (δ ≪ 1: the linearisation of each block's
correlation map at the collapsed point ρ = 1, the angle exponent's definition), block l's exponent is

    λ_a(l) = ½ log[(1 − ρ_l)/(1 − ρ_{l−1})],       ρ_l the correlation after block l.

The gradient norm per feature is √(σ_g² · entries), the entries are the same at every block output, so

    λ_g(l) = ½ log[σ²_{g,l−1} / σ²_{g,l}],        σ²_{g,l} = Var(∂loss/∂x_l), x_0 = the embedding output,

from the predicted records' backward maps (`sigprop.models.predict`). The model's λ is the mean over blocks,
(1/L) Σ_l λ(l): the log growth rate from the first block's input to the last block's output.

Finite network: the same two formulas on `sigprop.diagnostics.measure`'s records, after replacing the
embedding output by tokens x_t = σ(u + ε z_t)/√(1 + ε²) (u, z_t ~ N(0, I_d), one u per sequence; ρ = 1/(1 + ε²)
= 1 − δ) for λ_a, and on the model's own inputs for λ_g.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..diagnostics import measure
from ..diagnostics.statistics import token_correlation
from ..models.transformer import Chain
from ..records import Record
from ..theory.moments.blocks import serial
from ..theory.moments.state import Moments

SMALL_ANGLE = 1e-3     # δ = 1 − ρ at the stack input: θ ≈ 0.045 rad, in the linear regime of every block's map


def _block_ends(labels: Sequence) -> list[int]:
    """Index in ``labels`` of each block's last labelled output (layer ≥ 1), in order."""
    ends = {}
    for i, lab in enumerate(labels):
        if lab is not None and lab[0] >= 1:
            ends[lab[0]] = i
    return [ends[k] for k in sorted(ends)]


def angle_exponents_theory(chain: Chain, delta: float = SMALL_ANGLE) -> list[float]:
    """λ_a(l) per block from the maps: the chain (labels, components) traced from the embedding to its output,
    then again from the embedding output's variance with correlation 1 − ``delta``."""
    labels, comps = chain
    if (0, "embed") not in labels:
        raise NotImplementedError("advise: the chain has no embedding output (0, 'embed') to start the angle from")
    start = labels.index((0, "embed"))
    emb = serial(*comps[:start + 1]).fwd(Moments(0.0, 1.0, 0.0))
    states = serial(*comps[start + 1:]).trace(Moments(0.0, emb.var, 1.0 - delta))     # states[0]: stack input
    rho = [1.0 - delta] + [states[i - start].corr for i in _block_ends(labels)]
    return _angle_rates(rho)


def _angle_rates(rho: Sequence[float]) -> list[float]:
    return [0.5 * math.log(max(1.0 - b, 1e-300) / max(1.0 - a, 1e-300)) for a, b in zip(rho[:-1], rho[1:])]


def gradient_exponents(records: Sequence[Record]) -> list[float]:
    """λ_g(l) per block from records of one stack (predicted or measured, layer 0 = embedding output): the
    gradient variance at each block's last sublayer output against the previous block's."""
    ends: dict[int, float] = {}
    for r in records:
        if r.grad_var is not None:
            ends[r.layer] = r.grad_var
    layers = sorted(ends)
    if not layers or layers[0] != 0 or len(layers) < 2:
        raise ValueError("advise: gradient exponents need records with gradients at layer 0 and at least one block")
    g = [ends[k] for k in layers]
    return [0.5 * math.log(a / b) for a, b in zip(g[:-1], g[1:])]


def main_stack(records: Sequence[Record]) -> list[Record]:
    """The records of the stack that ends at the output (the last one, "dec" for an encdec)."""
    last = records[-1].stack
    return [r for r in records if r.stack == last]


@torch.no_grad()
def _collinear(shape: torch.Size, var: float, delta: float, gen: torch.Generator, dtype: torch.dtype
               ) -> torch.Tensor:
    B, T, d = shape
    eps = math.sqrt(delta / (1.0 - delta))
    u = torch.randn(B, 1, d, generator=gen, dtype=torch.float64)
    z = torch.randn(B, T, d, generator=gen, dtype=torch.float64)
    return (math.sqrt(var) * (u + eps * z) / math.sqrt(1.0 + eps ** 2)).to(dtype)      # (B, T, d)


def angle_exponents_measured(model: nn.Module, batch: object, var: float, delta: float = SMALL_ANGLE,
                             seed: int = 0) -> list[float]:
    """λ_a(l) per block of the finite network ``model`` (a sigprop model with an ``embed`` module): its
    embedding output is replaced by near-collinear tokens of variance ``var`` and correlation ≈ 1 − ``delta``;
    ρ_l is `measure`'s token correlation after block l (the stack input's measured ρ starts the ratios)."""
    gen = torch.Generator().manual_seed(seed)
    seen: list[torch.Tensor] = []

    def replace_output(module: nn.Module, inputs: tuple, out: torch.Tensor) -> torch.Tensor:
        x = _collinear(out.shape, var, delta, gen, out.dtype).to(out.device)
        seen.append(x)
        return x

    hook = model.embed.register_forward_hook(replace_output)
    try:
        records = main_stack(measure(model, batch, seed=seed, attention_stats=False, backward=False,
                                     stable_ranks=False))
    finally:
        hook.remove()
    ends: dict[int, float] = {}
    for r in records:
        if r.layer >= 1:
            ends[r.layer] = r.token_corr
    rho = [token_correlation(seen[0])] + [ends[k] for k in sorted(ends)]
    return _angle_rates(rho)


def model_exponent(per_block: Sequence[float]) -> float:
    """The model's λ: the mean of the per-block exponents."""
    return float(sum(per_block) / len(per_block))
