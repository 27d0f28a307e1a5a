"""The `Adapter` of sigprop's own models (`build_model`): every answer read off `Stack` and `Sublayer`.

A block's residual sites are its `Sublayer` modules (self-attention, cross-attention, MLP), each its own skip,
branch and output; their α, β live in the sublayer's `sigprop.nn.Residual`, their output projections are the
attention's ``o_proj`` and the MLP's ``fc2``, every parameter carries the role and site tags it was built with
(`sigprop.nn.roles`). An encoder–decoder's stacks are both recorded and traced; `blocks` and growth read the stack
that starts at the embedding (the encoder's), and growth refuses it (two depths).
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn

from ..console.errors import UserError
from ..nn import Attention
from ..nn.residual import Residual
from ..nn.roles import role_of, site_of, tag_site
from ..records import Record
from ..schemes import Site
from .adapter import Adapter, Chain, LogitsSink, Piece, ResidualSite
from .build import ARCHITECTURES, build_model
from .config import ModelConfig
from .predict import encoder_chain, model_chain, predict
from .stack import Stack

OUTPUT_PROJECTIONS = {"attn": "o_proj", "cross": "o_proj", "mlp": "fc2"}   # sublayer -> the attribute of its fn


class Native(Adapter):
    """sigprop's `DecoderLM`, `EncoderMLM`, `EncoderDecoder` and `ViT`."""

    def handles(self, model: nn.Module) -> bool:
        return isinstance(model, tuple(ARCHITECTURES.values()))

    def stacks(self, model: nn.Module) -> list[Stack]:
        """The model's stacks in forward order (an encoder–decoder: encoder, decoder)."""
        return [m for m in model.children() if isinstance(m, Stack)]

    def stack(self, model: nn.Module) -> str:
        return self.stacks(model)[0].blocks[0].attn.site.stack

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(self.stacks(model)[0].blocks)

    def record_sites(self, model: nn.Module) -> list[tuple[tuple[str, int, str], ResidualSite]]:
        return [((site.out.site.stack, site.out.site.layer + 1, site.kind), site) for stack in self.stacks(model)
                for block in stack.blocks for site in self.sites(block)]

    def sites(self, block: nn.Module) -> list[ResidualSite]:
        return [ResidualSite(kind, sub, 0, sub.fn, sub, out_is_input=False) for kind, sub in block.sublayers()]

    def residual(self, block: nn.Module, kind: str) -> Residual | None:
        return getattr(block, kind).residual

    def pieces(self, model: nn.Module) -> Iterator[Piece]:
        for name, p in model.named_parameters():
            role = role_of(p)
            if role is None:
                raise RuntimeError(f"parameter {name!r} has no role tag; tag it where it is built")
            stack, layer = site_of(p) or (None, None)
            yield Piece(p, role, layer, tuple(p.shape), stack)

    def output_projections(self, block: nn.Module, kind: str) -> list[nn.Module]:
        return [getattr(getattr(block, kind).fn, OUTPUT_PROJECTIONS[kind])]

    def output_norm(self, block: nn.Module, kind: str) -> nn.Module:
        norm = getattr(block, kind).out_norm
        return nn.Identity() if norm is None else norm

    def final_norm(self, model: nn.Module) -> nn.Module:
        return self.stacks(model)[0].final_norm

    def embedding(self, model: nn.Module) -> tuple[nn.Module, bool]:
        return model.embed, False

    def stack_input(self, model: nn.Module) -> nn.Module | None:
        """The embedding, where it feeds one stack (an encoder–decoder's feeds both)."""
        return model.embed if len(self.stacks(model)) == 1 else None

    @contextmanager
    def watch_logits(self, model: nn.Module, sink: LogitsSink) -> Iterator[None]:
        def hook(key: tuple[str, int, str]):
            def pre(attn: Attention, args: tuple, kwargs: dict) -> None:
                with torch.no_grad():
                    q, k, _ = attn.qkv(args[0], kwargs.get("kv"))
                    sink(key, attn.logits(q, k, kwargs.get("key_mask")))
            return pre

        handles = [site.branch.register_forward_pre_hook(hook(key), with_kwargs=True)
                   for key, site in self.record_sites(model) if isinstance(site.branch, Attention)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def insert_blocks(self, model: nn.Module, blocks: list[nn.Module], sources: list[int]) -> None:
        stack = self.stacks(model)[0]
        name = self.stack(model)
        for j, block in enumerate(blocks):
            tag_site(block, name, j)
            for kind, sub in block.sublayers():
                sub.site = Site(name, j, kind)
        stack.blocks = nn.ModuleList(blocks)
        model.cfg = dataclasses.replace(model.cfg, n_layers=len(blocks))

    def check_growth(self, model: nn.Module, mode: str) -> None:
        check_growth(model.cfg, mode)

    def fresh_blocks(self, model: nn.Module, n_layers: int) -> list[nn.Module]:
        sample = next(model.parameters())
        fresh = build_model(dataclasses.replace(model.cfg, n_layers=n_layers))
        return list(self.stacks(fresh)[0].blocks.to(sample.device, sample.dtype))

    def config(self, model: nn.Module) -> ModelConfig:
        return model.cfg

    def vocab_size(self, model: nn.Module) -> int:
        return int(model.cfg.vocab_size)

    def chain(self, model: nn.Module, inputs: Any) -> Chain:
        L = inputs[0].shape[-1]
        if len(self.stacks(model)) > 1:
            return encoder_chain(model, seq_len=L)
        return model_chain(model, seq_len=L)

    def predict(self, model: nn.Module, inputs: Any) -> list[Record]:
        return predict(model, seq_len=inputs[0].shape[-1])


def check_growth(cfg: ModelConfig, mode: str) -> None:
    """Refuse, from the config alone, a growth ``mode`` the model ``cfg`` builds cannot take (`sigprop.models.grow`):
    an encoder–decoder (two depths), "identity" under Post-LN (N(x + 0) ≠ x), "dslm" under another scheme.

    Raises:
        UserError: naming the reason.
    """
    if cfg.arch == "encdec":
        raise UserError("grow: an encoder-decoder has two stacks (n_layers and n_dec_layers), so which one grows "
                        "is ambiguous; grow supports arch 'decoder', 'encoder' and 'vit'")
    if mode == "identity" and cfg.norm_placement == "post":
        raise UserError(f"grow: mode 'identity' needs blocks x + f(x) with no norm after the add; this model "
                        f"(scheme {cfg.scheme!r}, norm_placement {cfg.norm_placement!r}) normalizes after it, "
                        "N(x + 0) ≠ x, so a zeroed block is not the identity: use mode 'copy' (or 'dslm' for scheme "
                        "'dslm')")
    if mode == "dslm" and cfg.scheme != "dslm":
        raise UserError(f"grow: mode 'dslm' initializes new blocks by DSLM's rules and needs a model of scheme "
                        f"'dslm'; this one has scheme {cfg.scheme!r}: use mode 'identity' or 'copy'")


NATIVE = Native()
