"""Optimizer param groups for a `transformers` model after `sigprop.hf.apply`: the scheme's `OptimRule`
per role, exactly as `sigprop.train.optim` builds them for a sigprop model.

    cfg = sigprop.hf.apply(model, "dslm")
    opt = torch.optim.AdamW(sigprop.hf.param_groups(model, cfg, lr=3e-4, weight_decay=0.1))

Roles come from the family's piece map (`Family.pieces`, the head included; `sigprop.train.optim.param_rules` reads
every model's adapter the same way), never from parameter names;
a piece inside block l has site (stack, l), so the depth rules of "depth_mup"/"completep" reach the
blocks' weights, norms and biases and leave the embeddings, the final norm and the heads alone.
A fused parameter (GPT-2's ``c_attn`` holds Q, K and V) is one tensor to the optimizer, so its slices
must share one rule; they do under every scheme and parametrization `apply` supports (Q, K and V of one
block are hidden weights of one site), and `param_groups` raises ValueError naming the parameter if they
ever differ. The forward multipliers that belong with these rules (μP's init, attention and tied-logit
scales, the α-family's branch multipliers) are set by `apply`; pass the ``cfg`` it returned.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from ..models import ModelConfig
from ..train.config import OptimConfig
from ..train.optim import param_groups as groups_of
from ..train.optim import param_rules


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
