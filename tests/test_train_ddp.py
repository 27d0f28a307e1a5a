"""DDP: 2 gloo ranks under torchrun see the same global batch and follow the same loss curve as 1 process."""

import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN, loss_curve, torchrun
from sigprop.train import load_config, load_run, train

pytestmark = pytest.mark.slow

SETS = [*FAST_TRAIN, "train.eval_batches=2", "train.eval_every=3", "optim.warmup_steps=2", "train.steps=6",
        "train.batch_size=8", "train.diag_every=3"]


def test_two_gloo_ranks_match_one_process(tmp_path):
    # the masked-LM objective: each rank's micro-batches hold different numbers of targets,
    # so this also checks the global normalisation of the loss
    one, two = tmp_path / "one", tmp_path / "two"
    train(load_config(CONFIGS / "tiny_encoder.toml", [*SETS, f"train.out_dir={one}"]))
    torchrun(tmp_path, "tiny_encoder", [*SETS, f"train.out_dir={two}", "train.grad_accum=2"])
    a, b = loss_curve(one), loss_curve(two)
    assert [k[:2] for k in a] == [k[:2] for k in b] and len(a) == 6 + 3
    assert [x[2] for x in b] == pytest.approx([x[2] for x in a], rel=1e-5)
    _, m1, _ = load_run(one)
    _, m2, _ = load_run(two)
    for (name, p1), p2 in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(p2, p1, rtol=1e-4, atol=1e-6, msg=name)
