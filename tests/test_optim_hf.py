"""sigprop.hf.param_groups: the scheme's optimizer rules for a transformers model after `apply`."""
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sigprop.hf as hf  # noqa: E402


def gpt2(layers: int = 2, d: int = 32) -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=d, n_layer=layers, n_head=4, n_positions=32, bos_token_id=None, eos_token_id=None))


@pytest.mark.parametrize("scheme,kw", [("dslm", {}), ("shaped", {"learn_residual": True})])
def test_groups_cover_every_parameter_once(scheme, kw):
    model = gpt2()
    cfg = hf.apply(model, scheme, **kw)
    groups = hf.param_groups(model, cfg, lr=1e-3, weight_decay=0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    assert {g["lr_mult"] for g in groups} == {1.0}                       # these schemes keep multiplier 1
    assert all(g["weight_decay"] == 0.0 for g in groups for p in g["params"] if p.ndim < 2)
    torch.optim.AdamW(groups).step()                                      # a valid AdamW group list


def test_mup_rule_reaches_the_fused_attention_weight():
    """c_attn fuses Q, K, V: one tensor, one rule (all hidden under μP: lr × n₀/n)."""
    model = gpt2(d=64)
    cfg = dataclasses.replace(hf.apply(model, "dslm"), parametrization="mup", base_width=16)
    groups = hf.param_groups(model, cfg, lr=1e-3)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    block = model.transformer.h[0]
    assert lr_of[id(block.attn.c_attn.weight)] == pytest.approx(1e-3 / 4)
    assert lr_of[id(block.mlp.c_fc.weight)] == pytest.approx(1e-3 / 4)
    assert lr_of[id(model.transformer.wte.weight)] == pytest.approx(1e-3)   # input (and tied readout) weight
    assert lr_of[id(block.ln_1.weight)] == pytest.approx(1e-3)
