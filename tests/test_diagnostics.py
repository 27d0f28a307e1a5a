"""Diagnostics: statistics against constructions with known answers; measure() against direct computation."""
import dataclasses
import math
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import grads_as_found
from sigprop import ModelConfig, build_model
from sigprop.diagnostics import attention_entropy, diagnose_model, measure, stable_rank, token_correlation
from sigprop.records import Record, format_table, from_json, to_csv, to_json


@pytest.mark.parametrize("r", [0.0, 0.3, 0.9])
def test_token_correlation_recovers_construction(r):
    """x_t = √r·s + √(1−r)·e_t (+ a constant offset) has token correlation r. The standard error
    is measured from 16 independent batch chunks; the estimate must be within 4 of them."""
    g = torch.Generator().manual_seed(0)
    b, t, d = 64, 16, 128
    x = math.sqrt(r) * torch.randn(b, 1, d, generator=g, dtype=torch.float64) \
        + math.sqrt(1 - r) * torch.randn(b, t, d, generator=g, dtype=torch.float64) + 3.0
    chunks = torch.tensor([token_correlation(c) for c in x.chunk(16)])
    se = chunks.std().item() / 4
    assert se < 0.02
    assert abs(token_correlation(x) - r) < 4 * se


def test_stable_rank_and_entropy_closed_forms():
    x = torch.zeros(2, 4, 6, dtype=torch.float64)
    x[:, 0, 0], x[:, 1, 1], x[:, 2, 2] = 2.0, 1.0, 1.0           # singular values 2, 1, 1 -> (4+1+1)/4
    assert stable_rank(x) == pytest.approx(1.5)
    m = np.random.default_rng(0).standard_normal((5, 7))
    s = np.linalg.svd(m, compute_uv=False)
    assert stable_rank(torch.from_numpy(m)[None]) == pytest.approx((s ** 2).sum() / s[0] ** 2)
    p = torch.full((1, 2, 3, 8), 1 / 8, dtype=torch.float64)
    assert attention_entropy(p) == pytest.approx(math.log(8))
    one_hot = torch.zeros(1, 1, 2, 5, dtype=torch.float64)
    one_hot[..., 0] = 1
    assert attention_entropy(one_hot) == pytest.approx(0.0)


def test_measure_matches_direct_computation():
    torch.manual_seed(0)
    cfg = ModelConfig(scheme="preln", d_model=32, n_heads=4, n_layers=2, max_seq_len=16)
    model = build_model(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (3, 16))
    recs = measure(model, ids, seed=5)
    assert [(r.layer, r.sublayer) for r in recs] == [(0, "embed"), (1, "attn"), (1, "mlp"), (2, "attn"), (2, "mlp")]
    # direct: run the stack by hand, take gradients with autograd
    h0 = model.embed(ids)
    h1a = model.stack.blocks[0].attn(h0)
    hs = [h0, h1a]
    x = model.stack.blocks[0].mlp(h1a)
    hs.append(x)
    for sub in (model.stack.blocks[1].attn, model.stack.blocks[1].mlp):
        x = sub(x)
        hs.append(x)
    logits = model.logits(model.stack.final_norm(x))
    g = torch.Generator().manual_seed(5)
    loss = (logits * torch.randn(logits.shape, generator=g, dtype=logits.dtype)).sum()
    grads = torch.autograd.grad(loss, hs)
    for rec, h, gr in zip(recs, hs, grads):
        assert rec.fwd_var == pytest.approx(h.var().item(), rel=1e-10)
        assert rec.fwd_mean == pytest.approx(h.mean().item(), rel=1e-8, abs=1e-12)
        assert rec.grad_var == pytest.approx(gr.var().item(), rel=1e-10)
        assert rec.token_corr == pytest.approx(token_correlation(h), rel=1e-10)
    attn = model.stack.blocks[1].attn
    p = attn.fn.attention_matrix(attn.norm(hs[2]))
    assert recs[3].attn_entropy == pytest.approx(attention_entropy(p), rel=1e-10)
    assert recs[3].max_logit is not None and recs[4].attn_entropy is None


def test_measure_leaves_parameter_grads_untouched_and_handles_every_arch():
    torch.manual_seed(1)
    for arch, batch in [("encoder", {"input_ids": torch.randint(0, 50, (2, 8)),
                                     "attention_mask": torch.ones(2, 8, dtype=torch.bool)}),
                        ("encdec", (torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 5)))),
                        ("vit", torch.randn(2, 1, 8, 8))]:
        tokens = {} if arch == "vit" else {"vocab_size": 50, "max_seq_len": 8}
        cfg = ModelConfig(arch=arch, scheme="shaped", d_model=16, n_heads=2, n_layers=2, **tokens)
        model = build_model(cfg)
        recs = measure(model, batch)
        assert all(p.grad is None for p in model.parameters())
        n_sub = {"encdec": 2 * 2 + 2 * 3}.get(arch, 2 * 2)
        assert len(recs) == n_sub + 1
        assert all(math.isfinite(r.fwd_var) and r.grad_var is not None for r in recs)


