"""`apply`: re-initialize and rescale a `transformers` model by a sigprop scheme, in place.

The HF config is mirrored by a `ModelConfig` (`mirror_config`); the scheme's own rules then give
every number: ``init_std(cfg, ParamInfo)`` for each weight (the scheme's std with the width
parametrization's multipliers), ``residual(cfg, Site)`` for each residual add, ``attention_scale(cfg)``
for softmax attention logits, ``logit_scale(cfg)`` for a tied output head. What the mirror cannot
express is a documented gain on top of the scheme's std:

* embeddings: the schemes assume `TokenEmbedding.n_tables` = 2 summed tables; a family with T
  tables gets gain √(2/T) (unit stream variance), and the tied-logit scale √(T/2) to match; a table whose output
  the model multiplies by s (`Family.embed_scale`: Gemma's √d) gets a further 1/s, its tied logits s;
* norms: gain one, i.e. weight 1 − `Family.norm_offset` (Gemma's (1 + w) norms: w = 0), q_norm/k_norm included;
* gated MLP (LLaMA): W_down gets gain √(m₂(mirror activation)/m₂(gate)), which turns the
  scheme's d_ff·σ_down²·m₂ = const into the gated form of `sigprop.theory.gated.gated_output_moment`;
* DSLM V/O: gain (G_l / G'_l)^{1/4} on W_V and W_O, where the scheme's std divides by the attention
  gain G_l of its own depth recursion (two tables, plain MLP) and G'_l is the gain of the same recursion
  (`sigprop.schemes.dslm.correlations`) with the family's tables and MLP kernel: 1 for GPT-2 and BERT.
  Both run over the mirror's ``max_seq_len`` keys: ``seq_len`` when given, else the family's number of
  positions.

Residual scaling. HF blocks write their residual adds as ``x + g`` inside ``forward``. A pre-hook
on the module that receives the skip x keeps x; a hook on the branch returns Residual(x, g) − x =
αx + βg − x, so the block's own add yields x + (αx + βg − x) = αx + βg: exactly λx + βf(x) in
exact arithmetic, one rounding away in floating point. Post-LN (BERT) becomes N(αx + βg) the same
way. α, β live in a `sigprop.nn.Residual` registered on the block (in its ``state_dict``).

Admin (``scheme="admin"``, Post-LN: BERT) mirrors ``admin_mode="constant"``: every shortcut gets the trainable
per-channel ω = √((N+1)/ln(N+1) − 1); ``sigprop.schemes.admin.profile(model, input_ids)`` after `apply`
replaces it by the profiled ω of one forward pass (one stack, in sublayer order).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from ..models import ModelConfig
from ..models.adapter import record_std
from ..nn import Residual, TokenEmbedding, make_activation
from ..nn.roles import role_of
from ..schemes import ParamInfo, Site, dslm, get_scheme
from ..theory.gated import gate_moment, gated_kernel
from .base import Family, Piece, ResidualSite
from .bert import Bert
from .gemma3 import Gemma3
from .gpt2 import GPT2
from .llama import Llama
from .olmo2 import Olmo2
from .qwen3 import Qwen3
from .shaped import NAME, ShapedMix, register

FAMILIES: tuple[Family, ...] = (GPT2(), Bert(), Llama(), Qwen3(), Olmo2(), Gemma3())
SUPPORTED: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)
"""The ``config.model_type`` values `apply` accepts (the GPT-2, BERT, LLaMA, Qwen3, OLMo 2 and Gemma 3 text
families); any other raises ``ValueError`` naming this list."""
SCHEMES = ("dslm", "shaped", "deepnorm", "depth_mup", "completep", "admin")
# arguments of `apply` each scheme reads; a non-default value of any other is refused
USES = {"dslm": ("gamma", "k", "r0", "seq_len", "learn_residual"),
        "shaped": ("gamma", "tau0", "c_plus", "c_minus", "shaping", "learn_residual"),
        "deepnorm": ("learn_residual",), "depth_mup": (), "completep": (), "admin": ()}
PLACEMENTS = {"pre": "Pre-LN", "post": "Post-LN", "out": "branch-output norm (x + N(f(x)))",
              "sandwich": "sandwich norm (x + N₂(f(N₁(x))))"}
DEFAULTS = dict(gamma=None, k=2.0, r0=None, tau0=1.0, c_plus=0.0, c_minus=-1.0, shaping="fixed",
                learn_residual=False, seq_len=None)


def family_of(model: nn.Module) -> Family:
    """The `Family` of ``model``; a clear error naming the supported ``model_type`` values otherwise."""
    for family in FAMILIES:
        if family.handles(model):
            return family
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    raise ValueError(f"sigprop.hf supports transformers models with config.model_type in {SUPPORTED}; "
                     f"got {type(model).__name__} with model_type {model_type!r}")


def mirror_config(model: nn.Module, scheme: str = "dslm", *, gamma: float | None = None, k: float = 2.0,
                  r0: float | None = None, tau0: float = 1.0, c_plus: float = 0.0, c_minus: float = -1.0,
                  shaping: str = "fixed", learn_residual: bool = False,
                  parametrization: str = ModelConfig.parametrization, base_width: int = ModelConfig.base_width,
                  base_depth: int = ModelConfig.base_depth) -> ModelConfig:
    """The `ModelConfig` that mirrors ``model.config`` under ``scheme`` (validated by ModelConfig): what
    `apply` returns, without changing the model. The arguments are `apply`'s.

    Raises:
        ValueError: as `apply`: an unsupported ``model_type`` or scheme, or an invalid field (`FieldError`).
    """
    family = family_of(model)
    if scheme not in SCHEMES:
        raise ValueError(f"sigprop.hf.apply scheme must be one of {SCHEMES}, got {scheme!r}")
    _check_placement(model, family, scheme)
    fields = family.mirror(model.config)
    if scheme == "shaped":
        fields["activation"] = "shaped_relu"
        fields["qk_norm"] = False                 # the qk-norms go with the other norms (`Family.norm_slots`)
        del fields["norm_type"]                   # norm "none": a norm type would be a field with no effect
    if scheme == "admin":
        fields["admin_mode"] = "constant"         # profiling needs data: `sigprop.schemes.admin.profile` after apply
    return ModelConfig(**fields, scheme=scheme, norm_placement="none" if scheme == "shaped" else family.placement,
                       residual_gamma=gamma, dslm_k=k, dslm_r0=r0, tau0=tau0, c_plus=c_plus, c_minus=c_minus,
                       shaping=shaping, learn_residual=learn_residual, parametrization=parametrization,
                       base_width=base_width, base_depth=base_depth)


def _check_placement(model: nn.Module, family: Family, scheme: str) -> None:
    """Refuse a scheme whose norm placement (`Scheme.norm_placements`) the family's blocks do not have ("shaped"
    drops the norms, so it fits every Pre-LN and Post-LN family; with a norm on the branch output the gated MLP
    would be left unnormalized, `sigprop.hf.olmo2`)."""
    placements = get_scheme(scheme).norm_placements
    if scheme == "shaped" and family.placement not in ("pre", "post"):
        raise ValueError(f"sigprop.hf.apply scheme 'shaped' removes the blocks' norms; {model.config.model_type!r} "
                         f"has a {PLACEMENTS[family.placement]}, whose removal leaves its gated MLP unnormalized (its "
                         "branch grows like |x|²): no exact shaped form; use 'depth_mup' or 'completep'")
    if scheme == "shaped" or family.placement in placements:
        return
    need = placements[0]
    ok = tuple(t for f in FAMILIES if f.placement == need for t in f.model_types)
    raise ValueError(f"sigprop.hf.apply scheme {scheme!r} is {PLACEMENTS[need]}; supported for model_type in {ok}, "
                     f"not {PLACEMENTS[family.placement]} {model.config.model_type!r}")


def apply(model: nn.Module, scheme: str = "dslm", *, gamma: float | None = None, k: float = 2.0,
          r0: float | None = None, tau0: float = 1.0, c_plus: float = 0.0, c_minus: float = -1.0,
          shaping: str = "fixed", learn_residual: bool = False, seq_len: int | None = None,
          parametrization: str = ModelConfig.parametrization, base_width: int = ModelConfig.base_width,
          base_depth: int = ModelConfig.base_depth, reinit: bool = True) -> ModelConfig:
    """Make ``model`` (a `transformers` model of a family in `SUPPORTED`) a ``scheme`` model, in place.

    Arguments the scheme does not read must keep their defaults. Every weight drawn records its std
    (`record_std`), which `sigprop.hf.predict` reads. Optimizer groups: `sigprop.hf.param_groups`.

    Args:
        model: the `transformers` model; its ``config.model_type`` must be in `SUPPORTED`.
        scheme: "dslm", "shaped", "deepnorm", "depth_mup", "completep" or "admin".
        gamma: residual β (γ); None → the scheme's default (dslm √(k/N), shaped 0.2).
        k: DSLM β² = k/N.
        r0: DSLM embedding token correlation (None → Zipf estimate).
        tau0: shaped attention temperature τ₀.
        c_plus: shaped-ReLU c₊.
        c_minus: shaped-ReLU c₋.
        shaping: "fixed" | "recover" | "learn" γ₁/γ₂/s₋.
        learn_residual: train λ, β.
        seq_len: DSLM only, the sequence length T the V/O rule is made for (None → the model's number of
            positions; give the training length, short and causal sequences need it).
        parametrization: as the `ModelConfig` field, for every scheme: "mup" re-initializes input roles at
            ``base_width`` and untied heads by m^{-1/2}, scales attention logits (softmax attention) by the
            scheme's `attention_scale` and tied logits by its `logit_scale`.
        base_width: the μP base width.
        base_depth: L₀ of "depth_mup"/"completep", whose branch multipliers (L₀/L)^α are the scheme's
            `residual`.
        reinit: False re-attaches the forward changes only (e.g. before ``load_state_dict`` of a model saved
            after `apply`).

    Returns:
        The mirrored `ModelConfig`, also stored as ``model.sigprop_config``.

    Raises:
        ValueError: a ``model_type`` outside `SUPPORTED`, an unknown scheme or one this family's norm
            placement refuses, an argument the scheme does not read set to another value than its default, a
            non-finite number, a ``seq_len`` that is not a positive int, or ``shaping="recover"`` (its schedule
            needs a trainer); an invalid `ModelConfig` field (`FieldError`).
        RuntimeError: a model `apply` was already applied to, or one that refuses the shaped attention
            implementation.
    """
    if getattr(model, "sigprop_config", None) is not None:
        raise RuntimeError("sigprop.hf.apply was already applied to this model")
    _check_arguments(scheme, dict(gamma=gamma, k=k, r0=r0, tau0=tau0, c_plus=c_plus, c_minus=c_minus,
                                  shaping=shaping, learn_residual=learn_residual, seq_len=seq_len))
    family = family_of(model)
    cfg = mirror_config(model, scheme, gamma=gamma, k=k, r0=r0, tau0=tau0, c_plus=c_plus, c_minus=c_minus,
                        shaping=shaping, learn_residual=learn_residual, parametrization=parametrization,
                        base_width=base_width, base_depth=base_depth)
    if seq_len is not None:
        cfg = dataclasses.replace(cfg, max_seq_len=seq_len)
    if scheme == "shaped":
        _shape(model, family, cfg)
    if reinit:
        initialize(model, family, cfg)
    _scale_residuals(model, family, cfg)
    _scale_attention_logits(model, family, cfg)
    _scale_tied_logits(model, family, cfg)
    model.sigprop_config = cfg
    return cfg


def _check_arguments(scheme: str, given: dict[str, Any]) -> None:
    """Refuse non-finite numbers, a non-positive ``seq_len``, ``shaping="recover"``, and non-default values of
    arguments ``scheme`` does not read (they would be silently ignored)."""
    if scheme not in USES:
        raise ValueError(f"sigprop.hf.apply scheme must be one of {SCHEMES}, got {scheme!r}")
    for name, value in given.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"sigprop.hf.apply argument {name} must be a finite number, got {value!r}")
        if value != DEFAULTS[name] and name not in USES[scheme]:
            raise ValueError(f"sigprop.hf.apply argument {name}={value!r} is not used by scheme {scheme!r} "
                             f"(it reads {USES[scheme]}); leave it at its default {DEFAULTS[name]!r}")
    seq_len = given["seq_len"]
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f"sigprop.hf.apply argument seq_len must be a positive int or None, got {seq_len!r}")
    if given["shaping"] == "recover":
        raise ValueError("sigprop.hf.apply argument shaping='recover' needs its γ₁/γ₂/s₋ schedule stepped by a "
                         "training loop, which sigprop.hf does not run: use shaping='fixed' or 'learn'")


def _shape(model: nn.Module, family: Family, cfg: ModelConfig) -> None:
    """Norms → identity, activations → shaped ReLU (both as the family says), shaped attention."""
    base = model.base_model
    for parent, name in family.norm_slots(base):
        setattr(parent, name, nn.Identity())
    act = get_scheme(cfg.scheme).activation(cfg)
    for parent, name in [] if family.gated else family.act_slots(base):
        setattr(parent, name, make_activation(act, cfg.d_model, cfg.c_plus, cfg.c_minus, cfg.shaping))
    for attn in family.attentions(base):
        attn.sigprop_shape = ShapedMix(cfg.n_heads, cfg.d_model, attn.is_causal, cfg.tau0, mode=cfg.shaping)
    register()
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:
        raise RuntimeError(f"{type(model).__name__} refused attn_implementation {NAME!r}")


@torch.no_grad()
def initialize(model: nn.Module, family: Family, cfg: ModelConfig) -> dict[str, int]:
    """Initialize every parameter of ``model`` from its role (bias 0, norm 1, shaping constants as their module
    set them, else N(0, (gain·std)²), gains in the module docstring). Every element of every parameter must be
    covered exactly once; returns counts per role.
    """
    scheme = get_scheme(cfg.scheme)
    stack = "dec" if cfg.arch == "decoder" else "enc"
    table_gain = math.sqrt(TokenEmbedding.n_tables / family.n_tables)
    embed_gain = table_gain / family.embed_scale(model.base_model)
    parent, name = family.act_slots(model.base_model)[0]
    act = getattr(parent, name)
    gate_gain = math.sqrt(dslm.second_moment(cfg.activation) / gate_moment(act)) if family.gated else 1.0
    vo_gain = _vo_gains(cfg, family, stack, act) if cfg.scheme == "dslm" else None

    def gain(piece: Piece) -> float:
        if piece.role in ("embed", "pos"):
            return embed_gain if piece.role == "embed" else table_gain
        if piece.role == "ffn_out":
            return gate_gain
        if piece.role in ("v", "o") and vo_gain is not None:
            return vo_gain[piece.layer]
        return 1.0

    covered: dict[int, int] = {}
    counts: dict[str, int] = {}

    def init(piece: Piece) -> None:
        if piece.role == "bias":
            piece.tensor.zero_()
        elif piece.role == "norm":
            piece.tensor.fill_(1.0 - family.norm_offset)       # gain norm_offset + weight = 1
        else:
            std = scheme.init_std(cfg, ParamInfo(piece.role, stack, piece.layer, piece.shape))
            piece.tensor.normal_(0.0, gain(piece) * std)
            record_std(piece, gain(piece) * std)
        covered[id(piece.param)] = covered.get(id(piece.param), 0) + piece.tensor.numel()
        counts[piece.role] = counts.get(piece.role, 0) + 1

    for piece in family.pieces(model):
        init(piece)
    for p in model.parameters():                 # shaping constants (γ₁, γ₂, s₋ under "learn"): set by their module
        if role_of(p) == "constant" and id(p) not in covered:
            covered[id(p)] = p.numel()
            counts["constant"] = counts.get("constant", 0) + 1
    wrong = [name for name, p in model.named_parameters() if covered.get(id(p), 0) != p.numel()]
    if wrong:
        raise RuntimeError(f"sigprop.hf has no init rule for (or initialized twice) parameters {wrong}")
    return counts


def _vo_gains(cfg: ModelConfig, family: Family, stack: str, act: nn.Module) -> list[float]:
    """(G_l / G'_l)^{1/4} per block (module docstring): the scheme's recursion against the family's."""
    kernel = gated_kernel(act) if family.gated else (lambda r: dslm.activation_kernel(cfg.activation, r))
    ours = dslm.correlations(cfg, stack, kernel, family.n_tables, family.shared_tables)
    return [dslm.vo_std(cfg, g_ours) / dslm.vo_std(cfg, g)
            for (_, g), (_, g_ours) in zip(dslm.block_correlations(cfg, stack), ours)]


def _scale_residuals(model: nn.Module, family: Family, cfg: ModelConfig) -> None:
    scheme = get_scheme(cfg.scheme)
    stack = "dec" if cfg.arch == "decoder" else "enc"
    for layer, block in enumerate(family.blocks(model)):
        for site in family.sites(block):
            residual = Residual(*scheme.residual(cfg, Site(stack, layer, site.kind)), learnable=cfg.learn_residual,
                                width=cfg.d_model if scheme.channel_residual else None)
            block.add_module(f"sigprop_{site.kind}_residual", residual)
            _hook_residual(site, residual)


def _hook_residual(site: ResidualSite, residual: Residual) -> None:
    """Turn the block's ``x + g`` at ``site`` into ``αx + βg`` (module docstring)."""
    kept: dict[str, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple) -> None:
        kept["x"] = args[site.skip_arg]

    def scale(module: nn.Module, args: tuple, out: torch.Tensor | tuple) -> torch.Tensor | tuple:
        x = kept.pop("x")
        if isinstance(out, tuple):
            return (residual(x, out[0]) - x, *out[1:])
        return residual(x, out) - x

    site.skip.register_forward_pre_hook(keep)
    site.branch.register_forward_hook(scale)


def _scale_attention_logits(model: nn.Module, family: Family, cfg: ModelConfig) -> None:
    """Softmax attention's QKᵀ multiplier from the scheme's `attention_scale` (μP: √d_head₀/d_head), set as the
    ``scaling`` every supported attention module passes to its attention function; None keeps 1/√d_head."""
    scheme = get_scheme(cfg.scheme)
    scale = scheme.attention_scale(cfg)
    if scale is None or scheme.attention != "softmax":
        return
    for attn in family.attentions(model.base_model):
        attn.scaling = scale


def _scale_tied_logits(model: nn.Module, family: Family, cfg: ModelConfig) -> None:
    """A head tied to the token embedding returns logits × 1/√(d σ_e²), as sigprop's tied heads; the factor is the
    head's ``sigprop_logit_scale``."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or out.weight is not inp.weight:
        return
    out.sigprop_logit_scale = (get_scheme(cfg.scheme).logit_scale(cfg) * family.embed_scale(model.base_model)
                               * math.sqrt(family.n_tables / TokenEmbedding.n_tables))
    out.register_forward_hook(lambda module, args, logits: logits * module.sigprop_logit_scale)
