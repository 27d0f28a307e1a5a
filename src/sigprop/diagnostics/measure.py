r"""Measure per-sublayer moments of any torch model with forward and backward hooks.

`measure(model, batch)` runs one forward and backward pass and returns one `Record` per
sublayer output (and the embedding output as layer 0): mean, variance, token correlation,
gradient variance, the stable rank of the token matrix, and for attention sublayers the
softmax entropy and largest logit. The default loss is ⟨output, G⟩ with G ~ N(0, 1) fixed by
``seed``, so ∂loss/∂output has unit variance, the starting point of the theory's backward maps.
``backward=False`` runs the forward pass alone (no gradient variance); ``stable_ranks=False`` skips the
stable ranks (an SVD per record), where only the moments are wanted.

On a model without an adapter (neither a sigprop model nor a supported `transformers` family), ``blocks``
names the modules to measure (as mup's coordinate check does on any model): a module class (or a tuple, list
or any iterable of classes), a regular expression matched against the qualified module names
(``r"transformer\.h\.\d+"``), or a predicate ``(name, module) -> bool``. Their outputs (the first element
of a tuple output) are the records; the selected modules must run in the forward pass (a container such as
``nn.ModuleList`` never does: select the blocks in it).

Variances (``fwd_var``, ``grad_var``) are the sample variance over every entry of the tensor
(batch × tokens × features) with the N − 1 (unbiased) estimator, ``torch.Tensor.var``'s default.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any, Callable, Union

import torch
from torch import nn

from ..models.adapter import adapter_of
from ..nn.modes import in_mode
from ..records import Record
from .statistics import attention_entropy, stable_rank, token_correlation

Selector = Union[type, Iterable[type], str, Callable[[str, nn.Module], bool]]
SELECTOR_FORMS = ("a module class, an iterable (tuple, list) of module classes, a regular expression or a "
                  "callable (name, module) -> bool")


def select(model: nn.Module, blocks: Selector) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every submodule of ``model`` that ``blocks`` selects, in `named_modules` order."""
    if isinstance(blocks, str):
        pattern = re.compile(blocks)
        keep = lambda name, m: pattern.fullmatch(name) is not None
    elif isinstance(blocks, type):
        keep = lambda name, m: isinstance(m, blocks)
    elif callable(blocks):
        keep = blocks
    elif isinstance(blocks, Iterable):
        classes = tuple(blocks)
        if not classes or not all(isinstance(c, type) for c in classes):
            raise ValueError(f"measure: blocks given as a collection must hold one or more module classes; "
                             f"got {blocks!r}")
        keep = lambda name, m: isinstance(m, classes)
    else:
        raise ValueError(f"measure: blocks must be {SELECTOR_FORMS}; got {blocks!r}")
    chosen = [(name, m) for name, m in model.named_modules() if name and keep(name, m)]
    if not chosen:
        raise ValueError(f"measure: blocks={blocks!r} selects no submodule of {type(model).__name__}")
    return chosen


def random_projection_loss(out: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """⟨out, G⟩ with G ~ N(0, 1) i.i.d. (seeded): a loss whose output gradient has unit variance.

    Args:
        out: the model's output, any shape.
        seed: seed of G (drawn on the CPU, then moved to ``out``'s device).
    """
    g = torch.Generator().manual_seed(seed)
    return (out * torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)).sum()


