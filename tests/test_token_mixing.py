"""Every moment map declares how it mixes token positions (`Mixing`), and the per-position theory of a causal stack
reads that declaration: a map without one raises NotImplementedError naming it, through `predict`."""
from __future__ import annotations

import math

import numpy as np
import pytest
from torch import nn

from sigprop.models import ModelConfig, build_model, predict
from sigprop.theory.moments import (
    Attention,
    Component,
    CrossAttention,
    Dropout,
    Embedding,
    GatedMLP,
    GeLU,
    LayerNorm,
    Linear,
    MemoryView,
    Moments,
    PatchEmbedding,
    PiecewiseLinear,
    QueryView,
    ReLU,
    RMSNorm,
    RopeAttention,
    ShapedReLU,
    Smooth,
    causal,
)
from sigprop.theory.moments.positions import position_fwd
from sigprop.theory.moments.state import Mixing, replace

M = Moments(0.0, 1.0, 0.2)
CROSS = CrossAttention(32, 2, 8, 8, 1 / 32, 1 / 32, 1 / 32, 1 / 32)
ATTENTION = dict(d=32, n_heads=2, L=8, q_var=1 / 32, k_var=1 / 32, v_var=1 / 32, o_var=1 / 32)
DECLARED = [
    (Linear(8, 8, 0.125), Mixing.AFFINE),
    (Dropout(0.0), Mixing.IDENTITY),
    (Dropout(0.1), Mixing.AFFINE),
    (LayerNorm(8), Mixing.SCALE_FREE),
    (RMSNorm(8), Mixing.SCALE_FREE),
    (ReLU(), Mixing.TOKENWISE),
    (GeLU(), Mixing.TOKENWISE),
    (ShapedReLU(64, 1.0, -1.0), Mixing.TOKENWISE),
    (PiecewiseLinear(1.0, 0.5), Mixing.TOKENWISE),
    (Smooth("silu"), Mixing.TOKENWISE),
    (GatedMLP(8, 16, 0.125, 0.125, 0.0625, Smooth("silu")), Mixing.TOKENWISE),
    (QueryView(CROSS, M), Mixing.TOKENWISE),
    (MemoryView(CROSS, M), Mixing.ALL),
    (Embedding(1.0, (0.1, 0.0)), Mixing.SOURCE),
    (PatchEmbedding(0.1, 16, 0.1, 0.1, 4), Mixing.SOURCE),
    (Attention(**ATTENTION), Mixing.ALL),
    (Attention(**ATTENTION, causal=True), Mixing.CAUSAL_SOFTMAX),
    (Attention(**ATTENTION, causal=True, shaped=True), Mixing.CAUSAL_SHAPED),
    (RopeAttention(Attention(**ATTENTION, causal=True), (1.0,) * 8), Mixing.CAUSAL),
    (RopeAttention(Attention(**ATTENTION), (1.0,) * 8), Mixing.ALL),
]


@pytest.mark.parametrize("c, mixing", DECLARED, ids=lambda x: type(x).__name__ if not isinstance(x, Mixing) else "")
def test_each_map_declares_its_token_mixing(c: Component, mixing: Mixing) -> None:
    assert c.token_mixing() is mixing
    assert mixing.tokenwise == (mixing in {Mixing.IDENTITY, Mixing.AFFINE, Mixing.TOKENWISE, Mixing.SCALE_FREE,
                                           Mixing.SOURCE})


class Undeclared(Component):
    """A tokenwise-looking map (the identity) that does not declare its mixing."""

    def fwd(self, m: Moments) -> Moments:
        return m

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var, grad_corr=g_out.grad_corr)


class Unrelated:
    """A map with fwd and bwd that does not subclass `Component` either."""

    fwd = Undeclared.fwd
    bwd = Undeclared.bwd


class Activation(nn.Module):
    """An activation module whose moment map is ``map_class()``."""

    def __init__(self, map_class: type) -> None:
        super().__init__()
        self.map_class = map_class

    def moment_map(self) -> Component:
        return self.map_class()


@pytest.mark.parametrize("map_class", [Undeclared, Unrelated])
@pytest.mark.parametrize("scheme", ["preln", "shaped"])
def test_predict_refuses_a_map_without_a_declaration(map_class: type, scheme: str) -> None:
    """Through the per-pair forward's cover check (Pre-LN) and the per-position forward (shaped attention, which
    the forward per pair does not cover) alike: never read as tokenwise."""
    model = build_model(ModelConfig(arch="decoder", scheme=scheme, vocab_size=64, d_model=32, n_heads=2, n_layers=2,
                                    max_seq_len=8), device="meta")
    predict(model)
    model.stack.blocks[1].mlp.fn.act = Activation(map_class)
    with pytest.raises(NotImplementedError, match=map_class.__name__):
        predict(model)


def test_bidirectional_attention_has_no_per_position_backward() -> None:
    att = Attention(**ATTENTION)
    with pytest.raises(NotImplementedError, match="Attention: every row reads every position"):
        causal.position_bwd(att, M, np.eye(8))


def test_an_identity_changes_no_per_position_variance() -> None:
    """Dropout at p = 0 declares the identity; its per-position variances are its input's."""
    v = np.linspace(0.5, 2.0, 8)
    assert np.allclose(position_fwd(Dropout(0.0), M, v), v, rtol=0, atol=1e-15 * math.fsum(v))
