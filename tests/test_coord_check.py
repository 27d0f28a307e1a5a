"""mup's coordinate check (sigprop.train.coord_check): the per-block activation change after three Adam
steps is flat in width under μP and in depth under CompleteP / depth-μP, and grows under the standard rules.

Setup: decoder, vocabulary 256, 16 tokens × batch 4 of fixed random tokens, constant lr 1e-4 (the
change is linear in lr there), mean over blocks of ‖h_l(3) − h_l(0)‖/‖h_l(0)‖, log-log slope.
Width: 2 blocks, widths 64 → 512, μP base width 64. Depth: width 32, 4 → 64 blocks, base depth 1
(the papers' literal L^{-α}), mean over seeds 0–7: one seed's depth slope scatters by about 0.08, so
eight seeds bring the slope's standard error to about 0.03. Measured values are in docs/transfer.md.
"""
import numpy as np
import pytest

from sigprop.models import ModelConfig
from sigprop.train.coord_check import activation_change, mean_change, slope

WIDTHS, DEPTHS, LR, SEEDS = (64, 128, 256, 512), (4, 8, 16, 32, 64), 1e-4, range(8)


def width_slope(parametrization: str) -> float:
    changes = [mean_change(activation_change(ModelConfig(vocab_size=256, d_model=w, n_layers=2, n_heads=4,
                                                         max_seq_len=16, parametrization=parametrization,
                                                         base_width=64), LR)) for w in WIDTHS]
    return slope(WIDTHS, changes)


def depth_slope(scheme: str) -> float:
    changes = [np.mean([mean_change(activation_change(ModelConfig(vocab_size=256, d_model=32, n_layers=n, n_heads=4,
                                                                  max_seq_len=16, scheme=scheme, base_depth=1),
                                                      LR, seed=seed)) for seed in SEEDS]) for n in DEPTHS]
    return slope(DEPTHS, changes)


@pytest.mark.slow
def test_width_coordinate_check():
    mup, standard = width_slope("mup"), width_slope("standard")
    assert abs(mup) <= 0.15, mup            # measured 0.04
    assert standard >= 0.3, standard        # measured 0.93


@pytest.mark.slow
def test_depth_coordinate_check():
    completep, depth_mup, preln = depth_slope("completep"), depth_slope("depth_mup"), depth_slope("preln")
    assert abs(completep) <= 0.15, completep     # measured −0.07
    assert abs(depth_mup) <= 0.15, depth_mup     # measured 0.13: a rise from 4 to 16 blocks, flat from 16 on
    assert preln >= 0.3, preln                   # measured 0.67: standard Pre-LN at one lr moves more when deeper
