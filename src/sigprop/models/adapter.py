"""`Adapter`: the one interface through which every tool reads a model family (torchtitan's ``ModelSpec`` idea).

A tool that walks a model (predict, measure, grow, param rules, advise) asks the model's adapter
(`adapter_of`) and never the model's class. An adapter names:

* the blocks of the model's stack, in order, and how to put a new list of blocks in their place (`insert_blocks`);
* each block's residual sites (`ResidualSite`: the kind, the module whose output is the stream after the add,
  and for a hooked add the skip and branch), the residual weights (α, β) of a site, its output projections and
  its branch-output norm (the norms' placement, "pre", "post", "none", "out" or "sandwich" of `sigprop.nn.block`,
  enters through each site's moment maps and the growth rules);
* every parameter as a role-tagged `Piece` (`sigprop.nn.roles`) with its stack and block, whose init std is
  recorded where it was drawn (`sigprop.nn.roles.set_init_std`);
* the final norm, the module whose output is the record at layer 0 (the stream entering the first block), and
  the sigprop `ModelConfig` the model's scheme reads (None for a model no scheme was applied to).

The model's theory hangs on the same adapter: `chain` (its moment maps in forward order, with record labels) and
`predict` (the predicted `Record` list). Implemented once for sigprop's own models (`sigprop.models.native`) and
once per Hugging Face family (`sigprop.hf.base.Family`, one file per family under `sigprop.hf`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..nn.residual import Residual
from ..nn.roles import init_std_of, set_init_std
from ..records import Record
from ..theory.moments.state import Component
from .config import ModelConfig

Label = tuple[int, str] | None          # (layer, sublayer) of a recorded point; None: not recorded
Chain = tuple[list[Label], list[Component]]
LogitsSink = Callable[[tuple[str, int, str], torch.Tensor], None]


@dataclass(frozen=True)
class Piece:
    """One weight: a parameter or a slice of a fused one (GPT-2's ``c_attn``).

    ``shape`` is (fan_out, fan_in) as in `sigprop.schemes.ParamInfo`, whatever the storage layout (GPT-2's
    Conv1D stores (fan_in, fan_out)); ``stack`` and ``layer`` locate a piece inside a block (None outside).
    """

    tensor: torch.Tensor
    role: str
    layer: int | None
    shape: tuple[int, ...]
    stack: str | None = None

    @property
    def param(self) -> torch.Tensor:
        """The parameter this piece lives in."""
        return self.tensor if self.tensor._base is None else self.tensor._base

    @property
    def std(self) -> float | None:
        """The std this piece's weights were drawn with (`record_std`); None where none was recorded."""
        return recorded_std(self.tensor)


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


@dataclass(frozen=True)
class ResidualSite:
    """One residual add of a block: ``x + g`` (Pre-LN: g = f(N(x)); Post-LN: N(x + g)).

    The stream after the add is the output of ``out`` (or its input, ``out_is_input``). Where the add is written
    inside a block's ``forward`` (Hugging Face), ``skip`` is called with the skip input x as positional argument
    ``skip_arg`` and ``branch`` returns g (or a tuple whose first entry is g); a sigprop `Sublayer` is all three.
    """

    kind: str                 # "attn" | "cross" | "mlp"
    skip: nn.Module
    skip_arg: int
    branch: nn.Module
    out: nn.Module
    out_is_input: bool


class Adapter(ABC):
    """Interface of one model family; subclasses fill every abstract member (module docstring)."""

    norm_offset: float = 0.0            # the norms' gain is norm_offset + weight (Gemma's (1 + w): 1)
    measured_mode: str | None = None    # the train/eval mode tools measure the model in (None: the model's own)

    @abstractmethod
    def handles(self, model: nn.Module) -> bool:
        """Whether ``model`` belongs to this family."""

    @abstractmethod
    def stack(self, model: nn.Module) -> str:
        """The name of the stack `blocks` lists ("dec" causal, "enc" bidirectional), as records and sites name it."""

    @abstractmethod
    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The blocks of the model's stack, in order."""

    @abstractmethod
    def sites(self, block: nn.Module) -> list[ResidualSite]:
        """The block's residual sites in execution order."""

    def record_sites(self, model: nn.Module) -> list[tuple[tuple[str, int, str], ResidualSite]]:
        """Every residual site of the model in forward order, under its record key (stack, 1-based layer, kind)."""
        stack = self.stack(model)
        return [((stack, i + 1, site.kind), site) for i, block in enumerate(self.blocks(model))
                for site in self.sites(block)]

    @abstractmethod
    def residual(self, block: nn.Module, kind: str) -> Residual | None:
        """The residual weights (α, β) of site ``kind`` of ``block``; None for a plain add x + g (α = β = 1)."""

    @abstractmethod
    def pieces(self, model: nn.Module) -> Iterator[Piece]:
        """Every parameter (a fused one by its slices), with its role, stack and block."""

    @abstractmethod
    def output_projections(self, block: nn.Module, kind: str) -> list[nn.Module]:
        """The Linear/Conv1D modules whose output is the branch output of site ``kind``: zeroed, the branch adds 0."""

    def output_norm(self, block: nn.Module, kind: str) -> nn.Module:
        """The norm on the branch output of site ``kind`` (placements "out" and "sandwich"); nn.Identity if none."""
        return nn.Identity()

    @abstractmethod
    def final_norm(self, model: nn.Module) -> nn.Module:
        """The norm after the last block (nn.Identity where there is none)."""

    @abstractmethod
    def embedding(self, model: nn.Module) -> tuple[nn.Module, bool]:
        """(module, is_input): the stream entering the first block is that module's output (its input if is_input)."""

    def stack_input(self, model: nn.Module) -> nn.Module | None:
        """The module whose output is the input of the stack `chain` starts at and reaches nothing else (replacing it
        probes that stack alone); None where there is none."""
        return None

    @abstractmethod
    def watch_logits(self, model: nn.Module, sink: LogitsSink) -> AbstractContextManager[None]:
        """Inside the context each attention sublayer hands its masked logits (B, H, T, S) to ``sink`` under its
        record key (stack, layer, "attn"/"cross"); masked entries −inf."""

    @abstractmethod
    def insert_blocks(self, model: nn.Module, blocks: list[nn.Module], sources: list[int]) -> None:
        """Make ``blocks`` the model's stack, in place: renumber them (block j of the new stack is block j wherever a
        block records its index) and set the model's depth to ``len(blocks)``; ``sources[j]``: the index, in the
        old stack, of the block block j is or was copied from."""

    @abstractmethod
    def check_growth(self, model: nn.Module, mode: str) -> None:
        """Raise `UserError` where growth ``mode`` (`sigprop.models.grow`) cannot honour this model."""

    def fresh_blocks(self, model: nn.Module, n_layers: int) -> list[nn.Module]:
        """Blocks of a freshly initialized model of this one's kind at depth ``n_layers`` (growth mode "dslm")."""
        raise NotImplementedError(f"{type(model).__name__} has no freshly initialized blocks of another depth")

    @abstractmethod
    def config(self, model: nn.Module) -> ModelConfig | None:
        """The `ModelConfig` whose scheme the model follows; None where no scheme was applied."""

    @abstractmethod
    def vocab_size(self, model: nn.Module) -> int:
        """The number of token ids (classes of a classifier head)."""

    @abstractmethod
    def chain(self, model: nn.Module, inputs: Any) -> Chain:
        """The moment maps of the stack that starts at the embedding, with each output's record label, for the
        model's positional ``inputs`` (their length and token statistics)."""

    @abstractmethod
    def predict(self, model: nn.Module, inputs: Any) -> list[Record]:
        """Predicted records at init for the model's positional ``inputs``, in `sigprop.diagnostics.measure`'s
        schema and order."""


def adapter_of(model: nn.Module) -> Adapter:
    """The adapter of ``model``: sigprop's own models, or a Hugging Face family (`sigprop.hf.base.Family`).

    Raises:
        ValueError: a model no adapter handles, named.
    """
    from ..hf.apply import FAMILIES
    from .native import NATIVE

    for adapter in (NATIVE, *FAMILIES):
        if adapter.handles(model):
            return adapter
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    raise ValueError(f"{type(model).__name__} is neither a sigprop model (build_model) nor a transformers model of "
                     f"a supported family (sigprop.hf.SUPPORTED); got model_type {model_type!r}")
