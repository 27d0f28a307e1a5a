"""`ModelConfig`: one frozen, validated dataclass describing any sigprop model."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..nn.mlp import ACTIVATIONS
from ..nn.norm import NORM_TYPES
from ..nn.shaped_attention import QK_SCALINGS, SHAPING_MODES
from ..schemes import SCHEMES, get_scheme, mup

ARCHS = ("decoder", "encoder", "encdec", "vit")
NORMS = ("preln", "postln", "none")


def _choice(field: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"ModelConfig.{field} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "decoder"             # decoder (causal LM) | encoder (MLM) | encdec | vit
    vocab_size: int = 256             # token vocabulary (unused by vit)
    d_model: int = 128                # residual stream width n
    n_layers: int = 4                 # blocks (the encoder's for encdec)
    n_heads: int = 4                  # attention heads; d_model % n_heads == 0
    d_ff: int | None = None           # MLP hidden width; None → 4·d_model
    max_seq_len: int = 128            # longest sequence (learned position table size)
    scheme: str = "preln"             # preln | postln | vanilla | shaped | dslm | deepnorm
    norm: str | None = None           # preln | postln | none; None → the scheme's default
    norm_type: str = "layernorm"      # layernorm | rmsnorm
    activation: str = "relu"          # relu | gelu | shaped_relu (scheme "shaped" always shapes)
    dropout: float = 0.0              # on every residual branch and the embeddings, in [0, 1)
    bias: bool = False                # biases in Linear layers (zero at init)
    n_dec_layers: int | None = None   # encdec decoder blocks; None → n_layers
    residual_lambda: float | None = None  # shaped/dslm: λ in x ← λx + γf(x); None → √(1 − γ²)
    residual_gamma: float | None = None   # shaped/dslm: γ (β); None → scheme default
    learn_residual: bool = False      # train λ, γ (fixed values must satisfy λ² + γ² = 1)
    tau0: float = 1.0                 # shaped attention temperature τ = τ₀√(n·n_k), > 0
    qk_scaling: str = "temperature"   # shaped: where the 1/√n of τ lives: temperature | init (W_Q, W_K ~ N(0, n^-3/2))
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

    def __post_init__(self) -> None:
        _choice("arch", self.arch, ARCHS)
        _choice("scheme", self.scheme, tuple(SCHEMES))
        scheme = get_scheme(self.scheme)
        if self.norm is None:
            object.__setattr__(self, "norm", scheme.norms[0])
        _choice("norm", self.norm, scheme.norms)
        _choice("norm_type", self.norm_type, NORM_TYPES)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("shaping", self.shaping, SHAPING_MODES)
        _choice("qk_scaling", self.qk_scaling, QK_SCALINGS)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.n_dec_layers is None:
            object.__setattr__(self, "n_dec_layers", self.n_layers)
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len", "n_dec_layers",
                  "image_size", "patch_size", "in_channels", "n_classes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{f} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig.d_model ({self.d_model}) must be divisible by "
                             f"ModelConfig.n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")
        if not self.tau0 > 0:
            raise ValueError(f"ModelConfig.tau0 must be > 0, got {self.tau0}")
        if self.arch == "vit" and self.image_size % self.patch_size:
            raise ValueError(f"ModelConfig.image_size ({self.image_size}) must be divisible by "
                             f"ModelConfig.patch_size ({self.patch_size})")
        self._check_residual()
        self._check_transfer()
        scheme.check(self)

    def _check_residual(self) -> None:
        lam, gam = self.residual_lambda, self.residual_gamma
        if gam is not None and not 0.0 < gam <= 1.0:
            raise ValueError(f"ModelConfig.residual_gamma must be in (0, 1], got {gam}")
        if lam is not None and not 0.0 <= lam <= 1.0:
            raise ValueError(f"ModelConfig.residual_lambda must be in [0, 1], got {lam}")
        if lam is not None and gam is None:
            raise ValueError("ModelConfig.residual_lambda needs residual_gamma (λ alone is ambiguous)")
        if lam is not None and not self.learn_residual and not math.isclose(lam ** 2 + gam ** 2, 1.0, abs_tol=1e-6):
            raise ValueError(f"ModelConfig.residual_lambda² + residual_gamma² must equal 1 when fixed "
                             f"(learn_residual=False), got {lam ** 2 + gam ** 2:.6g}")

    def _check_transfer(self) -> None:
        mup.check(self)
        if not isinstance(self.qk_norm, bool):
            raise ValueError(f"ModelConfig.qk_norm must be true or false, got {self.qk_norm!r}")
        if self.qk_norm and get_scheme(self.scheme).attention != "softmax":
            raise ValueError(f"ModelConfig.qk_norm=True needs softmax attention; scheme {self.scheme!r} uses "
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
        """Build from a mapping; unknown keys are an error naming the valid ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**d)
