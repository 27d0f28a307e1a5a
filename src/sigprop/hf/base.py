"""What `sigprop.hf` must know about one `transformers` model family, and nothing else.

A `Family` is the family's `sigprop.models.adapter.Adapter`: it names, on the family's backbone
(``model.base_model``), its blocks, the two residual sites of each block, every weight with its sigprop role
(`sigprop.nn.roles`), each site's output projections, the norm and activation slots that scheme ``shaped``
replaces, and the `ModelConfig` fields that mirror the HF config. `sigprop.hf.apply` does the rest generically.
For `sigprop.hf.predict` it maps each module type to its moment map (`input_maps`, `branch_maps`, `site_norm`,
`output_norm`, `final_norm`, `head_maps`) and states the std HF's own init draws each weight with
(`hf_init_std`); `sigprop.hf.walk` composes them.
"""
from __future__ import annotations

import dataclasses
from abc import abstractmethod
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from torch import nn

from ..console.errors import UserError
from ..extras import require
from ..models.adapter import Adapter, Chain, LogitsSink, Piece, ResidualSite
from ..models.config import ModelConfig
from ..nn.maps import zero_bias
from ..nn.modes import in_mode
from ..nn.residual import Residual
from ..records import Record
from ..theory.moments.linear import Linear
from ..theory.moments.state import Component
from .logits import watch_attention_logits

if TYPE_CHECKING:
    from .walk import Walk


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


def head_pieces(model: nn.Module) -> Iterator[Piece]:
    """Parameters outside the backbone (LM/MLM/classifier heads): Linear/Conv1D weights → ``head``, norms → ``norm``,
    other vectors named ``bias`` → ``bias``; a head tied to a backbone table is listed under it (`Family.pieces`)."""
    inside = {id(m) for m in model.base_model.modules()}
    for module in model.modules():
        if id(module) in inside:
            continue
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
            yield from linear_pieces(module, "head", None)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            yield from norm_pieces(module, None)
        else:
            yield from (Piece(p, "bias", None, tuple(p.shape)) for n, p in module.named_parameters(recurse=False)
                        if n == "bias" and p.ndim == 1)


GELU_LIKE = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def mirror_activation(name: str) -> str:
    """sigprop's name for an HF activation; the tanh GeLU variants share exact GeLU's moments to ~1e-3."""
    if name == "relu":
        return "relu"
    if name in GELU_LIKE:
        return "gelu"
    raise ValueError(f"sigprop.hf supports MLP activations ('relu',) + {GELU_LIKE}, got {name!r}")


