"""`build_model`: construct the architecture a `ModelConfig` names and initialize it by its scheme."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..schemes import get_scheme, initialize
from .config import ModelConfig
from .transformer import DecoderLM, EncoderDecoder, EncoderMLM, ViT

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "decoder": DecoderLM, "encoder": EncoderMLM, "encdec": EncoderDecoder, "vit": ViT,
}


def build_model(cfg: ModelConfig, device: str | torch.device | None = None) -> nn.Module:
    """A freshly initialized model; ``torch.manual_seed`` beforehand makes it deterministic. ``device="meta"``
    allocates no weights: the init pass only records each weight's std (what `predict` reads)."""
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = ARCHITECTURES[cfg.arch](cfg)
    initialize(model, cfg, get_scheme(cfg.scheme))
    return model
