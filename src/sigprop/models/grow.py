"""`grow`: make a trained model deeper by inserting blocks (LLaMA Pro, SOLAR, Staged Training).

Placement (`plan`), for a stack of L blocks grown to N (E = N − L new blocks):

* ``every=J``: the insertion points are after the existing blocks J, 2J, …, ⌊L/J⌋·J (1-based). New
  blocks are dealt to them in turn from the bottom, round after round, until E are placed: point i
  receives ⌊E/P⌋ blocks, plus one more for the first E mod P points (P = ⌊L/J⌋ points), all inserted
  directly after its existing block. The neighbour of a new block is the existing block it follows.
* ``at="top"`` (the default): the new blocks are appended after the last block; the k-th (0-based)
  one's neighbour is existing block L − m + (k mod m), m = min(E, L): the top E blocks again, in
  order (every block, cyclically, when E > L).

Modes:

* ``identity``: each new block is a copy of its neighbour whose output projections (attention ``o_proj``
  and MLP ``fc2``; GPT-2's two ``c_proj``; LLaMA's ``o_proj`` and ``down_proj``), weights and biases, are
  zero, so its branches add exactly 0. A sigprop sublayer is then the identity only if nothing else
  touches the stream: with the norm after the add (Post-LN, DeepNorm) ``N(αx)`` ≠ x, so such models
  are refused; a skip weight α ≠ 1 (DSLM's λ, the Shaped Transformer's λ) is set to exactly 1 in the
  new blocks (their β is the neighbour's), which makes them the identity. With a norm on the branch output
  (placements "out", "sandwich") a zeroed projection would feed that norm a zero vector (its output the
  shift, its Jacobian 1/√ε), so there the norm's gain and shift are zeroed instead and the projections
  kept: N(f)·0 + 0 = 0 (OLMo 2's output norms: weight 0; Gemma 3's, whose gain is 1 + weight: weight −1). The
  function, and so every logit, is unchanged; the new blocks start learning
  through the zeroed parameters' gradients.
* ``copy``: each new block is an exact copy of its neighbour (its residual weights included); the
  function changes.
* ``dslm``: for a model of scheme ``dslm`` only. The new blocks are those of a fresh model of the new
  depth N (`build_model`, weights drawn from torch's global RNG: seed it for a reproducible growth):
  DSLM's init and (λ, β) with β² = k/(new branch count), except W_V and W_O, rescaled to DSLM's rule at the
  attention gain of the grown stack's stream entering each new block (`sigprop.schemes.dslm_growth`). Existing
  blocks keep their trained weights and their own (λ, β) buffers, frozen at the old depth's values: every
  sublayer keeps λ² + β² = 1, so a unit-variance stream stays one through old and new blocks alike.

Kept in every mode: the embeddings, final norm and head, and every existing block with its residual
weights. A sigprop model gets ``cfg.n_layers = N``; its blocks are renumbered (site tags `tag_site`
and each sublayer's ``site``), new parameters carry their role tags and recorded init std (0 for a
zeroed projection), so `initialize`, the optimizer groups and checkpoints treat the grown model like a
freshly built one of depth N. A `transformers` model gets ``config.num_hidden_layers = N`` (and a
longer ``config.layer_types`` where the config has one) and renumbered ``layer_idx`` (KV cache slots).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..console.errors import UserError
from ..nn import Block
from ..nn.block import OUTPUT_NORMED
from ..nn.roles import set_init_std, tag_site
from ..schemes import Site
from ..schemes.dslm_growth import set_new_block_gains_
from .build import build_model
from .transformer import DecoderLM, EncoderDecoder, EncoderMLM, ViT

MODES = ("identity", "copy", "dslm")
PLACES = ("top",)
SUBLAYERS = ("attn", "cross", "mlp")
OUTPUT_PROJECTIONS = {"attn": "o_proj", "cross": "o_proj", "mlp": "fc2"}   # sigprop: sublayer -> fn attribute

# transformers families: model_type -> (block list attribute of the backbone, output projections of a block)
HF_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpt2": ("h", ("attn.c_proj", "crossattention.c_proj", "mlp.c_proj")),
    "llama": ("layers", ("self_attn.o_proj", "mlp.down_proj")),
    "mistral": ("layers", ("self_attn.o_proj", "mlp.down_proj")),
    "qwen2": ("layers", ("self_attn.o_proj", "mlp.down_proj")),
    "qwen3": ("layers", ("self_attn.o_proj", "mlp.down_proj")),
    "olmo2": ("layers", ()),
    "gemma3_text": ("layers", ()),
}
# transformers families with a norm on each branch output (placements "out", "sandwich"): model_type -> (those norms
# in a block, the offset c of their gain c + weight); mode "identity" zeroes their gain (weight = −c) instead of the
# projections (module docstring)
HF_OUTPUT_NORMS: dict[str, tuple[tuple[str, ...], float]] = {
    "olmo2": (("post_attention_layernorm", "post_feedforward_layernorm"), 0.0),
    "gemma3_text": (("post_attention_layernorm", "post_feedforward_layernorm"), 1.0),
}


@dataclass(frozen=True)
class Slot:
    """One block of the grown stack: ``source`` is the 0-based index of the existing block it is (``new``
    False) or whose neighbour copy it starts from (``new`` True)."""

    source: int
    new: bool


def plan(n_old: int, n_new: int, every: int | None = None, at: str | None = None) -> list[Slot]:
    """The grown stack of ``n_new`` blocks from ``n_old``, bottom to top, by the placement rule in the module
    docstring (``at="top"`` when ``every`` is None). Raises ValueError naming a bad argument."""
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new <= n_old:
        raise UserError(f"grow: n_layers must be an integer greater than the current depth {n_old}, got {n_new!r}")
    if every is not None and at is not None:
        raise UserError(f"grow: give every or at, not both (got every={every!r}, at={at!r})")
    if at is not None and at not in PLACES:
        raise UserError(f"grow: at must be one of {PLACES} or None, got {at!r}")
    extra = n_new - n_old
    if every is None:
        m = min(extra, n_old)
        return [Slot(i, False) for i in range(n_old)] + [Slot(n_old - m + k % m, True) for k in range(extra)]
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= n_old:
        raise UserError(f"grow: every must be an integer in [1, {n_old}] (the current depth), got {every!r}")
    points = n_old // every
    slots = []
    for i in range(n_old):
        slots.append(Slot(i, False))
        if (i + 1) % every == 0 and (p := (i + 1) // every - 1) < points:
            slots += [Slot(i, True)] * (extra // points + (p < extra % points))
    return slots


def grow(model: nn.Module, n_layers: int, mode: str = "identity", every: int | None = None,
         at: str | None = None) -> nn.Module:
    """A deeper copy of ``model`` with ``n_layers`` blocks (``model`` itself is not changed).

    ``model``: a sigprop `DecoderLM`, `EncoderMLM` or `ViT`, or a `transformers` model of a family in
    `HF_FAMILIES` (GPT-2, LLaMA, Mistral, Qwen2, Qwen3, OLMo 2, Gemma 3 text). An `EncoderDecoder` is refused (its
    two stacks make "the depth" ambiguous), as is a `transformers` model after `sigprop.hf.apply` (its hooks hold the
    old blocks).
    ``mode``: one of `MODES`; ``every``/``at``: placement (`plan`); the module docstring states both.

    Args:
        model: the trained model (not changed).
        n_layers: the depth after growth, more than the model's.
        mode: "identity" (zero-output copies: the function is unchanged), "copy" (plain copies) or "dslm"
            (DSLM blocks of the new depth beside the old ones' frozen branch scales).
        every: insert new blocks after every ``every``-th existing block.
        at: "top" (the default placement): append the new blocks on top.

    Returns:
        The deeper model, of the same class.

    Raises:
        UserError: (a ``ValueError``) a bad argument, a model of another kind, or a mode the model cannot
            honour; the error says why.
    """
    if mode not in MODES:
        raise UserError(f"grow: mode must be one of {MODES}, got {mode!r}")
    if isinstance(model, EncoderDecoder):
        raise UserError("grow: an encoder-decoder has two stacks (n_layers and n_dec_layers), so which one grows "
                        "is ambiguous; grow supports arch 'decoder', 'encoder' and 'vit'")
    if isinstance(model, (DecoderLM, EncoderMLM, ViT)):
        return _grow_sigprop(model, n_layers, mode, every, at)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in HF_FAMILIES:
        return _grow_hf(model, model_type, n_layers, mode, every, at)
    raise UserError(f"grow: supports sigprop DecoderLM, EncoderMLM and ViT models and transformers models with "
                    f"config.model_type in {tuple(HF_FAMILIES)}; got {type(model).__name__}"
                    + (f" with model_type {model_type!r}" if model_type is not None else ""))


def tagged_copy(module: nn.Module) -> nn.Module:
    """``copy.deepcopy(module)`` with every parameter's sigprop tags (role, site, init std) carried over
    (`nn.Parameter.__deepcopy__` drops a parameter's attributes)."""
    twin = copy.deepcopy(module)
    for src, dst in zip(module.parameters(), twin.parameters()):
        for key, value in vars(src).items():
            if key.startswith("_sigprop_"):
                setattr(dst, key, value)
    return twin


@torch.no_grad()
def _zero_projection(linear: nn.Module) -> None:
    """Zero a Linear/Conv1D's weight and bias; the weight's recorded init std becomes 0 (its moment map)."""
    linear.weight.zero_()
    set_init_std(linear.weight, 0.0)
    if getattr(linear, "bias", None) is not None:
        linear.bias.zero_()


@torch.no_grad()
def _zero_branch(sub: nn.Module, kind: str) -> None:
    """Make a sigprop sublayer's branch add exactly 0: zero its output norm's affine parameters where it has one
    (module docstring), else its output projection."""
    if sub.placement in OUTPUT_NORMED:
        for p in sub.out_norm.parameters():
            p.zero_()
    else:
        _zero_projection(getattr(sub.fn, OUTPUT_PROJECTIONS[kind]))


def _sublayers(block: Block) -> list[tuple[str, nn.Module]]:
    return [(kind, getattr(block, kind)) for kind in SUBLAYERS if getattr(block, kind) is not None]


def _grow_sigprop(model: nn.Module, n: int, mode: str, every: int | None, at: str | None) -> nn.Module:
    cfg = model.cfg
    old = list(model.stack.blocks)
    slots = plan(len(old), n, every, at)
    placement = model.stack.placement
    if mode == "identity" and placement == "post":
        raise UserError(f"grow: mode 'identity' needs blocks x + f(x) with no norm after the add; this model "
                        f"(scheme {cfg.scheme!r}, norm_placement {cfg.norm_placement!r}) normalizes after it, "
                        "N(x + 0) ≠ x, so a zeroed block is not the identity: use mode 'copy' (or 'dslm' for scheme "
                        "'dslm')")
    if mode == "dslm" and cfg.scheme != "dslm":
        raise UserError(f"grow: mode 'dslm' initializes new blocks by DSLM's rules and needs a model of scheme "
                        f"'dslm'; this one has scheme {cfg.scheme!r}: use mode 'identity' or 'copy'")
    new_cfg = dataclasses.replace(cfg, n_layers=n)
    grown = tagged_copy(model)
    sample = next(grown.parameters())
    fresh = build_model(new_cfg).stack.blocks.to(sample.device, sample.dtype) if mode == "dslm" else None
    stack = old[0].attn.site.stack
    blocks = []
    for j, slot in enumerate(slots):
        if not slot.new:
            block = grown.stack.blocks[slot.source]
        elif fresh is not None:
            block = fresh[j]
        else:
            block = tagged_copy(grown.stack.blocks[slot.source])
            if mode == "identity":
                for kind, sub in _sublayers(block):
                    _zero_branch(sub, kind)
                    with torch.no_grad():
                        sub.residual.alpha.fill_(1.0)
        tag_site(block, stack, j)
        for kind, sub in _sublayers(block):
            sub.site = Site(stack, j, kind)
        blocks.append(block)
    grown.stack.blocks = nn.ModuleList(blocks)
    grown.cfg = new_cfg
    if mode == "dslm":
        set_new_block_gains_(grown, [slot.new for slot in slots])     # their V/O at the grown stream's gain
    return grown


def _grow_hf(model: nn.Module, model_type: str, n: int, mode: str, every: int | None,
             at: str | None) -> nn.Module:
    if getattr(model, "sigprop_config", None) is not None:
        raise UserError("grow: this transformers model went through sigprop.hf.apply, whose hooks and residual "
                        "modules belong to its current blocks; grow the model first, then apply the scheme")
    config = model.config
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise UserError("grow: config.scale_attn_by_inverse_layer_idx=True scales each GPT-2 block's attention by "
                        "1/(its index + 1), so renumbering the blocks would change the existing ones")
    if mode == "dslm":
        raise UserError("grow: mode 'dslm' needs a sigprop model of scheme 'dslm'; a transformers model has no "
                        "sigprop scheme: use mode 'identity' or 'copy'")
    attr, projections = HF_FAMILIES[model_type]
    grown = copy.deepcopy(model)
    base = grown.base_model
    old = list(getattr(base, attr))
    slots = plan(len(old), n, every, at)
    blocks = []
    for j, slot in enumerate(slots):
        block = old[slot.source] if not slot.new else copy.deepcopy(old[slot.source])
        if slot.new and mode == "identity":
            for path in projections:
                linear = _find(block, path)
                if linear is not None:
                    _zero_projection(linear)
            norms, offset = HF_OUTPUT_NORMS.get(model_type, ((), 0.0))
            for path in norms:
                with torch.no_grad():
                    _find(block, path).weight.fill_(-offset)       # gain offset + weight = 0: N(f)·0 = 0
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = j
        blocks.append(block)
    setattr(base, attr, nn.ModuleList(blocks))
    types = getattr(config, "layer_types", None)
    grown.config.num_hidden_layers = n
    if isinstance(types, (list, tuple)) and len(types) == len(old):
        grown.config.layer_types = [types[s.source] for s in slots]
    return grown


def _find(module: nn.Module, path: str) -> Any:
    """The submodule at dotted ``path``, or None where the block has none (GPT-2 without cross-attention)."""
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module
