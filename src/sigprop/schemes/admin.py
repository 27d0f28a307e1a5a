"""Admin (Liu et al., EMNLP 2020, "Understanding the Difficulty of Training Transformers", arXiv 2004.08249).

Post-LN sublayer i: x_i = LN(ω_i ⊙ x_{i−1} + f_i(x_{i−1})), ω_i a trainable per-channel vector on the
shortcut (role "constant": lr multiplier 1, no weight decay, as every residual scalar; `Scheme.optim`),
every entry equal at init; standard (Xavier-like) init of the weights, as `postln`. A standard Post-LN
output depends on its last branches ~N times more than on its first and its gradient grows toward the
output; ω_i² = Σ_{j<i} Var f_j gives every branch the same share of the output, so the output change of a
parameter update is O(log N) rather than O(N) (the paper's Theorem 2). ``ModelConfig.admin_mode``:

* ``"constant"``: every ω = √((N+1)/ln(N+1) − 1), N the residual sublayers of the stack (2 per block,
  3 in an encdec decoder): the profiling-free O(log N) form (admin-torch's ``calculate_init``).
* ``"profile"`` (default): the profiling pass of Transformer-Clinic (`profile`), on the first training
  batch (`sigprop.models.calibrate`, called by the trainer before step 1 and by ``build_model(cfg,
  batch=...)``). A model built without data takes the theory's profile (`omega_profile` over its own moment
  maps, `Admin.calibrate`; `sigprop.models.predict.predicted_omegas` for a config), so it is always defined.
  A resumed run reads ω from its checkpoint (the checkpoint's values replace any profile).

Profiling, per stack in sublayer order with r = 1: ω_i ← r, then r ← √(Var[ω_i x_{i−1}] + Var[f_i(x_{i−1})]),
each variance over every entry of the (batch, tokens, features) tensor (Transformer-Clinic's ``np.var`` of
the flattened tensor), the sum of the two variances rather than the variance of the sum. The pass runs
in eval mode, so the branch variances carry no dropout (Transformer-Clinic profiles in training mode,
where a branch's variance is larger by 1/(1 − p)); without dropout the two agree, and every rank of a
data-parallel run computes the same ω from the same batch.

Moment map: the norm's output x_{i−1} has variance 1 and a branch reads x_{i−1} alone, so in the moments
the recursion is deterministic: ω_i² = ω_{i−1}² σ²_{i−2} + σ_f,i−1², σ² the variance of the sublayer's
input (1 after a norm; the embedding's for the first) and σ_f² that of its branch's output, both from
the sublayer's moment map (`sigprop.theory.moments.postnorm.PostNormResidual`) walked in forward order
with the ω found so far: the token correlation after each norm, and so the next attention branch's
variance, depends on the mix that ω sets.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from ..nn.block import Sublayer
from ..nn.modes import in_mode
from ..nn.residual import Residual
from ..theory.moments.postnorm import PostNormResidual
from ..theory.moments.state import Component, Moments
from .base import ChainOf, Scheme, Site, stack_layers, sublayers_per_block


def n_sublayers(cfg: Any, stack: str) -> int:
    """Residual sublayers N of ``stack``: blocks × sublayers per block."""
    return stack_layers(cfg, stack) * sublayers_per_block(cfg, stack)


def constant_omega(n: int) -> float:
    """ω = √((N+1)/ln(N+1) − 1) for N residual sublayers (the O(log N) output change without profiling)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"constant_omega needs a positive int number of sublayers, got {n!r}")
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


def _index(cfg: Any, site: Site) -> int:
    """Position of ``site`` among its stack's sublayers in forward order."""
    kinds = ("attn", "cross", "mlp") if sublayers_per_block(cfg, site.stack) == 3 else ("attn", "mlp")
    return site.layer * len(kinds) + kinds.index(site.sublayer)


def stack_names(cfg: Any) -> tuple[str, ...]:
    """The model's stacks in forward order: ("enc", "dec") for an encdec, ("dec",) for a decoder, else ("enc",)."""
    return {"encdec": ("enc", "dec"), "decoder": ("dec",)}.get(cfg.arch, ("enc",))


