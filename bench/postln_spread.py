"""Gradient spread through depth of a 48-layer DSLM Post-LN decoder at init, with the real LM loss.

    OMP_NUM_THREADS=1 python bench/postln_spread.py          # prints the table of bench/RESULTS.md
    OMP_NUM_THREADS=1 python bench/postln_spread.py --rules limit --widths 128
    OMP_NUM_THREADS=1 python bench/postln_spread.py --rules gram --widths 128 --max-seq-len 256

For each width and for DSLM's V/O rules — the token Gram recursion (`sigprop.schemes.dslm`, used up to
`GRAM_MAX_TOKENS` tokens), the mean-correlation recursion with the finite-length gain (beyond that length), and
the authors' L → ∞ rule (G_l = r_l, output correlation 1: no finite-length gain at all) — over
`SEEDS` float64 networks, each on its own 8 validation sequences of the embedded corpus (`configs/tiny_decoder.toml`
data, BPE vocabulary 512, 64 tokens):

* stream: max/min over sublayer outputs of the seed-mean gradient variance (`sigprop.diagnostics.measure`),
  with the cross-entropy of the next token ("LM") and with measure's random-projection loss ("proj"), beside
  `predict`'s (which assumes the random projection);
* weights: max/min over layers of the seed-mean gradient norm of each weight kind (all of a block's
  matrices, Q, V, O, the two MLP matrices), LM loss;
* "Q predicted": the query projection's spread from the moment maps (`q_weight_spread`).

The query weight's gradient, from the maps. ∂L/∂W_q = Σ_i x_i ⊗ δq_i over the N tokens of a sequence, with
x_i the attention's input and δq_i = ∂L/∂q_i. At init the forward and backward factors are independent, so

    E‖∂L/∂W_q‖²_F = Σ_i E|x_i|² E|δq_i|² + Σ_{i≠i'} E[x_i·x_i'] E[δq_i·δq_i']
                  = (d N / σ_q²) (x² V_q + (N − 1)(m² + r σ²) C_q),

where V_q and C_q are the per-coordinate variance and the covariance between two queries of the Q-path part of
the input gradient, W_q δq_i (`Attention.query_path`: each coordinate has variance σ_q² |δq_i|²), and m, σ², r,
x² = m² + σ² the input's mean, variance, token correlation and second moment. Under Post-LN the input has m = 0,
σ² = 1. The spread through depth is the ratio of the largest to the smallest per-layer value, square-rooted
(norms); the constant d N cancels.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sigprop import ModelConfig, build_model
from sigprop.diagnostics import measure
from sigprop.models import predict
from sigprop.schemes import dslm
from sigprop.theory.moments import attention
from sigprop.train import load_config, prepare_data
from sigprop.train.sampler import generator

SEEDS, LAYERS, WIDTHS, SEQ = 8, 48, (128, 256), 64
RULES = {"gram": "Gram recursion", "mean": "mean recursion", "limit": "authors' limit"}
ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {"block": lambda b: [p for p in b.parameters() if p.ndim >= 2],
           "Q": lambda b: [b.attn.fn.q_proj.weight], "V": lambda b: [b.attn.fn.v_proj.weight],
           "O": lambda b: [b.attn.fn.o_proj.weight], "MLP in": lambda b: [b.mlp.fn.fc1.weight],
           "MLP out": lambda b: [b.mlp.fn.fc2.weight]}


def lm_loss(targets: torch.Tensor):
    return lambda logits: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def ratio(rows: list[list[float]]) -> float:
    """max/min over depth of the mean over seeds."""
    mean = np.mean(rows, 0)
    return float(mean.max() / mean.min())


def spreads(cfg: ModelConfig, data) -> dict[str, float]:
    stream = {"LM": [], "proj": []}
    weights = {k: [] for k in WEIGHTS}
    for seed in range(SEEDS):
        batch = data.val.batch(torch.arange(seed * 8, seed * 8 + 8), generator(0, seed))
        (ids,), targets = batch.inputs, batch.targets
        for loss, fn in (("LM", lm_loss(targets)), ("proj", None)):
            torch.manual_seed(seed)
            stream[loss].append([r.grad_var for r in measure(build_model(cfg).double(), ids, loss_fn=fn, seed=seed,
                                                             attention_stats=False)])
        torch.manual_seed(seed)
        model = build_model(cfg).double()
        lm_loss(targets)(model(ids)).backward()
        for kind, params in WEIGHTS.items():
            norms = [sum(float(p.grad.pow(2).sum()) for p in params(b)) ** 0.5 for b in model.stack.blocks]
            weights[kind].append(norms)
    pred = np.array([r.grad_var for r in predict(cfg, seq_len=SEQ)])
    return {"stream LM": ratio(stream["LM"]), "stream proj": ratio(stream["proj"]),
            "stream predicted": float(pred.max() / pred.min()), **{k: ratio(v) for k, v in weights.items()},
            "Q predicted": q_weight_spread(cfg)}


def q_weight_spread(cfg: ModelConfig) -> float:
    """The query weight's gradient-norm spread through depth from the maps (module docstring): `predict` at
    ``SEQ`` tokens, reading each attention sublayer's Q-path variance and covariance as its backward computes
    them (the sublayers run top-down in backward)."""
    seen = []
    query_path = attention.Attention.query_path

    def recording(self, st, g, value_trace=False):
        v, c = query_path(self, st, g, value_trace)
        seen.append((st.m2 + st.s2) * (v + (SEQ - 1) * st.rho * c) / self.q_var)      # x² (V_q + (N−1)ρ C_q)/σ_q²
        return v, c

    attention.Attention.query_path = recording
    try:
        predict(cfg, seq_len=SEQ)
    finally:
        attention.Attention.query_path = query_path
    if len(seen) != cfg.n_layers:
        raise RuntimeError(f"expected one query path per block, got {len(seen)}")
    return float(np.sqrt(max(seen) / min(seen)))


EXACT, GRAM = dslm.theory_dslm.attention_correlation, dslm.theory_dslm.GRAM_MAX_TOKENS


def authors_limit(r: float, L: int | None, causal: bool, d: int, n_heads: int) -> tuple[float, float]:
    """`attention_correlation` at L → ∞ whatever the length: the authors' G = r, output correlation 1."""
    return EXACT(r, None, causal, d, n_heads)


