"""Tiny models learn on the embedded corpus; schedules, diagnostics and the run commands work."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN, train_argv
from sigprop.nn import ShapedAttention, ShapedReLU
from sigprop.train import Callback, eval_main, generate_main, load_config, read_jsonl, train
from sigprop.train.run_summary import read_run

FAST = [*FAST_TRAIN, "data.max_chars=150000", "train.eval_batches=2", "train.ckpt_every=0", "optim.warmup_steps=10"]


def run(out: Path, config: str, *sets: str, callbacks=()):
    cfg = load_config(CONFIGS / f"{config}.toml", [*FAST, f"train.out_dir={out}", *sets])
    return train(cfg, callbacks), read_jsonl(out / "metrics.jsonl")


@pytest.mark.parametrize("config", ["tiny_decoder", "tiny_encoder", "encdec"])
def test_validation_loss_drops(config, tmp_path):
    _, log = run(tmp_path, config, "train.steps=60", "train.eval_every=30")
    evals = [r for r in log if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 30, 60]
    first, last = evals[0], evals[-1]
    assert last["loss"] < 0.9 * first["loss"], (config, first, last)
    assert last["ppl"] < first["ppl"] and last["acc"] > first["acc"]
    train_rows = [r for r in log if r["kind"] == "train"]
    assert len(train_rows) == 60 and all(r["grad_norm"] > 0 and r["lr"] > 0 for r in train_rows)


def test_vit_learns_digits(tmp_path):
    pytest.importorskip("sklearn")
    _, log = run(tmp_path, "vit_digits", "train.steps=60", "train.eval_every=60", "train.batch_size=32",
                 "model.n_layers=2", "optim.lr=3e-3")
    evals = [r for r in log if r["kind"] == "eval"]
    assert evals[-1]["acc"] > 0.6 > evals[0]["acc"]


def test_grad_accum_matches_full_batch(tmp_path):
    _, a = run(tmp_path / "a", "tiny_decoder", "train.steps=4", "train.eval_batches=0")
    _, b = run(tmp_path / "b", "tiny_decoder", "train.steps=4", "train.eval_batches=0", "train.grad_accum=4")
    la = [r["loss"] for r in a if r["kind"] == "train"]
    lb = [r["loss"] for r in b if r["kind"] == "train"]
    assert la == pytest.approx(lb, rel=1e-5)


class Probe(Callback):
    """Records the shaping values in force at each step."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer):
        attn = next(m for m in trainer.model.modules() if isinstance(m, ShapedAttention))
        relu = next(m for m in trainer.model.modules() if isinstance(m, ShapedReLU))
        self.seen.append((attn.gamma1[0].item(), attn.gamma2[0].item(), relu.s_minus.item()))


SHAPED = ["model.scheme=shaped", "model.n_layers=2", "train.diag_every=2"]


def test_recover_schedule_decays_shaping_to_zero(tmp_path):
    probe = Probe()
    _, log = run(tmp_path, "tiny_decoder", *SHAPED, "model.shaping=recover", "train.recover_steps=4",
                 "train.steps=6", "train.eval_batches=0", callbacks=[probe])
    s0 = 1 - 1 / 32 ** 0.5   # s₋ = 1 + c₋/√n at init, c₋ = -1, n = 32
    expect = [(1 - k / 4, 1 - k / 4, s0 * (1 - k / 4)) for k in range(4)] + [(0.0, 0.0, 0.0)] * 2
    assert [v for row in probe.seen for v in row] == pytest.approx([v for row in expect for v in row])
    diag = [r for r in log if r["kind"] == "diag"]
    assert [r["step"] for r in diag] == [0, 2, 4, 6]
    for r in diag:
        attn = [row for row in r["layers"] if row["sublayer"] == "attn"]
        assert len(attn) == 2 and all(row["grad_var"] > 0 for row in r["layers"])
        assert 0 < r["attn_entropy_min"] <= r["attn_entropy"] <= math.log(32) and -1 <= r["token_corr"] <= 1