def omega_profile(cfg: Any, chain_of: ChainOf) -> dict[str, tuple[float, ...]]:
    """The profile `profile` gives at init in the moments (module docstring), per stack in sublayer order, from
    each stack's moment maps ``chain_of(stack, memory)`` (`Scheme.calibrate`; a decoder's read the encoder's
    output moments)."""
    omegas, memory = {}, None
    for stack in stack_names(cfg):
        omegas[stack], memory = _walk(chain_of(stack, memory))
    return omegas


def _walk(chain: list[Component]) -> tuple[tuple[float, ...], Moments]:
    """ω of every Post-LN sublayer of ``chain`` by the profiling recursion in the moments, and the chain's
    output moments (from the standard input N(0, 1), as `predict`)."""
    m, r, omegas = Moments(0.0, 1.0, 0.0), 1.0, []
    for c in chain:
        if isinstance(c, PostNormResidual):
            c = dataclasses.replace(c, alpha=r)
            omegas.append(r)
            r = math.sqrt(r * r * m.var + c.branch.fwd(m).var)
        m = c.fwd(m)
    return tuple(omegas), m


@torch.no_grad()
def profile(model: nn.Module, batch: torch.Tensor | tuple[torch.Tensor, ...]) -> dict[str | None, list[float]]:
    """Set every per-channel shortcut ω of ``model`` by one profiling forward pass on ``batch`` (the model's
    positional inputs: token ids, images, or (src, tgt) for an encdec), in eval mode (module docstring);
    returns the ω set, per stack in sublayer order. Sublayers of a sigprop model count per stack; the
    shortcuts `sigprop.hf.apply` registers on a Hugging Face model (key None) form one stack."""
    inputs = (batch,) if isinstance(batch, torch.Tensor) else tuple(batch)
    stacks = {id(m.residual): m.site.stack for m in model.modules() if isinstance(m, Sublayer) and hasattr(m, "site")}
    shortcuts = [m for m in model.modules() if isinstance(m, Residual) and m.alpha.ndim == 1]
    if not shortcuts:
        raise ValueError(f"profile needs a model with per-channel shortcut weights ω (scheme 'admin'); "
                         f"{type(model).__name__} has none")
    r: dict[str | None, float] = {}
    omegas: dict[str | None, list[float]] = {}
    seen: list[int] = []

    def hook(module: nn.Module, args: tuple) -> None:
        x, fx = args
        stack = stacks.get(id(module))
        module.alpha.fill_(r.get(stack, 1.0))
        omegas.setdefault(stack, []).append(r.get(stack, 1.0))
        seen.append(id(module))
        var = (x.double() * module.alpha.double()).var(unbiased=False) + fx.double().var(unbiased=False)
        r[stack] = math.sqrt(float(var))

    handles = [m.register_forward_pre_hook(hook) for m in shortcuts]
    try:
        with in_mode(model, "eval"):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    if sorted(seen) != sorted(map(id, shortcuts)):
        raise RuntimeError(f"the profiling pass ran {len(seen)} shortcut adds for the model's {len(shortcuts)} "
                           "shortcuts; each must run exactly once")
    return omegas


class Admin(Scheme):
    name = "admin"
    norm_placements = ("post",)
    channel_residual = True

    def residual(self, cfg: Any, site: Site) -> tuple[float, float]:
        """The constant ω; under admin_mode "profile" the model's `calibrate` replaces it."""
        return constant_omega(n_sublayers(cfg, site.stack)), 1.0

    def calibrate(self, cfg: Any, model: nn.Module, inputs: tuple[torch.Tensor, ...] | None, chain_of: ChainOf
                  ) -> None:
        """admin_mode "profile": `profile` on ``inputs``, or without data the theory's profile (`omega_profile`,
        the model in eval mode); "constant" keeps its ω."""
        if cfg.admin_mode != "profile":
            return
        if inputs is not None:
            profile(model, inputs)
            return
        with in_mode(model, "eval"):
            omegas = omega_profile(cfg, chain_of)
        for sub in model.modules():
            if isinstance(sub, Sublayer) and hasattr(sub, "site"):
                sub.residual.reset_alpha(omegas[sub.site.stack][_index(cfg, sub.site)])