def use_rule(rule: str) -> None:
    """Make `sigprop.schemes.dslm` take ``rule``'s V/O gains (module docstring)."""
    dslm.theory_dslm.attention_correlation = authors_limit if rule == "limit" else EXACT
    dslm.theory_dslm.GRAM_MAX_TOKENS = GRAM if rule == "gram" else 0
    dslm.block_correlations.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", choices=list(RULES), default=["gram", "mean"])
    parser.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS))
    parser.add_argument("--max-seq-len", type=int, default=SEQ,
                        help="the config's length, which the V/O rule is made for (the batches keep 64 tokens)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = load_config(ROOT / "configs" / "tiny_decoder.toml",
                          ["data.max_chars=200000", f"data.seq_len={SEQ}", "train.progress=false",
                           f"train.out_dir={tmp}"])
        data = prepare_data(run, Path(tmp))
        rows = []
        for rule in args.rules:
            use_rule(rule)
            for d in args.widths:
                cfg = ModelConfig(arch="decoder", vocab_size=run.model.vocab_size, d_model=d, n_heads=4,
                                  n_layers=LAYERS, max_seq_len=args.max_seq_len, scheme="dslm", norm_placement="post")
                rows.append((RULES[rule], d, spreads(cfg, data)))
    keys = list(rows[0][2])
    print("| V/O rule | width | " + " | ".join(keys) + " |\n|---|---|" + "---|" * len(keys))
    for rule, d, s in rows:
        print(f"| {rule} | {d} | " + " | ".join(f"{s[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
