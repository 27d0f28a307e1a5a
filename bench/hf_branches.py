"""Branch-level variance after DeepScaleLM init: every attention and MLP branch output, before the residual scaling.

GPT-2 (causal), LLaMA (causal, GQA, SwiGLU) and BERT (bidirectional, Post-LN) built locally with
`transformers` (tiny random configs, no downloads) and `sigprop.hf.apply(model, "dslm", seq_len=T)`, and
sigprop's own DSLM decoder/encoder; Zipf-distributed token ids (P(id = k) ∝ 1/(k+1)), ``--batch`` sequences
of T tokens, one network per (model, T, seed). A forward hook on the branch's last linear map (GPT-2
``c_proj``, LLaMA ``o_proj``/``down_proj``, BERT ``output.dense``, sigprop ``Sublayer.fn``) records its
output variance, i.e. before λx + βf(x). ``--seq-len none`` rows apply with ``seq_len=None`` (the model's
number of positions) and feed sequences of that length.

    python bench/hf_branches.py [--width 64] [--layers 48] [--seqs 16 32 128 none] [--seeds 0 1 2 3]
"""
from __future__ import annotations

import argparse
import statistics

import torch

VOCAB = 256


def zipf_ids(batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    """(batch, seq) token ids with P(k) ∝ 1/(k + 1) over VOCAB ids."""
    w = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(w / w.sum(), batch * seq, replacement=True, generator=g).view(batch, seq)


def hf_model(family: str, width: int, layers: int, positions: int) -> torch.nn.Module:
    """A tiny randomly initialized GPT-2, LLaMA or BERT (dropout 0)."""
    import transformers

    common = dict(vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=width, n_layer=layers, n_head=4, n_positions=positions, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **common))
    if family == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=4 * width,
            max_position_embeddings=positions, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common))
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=width, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=3 * width, max_position_embeddings=positions, **common)
    return transformers.AutoModelForCausalLM.from_config(config)


def branches(family: str, model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(kind, module whose output is the branch before the residual scaling), in execution order."""
    if family == "sigprop":
        return [(m.site.sublayer, m.fn) for m in model.modules() if hasattr(m, "site") and hasattr(m, "fn")]
    base = model.base_model
    if family == "gpt2":
        return [x for b in base.h for x in (("attn", b.attn.c_proj), ("mlp", b.mlp.c_proj))]
    if family == "llama":
        return [x for b in base.layers for x in (("attn", b.self_attn.o_proj), ("mlp", b.mlp.down_proj))]
    return [x for b in base.encoder.layer for x in (("attn", b.attention.output.dense), ("mlp", b.output.dense))]


@torch.no_grad()
def branch_variances(family: str, model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[str, float]]:
    """(kind, output variance) of every branch of ``model`` on ``ids``."""
    rows: list[tuple[str, float]] = []
    hooks = [m.register_forward_hook(lambda mod, args, out, k=kind: rows.append((k, out.var().item())))
             for kind, m in branches(family, model)]
    model.eval()
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return rows


def build(family: str, width: int, layers: int, seq: int | None, seed: int, positions: int = 128) -> torch.nn.Module:
    """``family`` ("gpt2", "llama", "bert", "sigprop-dec", "sigprop-enc") at init under DSLM for ``seq``."""
    torch.manual_seed(seed)
    if family.startswith("sigprop"):
        from sigprop import ModelConfig, build_model

        arch = "decoder" if family == "sigprop-dec" else "encoder"
        return build_model(ModelConfig(arch=arch, scheme="dslm", vocab_size=VOCAB, d_model=width, n_layers=layers,
                                       n_heads=4, d_ff=4 * width, max_seq_len=seq or positions))
    import sigprop.hf

    model = hf_model(family, width, layers, positions)
    sigprop.hf.apply(model, "dslm", seq_len=seq)
    return model


def branch_means(family: str, width: int, layers: int, seq: int | None, seeds: tuple[int, ...], batch: int = 8,
                 positions: int = 128) -> dict[str, list[float]]:
    """Per kind ("attn", "mlp"), each branch's output variance averaged over one network per seed (its
    expectation at init; a single network's branch fluctuates by ~2/√d once tokens are strongly correlated)."""
    per_seed = []
    for seed in seeds:
        model = build(family, width, layers, seq, seed, positions)
        per_seed.append(branch_variances(family.split("-")[0], model, zipf_ids(batch, seq or positions, seed + 1)))
    out = {}
    for kind in ("attn", "mlp"):
        runs = [[v for k, v in rows if k == kind] for rows in per_seed]        # (seeds, branches)
        out[kind] = [statistics.fmean(col) for col in zip(*runs)]
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--seqs", nargs="+", default=["16", "32", "128", "none"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--families", nargs="+", default=["gpt2", "llama", "bert", "sigprop-dec", "sigprop-enc"])
    a = parser.parse_args()
    print(f"width {a.width}, {a.layers} layers, batch 8, Zipf ids; each branch's variance averaged over seeds "
          f"{a.seeds}; per cell: median over the branches [min, max]")
    print("| model | causal | seq_len | attention median | attention range | MLP median | MLP range |")
    print("|---|---|---|---|---|---|---|")
    for family in a.families:
        causal = family in ("gpt2", "llama", "sigprop-dec")
        for s in a.seqs:
            seq = None if s == "none" else int(s)
            means = branch_means(family, a.width, a.layers, seq, tuple(a.seeds))
            cells = []
            for kind in ("attn", "mlp"):
                v = means[kind]
                cells += [f"{statistics.median(v):.2f}", f"[{min(v):.2f}, {max(v):.2f}]"]
            label = "None (T = 128 positions)" if seq is None else str(seq)
            print(f"| {family} | {causal} | {label} | " + " | ".join(cells) + " |", flush=True)
