"""A run config with ``model.hf_family`` trains a `transformers` causal LM (GPT-2, LLaMA, Qwen3, OLMo 2, Gemma 3)
with sigprop's trainer, data, optimizer rules and checkpoints, and `advise` judges it through the family's
adapter."""
import math
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, StopAt, loss_curve
from sigprop.models import ModelConfig, build_model, predict
from sigprop.models.adapter import adapter_of
from sigprop.models.build import param_count
from sigprop.models.config import HF_FAMILIES, HF_SIZES
from sigprop.train import eval_main, generate_main, load_config, read_jsonl, train

pytest.importorskip("transformers")

CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "olmo2": "Olmo2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
SMALL = ("data.max_chars=60000", "model.d_model=32", "model.n_layers=2", "data.seq_len=16", "model.max_seq_len=16",
         "train.batch_size=8", "train.eval_batches=1", "optim.warmup_steps=2", "train.progress=false")


def run_config(family: str, out: Path, *sets: str):
    return load_config(CONFIGS / "tiny_decoder.toml", [f'model.hf_family="{family}"', *SMALL,
                                                       f"train.out_dir={out}", *sets])


def test_every_family_a_config_names_builds_its_model_with_the_configs_sizes():
    """`Family.config_fields` inverts the family's `mirror` on the sizes, at the family's own init (no sigprop
    scheme: the adapter's config is None), and the parameter count reads the same model."""
    for family in HF_FAMILIES[1:]:
        cfg = ModelConfig(hf_family=family, vocab_size=96, d_model=48, n_layers=3, n_heads=4, d_ff=80,
                          max_seq_len=24)
        model = build_model(cfg)
        adapter = adapter_of(model)
        assert type(model).__name__ == CLASSES[family] and adapter.config(model) is None
        mirrored = adapter.mirror(model.config)
        sizes = ("arch", *HF_SIZES)
        assert {k: mirrored[k] for k in sizes} == {k: getattr(cfg, k) for k in sizes}
        assert param_count(cfg) == sum(p.numel() for p in model.parameters())
        attn = model.model.layers[0].self_attn if family != "gpt2" else None
        if attn is not None:                                         # every family's logits at d_k^{-1/2}
            assert attn.scaling == pytest.approx(cfg.d_head ** -0.5)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_transformers_run_trains_and_its_loss_falls(family, tmp_path):
    trainer = train(run_config(family, tmp_path, "train.steps=12", "train.eval_every=6", "train.diag_every=12"))
    assert type(trainer.model).__name__ == CLASSES[family]
    grouped = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert sorted(map(id, grouped)) == sorted(id(p) for p in trainer.model.parameters())
    evals = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl", "eval")]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.2
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl", "diag")] == [0, 12]
    assert eval_main(["--run", str(tmp_path)]) == 0                                  # the run folder's commands
    assert generate_main(["--run", str(tmp_path), "--max-new-tokens", "3", "--seed", "0"]) == 0


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_transformers_run_resumes_bit_exactly(family, tmp_path):
    sets = ("train.steps=6", "train.ckpt_every=3", "train.eval_every=3")
    ref = train(run_config(family, tmp_path / "ref", *sets))
    train(run_config(family, tmp_path / "cut", *sets), [StopAt(2)])
    resumed = train(run_config(family, tmp_path / "cut", *sets, "train.resume=true"))
    assert loss_curve(tmp_path / "cut") == loss_curve(tmp_path / "ref")          # exact float equality
    for (name, a), b in zip(ref.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_advise_judges_a_transformers_run_through_its_family(tmp_path):
    """The maps' exponents come from the GPT-2 family's walk (`sigprop.hf.predict`), beside the measured ones."""
    cfg = run_config("gpt2", tmp_path, "train.steps=40", "train.batch_size=4")
    from sigprop.advice import advise

    a = advise(cfg)
    assert math.isfinite(a.lambda_a) and a.unmapped is None
    assert abs(a.lambda_g - a.lambda_g_measured) <= 0.05 + 0.1 * abs(a.lambda_g)
    assert a.lr_interval[0] <= a.recommended_lr <= a.lr_interval[1] <= a.max_stable_lr * (1 + 1e-12)


def test_hf_family_is_validated_naming_the_field():
    with pytest.raises(ValueError, match=r"ModelConfig\.hf_family='bert' is invalid: .*\(None, 'gpt2', 'llama', "
                                         r"'qwen3', 'olmo2', 'gemma3_text'\)"):
        ModelConfig(hf_family="bert")
    with pytest.raises(ValueError, match=r"ModelConfig\.hf_family='gpt2' builds a causal LM: it needs arch"):
        ModelConfig(hf_family="gpt2", arch="encoder")
    for field, value in (("scheme", "dslm"), ("activation", "gelu"), ("dropout", 0.1), ("bias", True)):
        with pytest.raises(ValueError, match=rf"ModelConfig\.{field}={value!r} has no effect with hf_family"):
            ModelConfig(hf_family="llama", **{field: value})
    cfg = ModelConfig(hf_family="llama", scheme="preln", base_width=32)      # defaults and the transfer fields pass
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg                       # as a saved config reads back


def test_predict_from_a_config_refuses_a_transformers_model():
    """`predict` walks sigprop's own models; a transformers model is walked from its token ids by `sigprop.hf`."""
    cfg = ModelConfig(hf_family="gpt2", d_model=32, n_layers=1)
    with pytest.raises(NotImplementedError, match=r"GPT2LMHeadModel has no moment chain.*hf_family"):
        predict(cfg)