@pytest.mark.parametrize("build", ["sigprop", "nano"])
def test_measure_forward_only_keeps_the_forward_fields(build):
    """``backward=False`` gives the full pass's forward fields, no gradient variance, and leaves ``.grad`` as found;
    ``stable_ranks=False`` drops only the stable ranks."""
    torch.manual_seed(0)
    model, ids, kw = sigprop_decoder() if build == "sigprop" else nano_gpt()
    fields = lambda r: [x for x in (r.fwd_mean, r.fwd_var, r.token_corr, r.stable_rank, r.attn_entropy, r.max_logit)
                        if x is not None]
    full, found = measure(model, ids, **kw), []
    grads_as_found(model, "random", lambda: found.extend(measure(model, ids, backward=False, **kw)))
    assert [r.grad_var for r in found] == [None] * len(full)
    assert [(r.layer, r.sublayer) for r in found] == [(r.layer, r.sublayer) for r in full]
    for a, b in zip(full, found):
        assert fields(b) == pytest.approx(fields(a), rel=1e-10, abs=1e-14)
    unranked = measure(model, ids, stable_ranks=False, **kw)
    assert [r.stable_rank for r in unranked] == [None] * len(full)
    assert [dataclasses.replace(r, stable_rank=None) for r in full] == unranked


def test_records_roundtrip_csv_json():
    recs = [Record(layer=1, sublayer="attn", fwd_mean=0.0, fwd_var=1.5, token_corr=0.25, grad_var=None),
            Record(layer=1, sublayer="mlp", fwd_mean=0.1, fwd_var=1.0, token_corr=0.5, grad_var=2.0,
                   source="predicted")]
    assert from_json(to_json(recs)) == recs
    csv_text = to_csv(recs)
    assert csv_text.splitlines()[0].startswith("layer,sublayer,fwd_mean")
    assert csv_text.splitlines()[1].split(",")[5] == ""          # None -> empty cell
    assert "predicted" in csv_text and "1.5" in format_table(recs)


