"""What `sigprop.hf` must know about one `transformers` model family, and nothing else.

A `Family` names, on the family's backbone (``model.base_model``): its blocks, the two residual
sites of each block, every backbone weight with its sigprop role (`sigprop.nn.roles`), the norm
and activation slots that scheme ``shaped`` replaces, and the `ModelConfig` fields that mirror
the HF config. `sigprop.hf.apply` does the rest generically. For `sigprop.hf.predict` it maps each
module type to its moment map (`input_maps`, `branch_maps`, `site_norm`, `out_norm`, `final_norm`, `head_maps`) and
states the std HF's own init draws each weight with (`hf_init_std`); `sigprop.hf.walk` composes them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import torch
from torch import nn

from ..nn.maps import zero_bias
from ..nn.roles import init_std_of, set_init_std
from ..theory.moments.linear import Linear
from ..theory.moments.state import Component

if TYPE_CHECKING:
    from .walk import Walk


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


def _slice_key(view: torch.Tensor) -> tuple:
    return view.storage_offset(), tuple(view.shape), tuple(view.stride())


def record_std(piece: Piece, std: float) -> None:
    """Record the std ``piece`` was drawn with: on its parameter (`sigprop.nn.roles.set_init_std`), or for a slice
    of a fused parameter (GPT-2's ``c_attn``) under the slice's offset, shape and strides."""
    if piece.tensor._base is None:
        set_init_std(piece.tensor, std)
        return
    param = piece.tensor._base
    stds = getattr(param, "_sigprop_slice_stds", {})
    stds[_slice_key(piece.tensor)] = float(std)
    param._sigprop_slice_stds = stds


def recorded_std(tensor: torch.Tensor) -> float | None:
    """The std `record_std` recorded for ``tensor`` (a parameter, or the same slice of a fused one), else None."""
    if tensor._base is None:
        return init_std_of(tensor)
    return getattr(tensor._base, "_sigprop_slice_stds", {}).get(_slice_key(tensor))


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
    placement: ClassVar[str]                 # "pre" | "post" | "out" | "sandwich": where the blocks' norms sit
    n_tables: ClassVar[int]                  # embedding tables summed into the stream
    shared_tables: ClassVar[int] = 0         # of which one row is added at every position (BERT's token type)
    gated: ClassVar[bool] = False            # MLP is φ(x W_gate) ⊙ (x W_up) W_down; "shaped" keeps its φ
    norm_offset: ClassVar[float] = 0.0       # the norms' gain is norm_offset + weight (Gemma's (1 + w): 1)

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

    def hf_init_std(self, config: Any, role: str) -> float:
        """The std HF's init draws a weight of ``role`` with, for a model built from ``config``.

        ``PreTrainedModel._init_weights``: every nn.Linear, Conv1D and nn.Embedding weight from
        N(0, initializer_range²), biases zero, norms one (the padding row of an embedding with ``padding_idx``
        zero); families whose ``_init_weights`` re-draws some weights override this."""
        return float(config.initializer_range)

    @abstractmethod
    def input_maps(self, walk: "Walk", base: nn.Module) -> list[Component | None]:
        """Embedding tables (and the family's embedding norm) and dropout: the maps up to the stream entering
        the first block."""

    @abstractmethod
    def branch_maps(self, walk: "Walk", block: nn.Module, kind: str, L: int) -> list[Component | None]:
        """The branch of residual site ``kind`` ("attn" | "mlp") of ``block`` over ``L`` tokens, its dropout
        included, without the site's norm (`site_norm`)."""

    @abstractmethod
    def site_norm(self, block: nn.Module, kind: str) -> nn.Module:
        """The norm of residual site ``kind``: before the branch (Pre-LN, and N₁ of a sandwich) or after the add
        (Post-LN); nn.Identity where there is none (placement "out")."""

    def out_norm(self, block: nn.Module, kind: str) -> nn.Module:
        """The norm on the branch output of residual site ``kind`` (placements "out" and "sandwich": x + N(f(·)));
        nn.Identity where there is none."""
        return nn.Identity()

    def final_norm(self, base: nn.Module) -> nn.Module:
        """The norm after the last block (nn.Identity where there is none)."""
        return nn.Identity()

    def embed_scale(self, base: nn.Module) -> float:
        """The factor the token embedding's output is multiplied by (Gemma: √d); 1 for a plain table."""
        return 1.0

    def head_maps(self, walk: "Walk", model: nn.Module) -> list[Component | None]:
        """The maps from the backbone's output to the output `diagnose` differentiates: none for the bare
        backbone, the LM head ``lm_head`` (tied to the token table or not, times the ``sigprop_logit_scale``
        `apply` gave a tied head) for a causal LM; any other head raises NotImplementedError."""
        if model is model.base_model:
            return []
        head = getattr(model, "lm_head", None)
        if not isinstance(head, nn.Linear):
            raise NotImplementedError(f"{type(model).__name__}: its head has no moment map (the LM head and the bare "
                                      "backbone have)")
        return [tied_head(walk, model, head)]


def tied_head(walk: "Walk", model: nn.Module, head: nn.Linear) -> Linear:
    """Linear(d, V) of an LM head, zero bias: its own weight's variance, or (tied) the token table's, times
    ``head.sigprop_logit_scale``². A tied table HF initialized with a zero padding row gives V − 1 rows of σ²."""
    zero_bias(head, "LM head")
    table = model.get_input_embeddings()
    if head.weight is table.weight:
        var = walk.var(table.weight, "embed", "token embedding")
        if not walk.applied and table.padding_idx is not None:
            var *= (table.num_embeddings - 1) / table.num_embeddings
    else:
        var = walk.var(head.weight, "head", "LM head")
    return Linear(head.in_features, head.out_features, getattr(head, "sigprop_logit_scale", 1.0) ** 2 * var)
