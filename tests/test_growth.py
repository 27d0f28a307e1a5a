"""Growth during training (``train.grow_at``): the grown model, its optimizer state, exact resume, refusals."""
import pytest
import torch

from helpers import CONFIGS, FAST_TRAIN, StopAt, loss_curve
from sigprop.train import Callback, list_checkpoints, load_config, load_run, read_jsonl, train

FAST = [*FAST_TRAIN, "train.eval_batches=1", "optim.warmup_steps=2", "train.batch_size=4", "train.steps=8",
        "train.eval_every=2", "train.ckpt_every=2", "train.diag_every=0"]
GROW = ["train.grow_at=4", "train.grow_to=5", "train.grow_every=1"]


def cfg_for(out, *sets):
    return load_config(CONFIGS / "tiny_decoder.toml", [*FAST, f"train.out_dir={out}", *sets])


@pytest.fixture(scope="module")
def grown_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grown")
    return out, train(cfg_for(out, *GROW))


def test_identity_growth_keeps_the_function_and_the_trained_blocks(tmp_path, grown_run):
    """Up to the growth the run is the run without growth (same data, same RNG stream); at step 4 the checkpoint
    holds 5 blocks whose logits equal the 2-block model's, and then the training goes on with all of them."""
    plain = train(cfg_for(tmp_path, "train.stop_at=4"))
    out, trainer = grown_run
    assert [r for r in loss_curve(out) if r[1] <= 4] == loss_curve(tmp_path)
    assert [e["n_layers"] for e in read_jsonl(out / "metrics.jsonl", "event") if e["event"] == "grown"] == [5]
    at_growth = next(p for p in list_checkpoints(out / "checkpoints") if p.name.startswith("step_00000004"))
    cfg, deeper, _ = load_run(out, at_growth)
    assert cfg.model.n_layers == 5 and len(deeper.stack.blocks) == 5
    ids = torch.randint(0, cfg.model.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(deeper(ids), plain.model.eval()(ids), rtol=0, atol=1e-6)
    final = trainer.model
    assert trainer.cfg.model.n_layers == 5 and trainer.state.step == 8
    still_zero = [n for n, p in final.named_parameters() if not p.any()]
    assert not still_zero, f"the new blocks' zeroed projections never trained: {still_zero}"


def test_growth_carries_adam_state_of_the_old_blocks(tmp_path):
    """Right after the growth, every old parameter's AdamW moments are the ones it had; the new blocks' are zero."""
    seen = {}

    class Snapshot(Callback):
        def on_step_end(self, trainer):
            if trainer.state.step in (4,):
                opt = trainer.optimizer
                seen[trainer.cfg.model.n_layers] = {n: opt.state[p]["exp_avg"].clone()
                                                    for n, p in trainer.model.named_parameters() if p in opt.state}

    class After(Callback):
        def on_step_start(self, trainer):
            if trainer.state.step == 4:
                opt = trainer.optimizer
                seen["after"] = {n: opt.state[p]["exp_avg"].clone() if p in opt.state else None
                                 for n, p in trainer.model.named_parameters()}

    train(cfg_for(tmp_path, *GROW, "train.stop_at=5"), [Snapshot(), After()])
    before, after = seen[2], seen["after"]
    # grow_every=1 on 2 blocks to 5: old blocks 0, 1 go to 0 and 2 or 3 (plan) - match by tensor equality
    for name, m in before.items():
        if not name.startswith("stack.blocks."):
            torch.testing.assert_close(after[name], m, rtol=0, atol=0)
    old_block_moments = [m for n, m in before.items() if n.startswith("stack.blocks.")]
    new_block_moments = [m for n, m in after.items() if n.startswith("stack.blocks.")]
    for m in old_block_moments:
        assert any(x is not None and x.shape == m.shape and torch.equal(x, m) for x in new_block_moments)
    zeros = [x for x in new_block_moments if x is not None and not x.any()]
    assert len(zeros) == len(new_block_moments) - len(old_block_moments)


def test_a_grown_run_resumes_bit_exactly(tmp_path, grown_run):
    ref_dir, ref = grown_run
    first = train(cfg_for(tmp_path, *GROW), [StopAt(6)])
    assert first.state.step == 6 and first.cfg.model.n_layers == 5
    resumed = train(cfg_for(tmp_path, *GROW, "train.resume=true"))
    assert loss_curve(tmp_path) == loss_curve(ref_dir)
    for (name, a), b in zip(ref.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("sets, match", [
    (["train.grow_at=4", "train.grow_to=2"], r"train\.grow_to.*more blocks than model\.n_layers=2"),
    (["train.grow_at=8", "train.grow_to=4"], r"train\.grow_at.*train\.steps - 1 = 7"),
    (["train.grow_at=4", "train.grow_to=4", "train.grow_mode=wider"], r"train\.grow_mode.*identity"),
    (["train.grow_at=4", "train.grow_to=4", "train.grow_every=3"], r"train\.grow_every.*\[1, 2\]"),
    (["train.grow_at=4", "train.grow_to=4", "model.scheme=postln"], r"train\.grow_mode='identity'.*no norm after"),
    (["train.grow_at=4", "train.grow_to=4", "train.grow_mode=dslm"], r"train\.grow_mode='dslm'.*scheme"),
    (["train.grow_at=4", "train.grow_to=4", "train.compile=blocks"], r"train\.compile"),
])
def test_growth_that_cannot_run_is_refused_with_the_field(tmp_path, sets, match):
    with pytest.raises(ValueError, match=match):
        cfg_for(tmp_path, *sets)
