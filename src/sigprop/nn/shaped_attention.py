"""Shaped attention (Noci et al., NeurIPS 2023, §2).

    A = γ₁ I + Softmax(Q Kᵀ / τ + mask) − γ₂ C,     τ = τ₀ √(n · n_k),

n = d_model, n_k = d_head, C = the softmax of all-zero logits under the same mask (row i is
uniform over the m_i keys it may see: 1/m_i for causal and padding masks). At initialization
Softmax(Y/τ) = C + O(1/τ), so A = γ₁I + O(1/√n): each layer is a small perturbation of the
identity and the token covariance follows an SDE in t = depth/width instead of collapsing.
The 1/√n in τ is equivalent at init to the paper's training form τ = √n_k with Q/K weight
variance reduced by 1/n (Appendix D).

Fused form: A V = γ₁ V + SDPA(Q, K, V) − γ₂ C V, where C V is a (cumulative) masked mean of V,
so no (T, S) matrix is ever materialized. γ₁, γ₂ are per head; ``mode`` makes them fixed
buffers ("fixed"/"recover", set by `set_shape` from a schedule) or trainable ("learn").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..fields import current_value
from .attention import Attention, attention_mask
from .maps import scalar
from .roles import tag

SHAPING_MODES = ("fixed", "recover", "learn")
QK_SCALINGS = ("temperature", "weights")
DEPRECATED_QK_SCALINGS = {"init": "weights"}     # old value -> its name now


def masked_mean(v: torch.Tensor, causal: bool, key_mask: torch.Tensor | None) -> torch.Tensor:
    """C V: row i averages v over the keys it may see. v: (B, H, S, dh) -> (B, H, S, dh) if causal,
    else (B, H, 1, dh), which broadcasts over any number of queries."""
    if key_mask is None:
        if causal:
            counts = torch.arange(1, v.shape[-2] + 1, device=v.device, dtype=v.dtype)
            return v.cumsum(-2).div_(counts[:, None])
        return v.mean(-2, keepdim=True)
    w = key_mask.to(v.dtype)[:, None, :, None]                               # (B, 1, S, 1)
    if causal:
        return (v * w).cumsum(-2) / w.cumsum(-2).clamp_min(1.0)
    return (v * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True).clamp_min(1.0)


class Shaping:
    """γ₁, γ₂ per head and the fused mixing step: the shaping logic `ShapedAttention` and `sigprop.hf`'s
    attention adapter share. The host module calls `init_shaping` in its ``__init__``."""

    identity: bool

    def init_shaping(self, n_heads: int, gamma1: float, gamma2: float, mode: str, identity: bool = True) -> None:
        """γ₁ (0 without ``identity``), γ₂: trainable for ``mode="learn"`` (role "constant"), else buffers."""
        if mode not in SHAPING_MODES:
            raise ValueError(f"mode must be one of {SHAPING_MODES}, got {mode!r}")
        self.identity, self.mode = identity, mode
        for name, value, used in (("gamma1", gamma1, identity), ("gamma2", gamma2, True)):
            g = torch.full((n_heads,), float(value) if used else 0.0)
            if mode == "learn" and used:         # an unused Parameter would break DDP
                setattr(self, name, nn.Parameter(g))
                tag(getattr(self, name), "constant")
            else:
                self.register_buffer(name, g)

    @torch.no_grad()
    def set_shape(self, gamma1: float, gamma2: float) -> None:
        """Set γ₁ (ignored without identity) and γ₂ for every head, e.g. from the Recover schedule."""
        if self.identity:
            self.gamma1.fill_(gamma1)
        self.gamma2.fill_(gamma2)

    def _g(self, g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return g.to(like.dtype).view(1, -1, 1, 1)                           # (1, H, 1, 1)

    def shape(self, y: torch.Tensor, v: torch.Tensor, causal: bool, key_mask: torch.Tensor | None) -> torch.Tensor:
        """γ₁ V + y − γ₂ C V for y = Softmax(QKᵀ/τ + mask) V: y (B, H, T, dh), v (B, H, S, dh). With T < S
        (a KV cache) the queries are the last T keys: the identity and C terms take the last T rows."""
        t, s = y.shape[-2], v.shape[-2]
        y = torch.addcmul(y, self._g(self.gamma2, v), masked_mean(v, causal, key_mask)[..., -t:, :], value=-1.0)
        return torch.addcmul(y, self._g(self.gamma1, v), v[..., s - t:, :]) if self.identity else y


class ShapedAttention(Shaping, Attention):
    """Multi-head shaped attention; drop-in for `Attention`.

    identity=False drops the γ₁ I term (cross-attention, where queries and keys differ); output_proj=False
    drops W_O (`Attention`).
    qk_scaling: "temperature" puts the whole τ = τ₀√(n·n_k) in the logit scale (W_Q, W_K ~ N(0, 1/n));
    "weights" is the paper's training form (App. D): τ = τ₀√n_k and the scheme draws W_Q, W_K from
    N(0, n^{-3/2}), so the 1/√n lives in the weights. Logits are identical at init. Adam's step ignores a
    weight's scale, so per step the logits move n^{1/4} times more with "weights" (to first order in the lr:
    the same ΔW, a √n larger logit scale, n^{1/4} smaller W): the paper's way of not re-tuning the Q/K
    learning rate. "init" is the deprecated name of "weights".

    Args:
        d_model: the stream width n.
        n_heads: heads; each of width n_k = n/heads.
        causal: mask each query's later keys (C then averages over the visible keys).
        tau0: the temperature τ₀ (> 0).
        gamma1: γ₁, the weight of the identity term.
        gamma2: γ₂, the weight of the centring term C.
        mode: "fixed", "recover" (γ₁, γ₂ set by the trainer's schedule) or "learn" (trainable).
        identity: keep the γ₁ I term.
        bias: biases in the projections.
        qk_scaling: "temperature" or "weights" (above).
        output_proj: an output projection W_O.

    Raises:
        ValueError: ``tau0`` <= 0, an unknown ``qk_scaling`` or ``mode``, or ``d_model`` not divisible by
            ``n_heads``.
    """

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, tau0: float = 1.0,
                 gamma1: float = 1.0, gamma2: float = 1.0, mode: str = "fixed",
                 identity: bool = True, bias: bool = False, qk_scaling: str = "temperature",
                 output_proj: bool = True) -> None:
        if tau0 <= 0:
            raise ValueError(f"tau0 must be > 0, got {tau0}")
        qk_scaling = current_value("qk_scaling", qk_scaling, QK_SCALINGS, DEPRECATED_QK_SCALINGS)
        d_head = d_model // max(n_heads, 1)
        tau = tau0 * math.sqrt(d_head * (d_model if qk_scaling == "temperature" else 1))
        super().__init__(d_model, n_heads, causal, bias, scale=1.0 / tau, output_proj=output_proj)
        self.tau0, self.built_gammas = tau0, (gamma1 if identity else 0.0, gamma2)
        self.init_shaping(n_heads, gamma1, gamma2, mode, identity)

    def map_temperature(self) -> float:
        """τ = τ₀√(d·d_head), the shaped attention map's convention (`qk_scaling` acts through ``scale``)."""
        return self.tau0 * math.sqrt(self.d_model * self.d_head)

    def map_options(self) -> dict[str, float | bool]:
        """Shaped: τ₀ and the current γ₁ (0 without the identity term), γ₂, one value for all heads."""
        g1, g2 = self.built_gammas
        return {"shaped": True, "tau0": self.tau0,
                "gamma1": scalar(self.gamma1, g1, "shaped attention gamma1"),
                "gamma2": scalar(self.gamma2, g2, "shaped attention gamma2")}

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            key_mask: torch.Tensor | None) -> torch.Tensor:
        """A V = γ₁ V + Softmax(QKᵀ/τ + mask) V − γ₂ C V, (B, H, T, dh)."""
        return self.shape(super().mix(q, k, v, key_mask), v, self.causal, key_mask)

    def attention_matrix(self, x: torch.Tensor, kv: torch.Tensor | None = None,
                         key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The explicit shaped matrix A = γ₁I + Softmax − γ₂C, (B, H, T, S); rows sum to γ₁ + 1 − γ₂."""
        q, k, _ = self.qkv(x, kv)
        t, s = q.shape[-2], k.shape[-2]
        a = self.probabilities(q, k, key_mask)
        mask = attention_mask(t, s, self.causal, key_mask, q.device)
        keep = torch.ones(1, 1, t, s, dtype=a.dtype, device=a.device) if mask is None else mask.to(a.dtype)
        a = a - self._g(self.gamma2, a) * keep / keep.sum(-1, keepdim=True).clamp_min(1.0)
        if self.identity:
            a = a + self._g(self.gamma1, a) * torch.eye(t, s, dtype=a.dtype, device=a.device)
        return a