def _call(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def measure(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
            seed: int = 0, attention_stats: bool = True, blocks: Selector | None = None, backward: bool = True,
            stable_ranks: bool = True, mode: str | None = None) -> list[Record]:
    """Per-sublayer records of ``model`` on ``batch`` (a tensor, a tuple of args or a dict of kwargs).

    Without ``blocks``, the model's adapter (`sigprop.models.adapter.adapter_of`: a sigprop model or a
    `transformers` model of a supported family) names the records: the stream entering the first block (layer 0,
    "embed") and the stream after every residual site (stack, layer, kind), attention sites with the entropy
    and largest logit of the logits the adapter watches. With ``blocks`` (module docstring), the
    selected modules in order: record i (1-based ``layer``) is the i-th selected module, ``sublayer``
    its class name, ``stack`` "model"; no attention statistics. The model's output may be a tensor or
    carry one as ``.logits``/``.last_hidden_state`` or first tuple entry. Gradients are taken w.r.t.
    each output; every parameter's ``.grad`` is left as it was: None stays None, an existing tensor is
    the same tensor with the same values (`backprop`). ``backward=False``: the forward pass alone, under
    ``torch.no_grad``, ``grad_var`` None; ``stable_ranks=False``: ``stable_rank`` None. ``mode`` "eval" or
    "train": the pass runs with every module in that mode, each module's own put back afterwards.

    Args:
        model: any torch model.
        batch: its input: a tensor, a tuple of positional arguments or a dict of keyword arguments.
        loss_fn: the loss of the model's output whose gradient is measured (default
            `random_projection_loss`, whose output gradient has unit variance).
        seed: seed of the default loss's projection.
        attention_stats: record each attention sublayer's entropy and largest logit.
        blocks: which modules to record (module docstring); default sigprop's sublayers.
        backward: take the backward pass (``grad_var``); False: the forward alone, under ``torch.no_grad``.
        stable_ranks: record each output's stable rank (an SVD per sequence).
        mode: "eval" or "train" for the pass; None: the modules' own modes.

    Returns:
        One `Record` per recorded module output, in execution order (layer 0: the embedding).

    Raises:
        ValueError: nothing can be recorded: without ``blocks``, on a model no adapter handles (pass
            ``blocks``); with ``blocks``, when none of the selected modules ran in the forward pass or returned
            a tensor (the error names the selected modules); or ``blocks`` of another form, or selecting no
            submodule; or a ``mode`` other than "eval" and "train".
    """
    if mode is not None:
        with in_mode(model, mode):
            return measure(model, batch, loss_fn, seed, attention_stats, blocks, backward, stable_ranks)
    outputs: dict[tuple, torch.Tensor] = {}
    attn_stats: dict[tuple, tuple[float, float]] = {}
    ran: set[tuple] = set()
    hooks = []

    def keep(key: tuple) -> Callable:
        def hook(module: nn.Module, inputs: tuple, out: Any) -> None:
            ran.add(key)
            out = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(out, torch.Tensor):
                keep_first(outputs, key, out)
        return hook

    if blocks is not None:
        chosen = select(model, blocks)
        for i, (_, m) in enumerate(chosen):
            hooks.append(m.register_forward_hook(keep(("model", i + 1, type(m).__name__))))
        backprop(model, lambda: _call(model, batch), hooks, loss_fn, seed, backward)
        if not outputs:
            raise ValueError(_nothing_recorded(model, blocks, chosen, bool(ran)))
        return records_from(outputs, attn_stats, stable_ranks)

    try:
        adapter = adapter_of(model)
    except ValueError:
        raise ValueError(f"measure: {type(model).__name__} has no sigprop Sublayer to measure; pass blocks= "
                         f"({SELECTOR_FORMS}) to name the modules whose outputs to record") from None

    def sink(key: tuple, logits: torch.Tensor) -> None:
        attn_stats[key] = attention_entropy(logits.softmax(-1)), logits.amax().item()

    sites = adapter.record_sites(model)
    embed, embed_is_input = adapter.embedding(model)
    for key, module, is_input in [((sites[0][0][0], 0, "embed"), embed, embed_is_input),
                                  *((key, site.out, site.out_is_input) for key, site in sites)]:
        hook = keep(key)
        hooks.append(module.register_forward_pre_hook(lambda m, args, hook=hook: hook(m, args, args[0])) if is_input
                     else module.register_forward_hook(hook))
    with adapter.watch_logits(model, sink) if attention_stats else nullcontext():
        backprop(model, lambda: _call(model, batch), hooks, loss_fn, seed, backward)
    return records_from(outputs, attn_stats, stable_ranks)


def _nothing_recorded(model: nn.Module, blocks: Selector, chosen: list[tuple[str, nn.Module]], ran: bool) -> str:
    """The error of a selector whose modules gave no output: what it selected, and what went wrong."""
    shown = ", ".join(f"{name} ({type(m).__name__})" for name, m in chosen[:8])
    more = f" and {len(chosen) - 8} more" if len(chosen) > 8 else ""
    what = ("they ran, but none returned a tensor (or a tuple starting with one)" if ran else
            "none of them executed in the forward pass (a container such as nn.ModuleList is never called: "
            "select the blocks inside it)")
    return (f"measure: blocks={blocks!r} selects {len(chosen)} submodule(s) of {type(model).__name__}: "
            f"{shown}{more}; {what}")


def keep_first(outputs: dict[tuple[str, int, str], torch.Tensor], key: tuple[str, int, str], y: torch.Tensor
               ) -> None:
    """Keep ``y`` as the output recorded under ``key`` unless one is there already (a module that runs twice, such
    as a shared embedding, reports its first call), retaining its gradient where it has one."""
    if key not in outputs:
        if y.requires_grad:
            y.retain_grad()
        outputs[key] = y


def backprop(model: nn.Module, forward: Callable[[], torch.Tensor], hooks: list,
             loss_fn: Callable[[torch.Tensor], torch.Tensor] | None, seed: int, backward: bool = True) -> None:
    """Run ``forward()``, back-propagate ``loss_fn(out)`` (default `random_projection_loss`), then
    remove ``hooks``. Every parameter's ``.grad`` is left as it was: it is set aside (None during the
    pass, so the pass's gradients never accumulate into it) and put back afterwards, the same tensor
    object with the same values, or None. ``backward=False``: ``forward()`` alone, under ``torch.no_grad``."""
    saved_grads = {p: p.grad for p in model.parameters()} if backward else {}
    for p in saved_grads:
        p.grad = None
    try:
        if backward:
            out = output_tensor(forward())
            (loss_fn(out) if loss_fn is not None else random_projection_loss(out, seed)).backward()
        else:
            with torch.no_grad():
                forward()
    finally:
        for h in hooks:
            h.remove()
        for p, g in saved_grads.items():
            p.grad = g


def output_tensor(out: Any) -> torch.Tensor:
    """The tensor a model returned: itself, its ``logits`` or ``last_hidden_state``, or the first tuple entry."""
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    return out[0] if isinstance(out, (tuple, list)) else out


def records_from(outputs: dict[tuple[str, int, str], torch.Tensor],
                 attn_stats: dict[tuple[str, int, str], tuple[float, float]], stable_ranks: bool = True
                 ) -> list[Record]:
    """One measured `Record` per kept output, keyed (stack, layer, sublayer), in insertion order; with
    ``stable_ranks`` False, ``stable_rank`` None."""
    records = []
    for (stack, layer, kind), y in outputs.items():
        entropy, max_logit = attn_stats.get((stack, layer, kind), (None, None))
        records.append(Record(
            layer=layer, sublayer=kind, stack=stack, source="measured",
            fwd_mean=y.mean().item(), fwd_var=y.var().item(), token_corr=token_correlation(y.detach()),
            grad_var=None if y.grad is None else y.grad.var().item(),
            attn_entropy=entropy, max_logit=max_logit,
            stable_rank=stable_rank(y.detach()) if stable_ranks else None,
        ))
    return records
