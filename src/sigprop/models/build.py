"""`build_model`: construct the architecture a `ModelConfig` names and initialize it by its scheme."""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from ..schemes import get_scheme, initialize
from .adapter import adapter_of
from .config import ModelConfig
from .transformer import DecoderLM, EncoderDecoder, EncoderMLM, ViT

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "decoder": DecoderLM, "encoder": EncoderMLM, "encdec": EncoderDecoder, "vit": ViT,
}
"""``ModelConfig.arch`` -> the model class `build_model` instantiates with the config."""


# torch's default initializers, which module constructors call; on the meta device there is nothing to draw
_TORCH_INITS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
                "trunc_normal_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (its previous state restored after). Building a
    deep model and its moment chain allocates O(blocks) long-lived container objects (modules, parameters,
    maps); every generation-2 collection in between would rescan all of them and the whole imported torch,
    which costs more than the construction itself. Whatever garbage the block leaves is collected later."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _on_meta() -> Iterator[None]:
    """Construct sigprop's modules on the meta device, with torch's default initializers skipped (they are replaced
    by `initialize` anyway, and on meta tensors they only cost time). Not for a `transformers` model: that library
    keeps the initializers it finds at its first import, so patching them while it first loads would leave every
    model it builds later in the process uninitialized."""
    saved = {name: getattr(nn.init, name) for name in _TORCH_INITS}
    for name in _TORCH_INITS:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def construct(cfg: ModelConfig) -> nn.Module:
    """The module ``cfg`` names, on torch's current device: ``cfg.arch``'s class (`ARCHITECTURES`), its weights not
    yet initialized by the scheme; or, with ``cfg.hf_family`` set, that `transformers` causal LM, initialized by its
    family (`sigprop.hf.base.Family.build`)."""
    if cfg.hf_family is None:
        return ARCHITECTURES[cfg.arch](cfg)
    from ..hf.apply import FAMILIES

    return next(f for f in FAMILIES if cfg.hf_family in f.model_types).build(cfg)


def build_model(cfg: ModelConfig, device: str | torch.device | None = None,
                batch: torch.Tensor | Sequence[torch.Tensor] | None = None) -> nn.Module:
    """A freshly initialized model; ``torch.manual_seed`` beforehand makes it deterministic. ``device="meta"``
    allocates no weights: the init pass only records each weight's std (what `predict` reads). ``batch``: the
    model's positional inputs for the scheme's data-dependent init (`calibrate`; Admin's profiled ω). With
    ``cfg.hf_family`` set, the `transformers` causal LM of that family (`construct`), at the family's own init, which
    no scheme changes; its forward returns an output whose ``logits`` are (B, T, vocab_size).

    Args:
        cfg: the validated model configuration; ``cfg.arch`` picks the class (`ARCHITECTURES`), ``cfg.scheme``
            the init; ``cfg.hf_family``, if set, the transformers model instead.
        device: where to allocate the weights (default torch's current device); ``"meta"``: nowhere.
        batch: the model's positional inputs (token ids, images, or (src, tgt) for an encdec) for `calibrate`.

    Returns:
        The model, its every parameter initialized by the scheme's rule for its role.

    Raises:
        ValueError: a ``batch`` with ``device="meta"``.
        RuntimeError: a parameter without a role tag (`initialize`).
    """
    meta = device is not None and torch.device(device).type == "meta"
    if batch is not None and meta:
        raise ValueError("build_model: a batch needs real weights to run on; it cannot be used with device='meta'")
    if meta:
        context = _on_meta() if cfg.hf_family is None else torch.device("meta")
    else:
        context = torch.device(device) if device is not None else contextlib.nullcontext()
    with gc_paused():
        with context:
            model = construct(cfg)
        if cfg.hf_family is None:
            initialize(model, cfg, get_scheme(cfg.scheme))
        calibrate(model, batch)
    return model


def calibrate(model: nn.Module, batch: torch.Tensor | Sequence[torch.Tensor] | None = None) -> None:
    """Let the scheme of ``model`` (a sigprop model) set its data-dependent init values (`Scheme.calibrate`) from
    ``batch``, the model's positional inputs (token ids, images, or (src, tgt) for an encdec), on the model's
    device, or without data from the model's own moment maps (each stack's ``stack_chain``):
    `sigprop.schemes.admin.profile` or the theory's profile under scheme "admin" with ``admin_mode="profile"``;
    nothing for the schemes whose init is data-free, nor for a model without a scheme (`Adapter.config` None: a
    `transformers` model at its family's init). `build_model` calls it; call it again at init with data (the
    trainer does, on its first training batch).

    Args:
        model: a model `build_model` returned.
        batch: the model's positional inputs; None: no data.
    """
    cfg = adapter_of(model).config(model)
    if cfg is None:
        return
    inputs = None if batch is None else (batch,) if isinstance(batch, torch.Tensor) else tuple(batch)
    get_scheme(cfg.scheme).calibrate(cfg, model, inputs, model.stack_chain)


def meta_model(model: ModelConfig | Mapping[str, Any]) -> nn.Module:
    """The model a config (or its ``model`` table) builds, on the meta device: shapes only, no memory, no init."""
    cfg = model if isinstance(model, ModelConfig) else ModelConfig.from_dict(dict(model))
    with torch.device("meta"):
        return construct(cfg)


def trainable(module: nn.Module) -> int:
    """Number of trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def param_count(model: ModelConfig | Mapping[str, Any]) -> int:
    """Trainable parameters of the model a config builds."""
    return trainable(meta_model(model))


def non_embedding_count(model: ModelConfig | Mapping[str, Any]) -> int:
    """Trainable parameters outside the model's ``embed`` module (token/position tables, tied LM head; ViT patch
    projection, position table, class token)."""
    net = meta_model(model)
    return trainable(net) - trainable(net.embed)
