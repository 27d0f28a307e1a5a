"""Training FLOPs per token against torch's FLOP counter on a real forward and backward pass."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from sigprop import ModelConfig, build_model
from sigprop.models.flops import train_flops_per_token

BASE = dict(vocab_size=96, d_model=32, n_layers=3, n_heads=4, max_seq_len=16)


@pytest.mark.parametrize("fields", [dict(arch="decoder", scheme="preln"), dict(arch="encoder", scheme="postln"),
                                    dict(arch="decoder", scheme="shaped"),
                                    dict(arch="decoder", scheme="preln", activation="gelu", d_ff=48, bias=True)],
                         ids=["decoder", "encoder", "shaped", "gelu-dff-bias"])
def test_counted_flops_equal_the_formula(fields):
    """The math attention kernel makes every product a counted mm/bmm; one sequence of T tokens."""
    cfg = ModelConfig(**BASE, **fields)
    torch.manual_seed(0)
    model = build_model(cfg)
    T = 12
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids).sum().backward()
    assert counter.get_total_flops() == T * train_flops_per_token(model, T)
    assert train_flops_per_token(build_model(cfg, device="meta"), T) == train_flops_per_token(model, T)


def test_an_encoder_decoder_counts_both_stacks_and_a_vit_its_patches_and_class_token():
    torch.manual_seed(0)
    T = 12
    encdec = build_model(ModelConfig(**BASE, arch="encdec", n_dec_layers=2))
    ids = torch.randint(0, BASE["vocab_size"], (1, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        encdec(ids, ids).sum().backward()
    assert counter.get_total_flops() == T * train_flops_per_token(encdec, T)
    vit = build_model(ModelConfig(arch="vit", d_model=32, n_heads=4, n_layers=2, image_size=8, patch_size=2,
                                  in_channels=1, n_classes=10))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        vit(torch.randn(1, 1, 8, 8)).sum().backward()
    assert counter.get_total_flops() == pytest.approx(17 * train_flops_per_token(vit, 17), rel=1e-12)  # 16 + 1


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_transformers_model_counts_its_conv1d_or_linear_products_and_its_query_width(family):
    """GPT-2's Conv1D products and tied head, LLaMA's gated MLP and untied head, both on a run config's sizes."""
    pytest.importorskip("transformers")
    cfg = ModelConfig(**BASE, hf_family=family, d_ff=40)
    torch.manual_seed(0)
    model = build_model(cfg)
    T = 12
    ids = torch.randint(0, cfg.vocab_size, (1, T))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids).logits.sum().backward()
    assert counter.get_total_flops() == T * train_flops_per_token(model, T)
    assert train_flops_per_token(build_model(cfg, device="meta"), T) == train_flops_per_token(model, T)


def test_refusals():
    with pytest.raises(NotImplementedError, match="Linear"):
        train_flops_per_token(torch.nn.Linear(2, 2), 8)
    with pytest.raises(ValueError, match="seq_len"):
        train_flops_per_token(build_model(ModelConfig(**BASE), "meta"), 0)
