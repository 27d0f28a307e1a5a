"""FSDP2 on 2 gloo ranks: the same loss curve and weights as 1 process, exact resume from its
consolidated checkpoint, and that checkpoint loads in a single process; in-training diagnostics
measured collectively equal the single-process measurement and leave training unchanged."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN, loss_curve
from helpers import torchrun as run_ranks
from sigprop.diagnostics import measure
from sigprop.models import build_model
from sigprop.records import to_rows
from sigprop.train import TrainConfig, list_checkpoints, load_config, load_run, prepare_data, read_jsonl, train
from sigprop.train.run import seed_everything
from sigprop.train.sampler import generator
from sigprop.train.trainer import DIAG_STREAM

TIMEOUT_S = 300
SETS = [*FAST_TRAIN, "train.eval_batches=2", "train.eval_every=3", "optim.warmup_steps=2", "train.steps=6",
        "train.batch_size=8", "train.ckpt_every=3", "train.keep_last=5", "train.diag_every=0"]


def torchrun(tmp_path: Path, sets: list[str]) -> None:
    run_ranks(tmp_path, "tiny_decoder", sets, TIMEOUT_S)


def weights(run: Path, checkpoint: Path | None = None) -> dict[str, torch.Tensor]:
    return load_run(run, checkpoint)[1].state_dict()


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process_and_resume_exactly(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train(load_config(CONFIGS / "tiny_decoder.toml", [*SETS, f"train.out_dir={one}"]))
    # grad_accum=2 also exercises the no-sync micro-steps
    torchrun(tmp_path, [*SETS, f"train.out_dir={two}", "train.distributed=fsdp", "train.grad_accum=2"])
    a, b = loss_curve(one), loss_curve(two)
    assert [k[:2] for k in a] == [k[:2] for k in b] and len(a) == 6 + 3
    # float summation order differs (reduce-scatter, sharded AdamW): measured 2e-7 relative on the losses,
    # 3e-7 relative (Frobenius norm) on the weights
    assert [x[2] for x in b] == pytest.approx([x[2] for x in a], rel=1e-5)
    w1, w2 = weights(one), weights(two)             # the 2-rank checkpoint, loaded in one process
    assert list(w1) == list(w2)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-6, msg=name)

    # resume: drop the final checkpoint, continue from step 3 on 2 ranks; must reproduce it exactly
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    final = list_checkpoints(resumed / "checkpoints")[-1]
    for p in resumed.glob("checkpoints/" + final.name.replace(".json", ".*")):
        p.unlink()
    torchrun(tmp_path, [*SETS, f"train.out_dir={resumed}", "train.distributed=fsdp", "train.grad_accum=2",
                        "train.resume=true"])
    w3 = weights(resumed)
    for name in w2:
        assert torch.equal(w3[name], w2[name]), name
    train_losses = [r["loss"] for r in read_jsonl(resumed / "metrics.jsonl") if r["kind"] == "train"]
    assert train_losses[-3:] == [x[2] for x in b if x[0] == "train"][-3:]


@pytest.mark.parametrize("key,value,allowed", [
    ("distributed", "zero3", "'ddp', 'fsdp'"), ("compile", "layers", "'off', 'blocks', 'model'"),
    ("precision", "fp16", "'fp32', 'bf16'")])
def test_scale_out_fields_are_validated(key, value, allowed):
    with pytest.raises(ValueError, match=rf"train\.{key}='{value}' is invalid: {key} must be one of \[{allowed}\]"):
        TrainConfig(**{key: value})
    with pytest.raises(ValueError, match="train.activation_checkpointing"):
        load_config(CONFIGS / "tiny_decoder.toml", ["train.activation_checkpointing=1"])


# dropout on, so a diagnostic pass that drew from the training RNG would change the losses
DIAG = [*FAST_TRAIN, "model.dropout=0.1", "train.steps=2", "train.batch_size=8", "optim.warmup_steps=1",
        "train.eval_batches=0", "train.ckpt_every=1", "train.keep_last=5", "train.distributed=fsdp"]


def train_losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


def assert_rows_close(got: list[dict], want: list[dict], step: int) -> None:
    assert len(got) == len(want), step
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key, value in w.items():
            if isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, w["layer"], w["sublayer"], key)
            else:
                assert g[key] == value, (step, w["layer"], w["sublayer"], key)


@pytest.mark.slow
def test_fsdp_diagnostics_are_the_single_process_measurement_and_leave_training_unchanged(tmp_path):
    on, off = tmp_path / "on", tmp_path / "off"
    torchrun(tmp_path, [*DIAG, f"train.out_dir={on}", "train.diag_every=1"])
    torchrun(tmp_path, [*DIAG, f"train.out_dir={off}", "train.diag_every=0"])
    assert train_losses(on) == train_losses(off) and len(train_losses(on)) == 2
    diag = {r["step"]: r for r in read_jsonl(on / "metrics.jsonl") if r["kind"] == "diag"}
    assert sorted(diag) == [0, 1, 2]                       # one record per diagnostic step in rank 0's log

    cfg = load_run(on)[0]
    data = prepare_data(cfg, on, save_tokenizer=False)     # the run's tokenizer, pinned by load_run
    n = min(len(data.val), cfg.train.batch_size // 2)      # the diagnostic batch is one rank's micro-batch
    inputs = data.val.batch(torch.arange(n), generator(cfg.train.seed, DIAG_STREAM)).inputs
    seed_everything(cfg.train.seed)                        # step 0: the initialization `train` builds
    models = {0: build_model(cfg.model).eval()}
    for ckpt in list_checkpoints(on / "checkpoints"):      # steps 1 and 2: the consolidated checkpoints
        models[json.loads(ckpt.read_text())["step"]] = load_run(on, ckpt)[1]
    assert sorted(models) == sorted(diag)
    for step, model in models.items():
        assert_rows_close(diag[step]["layers"], to_rows(measure(model, inputs)), step)


def test_fsdp_accepts_diagnostics():
    assert TrainConfig(distributed="fsdp", diag_every=100).diag_every == 100
