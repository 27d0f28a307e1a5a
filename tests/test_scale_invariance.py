"""Scale-invariant weights (`sigprop.advice.invariance`): which a model has, read through its adapter; a stack of
them trains far above the rule's largest stable lr, where the same stack without the norms does not."""
import pytest

from helpers import CONFIGS
from sigprop.advice import advise
from sigprop.advice.invariance import scale_invariant_weights
from sigprop.models import ModelConfig, build_model
from sigprop.train import load_config, read_jsonl, train
from sigprop.train.levels import TRAIN_MARGIN, unigram_loss

SIZES = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=16)
TINY = ("data.max_chars=60000", "model.d_model=32", "model.n_layers=2", "data.seq_len=32", "model.max_seq_len=32",
        "train.batch_size=8", "train.eval_batches=2", "optim.warmup_steps=8", "train.steps=80", "train.eval_every=40",
        "train.progress=false", "train.diag_every=0", 'model.norm_type="rmsnorm"')
INVARIANT = ('model.norm_placement="sandwich"', "model.qk_norm=true")


@pytest.mark.parametrize("fields, kinds", [
    ({}, ()), ({"scheme": "postln"}, ()), ({"qk_norm": True}, ("qk-norm",)),
    ({"norm_placement": "out"}, ("branch-output norm",)),
    ({"norm_placement": "sandwich", "qk_norm": True}, ("qk-norm", "branch-output norm")),
    ({"hf_family": "llama"}, ()), ({"hf_family": "qwen3"}, ("qk-norm",)),
    ({"hf_family": "olmo2"}, ("qk-norm", "branch-output norm")),
    ({"hf_family": "gemma3_text"}, ("qk-norm", "branch-output norm"))])
def test_the_scale_invariant_weights_are_read_from_the_modules(fields, kinds):
    if "hf_family" in fields:
        pytest.importorskip("transformers")
    assert scale_invariant_weights(build_model(ModelConfig(**SIZES, **fields))) == kinds


def _final_below_unigram(lr: float, sets: tuple[str, ...], out) -> float:
    train(load_config(CONFIGS / "tiny_decoder.toml", [*TINY, *sets, f"optim.lr={lr}", f"train.out_dir={out}"]))
    return unigram_loss(out) - read_jsonl(out / "metrics.jsonl", "eval")[-1]["loss"]


@pytest.mark.slow
def test_a_sandwich_qk_norm_stack_trains_far_above_the_rules_bound_where_pre_ln_does_not(tmp_path):
    """At lr 0.3 and 1 (80 steps), the sandwich + qk-norm decoder ends at least the training margin below its unigram
    loss; the Pre-LN decoder of the same sizes, without the norms, does not; the rule puts both lrs above its
    largest stable lr for both."""
    for lr in (0.3, 1.0):
        assert _final_below_unigram(lr, INVARIANT, tmp_path / f"inv-{lr}") >= TRAIN_MARGIN
        assert _final_below_unigram(lr, (), tmp_path / f"pre-{lr}") < TRAIN_MARGIN
    for sets in (INVARIANT, ()):
        a = advise(load_config(CONFIGS / "tiny_decoder.toml", [*TINY, *sets, f"train.out_dir={tmp_path}"]))
        assert a.max_stable_lr < 0.3


@pytest.mark.xfail(strict=True, reason="no map of a scale-invariant weight's self-tuned lr: the rule's stable bound "
                   "at init is 2x below 0.3 here and 10-100x below the largest lr that trains on the lr benchmark's "
                   "qk-norm families (sigprop.advice.invariance)")
def test_the_rule_says_a_sandwich_qk_norm_stack_trains_where_it_does(tmp_path):
    cfg = load_config(CONFIGS / "tiny_decoder.toml", [*TINY, *INVARIANT, f"train.out_dir={tmp_path}"])
    a = advise(cfg, lrs=[0.3, 1.0])
    assert a.scale_invariant == ("qk-norm", "branch-output norm")
    assert [p["outcome"] for p in a.predictions] == ["trains", "trains"]
