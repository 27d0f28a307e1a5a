"""Self-attention with rotary position embeddings (RoPE): the logit law across positions, and the moment maps.

RoPE: head width d_k (even), planes p = 0 … d_k/2 − 1 with frequencies θ_p (the standard θ_p = base^{−2p/d_k});
position t rotates plane p of the query and of the key by the angle tθ_p. With R_t that block-diagonal
orthogonal map, R_sᵀR_t = R_{t−s}, so the logit of query i on key j is

    l_ij = q_iᵀ R_{j−i} k_j / τ,   q_i = W_qᵀx_i, k_j = W_kᵀx_j,   W_q, W_k (d × d_k) i.i.d. N(0, σ_q²), N(0, σ_k²).

**Logit law.** Over the weights, given the tokens, E[(W_qᵀx)_α (W_qᵀx')_γ] = σ_q²(x·x')δ_αγ (W_k alike, and
independent), so

    E[l_ij l_i'j'] = σ_q²σ_k²/τ² (x_i·x_i')(x_j·x_j') tr(R_{j−i}ᵀR_{j'−i'}) = σ_q²σ_k² d_k/τ² (x_i·x_i')(x_j·x_j') c(Δ),
    c(Δ) = tr R_Δ / d_k = (2/d_k) Σ_p cos(Δθ_p),   Δ = (j' − i') − (j − i),

exact at every width (`logit_moment`; without RoPE c ≡ 1). For Gaussian tokens of moments (μ, σ², r),
E[(x_i·x_i')(x_j·x_j')] = d(d − 1) C_ii' C_jj' + d E4 by Isserlis, with C_ab = μ² + K_ab, K_ab = σ²(r + (1 − r)δ_ab)
the per-feature second moment and covariance and E4 = μ⁴ + μ²ΣK + K_ii'K_jj' + K_ijK_i'j' + K_ij'K_i'j.

What changes for one query i and two keys j ≠ j' (both ≠ i): the contrast that the softmax sees is

    E(l_ij − l_ij')²/2 = σ_q²σ_k² d_k d (μ² + σ²)/τ² · [d s² + d m₂(1 − c(j − j')) + O(1)],
    s² = (1 − r)σ², m₂ = μ² + rσ²,

where `Attention` has only the s² term. Writing x_j = m + s e_j (m shared by all tokens): the shared part, a
softmax-invariant constant without RoPE, becomes the key-dependent field a_j = q_iᵀR_{j−i}W_kᵀm/τ, of covariance
∝ m₂ c(j − j'); and each key's own part e_j is read along its own direction u_ij = W_k R_{j−i}ᵀq_i, with
û_ij·û_ij' → c(j − j') for d ≫ d_k, so the value tilt Σ_j a_ij z_j û_ij of `Attention`'s C_s = E(Σ a_j z_j)²
partly cancels. The row is no longer exchangeable: its softmax functionals (F2 = EΣS², Z1, the pair overlaps K1,
K2 and the backward B, Bz, CK of `Attention`) are those of a Gaussian logit vector with covariance
∝ s²I + m₂ c(j − j') plus the coupled directions, which do not reduce to the one-dimensional integrals of
`softmax`. How far the output moments move is measured in tests/test_moments_rope.py.

**Moments** (`RopeAttention`). Every other step of the layer is averaged in closed form where it is Gaussian and
linear, and what enters the softmax is sampled with its exact law, as `sigprop.theory.dslm.attention_gram` does:
per sample, L Gaussian tokens of the input moments at the model's width d (exchangeable covariance
σ²((1 − r)I + rJ), mean μ), fresh W_q, W_k, the rotation, A = Softmax(l) under the mask (⊙ Bernoulli(1 − p)/(1 − p)
for probability dropout; shaped: A = γ₁I + S' − γ₂C, τ² = τ₀² d d_k). Then, per output feature a of the mixing step
o = A X W_v, averaged over W_v exactly (E[o_i^a o_i'^a | A, X] = σ_v² (AX)_i·(AX)_i'),

    Var o = σ_v² E|(AX)_i|²  (rows averaged),   Cov(o_i, o_i') = σ_v² E[(AX)_i·(AX)_i']  (pairs i ≠ i' averaged),

and W_O is the exact `Linear`. Backward from the mixing step's output gradient g (exchangeable over tokens,
variance σ_g², correlation r_g, independent of the forward and of the weights: `state`): the input gradient
∂/∂X ⟨A X W_v, g⟩ through the values, queries and keys (all paths and their cross terms, computed exactly
per sample with W_v and g sampled too). Heads: each head's contribution to the input gradient is linear in its
own slice of g (independent, mean zero) and each writes through its own block of W_O, so variances and
covariances add over heads (grouped-query heads sharing W_k, W_v included): one head is sampled and counted
``n_heads`` times. Sampled in float32 (its rounding is far below the sampling error), fixed seed: the map is a
deterministic function of its inputs; `RopeAttention.sampled` gives
the standard errors of the estimates (relative ≲ 1 % at the default ``samples``).

**qk-norm** (``attention.qk_norm`` = k > 0, `sigprop.theory.moments.qk_norm`'s convention: ``q_var`` = g_q²(scale·τ)²,
``k_var`` = g_k²). The sampled head's queries and keys are normalized before the rotation (which keeps their norms,
so before or after is the same map): u = xW with W i.i.d. N(0, 1) (the norm removes the weights' scale), centred
when k = d_k − 1 (LayerNorm), then q̂ = √(q_var·D)·u/|u| over the D coordinates the norm spans. Per-head norms
(Qwen3, Gemma 3) span D = d_k; a norm over the whole projection (OLMo 2's q_norm and k_norm on H·d_k and H_kv·d_k
coordinates, ``qk_span``) divides each head by a length shared with the other heads: the sampled head is then the
first d_k of D sampled coordinates, and the input gradient runs through all D of them (autograd through the norm).
The heads stay uncorrelated (each writes through its own W_v, W_O and gradient slice, independent and of mean zero),
so counting the sampled head ``n_heads`` times stays exact.

**Per position** (`RopeAttention.position_vars`, `RopeAttention.position_bwd`), for the backward of a causal stack
traced per position (`sigprop.theory.moments.causal`): the same samples give each position's output variance (row i
of a causal mask reads i + 1 keys, so the mixing step's output shrinks along the sequence, which a norm after the
branch divides by position by position); and for an output gradient with covariance G over positions (independent
over features) the input gradient's covariance over positions is sampled as in the backward above, the output
gradient drawn as G^{1/2} z: exact under the same independence, at the cost of one more backward pass of samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch

from .attention import Attention
from .state import Component, Mixing, Moments, check_size, ratio, replace

CHUNK = 256            # samples per batched evaluation: bounds memory at (CHUNK, L, d) tensors


def standard_frequencies(d_k: int, base: float) -> tuple[float, ...]:
    """θ_p = base^{−2p/d_k}, p = 0 … d_k/2 − 1 (LLaMA's default rotary embedding)."""
    if d_k % 2:
        raise ValueError(f"RoPE head width d_k must be even, got {d_k}")
    return tuple(float(base ** (-2.0 * p / d_k)) for p in range(d_k // 2))


class Sampled(NamedTuple):
    """Estimates of the mixing step's moments and their standard errors (per feature; see the module docstring)."""

    var: float
    cov: float
    var_se: float
    cov_se: float
    rows: tuple[float, ...] = ()        # per position i: the variance of row i (var is their mean)


@dataclass(frozen=True)
class RopeAttention(Component):
    """``attention`` (its projections, heads, L, causal mask, dropout, shaping) with RoPE of ``frequencies``
    (θ_p, d_k/2 of them) on the queries and keys; ``samples`` sampled heads per map evaluation, ``seed`` fixed."""

    attention: Attention
    frequencies: tuple[float, ...]
    samples: int = 4096
    seed: int = 0
    qk_span: tuple[int, int] | None = None   # qk-norm over (D_q, D_k) coordinates; None: each head's d_k

    def __post_init__(self) -> None:
        att = self.attention
        check_size("samples", self.samples, minimum=2)
        if self.qk_span is not None and (att.qk_norm != att.d_k or min(self.qk_span) < att.d_k):
            raise ValueError(f"qk_span {self.qk_span} needs RMS qk-norm (attention.qk_norm = d_k = {att.d_k}) over at "
                             "least one head's coordinates")
        if 2 * len(self.frequencies) != att.d_k:
            raise ValueError(f"RoPE needs d_k/2 = {att.d_k // 2} frequencies, got {len(self.frequencies)}")
        if not all(math.isfinite(f) for f in self.frequencies):
            raise ValueError(f"RoPE frequencies must be finite, got {self.frequencies}")
        if att.L == math.inf:
            raise NotImplementedError("RoPE attention has no L → ∞ map here; give a finite L")

    @property
    def d(self) -> int:
        return self.attention.d

    def overlap(self, lag: np.ndarray | float) -> np.ndarray:
        """c(Δ) = tr R_Δ/d_k = (2/d_k) Σ_p cos(Δθ_p): the factor RoPE puts on the logit covariance at lag Δ."""
        theta = np.asarray(self.frequencies)
        return np.cos(np.multiply.outer(np.asarray(lag, dtype=float), theta)).mean(-1)

    def logit_moment(self, m: Moments, i: int, j: int, i2: int, j2: int) -> float:
        """E[l_ij l_i2j2] over the weights and Gaussian tokens of moments ``m`` (module docstring, exact)."""
        att, mu = self.attention, m.mean

        def k(a: int, b: int) -> float:
            return m.var * (m.corr + (1 - m.corr) * (a == b))

        pairs = (k(i, i2), k(i, j), k(i, j2), k(i2, j), k(i2, j2), k(j, j2))
        e4 = mu ** 4 + mu ** 2 * sum(pairs) + k(i, i2) * k(j, j2) + k(i, j) * k(i2, j2) + k(i, j2) * k(i2, j)
        tokens = self.d * (self.d - 1) * (mu ** 2 + k(i, i2)) * (mu ** 2 + k(j, j2)) + self.d * e4
        lag = (j2 - i2) - (j - i)
        return float(att.q_var * att.k_var * att.d_k / att.tau2 * tokens * self.overlap(lag))

    def sampled(self, m: Moments, g: Moments | None = None) -> Sampled:
        """The mixing step's output (``g`` None: var, cov of o = AXW_v) or input-gradient (``g``: the gradient
        at the mixing step's output; grad var, cov of ∂/∂X) moments per feature, with standard errors."""
        return _sampled(self, (m.mean, m.var, m.corr), None if g is None else (g.grad_var, g.grad_corr))

    def fwd(self, m: Moments) -> Moments:
        s = self.sampled(m)
        return self.attention.out_proj.fwd(replace(m, mean=0.0, var=s.var, corr=ratio(s.cov, s.var)))

    def token_mixing(self) -> Mixing:
        """Causal rows read keys j ≤ i at lag-dependent logits (`position_vars`, `position_bwd`); bidirectional
        rows read every position."""
        return Mixing.CAUSAL if self.attention.causal else Mixing.ALL

    def position_bwd(self, m_in: Moments, G: np.ndarray) -> np.ndarray:
        """The gradient covariance over positions (L, L) at the input, given ``G`` (L, L) at the output (per feature;
        `sigprop.theory.moments.causal`): the output projection scales it by d σ_o², then the mixing step's input
        gradient is sampled as in `bwd`, its output gradient drawn with covariance G over positions (independent
        over features) instead of an exchangeable one."""
        G = np.asarray(G, dtype=np.float64) * (self.attention.out_proj.d_in * self.attention.out_proj.weight_var)
        return np.asarray(_position_sampled(self, (m_in.mean, m_in.var, m_in.corr), G.round(15).tobytes()))

    def position_vars(self, m: Moments) -> np.ndarray:
        """(L,) the output variance at each position (row i of a causal mask reads i + 1 keys, so the mixing step's
        output shrinks along the sequence), from the same samples as `fwd`, whose variance is their mean."""
        s = self.sampled(m)
        return self.fwd(m).var * np.asarray(s.rows) / s.var

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        s = self.sampled(m_in)
        mixed = replace(m_in, mean=0.0, var=s.var, corr=ratio(s.cov, s.var))
        back = self.sampled(m_in, self.attention.out_proj.bwd(mixed, g_out))
        return replace(m_in, grad_var=back.var, grad_corr=ratio(back.cov, back.var))


def _exchangeable(shape: tuple[int, ...], mean: float, var: float, corr: float, what: str,
                  generator: torch.Generator) -> torch.Tensor:
    """Gaussian (..., L, width) with i.i.d. columns, each of mean ``mean`` and covariance var((1 − r)I + rJ) over L:
    √((1 − r)var)(e − ē) + √(var(1 + (L − 1)r)) ē, e ~ N(0, I)."""
    L = shape[-2]
    if 1 + (L - 1) * corr < 0:
        raise ValueError(f"{what} {corr} < −1/(L − 1) is no covariance of {L} exchangeable tokens")
    e = torch.randn(shape, generator=generator, dtype=torch.float32)
    bar = e.mean(-2, keepdim=True)
    return mean + math.sqrt((1 - corr) * var) * (e - bar) + math.sqrt(var * (1 + (L - 1) * corr)) * bar


def _projected(rope: RopeAttention, x: torch.Tensor, var: float, span: int, generator: torch.Generator
               ) -> torch.Tensor:
    """(n, L, d_k) queries or keys of one sampled head: x W, W i.i.d. N(0, ``var``); under qk-norm the first d_k of
    √(var·D)·u/|u|, u = x W over the norm's D = ``span`` coordinates (centred for LayerNorm; module docstring)."""
    att = rope.attention
    if not att.qk_norm:
        return x @ (torch.randn(x.shape[0], rope.d, att.d_k, generator=generator, dtype=torch.float32)
                    * math.sqrt(var))
    u = x @ torch.randn(x.shape[0], rope.d, span, generator=generator, dtype=torch.float32)  # (n, L, D)
    if att.qk_norm == att.d_k - 1:
        u = u - u.mean(-1, keepdim=True)
    return (math.sqrt(var * span) * u / u.norm(dim=-1, keepdim=True))[..., :att.d_k]


def _mixing(rope: RopeAttention, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A (n, L, L) of one sampled head per token set x (n, L, d): rotated logits, mask, softmax, dropout, shaping."""
    att, n, L = rope.attention, x.shape[0], x.shape[1]
    dk = att.d_k
    spans = rope.qk_span or (dk, dk)
    q, k = (_projected(rope, x, v, span, generator) for v, span in zip((att.q_var, att.k_var), spans))
    theta = torch.tensor(rope.frequencies, dtype=torch.float64)
    angle = torch.arange(L, dtype=torch.float64)[:, None] * theta                # position t, plane p: tθ_p
    phase = torch.polar(torch.ones_like(angle), angle).to(torch.complex64)
    q = torch.view_as_complex(q.reshape(n, L, dk // 2, 2)) * phase
    k = torch.view_as_complex(k.reshape(n, L, dk // 2, 2)) * phase
    logits = (q @ k.conj().transpose(-1, -2)).real / math.sqrt(att.tau2)      # a·b = Re(a b̄) per plane
    visible = torch.ones(L, L, dtype=torch.bool).tril() if att.causal else torch.ones(L, L, dtype=torch.bool)
    a = logits.masked_fill(~visible, float("-inf")).softmax(-1)
    if att.p > 0:
        a = a * (torch.rand(a.shape, generator=generator, dtype=torch.float32) >= att.p) / (1 - att.p)
    if att.shaped:
        uniform = visible / visible.sum(-1, keepdim=True)
        a = att.gamma1 * torch.eye(L, dtype=torch.float32) + a - att.gamma2 * uniform
    return a


def _moments(per: torch.Tensor, L: int, scale: float) -> Sampled:
    """(var, cov, their s.e., each position's var) from per-sample Gram matrices ``per`` (n, L, L) of rows summed
    over features."""
    rows = per.diagonal(dim1=-2, dim2=-1)                                       # (n, L)
    diag = rows.mean(-1)
    off = (per.sum((-2, -1)) - rows.sum(-1)) / (L * (L - 1))
    n = per.shape[0]
    return Sampled(scale * diag.mean().item(), scale * off.mean().item(), scale * diag.std().item() / math.sqrt(n),
                   scale * off.std().item() / math.sqrt(n), tuple((scale * rows.mean(0)).tolist()))


@lru_cache(maxsize=512)
def _position_sampled(rope: RopeAttention, m: tuple[float, float, float], key: bytes) -> tuple[tuple[float, ...], ...]:
    """`RopeAttention.position_bwd` for input (mean, var, corr) ``m`` and the mixing step's output-gradient
    covariance over positions (its float64 bytes ``key``): E[∂/∂X (∂/∂X)ᵀ]·H/d over sampled heads."""
    att, L, d = rope.attention, int(rope.attention.L), rope.d
    G = np.frombuffer(key, dtype=np.float64).reshape(L, L)
    w, v = np.linalg.eigh((G + G.T) / 2)
    root = torch.as_tensor(v * np.sqrt(np.clip(w, 0.0, None)), dtype=torch.float32)   # root rootᵀ = G
    mean, var, corr = m
    generator = torch.Generator().manual_seed(rope.seed)
    total = torch.zeros(L, L, dtype=torch.float64)
    for start in range(0, rope.samples, CHUNK):
        n = min(CHUNK, rope.samples - start)
        x = _exchangeable((n, L, d), mean, var, corr, "token correlation", generator).requires_grad_(True)
        a = _mixing(rope, x, generator)
        wv = torch.randn(n, d, att.d_k, generator=generator, dtype=torch.float32) * math.sqrt(att.v_var)
        grad = root @ torch.randn(n, L, att.d_k, generator=generator, dtype=torch.float32)
        (dx,) = torch.autograd.grad((a @ x @ wv * grad).sum(), x)
        total += (dx @ dx.transpose(-1, -2)).detach().double().sum(0)
    return tuple(map(tuple, (total / rope.samples * att.n_heads / d).tolist()))


@lru_cache(maxsize=512)
def _sampled(rope: RopeAttention, m: tuple[float, float, float], g: tuple[float, float] | None) -> Sampled:
    """`RopeAttention.sampled` for input (mean, var, corr) ``m`` and output gradient (var, corr) ``g``."""
    att, L, d = rope.attention, int(rope.attention.L), rope.d
    mean, var, corr = m
    generator = torch.Generator().manual_seed(rope.seed)
    grams = []
    for start in range(0, rope.samples, CHUNK):
        n = min(CHUNK, rope.samples - start)
        x = _exchangeable((n, L, d), mean, var, corr, "token correlation", generator)
        if g is None:
            with torch.no_grad():
                ax = _mixing(rope, x, generator) @ x
            grams.append(ax @ ax.transpose(-1, -2))
            continue
        x.requires_grad_(True)
        a = _mixing(rope, x, generator)
        wv = torch.randn(n, d, att.d_k, generator=generator, dtype=torch.float32) * math.sqrt(att.v_var)
        grad = _exchangeable((n, L, att.d_k), 0.0, g[0], g[1], "gradient correlation", generator)
        (dx,) = torch.autograd.grad((a @ x @ wv * grad).sum(), x)
        grams.append((dx @ dx.transpose(-1, -2)).detach())
    per = torch.cat(grams).double()
    if g is None:
        return _moments(per, L, att.v_var)
    return _moments(per, L, att.n_heads / d)
