"""`sigprop.train.one_run.train_run`: a run as an experiment records it."""
import math

import pytest

from sigprop.train.one_run import train_run

TINY = {"arch": "decoder", "d_model": 16, "n_layers": 1, "n_heads": 2, "vocab_size": 300, "max_seq_len": 16}
DATA = {"seq_len": 16, "max_chars": 20000}


def test_train_run_records_curves_with_gradient_norms(tmp_path):
    r = train_run(tmp_path / "r", TINY, data=DATA, train_cfg={"steps": 4, "batch_size": 2, "eval_every": 2})
    assert not r["diverged"] and r["error"] is None and r["steps_done"] == 4
    assert [s for s, _ in r["val_curve"]] == [0, 2, 4] and r["final_val_loss"] == r["val_curve"][-1][1]
    assert [row[0] for row in r["train_curve"]] == [1, 2, 3, 4]
    assert all(math.isfinite(g) and g > 0 for _, _, g in r["train_curve"])


def test_train_run_divergence_is_a_result(tmp_path):
    r = train_run(tmp_path / "r", {**TINY, "scheme": "vanilla"}, data=DATA,
                  optim={"lr": 1e4, "grad_clip": 0.0, "warmup_steps": 0}, train_cfg={"steps": 6, "batch_size": 2})
    assert r["diverged"] and "non-finite training loss" in r["error"]
    assert math.isnan(r["final_val_loss"]) and r["steps_done"] < 6


def test_train_run_interrupted_is_not_a_result(tmp_path, monkeypatch):
    from sigprop.train import one_run, run
    from sigprop.train.callbacks import Callback

    class StopAtTwo(Callback):
        def on_step_end(self, trainer):
            if trainer.state.step == 2:
                trainer.request_stop("SIGINT")

    real_train = run.train
    monkeypatch.setattr(run, "train", lambda cfg: real_train(cfg, callbacks=[StopAtTwo()]))
    with pytest.raises(KeyboardInterrupt, match="interrupted .SIGINT. at step 2"):
        one_run.train_run(tmp_path / "r", TINY, data=DATA, train_cfg={"steps": 5, "batch_size": 2})
    assert list((tmp_path / "r" / "checkpoints").iterdir())


def test_unigram_nll_scores_only_the_targets_that_carry_a_loss():
    """Against a hand count: masked LM targets are IGNORE except at the picked positions, which alone
    enter the unigram level (an IGNORE entry read as a token id would index the table from its end)."""
    from collections import Counter

    import torch

    from sigprop.train.levels import unigram_nll
    from sigprop.train.objectives import MaskedLM

    vocab, gen = 300, torch.Generator().manual_seed(0)
    train_tokens = torch.randint(4, vocab, (5000,), generator=gen) % 37 + 4     # skewed: 37 ids used
    val = MaskedLM(torch.randint(4, 41, (4096,), generator=gen), seq_len=32, vocab_size=vocab)
    targets = val.batch(torch.arange(64), gen).targets
    counts = Counter(train_tokens.tolist())
    picked = [t for t in targets.flatten().tolist() if t >= 0]
    expected = -sum(math.log((counts[t] + 1) / (len(train_tokens) + vocab)) for t in picked) / len(picked)
    assert 0.1 < len(picked) / targets.numel() < 0.2
    assert unigram_nll(train_tokens, targets, vocab) == pytest.approx(expected, rel=1e-12)
