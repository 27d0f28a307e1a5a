"""sigprop.hf after `apply`: the scheme's optimizer rules (`param_groups`) and the forward multipliers that go with
them (μP's attention and logit scales, the α-family's branch multipliers) on transformers models."""
import math

import pytest
import torch

from helpers import assert_first_adamw_step

pytest.importorskip("transformers")

import transformers

import sigprop.hf as hf
from sigprop.hf.apply import family_of
from sigprop.hf.optim import param_rules
from sigprop.schemes import Site, get_scheme

V = 64


def gpt2(layers: int = 2, d: int = 32) -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=d, n_layer=layers, n_head=4, n_positions=32, bos_token_id=None, eos_token_id=None))


def llama(layers: int = 2, d: int = 32) -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=d, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=3 * d, max_position_embeddings=32, bos_token_id=None, eos_token_id=None, pad_token_id=None))


def bert(layers: int = 2, d: int = 32) -> torch.nn.Module:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=d, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=4 * d,
        max_position_embeddings=32, pad_token_id=None))


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}
# μP at m = 64/16 = 4 with depth-μP at L/L₀ = 8/2 = 4, and CompleteP at L/L₀ = 8 (standard width)
TRANSFER = [("depth_mup", dict(parametrization="mup", base_width=16, base_depth=2)), ("completep", dict(base_depth=1))]


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
    cfg = hf.apply(model, "dslm", parametrization="mup", base_width=16)
    groups = hf.param_groups(model, cfg, lr=1e-3)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    block = model.transformer.h[0]
    assert lr_of[id(block.attn.c_attn.weight)] == pytest.approx(1e-3 / 4)
    assert lr_of[id(block.mlp.c_fc.weight)] == pytest.approx(1e-3 / 4)
    assert lr_of[id(model.transformer.wte.weight)] == pytest.approx(1e-3)   # input (and tied readout) weight
    assert lr_of[id(block.ln_1.weight)] == pytest.approx(1e-3)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("scheme,transfer", TRANSFER)
def test_branch_multipliers_are_the_schemes_residual(family, scheme, transfer):
    """Every residual add of every block is x + (L₀/L)^α f: the scheme's `residual(cfg, site)`, β ≠ 1 here."""
    model = MODELS[family](layers=8, d=64)
    cfg = hf.apply(model, scheme, **transfer)
    fam = family_of(model)
    for layer, block in enumerate(fam.blocks(model.base_model)):
        for kind in ("attn", "mlp"):
            res = getattr(block, f"sigprop_{kind}_residual")
            want = get_scheme(scheme).residual(cfg, Site("dec", layer, kind))
            assert (res.alpha.item(), res.beta.item()) == pytest.approx(want, rel=1e-12)
            assert want[1] == pytest.approx(4 ** -0.5 if scheme == "depth_mup" else 1 / 8)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_mup_attention_logits_use_one_over_d_head(family):
    """μP: QKᵀ·√d_head₀/d_head (d_head 16, d_head₀ 4: 1/8 instead of 1/4); the standard parametrization keeps
    1/√d_head."""
    model = MODELS[family](d=64)
    cfg = hf.apply(model, "dslm", parametrization="mup", base_width=16)
    attns = family_of(model).attentions(model.base_model)
    assert {a.scaling for a in attns} == {get_scheme("dslm").attention_scale(cfg)} == {1 / 8}
    model = MODELS[family](d=64)
    hf.apply(model, "dslm")
    assert {a.scaling for a in family_of(model).attentions(model.base_model)} == {0.25}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("scheme,transfer", TRANSFER)
def test_one_adamw_step_follows_each_parameters_rule(family, scheme, transfer):
    """One AdamW step (float64, ε large enough that its multiplier shows) after apply: every parameter moves
    by its rule (lr, ε and decay multipliers; `assert_first_adamw_step`), and the rules differ between roles."""
    torch.manual_seed(0)
    model = MODELS[family](layers=8, d=64).double().eval()
    cfg = hf.apply(model, scheme, **transfer)
    ids = torch.randint(0, V, (3, 16))
    model(ids, labels=ids).loss.backward()
    lr, eps, wd = 1e-3, 1e-3, 0.1
    opt = torch.optim.AdamW(hf.param_groups(model, cfg, lr=lr, eps=eps, weight_decay=wd))
    rules = param_rules(model, cfg)
    before = [p.detach().clone() for _, p, _ in rules]
    grads = [p.grad.detach().clone() for _, p, _ in rules]
    opt.step()
    seen = assert_first_adamw_step(rules, before, grads, [p.detach().clone() for _, p, _ in rules], lr, eps, wd)
    hidden = {r.lr for name, _, r in rules if "layers.0." in name or "h.0." in name}
    expected = (1 / 4) * 4 ** -0.5 if scheme == "depth_mup" else 1.0          # μP m = 4 × (L/L₀)^{α−1}
    assert len(seen) > 1 and any(x == pytest.approx(expected) for x in hidden), hidden


def test_unsupported_combinations_name_the_argument():
    with pytest.raises(ValueError, match=r"scheme 'completep' is Pre-LN; supported for model_type in \('gpt2', "
                                         r"'llama'.*not Post-LN 'bert'"):
        hf.apply(bert(), "completep")
    with pytest.raises(ValueError, match="ModelConfig.parametrization must be one of"):
        hf.apply(gpt2(), "depth_mup", parametrization="ntk")
    with pytest.raises(ValueError, match="ModelConfig.base_depth"):
        hf.apply(gpt2(), "depth_mup", base_depth=0)
    with pytest.raises(ValueError, match="ModelConfig.base_width .* divisible"):
        hf.apply(gpt2(), "dslm", parametrization="mup", base_width=30)


def test_mup_tied_logits_and_untied_head_init():
    """μP readouts: GPT-2's tied logits × the scheme's logit_scale (n₀/n over σ_e√n₀); LLaMA's untied head at
    the scheme's std × m^{-1/2}, its input embeddings at the std of width n₀."""
    torch.manual_seed(0)
    model = gpt2(d=64)
    cfg = hf.apply(model, "dslm", parametrization="mup", base_width=16)
    h = model.transformer(torch.randint(0, V, (2, 8))).last_hidden_state
    want = (h @ model.transformer.wte.weight.T) * get_scheme("dslm").logit_scale(cfg)
    torch.testing.assert_close(model.lm_head(h), want, rtol=1e-6, atol=1e-7)
    torch.manual_seed(0)
    model = llama(d=256)
    hf.apply(model, "depth_mup", parametrization="mup", base_width=16)
    assert model.lm_head.weight.std().item() == pytest.approx(math.sqrt(1 / 256) / 4, rel=0.05)     # m = 16
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(math.sqrt(2 / 16), rel=0.05)  # 1 table