def test_learn_mode_trains_the_shaping_parameters(tmp_path):
    trainer, _ = run(tmp_path, "tiny_decoder", *SHAPED, "model.shaping=learn", "train.steps=3",
                     "train.eval_batches=0", "optim.lr=1e-2")
    attn = next(m for m in trainer.model.modules() if isinstance(m, ShapedAttention))
    relu = next(m for m in trainer.model.modules() if isinstance(m, ShapedReLU))
    assert isinstance(attn.gamma2, torch.nn.Parameter) and (attn.gamma2 != 1.0).all()
    assert relu.s_minus.item() != pytest.approx(1 - 1 / 32 ** 0.5, abs=1e-6)


def test_run_folder_and_commands(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = train_argv("tiny_decoder", *FAST, f"train.out_dir={run_dir}", "train.steps=5")
    from sigprop.train import train_main
    assert train_main(argv) == 0
    assert {"config.toml", "command.txt", "tokenizer.json", "metrics.jsonl", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()}
    assert load_config(run_dir / "config.toml").train.steps == 5
    assert "train.steps=5" in (run_dir / "command.txt").read_text()
    capsys.readouterr()
    assert eval_main(["--run", str(run_dir)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    last_eval = [r for r in read_jsonl(run_dir / "metrics.jsonl", "eval")][-1]
    assert metrics["loss"] == pytest.approx(last_eval["loss"], rel=1e-6)
    assert generate_main(["--run", str(run_dir), "--prompt", "The assert", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("The assert")
    assert train_main(argv) == 2        # a fresh run into a folder with checkpoints is refused
    assert "already holds checkpoints" in capsys.readouterr().err


def test_tensorboard_is_an_optional_extra(tmp_path):
    sets = ("train.steps=2", "train.tensorboard=true", "train.eval_batches=0")
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ImportError, match=r"sigprop\[tensorboard\]"):
            run(tmp_path, "tiny_decoder", *sets)
    else:
        run(tmp_path, "tiny_decoder", *sets)
        assert any((tmp_path / "tensorboard").iterdir())


def test_block_gradient_norms_are_logged_on_the_steps_that_evaluate(tmp_path):
    """Each block's pre-clip gradient norm, on the evaluating steps only; with the embedding's and final norm's
    share they make up the global norm."""
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [*FAST, f"train.out_dir={tmp_path}", "train.steps=4",
                                                        "train.eval_every=2", "train.block_grads=true",
                                                        "model.n_layers=3", "train.diag_every=0"])
    train(cfg)
    rows = read_jsonl(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in rows if "block_grad_norms" in r] == [2, 4]
    for r in rows:
        if "block_grad_norms" in r:
            norms = r["block_grad_norms"]
            assert len(norms) == 3 and all(0 < g < math.inf for g in norms)
            assert math.sqrt(sum(g * g for g in norms)) < r["grad_norm"]
        assert "shortcut_factors" not in r                              # a Pre-LN stack has none
    with pytest.raises(ValueError, match=r"train\.block_grads.*fsdp"):
        load_config(CONFIGS / "tiny_decoder.toml", ["train.block_grads=true", "train.distributed=fsdp"])


def test_a_post_norm_stack_logs_each_sublayers_shortcut_factor_with_the_block_gradients(tmp_path):
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [*FAST, f"train.out_dir={tmp_path}", "train.steps=4",
                                                        "train.eval_every=2", "train.block_grads=true",
                                                        "model.n_layers=3", "train.diag_every=0",
                                                        'model.scheme="postln"'])
    train(cfg)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl", "train") if "block_grad_norms" in r]
    assert [r["step"] for r in rows] == [2, 4]
    for r in rows:
        assert len(r["shortcut_factors"]) == 6 and all(0 < s < 2 for s in r["shortcut_factors"])
    assert read_run(tmp_path)["shortcut_factors"][0][0] == 2
