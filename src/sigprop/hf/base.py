"""What `sigprop.hf` must know about one `transformers` model family, and nothing else.

A `Family` names, on the family's backbone (``model.base_model``): its blocks, the two residual
sites of each block, every backbone weight with its sigprop role (`sigprop.nn.roles`), the norm
and activation slots that scheme ``shaped`` replaces, and the `ModelConfig` fields that mirror
the HF config. `sigprop.hf.apply` does the rest generically.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch
from torch import nn


@dataclass(frozen=True)
class Piece:
    """One weight to initialize: a parameter or a slice of a fused one (GPT-2's ``c_attn``).

    ``shape`` is (fan_out, fan_in) as in `sigprop.schemes.ParamInfo`, whatever the storage
    layout (GPT-2's Conv1D stores (fan_in, fan_out)).
    """

    tensor: torch.Tensor
    role: str
    layer: int | None
    shape: tuple[int, ...]

    @property
    @abstractmethod
    def param(self) -> torch.Tensor:
        """The parameter this piece lives in."""
        return self.tensor if self.tensor._base is None else self.tensor._base


@dataclass(frozen=True)
class ResidualSite:
    """One residual add ``x + g`` written inside an HF block (Pre-LN: g = f(N(x)); Post-LN: N(x + g)).

    ``skip`` is called with the skip input x as positional argument ``skip_arg``; ``branch``
    returns g (or a tuple whose first entry is g); the sublayer's output stream is the input
    (``out_is_input``) or the output of ``out``.
    """

    kind: str                 # "attn" | "mlp"
    skip: nn.Module
    skip_arg: int
    branch: nn.Module
    out: nn.Module
    out_is_input: bool


def linear_pieces(module: nn.Module, role: str, layer: int | None) -> Iterator[Piece]:
    """Weight (``role``) and bias of an `nn.Linear` or a transformers ``Conv1D`` (weight stored (in, out))."""
    w = module.weight
    yield Piece(w, role, layer, tuple(w.shape) if isinstance(module, nn.Linear) else tuple(w.shape[::-1]))
    if module.bias is not None:
        yield Piece(module.bias, "bias", layer, tuple(module.bias.shape))


def norm_pieces(module: nn.Module, layer: int | None) -> Iterator[Piece]:
    """Gain (role ``norm``) and shift (``bias``) of a LayerNorm/RMSNorm; none once replaced by identity."""
    for name, p in module.named_parameters(recurse=False):
        yield Piece(p, "norm" if name == "weight" else "bias", layer, tuple(p.shape))


GELU_LIKE = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def mirror_activation(name: str) -> str:
    """sigprop's name for an HF activation; the tanh GeLU variants share exact GeLU's moments to ~1e-3."""
    if name == "relu":
        return "relu"
    if name in GELU_LIKE:
        return "gelu"
    raise ValueError(f"sigprop.hf supports MLP activations ('relu',) + {GELU_LIKE}, got {name!r}")


class Family(ABC):
    """Interface of one model family; subclasses fill every member."""

    model_types: ClassVar[tuple[str, ...]]   # HF ``config.model_type`` values handled
    placement: ClassVar[str]                 # "pre" | "post": where the blocks' norms sit
    n_tables: ClassVar[int]                  # embedding tables summed into the stream
    shared_tables: ClassVar[int] = 0         # of which one row is added at every position (BERT's token type)
    gated: ClassVar[bool] = False            # MLP is φ(x W_gate) ⊙ (x W_up) W_down; "shaped" keeps its φ
    exact_mirror: ClassVar[bool] = False     # the mirrored sigprop model has the same init law (for predict)

    @abstractmethod
    def mirror(self, config: Any) -> dict[str, Any]:
        """`ModelConfig` fields (arch, sizes, norm_type, activation, dropout, bias) of the HF config."""

    @abstractmethod
    def blocks(self, base: nn.Module) -> list[nn.Module]:
        """The transformer blocks, in order."""

    @abstractmethod
    def sites(self, block: nn.Module) -> list[ResidualSite]:
        """The block's residual sites in execution order: attention, then MLP."""

    @abstractmethod
    def pieces(self, base: nn.Module) -> Iterator[Piece]:
        """Every backbone parameter, with its role and block index."""

    @abstractmethod
    def norm_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        """(parent, attribute) of the backbone norms that scheme ``shaped`` sets to identity."""

    @abstractmethod
    def act_slots(self, base: nn.Module) -> list[tuple[nn.Module, str]]:
        """(parent, attribute) of every MLP activation (the gate of a gated MLP); scheme ``shaped``
        puts a shaped ReLU there unless the family is ``gated``."""

    @abstractmethod
    def attentions(self, base: nn.Module) -> list[nn.Module]:
        """The self-attention modules that call ``ALL_ATTENTION_FUNCTIONS``."""
