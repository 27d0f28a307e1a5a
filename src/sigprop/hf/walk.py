"""`predict`: the per-sublayer moments of a `transformers` model at init, walked from its own modules.

As `sigprop.models.predict` does for sigprop models, every HF module the forward pass runs is mapped to its
`sigprop.theory.moments` component, read off the module: widths, heads, causal mask, logit scale, dropout
rates (in the model's train/eval mode), the residual weights `sigprop.hf.apply` registered (α = β = 1
without them), and each weight's init variance. That variance is the std `apply` drew the weight with
(`sigprop.models.adapter.record_std`); on a model `apply` never touched, the std HF's own init draws it with, from
the config (`Family.hf_init_std`, the rule of the family's ``_init_weights``): a model straight from its
config, not a trained or loaded one. Biases must be zero and norm gains one (as both inits leave them).

The family adapter (`Family`) says which module computes what: `Family.input_maps` (embedding tables, their
norm and dropout: the stream entering the first block, record layer 0), `Family.branch_maps` (the attention
or MLP branch of one residual site, its dropout included), `Family.site_norm`, `Family.final_norm` and
`Family.head_maps` (what lies between the last block and the output `diagnose` differentiates). Each residual
site's maps (`Walk.site_maps`) are composed by the walker sigprop's own stacks use, `sigprop.nn.block.sites_chain`:
Pre-LN x ← αx + βD(f(N(x))), Post-LN x ← N(αx + βD(f(x))) (`PostNormResidual`, its input a previous norm's
output), a norm on the branch output (`Family.output_norm`: OLMo 2's x ← αx + βN(f(x)), Gemma's sandwich
x ← αx + βN₂(f(N₁(x)))) its map on f's output moments, and a norm replaced by the identity (``shaped``) drops out.
Backward: from logits with unit gradient variance, as `diagnose`'s random-projection loss, by the trace of
`sigprop.models.predict` (`trace`: a causal stack per position, a bidirectional one with the exchangeable maps).

A module, option or input without an exact map raises NotImplementedError naming it (RoPE whose frequencies
change at run time, the tanh-GeLU beyond its quadrature range, padding masks, a classification head, ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.adapter import recorded_std
from ..models.predict import to_records, trace
from ..nn.block import SiteMaps, sites_chain
from ..nn.maps import _unit_affine, attention_logit_factor, component_of, scalar, zero_bias
from ..nn.modes import in_mode
from ..records import Record
from ..theory.moments.attention import Attention
from ..theory.moments.blocks import serial
from ..theory.moments.dropout import Dropout
from ..theory.moments.linear import Linear
from ..theory.moments.norm import LayerNorm, RMSNorm
from ..theory.moments.pointwise import GeLU, Smooth
from ..theory.moments.state import Component, Mixing, Moments, replace
from .apply import family_of

# HF activation classes (transformers.activations) → their maps; GELUActivation is the exact-erf GeLU
ACTIVATIONS = {"GELUActivation": GeLU, "NewGELUActivation": lambda: Smooth("gelu_tanh"),
               "FastGELUActivation": lambda: Smooth("gelu_tanh"), "GELUTanh": lambda: Smooth("gelu_tanh"),
               "PytorchGELUTanh": lambda: Smooth("gelu_tanh"), "SiLUActivation": lambda: Smooth("silu"),
               "SiLU": lambda: Smooth("silu")}


class Walk:
    """The model being walked, and the lookups every family map needs: init variances, module components."""

    def __init__(self, model: nn.Module, batch: Any) -> None:
        self.model, self.family, self.batch, self.ids = model, family_of(model), batch, batch_ids(batch)
        self.applied = getattr(model, "sigprop_config", None) is not None

    def var(self, tensor: torch.Tensor, role: str, what: str) -> float:
        """σ² of the Gaussian ``tensor`` (a parameter or a fused slice) was drawn from: recorded by `apply`, else
        the family's HF init rule for ``role``."""
        std = recorded_std(tensor)
        if std is None:
            if self.applied:
                raise NotImplementedError(f"{what} has no std recorded by sigprop.hf.apply (apply(reinit=False) "
                                          "keeps weights whose init law is unknown)")
            std = self.family.hf_init_std(self.model.config, role)
        return std ** 2

    def table_var(self, table: nn.Embedding, role: str, what: str) -> float:
        """`var` of an embedding table; HF's init zeroes the padding row, which the batch must not read."""
        pad = table.padding_idx
        if not self.applied and pad is not None and bool((self.ids == pad).any()):
            raise NotImplementedError(f"{what}: the batch holds padding id {pad}, whose row HF's init sets to zero; "
                                      "the embedding map describes i.i.d. rows")
        return self.var(table.weight, role, what)

    def linear(self, module: nn.Module, role: str, what: str) -> Linear:
        """An nn.Linear (weight (out, in)) or transformers Conv1D (weight (in, out)) with zero bias."""
        zero_bias(module, what)
        w = module.weight
        d_out, d_in = tuple(w.shape) if isinstance(module, nn.Linear) else tuple(w.shape[::-1])
        return Linear(d_in, d_out, self.var(w, role, f"{what}.weight"))

    def component(self, module: nn.Module, what: str) -> Component | None:
        """A norm, activation or dropout module's map; None for the identity (a norm ``shaped`` removed)."""
        if isinstance(module, nn.Identity):
            return None
        if type(module).__name__.endswith("RMSNorm") and not isinstance(module, nn.RMSNorm):
            self.unit_gain(module, what)                             # LlamaRMSNorm, ..., Gemma3RMSNorm (1 + w)
            eps = _eps(module)
            return serial(SmallEpsilon(eps, what), RMSNorm(module.weight.numel())) if eps else RMSNorm(
                module.weight.numel())
        name = type(module).__name__
        if name in ACTIVATIONS:
            return ACTIVATIONS[name]()
        return component_of(module, what)

    def unit_gain(self, norm: nn.Module, what: str) -> None:
        """Refuse an HF norm whose gain (the family's ``norm_offset`` + weight) is not one everywhere, as at init."""
        weight = getattr(norm, "weight", None)
        if self.family.norm_offset == 0.0 or weight is None:
            _unit_affine(norm, what)
        elif not weight.is_meta and not bool((weight.detach() + self.family.norm_offset == 1.0).all()):
            raise NotImplementedError(f"{what} has a trained gain; the norm's moment map describes the init gain "
                                      f"{self.family.norm_offset:g} + weight = 1")

    def qk_norm(self, norm: nn.Module, what: str, projection: Linear) -> tuple[float, int, SmallEpsilon]:
        """(g², k, check) of an HF query or key RMSNorm after ``projection``: its gain squared (1 at init), the degrees
        of freedom of its output (its width), the qk-norm map's input (`sigprop.theory.moments.qk_norm`), and the
        identity map that refuses an attention input too small for the norm's ε (`SmallEpsilon`: a projected
        coordinate has mean square d_in σ_w² times the input's)."""
        if not type(norm).__name__.endswith("RMSNorm"):
            raise NotImplementedError(f"{what} ({type(norm).__name__}) has no qk-norm map (RMSNorm has)")
        self.unit_gain(norm, what)
        return 1.0, norm.weight.numel(), SmallEpsilon(_eps(norm), what, projection.d_in * projection.weight_var)

    def attention(self, module: nn.Module, L: int, variances: tuple[float, float, float, float], n_heads: int,
                  d: int, causal: bool, p: float, qk_norm: int = 0) -> Attention:
        """The attention map of an HF attention module with projection variances (q, k, v, o): its ``scaling``
        (softmax) or its `ShapedMix` (τ₀, γ₁, γ₂: shaped), attention-probability dropout ``p``; ``qk_norm`` > 0: each
        head's queries and keys normalized in that many degrees of freedom, (q, k) then the norms' g² (`qk_norm`)."""
        q, k, v, o = variances
        shape = getattr(module, "sigprop_shape", None)
        if shape is None:
            q *= attention_logit_factor(module.scaling, (d // n_heads) ** 0.5)
            return Attention(d, n_heads, L, q, k, v, o, p=p, causal=causal, qk_norm=qk_norm)
        if qk_norm:
            raise NotImplementedError("shaped attention with qk-norm has no moment map")
        return Attention(d, n_heads, L, q, k, v, o, p=p, causal=causal, shaped=True, tau0=shape.tau0,
                         gamma1=scalar(shape.gamma1, 1.0, "shaped attention gamma1"),
                         gamma2=scalar(shape.gamma2, 1.0, "shaped attention gamma2"))

    def site_maps(self, i: int, block: nn.Module, kind: str, L: int) -> SiteMaps:
        """The maps of residual site ``kind`` of block ``i`` over ``L`` tokens: the residual weights `apply`
        registered (α = β = 1 without them), the family's branch (its dropout included) and the site's norms."""
        family = self.family
        residual = family.residual(block, kind)
        alpha, beta = residual.values() if residual is not None else (1.0, 1.0)
        return SiteMaps(alpha, beta, tuple(c for c in family.branch_maps(self, block, kind, L) if c is not None),
                        self.component(family.site_norm(block, kind), f"layer {i} {kind} norm"),
                        self.component(family.output_norm(block, kind), f"layer {i} {kind} output norm"))

    def chain(self, L: int) -> tuple[list[tuple[int, str] | None], list[Component]]:
        """The model as moment maps from ids to its output, with each output's record label."""
        family, base = self.family, self.model.base_model
        inputs = [c for c in family.input_maps(self, base) if c is not None]
        labels: list[tuple[int, str] | None] = [None] * (len(inputs) - 1) + [(0, "embed")]
        chain: list[Component] = list(inputs)
        normalized = _normalized(inputs)
        sites = [(i, block, site.kind) for i, block in enumerate(family.blocks(base)) for site in family.sites(block)]
        maps = [self.site_maps(i, block, kind, L) for i, block, kind in sites]
        if maps and maps[0].norm is not None and normalized is None and family.placement == "post":
            raise NotImplementedError("the first Post-LN sublayer reads a norm output under dropout: its "
                                      "norm's input is neither normalized nor Gaussian")
        chain += sites_chain(maps, family.placement, normalized_input=bool(normalized))
        labels += [(i + 1, kind) for i, _, kind in sites]
        tail = [c for c in (self.component(family.final_norm(base), "final norm"),) if c is not None]
        tail += [c for c in family.head_maps(self, self.model) if c is not None]
        return labels + [None] * len(tail), chain + tail


@dataclass(frozen=True)
class SmallEpsilon:
    """The identity, refusing an input whose mean square μ² + σ² is not ≫ the ``eps`` of the RMSNorm it feeds.

    An HF RMSNorm computes x/√(ms(x) + ε); its map (`RMSNorm`) is the ε → 0 one, whose output variance is off by a
    factor ≈ ms/(ms + ε). Inputs with ε ≤ `EPS_SHARE`·(μ² + σ²) keep that bias under 1 %; smaller inputs (a branch
    output at HF's 0.02-std init, whose mean square can fall below ε = 1e-6) raise NotImplementedError naming the
    norm."""

    eps: float
    what: str
    gain: float = 1.0       # the norm's input mean square per unit mean square of this map's input

    def fwd(self, m: Moments) -> Moments:
        square = self.gain * (m.mean ** 2 + m.var)
        if self.eps > EPS_SHARE * square:
            raise NotImplementedError(f"{self.what}: its eps {self.eps:g} is not negligible against its input's mean "
                                      f"square {square:.3g}; the RMSNorm map is the eps → 0 one")
        return m

    def token_mixing(self) -> Mixing:
        """Tokenwise: its check reads each position's own input (`sigprop.theory.moments.state.Mixing`)."""
        return Mixing.TOKENWISE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        self.fwd(m_in)
        return replace(m_in, grad_var=g_out.grad_var, grad_corr=g_out.grad_corr)


EPS_SHARE = 0.01


def _eps(norm: nn.Module) -> float:
    """The ε of an HF RMSNorm (``variance_epsilon``: LLaMA, OLMo 2, Qwen; ``eps``: Gemma)."""
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 0.0)))


