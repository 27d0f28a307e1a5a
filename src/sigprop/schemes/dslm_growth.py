"""DSLM gains for the new blocks of a grown stack, from the stream the grown stack makes.

A DSLM model grown from L to N blocks (`sigprop.models.grow`, mode "dslm") keeps its old blocks with the (λ, β) of
depth L (β² = k/(2L)) and the V/O std made for the gain G of their stream at depth L; the new blocks come from a
fresh model of depth N, whose V/O std d²σ_v²σ_o² G_l = 1 − p holds G_l = G(r_l) of a fresh N-block stream at
layer l. The grown stream is not that stream: at β² = k/(2L) > k/(2N) each old block mixes more, the token
correlation r entering a new block is higher than a fresh model's r_l and so is the gain (G grows with r), and a
new attention branch at the fresh std has variance G(r)/G_l > 1 (measured in docs/grow.md).

Rule. Walk the grown stack bottom to top with DSLM's own recursion of the token correlation
(`sigprop.theory.dslm_stack`, the Gram recursion up to ``GRAM_MAX_TOKENS`` tokens, the mean recursion beyond,
as `sigprop.schemes.dslm.correlations` chooses), reading each block off its modules:

  old block  its own (λ, β) (`Residual.values`) and branch scales from its weights' recorded init stds: attention
             c = d²σ_v²σ_o²/(1 − p) (branch variance c·G at the gain G of its input, 1 where G is the gain its
             std was made for), MLP c = d d_ff σ₁²σ₂² m₂/(1 − p) (1 under DSLM's rule);
  new block  its (λ, β) and, at the gain G_j of the grown stream entering it, V/O std
             σ_v = σ_o = (√((1 − p)/G_j)/d)^{1/2} (`sigprop.schemes.dslm.vo_std`): a unit attention branch there,
             which is what the walk adds.

Each new block's W_V and W_O are rescaled by vo_std(G_j)/(recorded std) and the new std recorded, so the weights
stay the fresh draw (the same global RNG stream) at the new scale. Since a new block's gain depends only on the
blocks below it, one walk sets them all in order. A trained old block is read as the recursion reads any block,
by its residual weights and recorded init stds (not by its trained weights). A stack of one depth (nothing grown)
walks to the fresh model's (r_l, G_l) to rounding, rel. 1e-10 (`tests/test_grow_dslm.py`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import torch
from torch import nn

from ..nn import Block
from ..nn.block import OUTPUT_NORMED
from ..nn.maps import weight_var
from ..nn.roles import set_init_std
from ..theory import dslm as theory_dslm
from ..theory.dslm_stack import ResidualSite, gram_sites, mean_sites
from ..theory.kernels import tabulated
from .dslm import HOMOGENEOUS, _gram_arguments, activation_kernel, embedding_pairs, second_moment, vo_std

ATTENTIONS = ("attn", "cross")


def residual_sites(cfg: Any, block: Block, new: bool) -> tuple[ResidualSite, ...]:
    """The residual sites of ``block`` in forward order, read off its modules (module docstring): (λ, β) from its
    residuals; a new block's attention scale None (the rule at its own gain); an old block's attention c =
    d²σ_v²σ_o²/(1 − p) and every MLP's c = d d_ff σ₁²σ₂² m₂/(1 − p) from the recorded init stds.

    Raises:
        NotImplementedError: a weight without a recorded std, or a non-homogeneous activation (GeLU) whose
            σ₁² ≠ 1/d (its kernel then differs from the one the recursion uses), named.
    """
    sites, drop = [], cfg.dropout
    for kind in ("attn", "cross", "mlp"):
        sub = getattr(block, kind)
        if sub is None:
            continue
        lam, beta = sub.residual.values()
        what = f"block {sub.site.layer} {kind}"
        if kind in ATTENTIONS:
            fn = sub.fn
            scale = None if new else (cfg.d_model ** 2 * weight_var(fn.v_proj.weight, f"{what} W_V")
                                      * weight_var(fn.o_proj.weight, f"{what} W_O") / (1 - drop))
            sites.append(ResidualSite("attn", lam, beta, scale))
            continue
        s1 = weight_var(sub.fn.fc1.weight, f"{what} fc1") * cfg.d_model
        if cfg.activation not in HOMOGENEOUS and not math.isclose(s1, 1.0, rel_tol=1e-6):
            raise NotImplementedError(f"{what}: σ₁²d = {s1:.4g} ≠ 1 with activation {cfg.activation!r}, whose MLP "
                                      "kernel depends on it; the DSLM recursion takes the kernel at unit "
                                      "pre-activation variance")
        scale = s1 * cfg.d_ff * weight_var(sub.fn.fc2.weight, f"{what} fc2") * second_moment(cfg.activation)
        sites.append(ResidualSite("mlp", lam, beta, scale / (1 - drop)))
    return tuple(sites)


@lru_cache(maxsize=32)
def stack_gains(cfg: Any, stack: str, sites: tuple[ResidualSite, ...]) -> tuple[tuple[float, float], ...]:
    """(r, G) at every attention site of a stack of ``sites`` (forward order) of sigprop model ``cfg``: DSLM's
    recursion (`sigprop.theory.dslm_stack`) from the embeddings the scheme assumes (two tables, Zipf tokens), the
    Gram recursion up to ``GRAM_MAX_TOKENS`` tokens and the mean recursion beyond, as the scheme's
    `sigprop.schemes.dslm.correlations` for a fresh stack."""
    kernel = lambda r: activation_kernel(cfg.activation, r)     # noqa: E731
    causal, post = stack == "dec", cfg.norm_placement == "post"
    branch_norm = cfg.norm_placement in OUTPUT_NORMED
    if cfg.n_tokens > theory_dslm.GRAM_MAX_TOKENS:
        return mean_sites(embedding_pairs(cfg), sites, cfg.dropout, cfg.n_tokens, causal, cfg.d_model,
                          cfg.n_heads, kernel, post, branch_norm)
    grams = _gram_arguments(cfg, stack, kernel, 2, 0)[0]
    return gram_sites(grams, sites, cfg.dropout, causal, cfg.d_model, cfg.n_heads, tabulated(kernel), post,
                      branch_norm)


@torch.no_grad()
def set_new_block_gains_(model: nn.Module, new: Sequence[bool]) -> tuple[float, ...]:
    """Give every new block of a grown DSLM ``model`` the V/O std of DSLM's rule at the gain of the grown stream
    entering it (module docstring); ``new[j]``: block j of ``model.stack`` is new. Returns each block's gain G_j
    (old blocks: the gain of the stream they now see).

    The W_V and W_O of new block j (and of its cross-attention, which DSLM gives its block's rule) are multiplied
    by vo_std(cfg, G_j)/(recorded std), and that std is recorded, so `sigprop.models.predict` reads the grown model
    as it is.

    Raises:
        ValueError: ``new`` does not have one entry per block.
        NotImplementedError: a block `residual_sites` cannot read, named.
    """
    cfg, blocks = model.cfg, list(model.stack.blocks)
    if len(new) != len(blocks):
        raise ValueError(f"set_new_block_gains_: {len(new)} flags for {len(blocks)} blocks")
    stack = blocks[0].attn.site.stack
    sites = [residual_sites(cfg, block, is_new) for block, is_new in zip(blocks, new)]
    per_block = [sum(s.kind == "attn" for s in block_sites) for block_sites in sites]
    found = stack_gains(cfg, stack, tuple(s for block_sites in sites for s in block_sites))
    starts = [sum(per_block[:j]) for j in range(len(blocks))]
    gains = tuple(found[i][1] for i in starts)                   # a block's rule: the gain at its first attention
    for block, is_new, gain in zip(blocks, new, gains):
        if not is_new:
            continue
        std = vo_std(cfg, gain)
        for kind in ATTENTIONS:
            sub = getattr(block, kind)
            if sub is None:
                continue
            for weight in (sub.fn.v_proj.weight, sub.fn.o_proj.weight):
                weight.mul_(std / math.sqrt(weight_var(weight, f"block {sub.site.layer} {kind}")))
                set_init_std(weight, std)
    return gains
