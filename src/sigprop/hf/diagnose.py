"""`diagnose`: `sigprop.diagnostics.measure` for `transformers` models, in the same `Record` schema.

Rows: layer 0 "embed" = the stream entering the first block; then per block the stream after its
attention and after its MLP residual add (what sigprop's `Sublayer` outputs). Attention rows also
carry the Softmax entropy and largest logit, recorded by wrapping the model's attention function
(Q and K after RoPE; the shaped models' τ). Models on HF's "eager" path report none.

The pass runs in ``mode`` "eval" (dropout off: deterministic) or "train" (dropout on, as in training);
the model's own train/eval state is put back afterwards, module by module. ``plot`` overlays the
prediction walked from the model's modules (`sigprop.hf.walk`).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..diagnostics.measure import backprop, keep_first, records_from
from ..diagnostics.plot import plot_records
from ..diagnostics.statistics import attention_entropy
from ..records import Record
from .apply import family_of
from .walk import MODES, in_mode, predict

RECORDING = "sigprop_record"


def _attention_stats(module: nn.Module, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float | None) -> tuple[float, float]:
    """Entropy of Softmax(QKᵀ·scale + mask) and its largest unmasked logit; q (B, H, T, dh), k (B, H_kv, S, dh)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    shaped = getattr(module, "sigprop_shape", None)
    scale = shaped.scale(q.shape[-1]) if shaped is not None else (scaling or q.shape[-1] ** -0.5)
    logits = (q @ k.transpose(-2, -1)) * scale                                 # (B, H, T, S)
    t, s = logits.shape[-2:]
    if mask is None and module.is_causal:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    return attention_entropy(logits.softmax(-1)), logits.amax().item()


@contextmanager
def _recording_attention(model: nn.Module) -> Iterator[dict[nn.Module, tuple[float, float]]]:
    """Route the model's attention function through one that records `_attention_stats` per module."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner, stats = model.config._attn_implementation, {}
    if inner not in ALL_ATTENTION_FUNCTIONS or inner not in ALL_MASK_ATTENTION_FUNCTIONS:
        yield stats                                                          # "eager": a per-model function
        return

    def forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple:
        with torch.no_grad():
            stats[module] = _attention_stats(module, query, key, attention_mask, kwargs.get("scaling"))
        return ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(RECORDING, forward)
    AttentionMaskInterface.register(RECORDING, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    model.set_attn_implementation(RECORDING)
    try:
        yield stats
    finally:
        model.set_attn_implementation(inner)


def _predicted(model: nn.Module, batch: Any, mode: str) -> tuple[list[Record], str | None]:
    """`sigprop.hf.predict` of ``model`` on ``batch`` in ``mode``, or ([], the reason) where a module, option or
    input has no exact moment map."""
    try:
        return predict(model, batch, mode), None
    except NotImplementedError as e:
        return [], str(e)


def diagnose(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
             seed: int = 0, attention_stats: bool = True, plot: str | Path | None = None,
             mode: str = "eval", backward: bool = True, stable_ranks: bool = True) -> list[Record]:
    """Per-sublayer records of a `transformers` model on ``batch`` (input_ids, or a dict of kwargs).

    One forward and backward pass; the loss is ``loss_fn(out)`` or ⟨out, G⟩ with G ~ N(0, 1)
    (`random_projection_loss`), out = the logits (or last hidden state). ``mode``: "eval" (default:
    dropout off, two calls give the same records) or "train" (dropout on, to measure its effect); the
    model's train/eval state is restored afterwards. Every parameter's ``.grad`` is left as it was (None
    stays None; a tensor keeps its values and identity). ``backward=False``: the forward pass alone (no gradient
    variance); ``stable_ranks=False``: no stable ranks (as in `sigprop.diagnostics.measure`). ``plot``: write a PNG
    of the measured curves with `plot_records`, and the predicted ones: `sigprop.hf.predict`, walked from the
    model's own modules in the same mode. Where a module, option or input has no exact moment map the plot is titled
    "measured only" and a warning names it.

    Args:
        model: a `transformers` model of a supported family (`SUPPORTED`), with or without `apply`.
        batch: input_ids (B, T), or a dict of keyword arguments of the model's forward.
        loss_fn: the loss of the output whose gradient is measured (default `random_projection_loss`).
        seed: seed of the default loss's projection.
        attention_stats: record each attention's entropy and largest logit.
        plot: the PNG to write, measured beside predicted; None: no plot.
        mode: "eval" or "train".
        backward: take the backward pass.
        stable_ranks: record the stable ranks.

    Returns:
        One `Record` per sublayer (layer 0: the embedding output), as `sigprop.diagnostics.measure`.

    Raises:
        ValueError: a ``mode`` other than "eval" or "train", or a model of an unsupported family.
    """
    if mode not in MODES:
        raise ValueError(f"hf.diagnose: mode must be one of {list(MODES)}, got {mode!r}")
    family = family_of(model)
    blocks = family.blocks(model.base_model)
    stack = "dec" if family.mirror(model.config)["arch"] == "decoder" else "enc"
    outputs: dict[tuple[str, int, str], torch.Tensor] = {}

    def keep(key: tuple[str, int, str], as_input: bool) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any = None) -> None:
            keep_first(outputs, key, args[0] if as_input else (out[0] if isinstance(out, tuple) else out))
        return hook

    hooks = [blocks[0].register_forward_pre_hook(keep((stack, 0, "embed"), True))]
    for layer, block in enumerate(blocks):
        for site in family.sites(block):
            hook = keep((stack, layer + 1, site.kind), site.out_is_input)
            hooks.append(site.out.register_forward_pre_hook(hook) if site.out_is_input
                         else site.out.register_forward_hook(hook))
    attention_layer = {m: i + 1 for i, m in enumerate(family.attentions(model.base_model))}

    def forward() -> torch.Tensor:
        out = model(**batch) if isinstance(batch, dict) else model(batch)
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    with in_mode(model, mode), _recording_attention(model) if attention_stats else nullcontext({}) as stats:
        backprop(model, forward, hooks, loss_fn, seed, backward)
    attn = {(stack, attention_layer[m], "attn"): v for m, v in stats.items() if m in attention_layer}
    records = records_from(outputs, attn, stable_ranks)
    if plot is not None:
        predicted, reason = _predicted(model, batch, mode)
        if reason is not None:
            warnings.warn(f"hf.diagnose plots the measurement only: {reason}", stacklevel=2)
        curves = {"measured": records} | ({"predicted": predicted} if predicted else {})
        plot_records(curves, plot, title=f"{type(model).__name__}, {mode} mode"
                     + ("" if predicted else " (measured only)"))
    return records