def test_plot_records_writes_png(tmp_path):
    from sigprop.diagnostics.plot import plot_records

    torch.manual_seed(0)
    cfg = ModelConfig(scheme="postln", d_model=16, n_heads=2, n_layers=3, max_seq_len=8)
    recs = measure(build_model(cfg), torch.randint(0, 256, (2, 8)))
    out = plot_records({"measured": recs, "predicted": recs}, tmp_path / "p.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


# --- measure on any torch model, given a block selector ---------------------------------------------

class NanoBlock(torch.nn.Module):
    """A nanoGPT-style Pre-LN block written by hand: causal self-attention and a GeLU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.c_attn, self.c_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.c_attn(self.ln_1(x)).split(d, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)       # (B, H, T, dh)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(torch.nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 3, heads: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.h = torch.nn.ModuleList(NanoBlock(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def test_measure_any_model_with_a_block_selector():
    """On a model sigprop knows nothing about, the three selector forms pick the same blocks, and each record holds
    that block's output variance, token correlation and the gradient variance of the random-projection loss,
    recomputed here by hand with hooks and autograd."""
    torch.manual_seed(0)
    model = NanoGPT().double()
    ids = torch.randint(0, 64, (4, 16))
    by_type = measure(model, ids, blocks=NanoBlock)
    assert [(r.layer, r.sublayer, r.stack) for r in by_type] == [(i, "NanoBlock", "model") for i in (1, 2, 3)]
    assert measure(model, ids, blocks=r"h\.\d+") == by_type
    assert measure(model, ids, blocks=lambda name, m: isinstance(m, NanoBlock)) == by_type

    outs = []

    def keep(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.retain_grad()
        outs.append(out)

    hooks = [b.register_forward_hook(keep) for b in model.h]
    logits = model(ids)
    g = torch.Generator().manual_seed(0)
    (logits * torch.randn(logits.shape, generator=g, dtype=logits.dtype)).sum().backward()
    for h in hooks:
        h.remove()
    for rec, y in zip(by_type, outs):
        assert rec.fwd_var == pytest.approx(y.var().item(), rel=1e-12)
        assert rec.token_corr == pytest.approx(token_correlation(y.detach()), rel=1e-12)
        assert rec.grad_var == pytest.approx(y.grad.var().item(), rel=1e-12)
    assert all(p.grad is not None for p in model.parameters())          # ours, from the manual pass, kept


def test_measure_selector_errors_are_clear():
    model = NanoGPT()
    ids = torch.randint(0, 64, (2, 16))
    with pytest.raises(ValueError, match="selects no submodule of NanoGPT"):
        measure(model, ids, blocks=r"blocks\.\d+")
    with pytest.raises(ValueError, match="blocks must be a module class"):
        measure(model, ids, blocks=3)
    for empty in ([], [NanoBlock, 3]):
        with pytest.raises(ValueError, match="one or more module classes"):
            measure(model, ids, blocks=empty)


def test_measure_refuses_to_return_nothing():
    """No records is an error, not an empty list: a third-party model without ``blocks``, and a selector that
    matches only a container (the ModuleList ``h``, never called itself) name what was selected and why."""
    model = NanoGPT()
    ids = torch.randint(0, 64, (2, 16))
    with pytest.raises(ValueError, match="NanoGPT has no sigprop Sublayer to measure; pass blocks="):
        measure(model, ids)
    for blocks in (torch.nn.ModuleList, "h", [torch.nn.ModuleList]):
        with pytest.raises(ValueError, match=r"selects 1 submodule\(s\) of NanoGPT: h \(ModuleList\); none of them "
                                             r"executed in the forward pass"):
            measure(model, ids, blocks=blocks)

    class Tagged(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"y": x}

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.tag = NanoGPT(), Tagged()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.tag(self.net(ids))["y"]

    with pytest.raises(ValueError, match=r"tag \(Tagged\); they ran, but none returned a tensor"):
        measure(Wrapper(), ids, blocks=Tagged)


def test_measure_takes_any_iterable_of_classes():
    torch.manual_seed(0)
    model = NanoGPT().double()
    ids = torch.randint(0, 64, (2, 16))
    by_type = measure(model, ids, blocks=NanoBlock)
    assert measure(model, ids, blocks=[NanoBlock]) == by_type
    assert measure(model, ids, blocks=(c for c in [NanoBlock])) == by_type
    both = measure(model, ids, blocks=[NanoBlock, torch.nn.GELU])
    assert [r.sublayer for r in both] == ["GELU", "NanoBlock"] * 3


# --- measure leaves every parameter's .grad as it found it -------------------------------------------

def sigprop_decoder() -> tuple[torch.nn.Module, torch.Tensor, dict]:
    model = build_model(ModelConfig(scheme="preln", d_model=32, n_heads=4, n_layers=2, max_seq_len=16)).double()
    return model, torch.randint(0, 256, (3, 16)), {}


def nano_gpt() -> tuple[torch.nn.Module, torch.Tensor, dict]:
    return NanoGPT().double(), torch.randint(0, 64, (3, 16)), {"blocks": NanoBlock}


@pytest.mark.parametrize("fill", ["zeros", "random"])
@pytest.mark.parametrize("build", [sigprop_decoder, nano_gpt])
def test_measure_leaves_existing_grads_exactly_as_found(build, fill):
    """Zeroed grads stay zero and prefilled ones bit-identical, the same tensors; the records do not depend on them."""
    torch.manual_seed(0)
    model, ids, kw = build()
    clean = measure(model, ids, **kw)
    grads_as_found(model, fill, lambda: measure(model, ids, **kw))
    assert measure(model, ids, **kw) == clean


def test_diagnose_model_writes_the_diagnose_files(tmp_path):
    torch.manual_seed(0)
    model = NanoGPT().double()
    ids = torch.randint(0, 64, (2, 16))
    records = diagnose_model(model, ids, blocks=NanoBlock, out=tmp_path)
    assert records == measure(model, ids, blocks=NanoBlock)
    assert from_json((tmp_path / "measured.json").read_text()) == records
    assert len((tmp_path / "measured.csv").read_text().splitlines()) == 1 + len(records)
    assert (tmp_path / "diagnose.png").stat().st_size > 0


ROOT = Path(__file__).resolve().parents[1]


def test_the_diagnose_any_model_example_runs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    main = runpy.run_path(str(ROOT / "examples" / "diagnose_any_model.py"))["main"]
    main(["--layers", "4", "--width", "32", "--seq-len", "16", "--batch", "2", "--out", str(tmp_path)])
    records = from_json((tmp_path / "measured.json").read_text())
    assert [(r.layer, r.sublayer) for r in records] == [(i, "Block") for i in (1, 2, 3, 4)]
    assert (tmp_path / "diagnose.png").stat().st_size > 0
    assert "Block" in capsys.readouterr().out


def test_the_diagnose_model_example_in_the_docs_runs(tmp_path, monkeypatch, capsys):
    """The block after the marker in docs/moments.md, as written (an HF GPT-2 from a config, nothing downloaded)."""
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    text = (ROOT / "docs" / "moments.md").read_text()
    code = re.search(r"<!-- tests/test_diagnostics.py runs the next block -->\n```python\n(.*?)```", text, re.S)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/moments.md", "exec"), {})
    records = from_json((tmp_path / "runs" / "gpt2_blocks" / "measured.json").read_text())
    assert [(r.layer, r.sublayer) for r in records] == [(i, "GPT2Block") for i in range(1, 13)]
    assert "GPT2Block" in capsys.readouterr().out
    first, last = records[0], records[-1]                          # the numbers the text quotes, to 5 %
    assert (first.fwd_var, last.fwd_var) == pytest.approx((9.1e-4, 2.3e-3), rel=0.05)
    assert (first.grad_var, last.grad_var) == pytest.approx((117, 45), rel=0.05)