class Family(Adapter):
    """The `Adapter` of one `transformers` family; subclasses fill every abstract member. Methods that take the
    model accept the backbone too (``model.base_model`` of a backbone is itself)."""

    model_types: ClassVar[tuple[str, ...]]   # HF ``config.model_type`` values handled
    placement: ClassVar[str]                 # "pre" | "post" | "out" | "sandwich": where the blocks' norms sit
    n_tables: ClassVar[int]                  # embedding tables summed into the stream
    shared_tables: ClassVar[int] = 0         # of which one row is added at every position (BERT's token type)
    gated: ClassVar[bool] = False            # MLP is φ(x W_gate) ⊙ (x W_up) W_down; "shaped" keeps its φ
    norm_offset: ClassVar[float] = 0.0       # the norms' gain is norm_offset + weight (Gemma's (1 + w): 1)
    measured_mode = "eval"                   # as `sigprop.hf.diagnose` measures by default: dropout off

    @abstractmethod
    def mirror(self, config: Any) -> dict[str, Any]:
        """`ModelConfig` fields (arch, sizes, norm_type, activation, dropout, bias) of the HF config."""

    @abstractmethod
    def block_slot(self, base: nn.Module) -> tuple[nn.Module, str]:
        """(parent, attribute) of the backbone's list of transformer blocks."""

    def config_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        """The HF config's keyword arguments for ``cfg``'s sizes (`sigprop.models.config.HF_SIZES`), the inverse of
        `mirror` on them, with every dropout off; the family's defaults for the rest.

        Raises:
            NotImplementedError: a family sigprop builds no model of (`ModelConfig.hf_family` names the others).
        """
        raise NotImplementedError(f"sigprop builds no {self.model_types[0]!r} model from a ModelConfig")

    def build(self, cfg: ModelConfig) -> nn.Module:
        """The causal LM of model_type ``cfg.hf_family`` (one of `model_types`) with ``cfg``'s sizes
        (`config_fields`), randomly initialized by the family's own ``_init_weights`` (the stds of `hf_init_std`)
        from torch's global generator; no KV cache and no special token ids (sigprop's data has its own), so its
        forward maps ids (B, T) to an output whose ``logits`` are (B, T, vocab_size).

        Raises:
            MissingExtraError: ``transformers`` is not installed.
        """
        transformers = require("transformers", f"ModelConfig.hf_family={cfg.hf_family!r}",
                               "pip install 'sigprop[hf]'")
        config = transformers.AutoConfig.for_model(cfg.hf_family, **self.config_fields(cfg), use_cache=False,
                                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
        return transformers.AutoModelForCausalLM.from_config(config)

    @abstractmethod
    def sites(self, block: nn.Module) -> list[ResidualSite]:
        """The block's residual sites in execution order: attention, then MLP."""

    @abstractmethod
    def backbone_pieces(self, base: nn.Module) -> Iterator[Piece]:
        """Every backbone parameter, with its role and block index."""

    def handles(self, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) in self.model_types

    def stack(self, model: nn.Module) -> str:
        return "dec" if self.mirror(model.config)["arch"] == "decoder" else "enc"

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(getattr(*self.block_slot(model.base_model)))

    def residual(self, block: nn.Module, kind: str) -> Residual | None:
        """The `Residual` `sigprop.hf.apply` registered on the block for site ``kind``; None before `apply`."""
        residual = getattr(block, f"sigprop_{kind}_residual", None)
        return residual if isinstance(residual, Residual) else None

    def pieces(self, model: nn.Module) -> Iterator[Piece]:
        """`backbone_pieces`, then the parameters outside the backbone (LM/MLM/classifier heads, `head_pieces`); a
        piece inside a block carries the model's `stack`."""
        stack = self.stack(model)
        seen: set[int] = set()
        for piece in (*self.backbone_pieces(model.base_model), *head_pieces(model)):
            if piece.layer is None and id(piece.param) in seen:
                continue                                # a tied head is the token table
            seen.add(id(piece.param))
            yield piece if piece.layer is None else dataclasses.replace(piece, stack=stack)

    def embedding(self, model: nn.Module) -> tuple[nn.Module, bool]:
        return self.blocks(model)[0], True

    def watch_logits(self, model: nn.Module, sink: LogitsSink) -> AbstractContextManager[None]:
        stack = self.stack(model)
        keys = {m: (stack, i + 1, "attn") for i, m in enumerate(self.attentions(model.base_model))}
        return watch_attention_logits(model, keys, sink)

    def insert_blocks(self, model: nn.Module, blocks: list[nn.Module], sources: list[int]) -> None:
        """Also renumber each block's ``layer_idx`` (KV cache slots), set ``config.num_hidden_layers`` and, where the
        config lists ``layer_types`` per block, give each block its source's type."""
        config = model.config
        types = getattr(config, "layer_types", None)
        if isinstance(types, (list, tuple)) and len(types) == len(self.blocks(model)):
            config.layer_types = [types[s] for s in sources]
        for j, block in enumerate(blocks):
            for module in block.modules():
                if isinstance(getattr(module, "layer_idx", None), int):
                    module.layer_idx = j
        setattr(*self.block_slot(model.base_model), nn.ModuleList(blocks))
        config.num_hidden_layers = len(blocks)

    def check_growth(self, model: nn.Module, mode: str) -> None:
        if getattr(model, "sigprop_config", None) is not None:
            raise UserError("grow: this transformers model went through sigprop.hf.apply, whose hooks and residual "
                            "modules belong to its current blocks; grow the model first, then apply the scheme")
        if getattr(model.config, "scale_attn_by_inverse_layer_idx", False):
            raise UserError("grow: config.scale_attn_by_inverse_layer_idx=True scales each GPT-2 block's attention "
                            "by 1/(its index + 1), so renumbering the blocks would change the existing ones")
        if mode == "identity" and self.placement == "post":
            raise UserError(f"grow: mode 'identity' needs blocks x + f(x) with no norm after the add; model_type "
                            f"{model.config.model_type!r} normalizes after it, N(x + 0) ≠ x, so a zeroed block is not "
                            "the identity: use mode 'copy'")
        if mode == "dslm":
            raise UserError("grow: mode 'dslm' needs a sigprop model of scheme 'dslm'; a transformers model has no "
                            "sigprop scheme: use mode 'identity' or 'copy'")

    def config(self, model: nn.Module) -> Any:
        """What `sigprop.hf.apply` returned (``model.sigprop_config``); None before `apply`."""
        return getattr(model, "sigprop_config", None)

    def vocab_size(self, model: nn.Module) -> int:
        return int(model.config.vocab_size)

    def chain(self, model: nn.Module, inputs: Any) -> Chain:
        """`sigprop.hf.walk.Walk.chain` in eval mode over the ids ``inputs[0]``."""
        from .walk import Walk

        ids = inputs[0]
        with in_mode(model, "eval"):
            return Walk(model, ids).chain(ids.shape[-1])

    def predict(self, model: nn.Module, inputs: Any) -> list[Record]:
        """`sigprop.hf.predict` on the ids ``inputs[0]`` (eval mode)."""
        from .walk import predict

        return predict(model, inputs[0])

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
