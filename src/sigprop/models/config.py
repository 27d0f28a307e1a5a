"""`ModelConfig`: one frozen, validated dataclass describing any sigprop model."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from ..fields import (
    POSITIVE,
    POSITIVE_INT,
    SQUARABLE,
    SQUARABLE_POSITIVE,
    UNIT_CLOSED,
    FieldError,
    Range,
    Renamed,
    accepts_renamed_keys,
    check_fields,
    current_value,
    invalid,
    renamed_keys,
)
from ..nn.mlp import ACTIVATIONS
from ..nn.norm import NORM_TYPES
from ..nn.shaped_attention import DEPRECATED_QK_SCALINGS, QK_SCALINGS, SHAPING_MODES
from ..schemes import SCHEMES, get_scheme, mup

ARCHS = ("decoder", "encoder", "encdec", "vit")
ADMIN_MODES = ("profile", "constant")
HF_FAMILIES = (None, "gpt2", "llama", "qwen3", "olmo2", "gemma3_text")   # the transformers model_types a decoder
#                                                                       config may build (`hf_family`)
# the sizes a transformers model is built from (`sigprop.hf.base.Family.config_fields`); with ``hf_family`` set every
# field but these, arch, hf_family, base_width and base_depth (they name a transfer sweep's reference model,
# `USED_ONLY_BY`) keeps its default: the family's own architecture and init stand in for them
HF_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len")


MAX_VOCAB = 2 ** 22   # 4,194,304 tokens: well above real vocabularies (GPT-2 50,257; Llama 3 128,256), and the
#                     BPE trainer preallocates per token (a vocabulary of 2^31 aborts it for want of memory)

# Allowed intervals of the numeric fields; every other int field must be a positive integer.
RANGES = {
    "vocab_size": Range(1, MAX_VOCAB, label=f"a positive integer <= {MAX_VOCAB}"),
    "dropout": Range(0.0, 1.0, hi_open=True),
    "tau0": SQUARABLE_POSITIVE,         # the model divides by τ₀ (logits) and the theory by τ₀²
    "c_plus": SQUARABLE,                # the shaped ReLU normalises by s₊² + s₋², s± = 1 + c±/√n
    "c_minus": SQUARABLE,
    "residual_lambda": UNIT_CLOSED,
    "residual_gamma": Range(0.0, 1.0, lo_open=True),
    "dslm_k": POSITIVE,
    "dslm_r0": UNIT_CLOSED,
}


# schemes whose residual weights (λ, γ / α, β) are their own rule, which learn_residual may train
LEARNABLE_RESIDUAL = tuple(name for name, scheme in SCHEMES.items() if scheme.learnable_residual)


def _shaped_attention(cfg: ModelConfig) -> bool:
    return get_scheme(cfg.scheme).attention == "shaped"


def _shaped_relu(cfg: ModelConfig) -> bool:
    return get_scheme(cfg.scheme).activation(cfg) == "shaped_relu"


# Fields with an effect only under some arch/scheme: name -> (who uses it, in words; predicate).
# base_width and base_depth are absent on purpose: they name the reference model of a transfer sweep, so one
# base config can serve every point of a grid over parametrization or scheme (standard points ignore them).
USED_ONLY_BY: dict[str, tuple[str, Callable[[ModelConfig], bool]]] = {
    "vocab_size": ("token models (arch decoder, encoder, encdec)", lambda c: c.arch != "vit"),
    "max_seq_len": ("token models (arch decoder, encoder, encdec)", lambda c: c.arch != "vit"),
    "n_dec_layers": ("arch 'encdec'", lambda c: c.arch == "encdec"),
    "norm_type": ("models with a norm (norm_placement other than 'none')", lambda c: c.norm_placement != "none"),
    "tau0": ("shaped attention (scheme 'shaped')", _shaped_attention),
    "qk_scaling": ("shaped attention (scheme 'shaped')", _shaped_attention),
    "c_plus": ("the shaped ReLU (scheme 'shaped' or activation 'shaped_relu')", _shaped_relu),
    "c_minus": ("the shaped ReLU (scheme 'shaped' or activation 'shaped_relu')", _shaped_relu),
    "shaping": ("shaped attention or the shaped ReLU (scheme 'shaped' or activation 'shaped_relu')",
                lambda c: _shaped_attention(c) or _shaped_relu(c)),
    "dslm_k": ("scheme 'dslm'", lambda c: c.scheme == "dslm"),
    "dslm_r0": ("scheme 'dslm'", lambda c: c.scheme == "dslm"),
    "admin_mode": ("scheme 'admin'", lambda c: c.scheme == "admin"),
    "image_size": ("arch 'vit'", lambda c: c.arch == "vit"),
    "patch_size": ("arch 'vit'", lambda c: c.arch == "vit"),
    "in_channels": ("arch 'vit'", lambda c: c.arch == "vit"),
    "n_classes": ("arch 'vit'", lambda c: c.arch == "vit"),
}


def _choice(field: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise FieldError(invalid(f"ModelConfig.{field}", value, f"one of {allowed}"))


@accepts_renamed_keys
@dataclass(frozen=True)
class ModelConfig:
    """One model: architecture, sizes, scheme and the architecture knobs, validated on construction. Each field's
    comment says what it holds and which values it takes; `docs/architectures.md` lists the knobs with what
    `predict`, `diagnose`, `sigprop.hf.apply`, `grow` and `advise` do with each. A renamed field (``norm``) is
    still accepted, as a keyword or by `from_dict`, with a ``DeprecationWarning`` naming the new one.

    Raises:
        FieldError: a value outside its field's range or choices, or a field that has no effect with the others
            (a ViT field on a decoder, a scheme's knob under another scheme), named with the allowed values.
    """

    arch: str = "decoder"             # decoder (causal LM) | encoder (MLM) | encdec | vit
    vocab_size: int = 256             # token vocabulary (unused by vit)
    d_model: int = 128                # residual stream width n
    n_layers: int = 4                 # blocks (the encoder's for encdec)
    n_heads: int = 4                  # attention heads; d_model % n_heads == 0
    d_ff: int | None = None           # MLP hidden width; None → 4·d_model
    max_seq_len: int = 128            # longest sequence (learned position table size)
    scheme: str = "preln"             # preln | postln | vanilla | shaped | dslm | deepnorm | depth_mup | completep
    #                                   | gpt2 | admin
    norm_placement: str | None = None  # pre | post | none | out (x + N(f(x))) | sandwich (x + N₂(f(N₁(x)))): each
    #                                    sublayer's norms; None → the scheme's default
    norm_type: str = "layernorm"      # layernorm | rmsnorm
    activation: str = "relu"          # relu | gelu | shaped_relu (scheme "shaped" always shapes)
    dropout: float = 0.0              # on every residual branch and the embeddings, in [0, 1)
    bias: bool = False                # biases in Linear layers (zero at init)
    n_dec_layers: int | None = None   # encdec decoder blocks; None → n_layers (stays None for other archs)
    residual_lambda: float | None = None  # shaped/dslm: λ in x ← λx + γf(x); None → √(1 − γ²)
    residual_gamma: float | None = None   # shaped/dslm: γ (β); None → scheme default
    learn_residual: bool = False      # train λ, γ (schemes shaped, dslm, deepnorm; fixed values need λ² + γ² = 1)
    tau0: float = 1.0                 # shaped attention temperature τ = τ₀√(n·n_k), > 0
    qk_scaling: str = "temperature"   # shaped: where τ's 1/√n lives: temperature | weights (W_Q, W_K ~ N(0, n^-3/2))
    shaping: str = "fixed"            # fixed | recover (scheduled by the trainer) | learn
    c_plus: float = 0.0               # shaped ReLU s₊ = 1 + c₊/√n
    c_minus: float = -1.0             # shaped ReLU s₋ = 1 + c₋/√n
    dslm_k: float = 2.0               # DSLM β² = k/N
    dslm_r0: float | None = None      # DSLM embedding token correlation; None → Zipf estimate
    image_size: int = 8               # vit: square image side
    patch_size: int = 2               # vit: square patch side
    in_channels: int = 1              # vit: image channels
    n_classes: int = 10               # vit: classes
    parametrization: str = "standard"  # standard | mup (width rules of sigprop.schemes.mup)
    base_width: int = 128             # mup: width n₀ at which every multiplier is 1
    base_depth: int = 4               # depth_mup/completep: blocks L₀ at which every multiplier is 1
    qk_norm: bool = False             # norm (norm_type) on each head's queries and keys (softmax attention)
    admin_mode: str = "profile"       # admin: ω from one profiling pass (theory's profile without data) | constant
    hf_family: str | None = None      # None: sigprop's own model | gpt2 | llama: that `transformers` causal LM (arch
    #                                   decoder) of these sizes at its family's own init (`sigprop.hf.base.Family`)

    # deprecated field names, still read (with a DeprecationWarning) from keywords, mappings and files
    RENAMED_KEYS: ClassVar[Mapping[str, Renamed]] = {
        "norm": Renamed("norm_placement", {"preln": "pre", "postln": "post", "none": "none"})}

    def __post_init__(self) -> None:
        check_fields(self, "ModelConfig.", RANGES, int_range=POSITIVE_INT)
        _choice("arch", self.arch, ARCHS)
        _choice("scheme", self.scheme, tuple(SCHEMES))
        self._check_transformers()
        scheme = get_scheme(self.scheme)
        if self.norm_placement is None:
            object.__setattr__(self, "norm_placement", scheme.norm_placements[0])
        _choice("norm_placement", self.norm_placement, scheme.norm_placements)
        _choice("norm_type", self.norm_type, NORM_TYPES)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("shaping", self.shaping, SHAPING_MODES)
        object.__setattr__(self, "qk_scaling", current_value("ModelConfig.qk_scaling", self.qk_scaling, QK_SCALINGS,
                                                             DEPRECATED_QK_SCALINGS, stacklevel=5))
        _choice("admin_mode", self.admin_mode, ADMIN_MODES)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.d_model % self.n_heads:
            raise FieldError(f"ModelConfig.d_model ({self.d_model}) must be divisible by "
                             f"ModelConfig.n_heads ({self.n_heads})")
        if self.arch == "vit" and self.image_size % self.patch_size:
            raise FieldError(f"ModelConfig.image_size ({self.image_size}) must be divisible by "
                             f"ModelConfig.patch_size ({self.patch_size})")
        self._check_residual()
        self._check_transfer()
        scheme.check(self)
        self._check_used()
        # unused outside encdec; a saved n_dec_layers == n_layers (the old resolved value) reads as None
        if self.arch != "encdec":
            object.__setattr__(self, "n_dec_layers", None)
        elif self.n_dec_layers is None:
            object.__setattr__(self, "n_dec_layers", self.n_layers)

    def _check_used(self) -> None:
        """Refuse a non-default value of a field that the chosen arch/scheme ignores (it would do nothing)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, (used_by, used) in USED_ONLY_BY.items():
            value = getattr(self, name)
            if value == defaults[name] or used(self) or (name == "n_dec_layers" and value == self.n_layers):
                continue
            raise FieldError(f"ModelConfig.{name}={value!r} has no effect here (arch={self.arch!r}, "
                             f"scheme={self.scheme!r}, norm_placement={self.norm_placement!r}): it is used only by "
                             f"{used_by}; leave it at its default {defaults[name]!r}")

    def _check_transformers(self) -> None:
        """With ``hf_family`` set: a decoder whose fields outside `HF_SIZES` keep their defaults, as given or as
        resolved (a saved config's ``norm_placement``; the transformers family fixes its norms, activation, biases,
        positions and init, so a scheme or knob would do nothing)."""
        _choice("hf_family", self.hf_family, HF_FAMILIES)
        if self.hf_family is None:
            return
        if self.arch != "decoder":
            raise FieldError(f"ModelConfig.hf_family={self.hf_family!r} builds a causal LM: it needs arch 'decoder', "
                             f"got arch={self.arch!r}")
        free = ("arch", "hf_family", "base_width", "base_depth", *HF_SIZES)
        resolved = ModelConfig(**{name: getattr(self, name) for name in free if name != "hf_family"})
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in free and value not in (f.default, getattr(resolved, f.name)):
                raise FieldError(f"ModelConfig.{f.name}={value!r} has no effect with hf_family={self.hf_family!r}: "
                                 f"the transformers model is built from {HF_SIZES} at its family's own "
                                 f"architecture and init; leave it at its default {f.default!r}")

    def _check_residual(self) -> None:
        if self.learn_residual and not get_scheme(self.scheme).learnable_residual:
            raise FieldError(invalid("ModelConfig.learn_residual", True,
                                     f"False for scheme {self.scheme!r}, whose residual weights are fixed by its rule; "
                                     f"the schemes that train theirs: {LEARNABLE_RESIDUAL}"))
        lam, gam = self.residual_lambda, self.residual_gamma
        if lam is not None and gam is None:
            raise FieldError("ModelConfig.residual_lambda needs residual_gamma (λ alone is ambiguous)")
        if lam is not None and not self.learn_residual and not math.isclose(lam ** 2 + gam ** 2, 1.0, abs_tol=1e-6):
            raise FieldError(f"ModelConfig.residual_lambda² + residual_gamma² must equal 1 when fixed "
                             f"(learn_residual=False), got {lam ** 2 + gam ** 2:.6g}")

    def _check_transfer(self) -> None:
        mup.check(self)
        if self.qk_norm and get_scheme(self.scheme).attention != "softmax":
            raise FieldError(f"ModelConfig.qk_norm=True needs softmax attention; scheme {self.scheme!r} uses "
                             f"{get_scheme(self.scheme).attention!r} attention, whose temperature sets the logit scale")

    @property
    def n_tokens(self) -> int:
        """Tokens per sequence the stacks see at full length: 1 + (image_size/patch_size)² for vit (class token
        and patches), else max_seq_len."""
        return 1 + (self.image_size // self.patch_size) ** 2 if self.arch == "vit" else self.max_seq_len

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from a mapping (a deprecated key read as its new one); unknown keys are an error naming the valid
        ones."""
        d = renamed_keys(d, cls.RENAMED_KEYS, "ModelConfig.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise FieldError(f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**d)
