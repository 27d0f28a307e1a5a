"""`sigprop.models.predict` for the encoder–decoder and the ViT against `diagnostics.measure` (docs/moments.md §6).

Bar: per-sublayer forward variance and gradient variance within 10% median relative error
of the mean over independently initialized float64 networks, inputs as `sigprop diagnose` draws them
(uniform token ids, src and tgt of one length; N(0, 1) pixels), and a median relative standard error of
that mean below a third of the bar. Width 64, 4 layers (4 + 4 for encdec), seq 16; ViT 16×16×3 images,
patch 4 (T = 17).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch

from sigprop.models import ModelConfig, predict
from sigprop.records import Record

pytestmark = pytest.mark.slow

BAR = 0.10
SIZE = {"d_model": 64, "n_heads": 4, "n_layers": 4, "max_seq_len": 16, "vocab_size": 256}
VIT = {"image_size": 16, "patch_size": 4, "in_channels": 3}
SEEDS, BATCH = {"encdec": 256, "vit": 256}, {"encdec": 1, "vit": 4}
CONFIGS = {"preln": ("preln", None), "postln": ("postln", None), "dslm-preln": ("dslm", "pre")}


def config(arch: str, name: str) -> ModelConfig:
    scheme, placement = CONFIGS[name]
    size = {k: v for k, v in SIZE.items() if arch != "vit" or k not in ("max_seq_len", "vocab_size")}
    return ModelConfig(arch=arch, scheme=scheme, norm_placement=placement, **size, **(VIT if arch == "vit" else {}))


def model_input(cfg: ModelConfig) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """As `sigprop diagnose` draws it: N(0, 1) images for the ViT, (src, tgt) uniform token ids otherwise."""
    if cfg.arch == "vit":
        return torch.randn(BATCH["vit"], cfg.in_channels, cfg.image_size, cfg.image_size, dtype=torch.float64)
    return tuple(torch.randint(0, cfg.vocab_size, (BATCH[cfg.arch], cfg.max_seq_len)) for _ in range(2))


@pytest.fixture(scope="module")
def measured(measured_networks):
    """measured(arch, name) -> (seeds, points) measured forward and gradient variances, one measured run's
    records, the prediction."""
    @lru_cache(maxsize=None)
    def get(arch: str, name: str) -> tuple[np.ndarray, np.ndarray, list[Record], list[Record]]:
        cfg = config(arch, name)
        fwd, grad, run = measured_networks(cfg, tuple(range(SEEDS[arch])), model_input)
        return fwd, grad, run, predict(cfg, token_collision=1 / cfg.vocab_size)
    return get


@pytest.mark.parametrize("arch, name", [("encdec", "preln"), ("vit", "dslm-preln")])
def test_records_follow_measure(arch: str, name: str, measured) -> None:
    _, _, run, pred = measured(arch, name)
    assert [(r.stack, r.layer, r.sublayer) for r in pred] == [(r.stack, r.layer, r.sublayer) for r in run]


def _xfail(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=reason)


@pytest.mark.parametrize("arch, name", [
    ("encdec", "preln"), ("encdec", "dslm-preln"),
    pytest.param("encdec", "postln", marks=_xfail(
        "too noisy to test the bar: the gradient's Monte-Carlo s.e. is 3.6% over 256 networks, above bar/3 (the "
        "collapsed causal Post-LN decoder's per-network gradient is heavy-tailed); median error 5.3%")),
    ("vit", "postln"), ("vit", "dslm-preln"),
])
def test_predicted_matches_measured(arch: str, name: str, measured, median_error) -> None:
    fwd, grad, _, pred = measured(arch, name)
    for field, samples in (("fwd_var", fwd), ("grad_var", grad)):
        err, se = median_error(np.array([getattr(r, field) for r in pred]), samples)
        assert se < BAR / 3, f"{arch} {name} {field}: Monte-Carlo s.e. {se:.1%} too large to test a {BAR:.0%} bar"
        assert err < BAR, f"{arch} {name} {field}: median relative error {err:.1%}"


def test_pre_ln_vit_with_a_quieter_class_token_is_refused() -> None:
    """Under the Xavier-like init the class token's variance (σ_cls² + σ_pos² = 2/d) is ~15× below a patch
    token's; the head's gradient lands on it alone and its Pre-LN norms scale that gradient by its own 1/σ²,
    which the token-averaged maps cannot follow (their gradient was 27 % off, 91 % at the embedding): refused."""
    with pytest.raises(NotImplementedError, match="class token of variance"):
        predict(config("vit", "preln"))
