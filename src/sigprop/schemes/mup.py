"""μP, the maximal-update parametrization for Adam (Yang et al., "Tensor Programs V", NeurIPS 2021,
arXiv 2203.03466, Table 3 and App. B), as multipliers relative to a base width.

With width n = ``d_model``, base width n₀ = ``base_width`` and m = n/n₀ (heads fixed, so d_head ∝ n):

  role                         init std                 Adam LR   Adam ε   weight decay
  hidden (q k v o ffn_in/out)  scheme's (var ∝ 1/fan_in)  η/m      ε/m      λ·m
  input (embed pos cls patch)  scheme's at width n₀        η        ε        λ
  untied readout (head)        scheme's · m^{-1/2}        η/m      ε/m      λ·m
  tied readout (logits)        h·Eᵀ·(n₀/n)/(σ_e√n₀): mup's 1/m readout; variance n₀/n at init
  attention logits             QKᵀ·√d_head₀/d_head (1/d_head, equal to 1/√d_head at n₀)
  norms, biases, scalars       unchanged                  η        ε        0

Why each rule: after one Adam step every entry of a weight moves by ~η whatever its gradient's
size, so a hidden matrix's update changes its output by ~η·fan_in coordinate-wise unless η ∝ 1/n;
input weights have a fixed fan-in, so their η is width-free, and their init must keep Θ(1)
coordinates (the scheme's std at n₀); the readout sums n coordinates that become correlated with
it during training, hence 1/n rather than 1/√n; queries and keys become correlated the same
way, hence 1/d_head. Adam's ε follows the gradient scale of its role (1/n for hidden weights), and
weight decay λ·m keeps the per-step decay η·λ width-independent (CompleteP, Dey et al. 2025,
arXiv 2505.01618, Table 1). Invariant (checked by the coordinate check in tests/test_coord_check.py):
the per-layer activation change after a few Adam steps does not depend on the width.

The ``standard`` parametrization returns 1 for every multiplier (the scheme's own rules).
"""
from __future__ import annotations

import math
from typing import Any

from ..fields import FieldError

PARAMETRIZATIONS = ("standard", "mup")
HIDDEN = ("q", "k", "v", "o", "ffn_in", "ffn_out")
INPUT = ("embed", "pos", "cls", "patch")
READOUT = ("head",)


def width_mult(cfg: Any) -> float:
    """m = d_model/base_width under μP, else 1."""
    return cfg.d_model / cfg.base_width if cfg.parametrization == "mup" else 1.0


def lr_mult(cfg: Any, role: str) -> float:
    """Adam learning-rate multiplier of ``role``: 1/m for hidden and readout weights, else 1."""
    return 1.0 / width_mult(cfg) if role in HIDDEN + READOUT else 1.0


def std_mult(cfg: Any, role: str) -> float:
    """Init std multiplier on the scheme's std: m^{-1/2} for an untied readout (variance 1/n²·n₀), else 1.

    Input roles are handled by `base_width_shape` (their std is the scheme's at width n₀)."""
    return 1.0 / math.sqrt(width_mult(cfg)) if role in READOUT else 1.0


def readout_mult(cfg: Any) -> float:
    """Multiplier m^{-1/2} on the unit-variance tied-logit scale 1/(σ_e√n): together (n₀/n)/(σ_e√n₀), the
    1/m of mup's shared readout, so logits are O(1/√m) at init and stay Θ(1) after updates."""
    return 1.0 / math.sqrt(width_mult(cfg))


def attention_scale(cfg: Any) -> float | None:
    """QKᵀ multiplier √d_head₀/d_head under μP (d_head₀ = base_width/n_heads), None for the module's 1/√d_head."""
    if cfg.parametrization != "mup":
        return None
    return math.sqrt(cfg.base_width / cfg.n_heads) / cfg.d_head


def base_width_shape(cfg: Any, role: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape an input-role parameter has at width n₀ (its width axis: the first for "patch", else the last)."""
    axis = 0 if role == "patch" else len(shape) - 1
    return tuple(cfg.base_width if i == axis else s for i, s in enumerate(shape))


def check(cfg: Any) -> None:
    """Raise ValueError for μP settings that make no sense."""
    if cfg.parametrization not in PARAMETRIZATIONS:
        raise FieldError(f"ModelConfig.parametrization must be one of {PARAMETRIZATIONS}, "
                         f"got {cfg.parametrization!r}")
    if cfg.parametrization == "mup" and cfg.base_width % cfg.n_heads:
        raise FieldError(f"ModelConfig.base_width ({cfg.base_width}) must be divisible by ModelConfig.n_heads "
                         f"({cfg.n_heads}) under parametrization 'mup' (μP fixes the head count, d_head ∝ width)")
