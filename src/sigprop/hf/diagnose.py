"""`diagnose`: `sigprop.diagnostics.measure` for `transformers` models, in the same `Record` schema.

Rows: layer 0 "embed" = the stream entering the first block; then per block the stream after its
attention and after its MLP residual add (what sigprop's `Sublayer` outputs). Attention rows also
carry the Softmax entropy and largest logit, recorded by wrapping the model's attention function
(Q and K after RoPE; the shaped models' τ). Models on HF's "eager" path report none.

The pass runs in ``mode`` "eval" (dropout off: deterministic) or "train" (dropout on, as in training);
the model's own train/eval state is put back afterwards, module by module.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..diagnostics.measure import backprop, records_from
from ..diagnostics.plot import plot_records
from ..diagnostics.statistics import attention_entropy
from ..models import ModelConfig
from ..records import Record
from ..schemes import ParamInfo, Site, get_scheme
from .apply import _head_pieces, family_of

RECORDING = "sigprop_record"
MODES = ("eval", "train")


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


def _dropout_free_mirror(model: nn.Module, cfg: ModelConfig) -> ModelConfig | None:
    """``cfg`` with dropout 0, if that config gives ``model`` the same init and forward multipliers as ``cfg``
    (every weight's init std, every residual weight, the attention and tied-logit scales: the rules `apply`
    used), so that it describes the model with its dropout off; None when a rule reads the dropout rate
    (DSLM: its init carries 1 − p)."""
    off = dataclasses.replace(cfg, dropout=0.0)
    scheme, family, base = get_scheme(cfg.scheme), family_of(model), model.base_model
    stack = "dec" if cfg.arch == "decoder" else "enc"
    weights = [ParamInfo(piece.role, stack, piece.layer, piece.shape)
               for piece in [*family.pieces(base), *_head_pieces(model, {})] if piece.role not in ("bias", "norm")]
    sites = [Site(stack, layer, site.kind) for layer, block in enumerate(family.blocks(base))
             for site in family.sites(block)]
    same = (scheme.logit_scale(cfg) == scheme.logit_scale(off)
            and scheme.attention_scale(cfg) == scheme.attention_scale(off)
            and all(scheme.residual(cfg, site) == scheme.residual(off, site) for site in sites)
            and all(scheme.init_std(cfg, info) == scheme.init_std(off, info) for info in weights))
    return off if same else None


def _predicted(model: nn.Module, batch: Any, mode: str) -> list[Record] | None:
    """`sigprop.models.predict` for the mirrored config in ``mode``, if `apply` found the mirror exact,
    with the batch's own token-collision probability Σ_v (n_v/N)². "train": the mirror as it is (its
    dropout p on the embeddings and every branch); "eval": the mirror with p = 0 when that keeps the
    model's init law (`_dropout_free_mirror`), else None (no exact prediction: DSLM with p > 0)."""
    if not getattr(model, "sigprop_exact_mirror", False):
        return None
    try:
        from ..models.predict import predict
    except ImportError:
        return None
    cfg = model.sigprop_config
    if mode == "eval" and cfg.dropout > 0:
        cfg = _dropout_free_mirror(model, cfg)
        if cfg is None:
            return None
    ids = batch["input_ids"] if isinstance(batch, dict) else batch
    collision = (torch.bincount(ids.flatten()).double() / ids.numel()).square().sum().item()
    return predict(cfg, seq_len=ids.shape[-1], token_collision=collision)


def diagnose(model: nn.Module, batch: Any, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
             seed: int = 0, attention_stats: bool = True, plot: str | Path | None = None,
             mode: str = "eval") -> list[Record]:
    """Per-sublayer records of a `transformers` model on ``batch`` (input_ids, or a dict of kwargs).

    One forward and backward pass; the loss is ``loss_fn(out)`` or ⟨out, G⟩ with G ~ N(0, 1)
    (`random_projection_loss`), out = the logits (or last hidden state). ``mode``: "eval" (default:
    dropout off, two calls give the same records) or "train" (dropout on, to measure its effect); the
    model's train/eval state is restored afterwards. Every parameter's ``.grad`` is left as it was (None
    stays None; a tensor keeps its values and identity). ``plot``: write a PNG of the measured curves with
    `plot_records`, and the predicted ones for the same mode where `sigprop.models.predict` exists and
    `apply` found the mirrored `ModelConfig` exact (``model.sigprop_exact_mirror``: GPT-2, whose mirror
    attends over ``seq_len`` keys); in "eval" mode the mirror's dropout is taken as 0, which needs an init
    that does not depend on it (not DSLM with dropout p > 0); without a prediction the title says
    "measured only".
    """
    if mode not in MODES:
        raise ValueError(f"hf.diagnose: mode must be one of {list(MODES)}, got {mode!r}")
    family = family_of(model)
    blocks = family.blocks(model.base_model)
    stack = "dec" if family.mirror(model.config)["arch"] == "decoder" else "enc"
    outputs: dict[tuple[str, int, str], torch.Tensor] = {}

    def keep(key: tuple[str, int, str], as_input: bool) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any = None) -> None:
            y = args[0] if as_input else (out[0] if isinstance(out, tuple) else out)
            if key not in outputs:
                y.retain_grad()
                outputs[key] = y
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

    training = {m: m.training for m in model.modules()}
    model.train(mode == "train")
    try:
        with _recording_attention(model) if attention_stats else nullcontext({}) as stats:
            backprop(model, forward, hooks, loss_fn, seed)
    finally:
        for m, was in training.items():
            m.training = was
    attn = {(stack, attention_layer[m], "attn"): v for m, v in stats.items() if m in attention_layer}
    records = records_from(outputs, attn)
    if plot is not None:
        predicted = _predicted(model, batch, mode)
        curves = {"measured": records} | ({"predicted": predicted} if predicted else {})
        plot_records(curves, plot, title=f"{type(model).__name__}, {mode} mode"
                     + ("" if predicted else " (measured only)"))
    return records
