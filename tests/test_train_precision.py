"""bf16 autocast (train.precision="bf16"): a run trains, and shaped attention and the measured moments
agree with fp32 to bf16's rounding (tolerances below, each about 3x the value measured at these seeds)."""

import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN
from sigprop.diagnostics import measure
from sigprop.models import ModelConfig, build_model
from sigprop.nn import ShapedAttention
from sigprop.train import load_config, read_jsonl, train
from sigprop.train.callbacks import Callback
from sigprop.train.parallel import autocast
from sigprop.train.run import flushed_denormals


def test_bf16_run_trains(tmp_path):
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [
        *FAST_TRAIN, "train.steps=30",
        "train.batch_size=8", "train.eval_batches=1", "train.eval_every=0", "train.diag_every=0",
        "optim.warmup_steps=5", "optim.lr=3e-3", "train.precision=bf16",
        f"train.out_dir={tmp_path}"])
    train(cfg)
    evals = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals[-1] < evals[0] - 0.5, evals       # measured: 6.66 -> 5.69 nats


def test_autocast_is_bf16_only_when_asked():
    x = torch.randn(4, 4)
    with autocast("bf16", x.device):
        assert (x @ x).dtype == torch.bfloat16
    with autocast("fp32", x.device):
        assert (x @ x).dtype == torch.float32


def test_shaped_attention_in_bf16():
    torch.manual_seed(0)
    attn = ShapedAttention(256, 4, causal=True)
    x = torch.randn(8, 128, 256)
    with torch.no_grad():
        ref = attn(x)
        with autocast("bf16", x.device):
            out = attn(x)
    assert out.dtype == torch.bfloat16
    assert float((out.float() - ref).norm() / ref.norm()) < 1.2e-2        # measured 0.0038


@pytest.mark.parametrize("scheme", ["shaped", "dslm"])
def test_measured_moments_in_bf16(scheme):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", scheme=scheme, vocab_size=256, d_model=64, n_layers=16, n_heads=4,
                      max_seq_len=64)
    model = build_model(cfg)
    ids = torch.randint(0, 256, (8, 64))
    r32 = measure(model, ids)
    with autocast("bf16", ids.device):
        r16 = measure(model, ids)
    assert [(a.layer, a.sublayer) for a in r32] == [(b.layer, b.sublayer) for b in r16]
    for a, b in zip(r32, r16):
        assert b.fwd_var == pytest.approx(a.fwd_var, rel=6e-3)
        assert b.token_corr == pytest.approx(a.token_corr, abs=1e-3)
        if a.grad_var:
            assert b.grad_var == pytest.approx(a.grad_var, rel=4e-2)
        if a.attn_entropy is not None:
            assert b.attn_entropy == pytest.approx(a.attn_entropy, abs=3e-2)


class SubnormalProbe(Callback):
    """Records, at every step, whether CPU arithmetic keeps a subnormal float."""

    def __init__(self):
        self.kept = []

    def on_step_end(self, trainer):
        self.kept.append(float(torch.tensor(1e-39) * 1.5) != 0.0)


def _tiny_run(path, *extra):
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [
        *FAST_TRAIN, "train.steps=4", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=0",
        "train.diag_every=0", f"train.out_dir={path}", *extra])
    probe = SubnormalProbe()
    train(cfg, callbacks=[probe])
    return probe.kept, [r["loss"] for r in read_jsonl(path / "metrics.jsonl") if r["kind"] == "train"]


def test_flush_denormal_only_inside_the_run_and_numbers_unchanged(tmp_path):
    kept_off, loss_off = _tiny_run(tmp_path / "off")
    kept_on, loss_on = _tiny_run(tmp_path / "on", "train.flush_denormal=true")
    assert all(kept_off) and not any(kept_on)
    assert float(torch.tensor(1e-39) * 1.5) != 0.0          # IEEE behaviour is back after the run
    assert loss_on == loss_off                              # no subnormal in this run: bit-identical losses


def test_flushed_denormals_restores_ieee_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with flushed_denormals(True):
            assert float(torch.tensor(1e-39) * 1.5) == 0.0
            raise RuntimeError("a failed run")
    assert float(torch.tensor(1e-39) * 1.5) != 0.0
