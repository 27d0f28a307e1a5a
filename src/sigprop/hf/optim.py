"""Optimizer param groups for a `transformers` model after `sigprop.hf.apply`: the scheme's `OptimRule`
per role, exactly as `sigprop.train.optim` builds them for a sigprop model.

    cfg = sigprop.hf.apply(model, "dslm")
    opt = torch.optim.AdamW(sigprop.hf.param_groups(model, cfg, lr=3e-4, weight_decay=0.1))

Roles come from the family's piece map (`Family.pieces` and the head), never from parameter names;
a piece inside block l has site (stack, l), so the depth rules of "depth_mup"/"completep" reach the
blocks' weights, norms and biases and leave the embeddings, the final norm and the heads alone.
A fused parameter (GPT-2's ``c_attn`` holds Q, K and V) is one tensor to the optimizer, so its slices
must share one rule; they do under every scheme and parametrization `apply` supports (Q, K and V of one
block are hidden weights of one site), and `param_groups` raises ValueError naming the parameter if they
ever differ. The forward multipliers that belong with these rules (μP's init, attention and tied-logit
scales, the α-family's branch multipliers) are set by `apply`; pass the ``cfg`` it returned.
"""
from __future__ import annotations

from itertools import chain
from typing import Any

from torch import nn

from ..models import ModelConfig
from ..nn.roles import role_of
from ..schemes import OptimRule, ParamInfo, get_scheme
from ..train.config import OptimConfig
from ..train.optim import param_groups as groups_of
from .apply import _head_pieces, family_of


def param_rules(model: nn.Module, cfg: ModelConfig) -> list[tuple[str, nn.Parameter, OptimRule]]:
    """(name, parameter, rule) for every trainable parameter of ``model`` (``cfg``: what `apply` returned)."""
    family, scheme = family_of(model), get_scheme(cfg.scheme)
    stack = "dec" if cfg.arch == "decoder" else "enc"
    rules: dict[int, OptimRule] = {}
    for piece in chain(family.pieces(model.base_model), _head_pieces(model, rules)):   # a tied head is the embedding
        rule = scheme.optim(cfg, ParamInfo(piece.role, stack if piece.layer is not None else None, piece.layer,
                                           piece.shape))
        key = id(piece.param)
        if rules.setdefault(key, rule) != rule:
            name = next(n for n, p in model.named_parameters() if id(p) == key)
            raise ValueError(f"parameter {name!r} is fused from pieces with different optimizer rules "
                             f"({rules[key]} vs {rule}); sigprop.hf cannot give it one learning rate")
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) not in rules:                # modules apply added (trainable residual/shaping scalars) carry a tag
            if role_of(p) is None:
                raise RuntimeError(f"parameter {name!r} has no role in the {type(family).__name__} piece map")
            rules[id(p)] = scheme.optim(cfg, ParamInfo(role_of(p), None, None, tuple(p.shape)))
        out.append((name, p, rules[id(p)]))
    return out


def param_groups(model: nn.Module, cfg: ModelConfig, **optim: Any) -> list[dict[str, Any]]:
    """AdamW param groups (``lr``, ``eps``, ``weight_decay`` per group, ``lr_mult`` kept for schedules).

    Args:
        model: a `transformers` model after `apply`.
        cfg: what `apply` returned (its scheme's optimizer rule per parameter role).
        **optim: `OptimConfig` fields (lr, eps, weight_decay, ...).

    Returns:
        One group per distinct (lr, eps, weight-decay) multiplier set, for ``torch.optim.AdamW``.

    Raises:
        TypeError: an ``optim`` keyword that is not an `OptimConfig` field.
        FieldError: an invalid `OptimConfig` value.
    """
    return groups_of(param_rules(model, cfg), OptimConfig(**optim))
