"""AdamW with param groups from role tags and the model's scheme (`Scheme.optim`).

Every trainable parameter gets the scheme's `OptimRule` for its role and site: learning rate
``optim.lr × rule.lr``, ε ``optim.eps × rule.eps`` and weight decay ``optim.weight_decay ×
rule.weight_decay`` on matrices (ndim ≥ 2) only; norms, biases and shaping/residual scalars
never decay. Parameters with the same rule share one group, so a scheme with unit multipliers
gives the two groups (matrices, the rest) of a plain AdamW. Each group keeps its multiplier under
``"lr_mult"``; the trainer sets ``lr = schedule(step) × lr_mult`` every step. Groups come from the
role tags, never from parameter names.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.adapter import adapter_of
from ..nn.roles import role_of
from ..schemes import OptimRule, ParamInfo, get_scheme
from .config import OptimConfig


def param_rules(model: nn.Module, model_cfg: Any) -> list[tuple[str, nn.Parameter, OptimRule]]:
    """(name, parameter, rule) of every trainable parameter of ``model``, in ``named_parameters`` order: the rule of
    ``model_cfg``'s scheme for the role, stack and block of each of the model's pieces (`Adapter.pieces`: a sigprop
    model's role tags, a `transformers` family's piece map). A parameter no piece names (a module `sigprop.hf.apply`
    added: trainable residual or shaping scalars) takes its role tag, outside any block.

    Raises:
        ValueError: a fused parameter (GPT-2's ``c_attn``) whose pieces have different rules (it is one tensor to
            the optimizer), or a model no adapter handles.
        RuntimeError: a parameter with neither a piece nor a role tag.
    """
    adapter, scheme = adapter_of(model), get_scheme(model_cfg.scheme)

    def rule_of(role: str, stack: str | None, layer: int | None, shape: tuple[int, ...]) -> OptimRule:
        return scheme.optim(model_cfg, ParamInfo(role, stack if layer is not None else None, layer, shape))

    rules: dict[int, OptimRule] = {}
    for piece in adapter.pieces(model):
        rule, key = rule_of(piece.role, piece.stack, piece.layer, piece.shape), id(piece.param)
        if rules.setdefault(key, rule) != rule:
            name = next(n for n, p in model.named_parameters() if id(p) == key)
            raise ValueError(f"parameter {name!r} is fused from pieces with different optimizer rules "
                             f"({rules[key]} vs {rule}); it cannot have one learning rate")
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) not in rules:
            if role_of(p) is None:
                raise RuntimeError(f"parameter {name!r} has no role in the {type(adapter).__name__} piece map")
            rules[id(p)] = rule_of(role_of(p), None, None, tuple(p.shape))
        out.append((name, p, rules[id(p)]))
    return out


def param_groups(rules: list[tuple[str, nn.Parameter, OptimRule]], cfg: OptimConfig) -> list[dict[str, Any]]:
    """One AdamW param group per distinct (rule, decays) pair, in first-seen order."""
    groups: dict[tuple[OptimRule, bool], dict[str, Any]] = {}
    for _, p, rule in rules:
        decays = p.ndim >= 2
        g = groups.setdefault((rule, decays), {
            "params": [], "lr": cfg.lr * rule.lr, "lr_mult": rule.lr, "eps": cfg.eps * rule.eps,
            "weight_decay": cfg.weight_decay * rule.weight_decay if decays else 0.0})
        g["params"].append(p)
    return list(groups.values())


def make_optimizer(model: nn.Module, cfg: OptimConfig, model_cfg: Any | None = None) -> torch.optim.Optimizer:
    """AdamW over `param_groups`; ``model_cfg`` defaults to ``model.cfg`` (every sigprop model has one).

    ``fused=True``: one fused kernel call per parameter group and step, on CPU and CUDA, instead of
    PyTorch's default loop on CPU of about ten elementwise ops per parameter (a 192-layer model has
    ~2000 parameters); the same update up to float rounding.

    ``optim.optimizer="prodigy"``: Prodigy (Mishchenko & Defazio 2024, the ``prodigyopt`` package) over the same
    groups, with the run's betas, ε and decoupled weight decay, bias correction and the safeguard its authors
    advise under a warmup. Prodigy estimates one step size for every group and accepts no per-group lr, so the
    roles' lr multipliers are dropped (a parametrization's per-role lr rules, μP's, cannot be expressed); the
    weight-decay and ε rules stay.

    Args:
        model: the model; its parameters' role tags select each one's group.
        cfg: the optimizer settings.
        model_cfg: the `ModelConfig` whose scheme gives the per-role rules (default ``model.cfg``).

    Raises:
        ImportError: ``optim.optimizer="prodigy"`` without the ``prodigyopt`` package.
    """
    model_cfg = model.cfg if model_cfg is None else model_cfg
    groups = param_groups(param_rules(model, model_cfg), cfg)
    if cfg.optimizer == "prodigy":
        try:
            from prodigyopt import Prodigy
        except ImportError as e:
            raise ImportError("optim.optimizer='prodigy' needs the prodigyopt package: pip install prodigyopt") from e
        groups = [{**g, "lr_mult": 1.0} for g in groups]
        return Prodigy(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, decouple=True,
                       use_bias_correction=True, safeguard_warmup=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)
