"""Measure per-sublayer moments of any sigprop model with forward and backward hooks.

`measure(model, batch)` runs one forward and backward pass and returns one `Record` per
sublayer output (and the embedding output as layer 0): mean, variance, token correlation,
gradient variance, the stable rank of the token matrix, and for attention sublayers the
softmax entropy and largest logit. The default loss is ⟨output, G⟩ with G ~ N(0, 1) fixed by
``seed``, so ∂loss/∂output has unit variance, the starting point of the theory's backward maps.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..nn import Attention, Sublayer
from ..records import Record
from .statistics import attention_entropy, stable_rank, token_correlation


def random_projection_loss(out: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """⟨out, G⟩ with G ~ N(0, 1) i.i.d. (seeded): a loss whose output gradient has unit variance."""
    g = torch.Generator().manual_seed(seed)
    return (out * torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)).sum()


def _call(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _attention_stats(attn: Attention, args: tuple, kwargs: dict) -> tuple[float, float]:
    with torch.no_grad():
        q, k, _ = attn.qkv(args[0], kwargs.get("kv"))
        logits = attn.logits(q, k, kwargs.get("key_mask"))
        return attention_entropy(logits.softmax(-1)), logits.amax().item()


def measure(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
            seed: int = 0, attention_stats: bool = True) -> list[Record]:
    """Per-sublayer records of ``model`` on ``batch`` (a tensor, a tuple of args or a dict of kwargs).

    Modules are found by type: every `Sublayer` (its ``site`` names stack/layer/kind) and the
    model's ``embed`` module. Gradients are taken w.r.t. each output; parameters' ``.grad`` are
    left untouched (restored after the pass).
    """
    outputs: dict[tuple, torch.Tensor] = {}
    attn_stats: dict[tuple, tuple[float, float]] = {}
    hooks = []

    def keep(key: tuple) -> Callable:
        def hook(module: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
            if key not in outputs:                   # a shared embedding reports its first call
                out.retain_grad()
                outputs[key] = out
        return hook

    def attn_hook(key: tuple) -> Callable:
        def hook(module: Attention, args: tuple, kwargs: dict) -> None:
            attn_stats[key] = _attention_stats(module, args, kwargs)
        return hook

    sublayers = [m for m in model.modules() if isinstance(m, Sublayer) and hasattr(m, "site")]
    embed = getattr(model, "embed", None)
    if isinstance(embed, nn.Module) and sublayers:
        hooks.append(embed.register_forward_hook(keep((sublayers[0].site.stack, 0, "embed"))))
    for m in sublayers:
        key = (m.site.stack, m.site.layer + 1, m.site.sublayer)
        hooks.append(m.register_forward_hook(keep(key)))
        if attention_stats and isinstance(m.fn, Attention):
            hooks.append(m.fn.register_forward_pre_hook(attn_hook(key), with_kwargs=True))
    backprop(model, lambda: _call(model, batch), hooks, loss_fn, seed)
    return records_from(outputs, attn_stats)


def backprop(model: nn.Module, forward: Callable[[], torch.Tensor], hooks: list,
             loss_fn: Callable[[torch.Tensor], torch.Tensor] | None, seed: int) -> None:
    """Run ``forward()``, back-propagate ``loss_fn(out)`` (default `random_projection_loss`), then
    remove ``hooks`` and give every parameter back the ``.grad`` it had."""
    saved_grads = {p: p.grad for p in model.parameters()}
    try:
        out = forward()
        (loss_fn(out) if loss_fn is not None else random_projection_loss(out, seed)).backward()
    finally:
        for h in hooks:
            h.remove()
        for p, g in saved_grads.items():
            p.grad = g


def records_from(outputs: dict[tuple[str, int, str], torch.Tensor],
                 attn_stats: dict[tuple[str, int, str], tuple[float, float]]) -> list[Record]:
    """One measured `Record` per kept output, keyed (stack, layer, sublayer), in insertion order."""
    records = []
    for (stack, layer, kind), y in outputs.items():
        entropy, max_logit = attn_stats.get((stack, layer, kind), (None, None))
        records.append(Record(
            layer=layer, sublayer=kind, stack=stack, source="measured",
            fwd_mean=y.mean().item(), fwd_var=y.var().item(), token_corr=token_correlation(y.detach()),
            grad_var=None if y.grad is None else y.grad.var().item(),
            attn_entropy=entropy, max_logit=max_logit, stable_rank=stable_rank(y.detach()),
        ))
    return records
