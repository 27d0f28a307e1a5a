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

* ``identity``: each new block is a copy of its neighbour whose output projections (`Adapter.output_projections`:
  attention ``o_proj`` and MLP ``fc2``; GPT-2's two ``c_proj``; LLaMA's ``o_proj`` and ``down_proj``), weights and
  biases, are zero, so its branches add exactly 0. A sigprop sublayer is then the identity only if nothing else
  touches the stream: with the norm after the add (Post-LN, DeepNorm) ``N(αx)`` ≠ x, so such models
  are refused; a skip weight α ≠ 1 (DSLM's λ, the Shaped Transformer's λ) is set to exactly 1 in the
  new blocks (their β is the neighbour's), which makes them the identity. With a norm on the branch output
  (placements "out", "sandwich") a zeroed projection would feed that norm a zero vector (its output the
  shift, its Jacobian 1/√ε), so there the norm's gain and shift are zeroed instead and the projections
  kept: N(f)·0 + 0 = 0 (gain offset + weight = 0, `Adapter.norm_offset`: OLMo 2's output norms weight 0; Gemma 3's,
  whose gain is 1 + weight, weight −1). The
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
weights. The model's adapter (`sigprop.models.adapter.Adapter.insert_blocks`) puts the grown stack in place and
renumbers it: a sigprop model gets ``cfg.n_layers = N`` and renumbered blocks (site tags `tag_site` and each
sublayer's ``site``), its new parameters carry their role tags and recorded init std (0 for a zeroed projection),
so `initialize`, the optimizer groups and checkpoints treat the grown model like a freshly built one of depth N;
a `transformers` model gets ``config.num_hidden_layers = N`` (and a longer ``config.layer_types`` where the config
has one) and renumbered ``layer_idx`` (KV cache slots).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..console.errors import UserError
from ..nn.roles import set_init_std
from ..schemes.dslm_growth import set_new_block_gains_
from .adapter import Adapter, adapter_of

MODES = ("identity", "copy", "dslm")
PLACES = ("top",)


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

    ``model``: any model with an adapter (`sigprop.models.adapter.adapter_of`): a sigprop `DecoderLM`, `EncoderMLM`
    or `ViT`, or a `transformers` model of a family in `sigprop.hf.SUPPORTED`. An `EncoderDecoder` is refused (its
    two stacks make "the depth" ambiguous), as is a `transformers` model after `sigprop.hf.apply` (its hooks hold the
    old blocks), or any adapter's refusal (`Adapter.check_growth`).
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
    try:
        adapter = adapter_of(model)
    except ValueError as e:
        raise UserError(f"grow: supports sigprop DecoderLM, EncoderMLM and ViT models and transformers models of a "
                        f"supported family; {e}") from None
    adapter.check_growth(model, mode)
    slots = plan(len(adapter.blocks(model)), n_layers, every, at)
    grown = tagged_copy(model)
    old = adapter.blocks(grown)
    fresh = adapter.fresh_blocks(grown, n_layers) if mode == "dslm" else None
    blocks = []
    for j, slot in enumerate(slots):
        if not slot.new:
            block = old[slot.source]
        elif fresh is not None:
            block = fresh[j]
        else:
            block = tagged_copy(old[slot.source])
            if mode == "identity":
                _make_identity(adapter, block)
        blocks.append(block)
    adapter.insert_blocks(grown, blocks, [slot.source for slot in slots])
    if mode == "dslm":
        set_new_block_gains_(grown, [slot.new for slot in slots])     # their V/O at the grown stream's gain
    return grown


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
def _make_identity(adapter: Adapter, block: nn.Module) -> None:
    """Make every branch of ``block`` add exactly 0 and its shortcut weight α exactly 1 (module docstring): a norm on
    the branch output gets gain offset + weight = 0 and shift 0, else the output projections (weights and biases)
    are zeroed, their recorded init std 0 (their moment map)."""
    for site in adapter.sites(block):
        norm = adapter.output_norm(block, site.kind)
        if not isinstance(norm, nn.Identity):
            for name, p in norm.named_parameters(recurse=False):
                p.fill_(0.0 - adapter.norm_offset if name == "weight" else 0.0)
        else:
            for linear in adapter.output_projections(block, site.kind):
                linear.weight.zero_()
                set_init_std(linear.weight, 0.0)
                if getattr(linear, "bias", None) is not None:
                    linear.bias.zero_()
        residual = adapter.residual(block, site.kind)
        if residual is not None:
            residual.reset_alpha(1.0)