def _normalized(inputs: list[Component]) -> bool | None:
    """Whether the stream entering the first block is a norm's output: True, False (a sum of tables), or None for
    a norm output through active dropout."""
    last, before = inputs[-1], inputs[-2] if len(inputs) > 1 else None
    if isinstance(last, (LayerNorm, RMSNorm)):
        return True
    if isinstance(last, Dropout) and isinstance(before, (LayerNorm, RMSNorm)):
        return True if last.p == 0 else None
    return False


def batch_ids(batch: Any) -> torch.Tensor:
    """The input ids of ``batch`` (a tensor or a dict of model kwargs); refuses what the maps do not describe: a
    padding mask, explicit position ids, input embeddings."""
    if not isinstance(batch, dict):
        return batch
    for key in ("position_ids", "inputs_embeds"):
        if batch.get(key) is not None:
            raise NotImplementedError(f"hf.predict: batch key {key!r} has no moment map (ids only)")
    mask = batch.get("attention_mask")
    if mask is not None and not bool(mask.bool().all()):
        raise NotImplementedError("hf.predict: a padding attention_mask has no moment map (every key visible)")
    return batch["input_ids"]


def collision(ids: torch.Tensor) -> float:
    """Σ_v (n_v/N)²: the batch's probability that two positions hold the same id."""
    return (torch.bincount(ids.flatten()).double() / ids.numel()).square().sum().item()


def predict(model: nn.Module, batch: Any, mode: str = "eval") -> list[Record]:
    """Predicted records of a `transformers` model (a family in `SUPPORTED`) on ``batch``, in the schema,
    labels and order of `sigprop.hf.diagnose` (layer 0 = the stream entering the first block, then one record per
    sublayer), read off its modules in ``mode`` (module docstring); the batch enters through its length, its
    token-collision probability and (BERT) its token types.

    Args:
        model: a `transformers` model of a supported family, with or without `apply`.
        batch: input_ids (B, T), or a dict of keyword arguments of the model's forward.
        mode: "eval" (dropout off) or "train" (the modules' dropout rates).

    Returns:
        One predicted `Record` per sublayer, labelled as `sigprop.hf.diagnose` labels the measured ones.

    Raises:
        NotImplementedError: a module, option or input without an exact map, named.
    """
    walk = Walk(model, batch)
    stack = walk.family.stack(model)
    L = walk.ids.shape[-1]
    with in_mode(model, mode):
        labels, chain = walk.chain(L)
    return to_records(labels, trace(chain, walk.family.placement, stack == "dec", L), stack)
