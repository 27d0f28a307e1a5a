"""DeepScaleLM's finite-length attention gain and correlation recursion (`sigprop.theory.dslm`) against Monte
Carlo of a real attention layer (float64, fixed seeds, tolerances from the standard error), and the layering
rule that `sigprop.theory` imports neither schemes nor models."""
import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sigprop.theory.dslm import attention_correlation, pair_overlap
from sigprop.theory.moments.attention import attention_gain

D, HEADS = 64, 4


@torch.no_grad()
def one_layer(r: float, L: int, causal: bool, draws: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per network: output variance and mean token correlation of Softmax(QKᵀ/√d_k)·X W_v W_o (all weights
    N(0, 1/d)) on 8 sequences of unit-variance tokens with correlation r."""
    g = torch.Generator().manual_seed(seed)
    dk, b = D // HEADS, 8
    var, corr = [], []
    for _ in range(draws):
        x = math.sqrt(r) * torch.randn(b, 1, D, generator=g, dtype=torch.float64) \
            + math.sqrt(1 - r) * torch.randn(b, L, D, generator=g, dtype=torch.float64)
        wq, wk, wv, wo = (torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D) for _ in range(4))
        q, k, v = ((x @ w).view(b, L, HEADS, dk).transpose(1, 2) for w in (wq, wk, wv))     # (b, H, L, dk)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(b, L, D) @ wo
        gram = o @ o.transpose(1, 2) / D                                                     # (b, L, L)
        diag = gram.diagonal(dim1=1, dim2=2)
        var.append(diag.mean())
        corr.append(((gram.sum((1, 2)) - diag.sum(1)) / (L * (L - 1))).mean() / diag.mean())
    return torch.stack(var), torch.stack(corr)


@pytest.mark.parametrize("r, L, causal", [(0.0, 16, True), (0.1, 32, False)])
def test_attention_gain_and_output_correlation_match_monte_carlo(r, L, causal):
    """G within 4 standard errors + 2% (bench/attention_gain.py: ≤ 1.9% over L = 16–128, r = 0–0.6), r_out within
    0.03. The log-normal closed form r + (1−r)·mean_i min(1, e^{1−r}/n_i) misses the same G by 40% (causal, L = 16,
    r = 0) and DSLM's r_out = 1 misses the correlation by 0.3–0.6: this test fails for either."""
    var, corr = one_layer(r, L, causal, draws=60, seed=0)
    g, r_out = attention_correlation(r, L, causal, D, HEADS)
    assert g == attention_gain(r, L, causal, D, HEADS)
    se = var.std().item() / math.sqrt(len(var))
    assert abs(g - var.mean().item()) < 4 * se + 0.02 * var.mean().item()
    assert abs(r_out - corr.mean().item()) < 0.03
    lognormal = r + (1 - r) * sum(min(1.0, math.exp(1 - r) / n) for n in (range(1, L + 1) if causal else [L])) / (
        L if causal else 1)
    assert abs(lognormal - var.mean().item()) > 4 * se + 0.02 * var.mean().item() or not causal
    assert 1.0 - corr.mean().item() > 0.2


def test_attention_gain_limits():
    """One key, or identical tokens: G = 1. Long bidirectional rows of a wide model: G → r (DSLM's rule)."""
    assert attention_gain(0.3, 1, True, D, HEADS) == 1.0
    assert attention_gain(1.0, 32, False, D, HEADS) == 1.0
    assert attention_gain(0.3, 4096, False, 4096, 16) == pytest.approx(0.3, abs=2e-3)
    with pytest.raises(ValueError, match="r must be in"):
        attention_gain(1.5, 32, False, D, HEADS)


def test_pair_overlap_is_the_mean_over_query_pairs_of_one_over_the_larger_key_count():
    L = 7
    pairs = [(i, j) for i in range(1, L + 1) for j in range(1, L + 1) if i < j]
    assert pair_overlap(L, True) == pytest.approx(sum(1 / max(i, j) for i, j in pairs) / len(pairs), rel=1e-12)
    assert pair_overlap(L, False) == 1 / L


def test_theory_imports_neither_schemes_nor_models():
    """Every import statement in sigprop/theory (module level or inside functions) stays in theory or below it."""
    import sigprop.theory as theory
    root = Path(theory.__file__).parent
    above = ("sigprop.schemes", "sigprop.models", "sigprop.nn", "sigprop.hf", "sigprop.diagnostics", "sigprop.train",
             "sigprop.experiments", "sigprop.simulate", "sigprop.cli")
    found = []
    for path in root.rglob("*.py"):
        package = ["sigprop", "theory", *path.relative_to(root).parent.parts]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                names = [".".join(base + ([node.module] if node.module else []))]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [(path.name, n) for n in names if n.startswith(above)]
    assert found == []
