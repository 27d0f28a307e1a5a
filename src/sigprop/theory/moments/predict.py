"""`predict(cfg)`: a model's per-sublayer moments at init, composed from the component maps.

The prediction mirrors `sigprop.models.Stack` sublayer by sublayer, with the weight variances
and residual weights the config's scheme prescribes (``scheme.std``, ``scheme.residual``), so
prediction and the real model cannot drift apart. Forward: embeddings (token table with a
collision probability, position table) → dropout → sublayers → final norm (Pre-LN) → tied
logits. Backward: starts from ∂loss/∂logits with unit variance and no token correlation, as
`sigprop.diagnostics.measure`'s default loss produces.
  pre:  x ← α x + β D(f(N(x)));  post: x ← N(α x + β D(f(x))) (`PostNormResidual`);  none: x ← α x + β D(f(x)).
Covered: ``decoder`` and ``encoder``. Cross-attention (``encdec``) and patch embeddings
(``vit``) have no derived map yet and raise NotImplementedError.

Cost: each attention map evaluates the tabulated softmax functionals (`tables`), ~0.5 ms per
sublayer; the first call per (seq_len, causal) builds the table (~0.5 s at L = 128).
Accuracy against `sigprop.diagnostics.measure` (width 128, depth 48, seq 64; tests/test_predict.py,
docs/moments.md §6): Pre-LN and DSLM within ~1–9% median; causal models carry position-dependent
token correlations the exchangeable-token maps average away (attention branch variance 5–15% low
in deep layers); a rank-collapsed causal Post-LN decoder (token correlation ≥ COLLAPSED_CORR) is traced
backward per position (`causal`), which follows the standard Post-LN decoder's first-token gradient
(median error 28%, was 96%; the bottom layers stay 60–80% high).
"""
from __future__ import annotations

from typing import Any

from ...records import Record
from .attention import Attention
from .blocks import ffn_block, serial
from .causal import position_trace
from .dropout import Dropout
from .embedding import Embedding, zipf_collision_probability
from .linear import Linear
from .norm import LayerNorm, RMSNorm
from .pointwise import GeLU, ReLU, ShapedReLU
from .postnorm import PostNormResidual
from .residual import Residual
from .state import Component, Moments

Label = tuple[int, str] | None          # (layer, sublayer) of a recorded point; None: not recorded
COLLAPSED_CORR = 0.9    # a decoder whose token correlation reaches this takes the per-position backward (`causal`)


def _activation(kind: str, cfg: Any) -> Component:
    if kind == "relu":
        return ReLU()
    if kind == "gelu":
        return GeLU()
    return ShapedReLU(cfg.d_model, cfg.c_plus, cfg.c_minus)


def model_chain(cfg: Any, seq_len: int | None = None, token_collision: float | None = None
                ) -> tuple[list[Label], list[Component]]:
    """The model as a chain of moment maps, and the record label of each map's output.

    seq_len: tokens per sequence (default ``cfg.max_seq_len``). token_collision: P(two positions
    hold the same token); default the Zipf law over ``cfg.vocab_size`` (natural text); use
    1/vocab_size for uniformly random tokens.
    """
    from ...schemes import ParamInfo, Site, get_scheme      # schemes sit above theory; imported lazily

    if cfg.arch not in ("decoder", "encoder"):
        missing = "cross-attention" if cfg.arch == "encdec" else "patch-embedding"
        raise NotImplementedError(f"moments.predict covers arch 'decoder' and 'encoder'; {cfg.arch!r} needs a "
                                  f"{missing} moment map that is not derived yet")
    scheme = get_scheme(cfg.scheme)
    stack, causal = ("dec", True) if cfg.arch == "decoder" else ("enc", False)
    L = seq_len or cfg.max_seq_len
    d, p, centered = cfg.d_model, cfg.dropout, cfg.norm_type == "layernorm"
    norm = LayerNorm(d) if centered else RMSNorm(d)
    placement = {"preln": "pre", "postln": "post", "none": "none"}[cfg.norm]
    emb_var = scheme.std(cfg, ParamInfo("embed", None, None, (cfg.vocab_size, d))) ** 2
    collision = zipf_collision_probability(cfg.vocab_size) if token_collision is None else token_collision

    def var(role: str, layer: int, shape: tuple[int, int]) -> float:
        return scheme.std(cfg, ParamInfo(role, stack, layer, shape)) ** 2

    act = _activation(scheme.activation(cfg), cfg)

    def branch(kind: str, layer: int) -> list[Component]:
        if kind == "attn":
            return [Attention(d, cfg.n_heads, L, var("q", layer, (d, d)), var("k", layer, (d, d)),
                              var("v", layer, (d, d)), var("o", layer, (d, d)), causal=causal,
                              shaped=scheme.attention == "shaped", tau0=cfg.tau0), Dropout(p)]
        return list(ffn_block(d, cfg.d_ff, var("ffn_in", layer, (cfg.d_ff, d)),
                              var("ffn_out", layer, (d, cfg.d_ff)), act, p).components)

    def sublayer(kind: str, layer: int) -> Component:
        alpha, beta = scheme.residual(cfg, Site(stack, layer, kind))
        f = branch(kind, layer)
        if placement == "pre":
            return Residual(alpha, beta, serial(norm, *f))
        if placement == "post":
            last = (layer, kind) == (cfg.n_layers - 1, "mlp")        # its gradient comes from the head
            return PostNormResidual(alpha, beta, serial(*f), d, centered, normalized_input=(layer, kind) != (0, "attn"),
                                    upstream_align=(2.0 if centered else 1.0) if last else 0.0)
        return Residual(alpha, beta, serial(*f))

    labels: list[Label] = [(0, "embed"), None]
    chain: list[Component] = [Embedding(emb_var, (collision, 0.0)), Dropout(p)]
    for layer in range(cfg.n_layers):
        for kind in ("attn", "mlp"):
            labels.append((layer + 1, kind))
            chain.append(sublayer(kind, layer))
    if placement == "pre":
        labels.append(None)
        chain.append(norm)
    labels.append(None)
    chain.append(Linear(d, cfg.vocab_size, scheme.logit_scale(cfg) ** 2 * emb_var))
    return labels, chain


def predict(cfg: Any, seq_len: int | None = None, token_collision: float | None = None) -> list[Record]:
    """Predicted records (layer 0 = embedding output, then one per sublayer) for ``cfg``, in the schema
    of `sigprop.diagnostics.measure`; arguments as `model_chain`. A Post-LN decoder whose forward token
    correlation reaches COLLAPSED_CORR (near-uniform causal rows, where `causal`'s maps are exact) is traced
    backward with one gradient covariance per pair of positions; other models with the exchangeable maps.
    Pre-LN stays exchangeable: its stream gradient is carried by the identity path, which does not mix
    positions, and the per-position trace over-predicts its embedding-output point (964 vs 172 measured,
    exchangeable 150) while the other points agree either way."""
    labels, chain = model_chain(cfg, seq_len, token_collision)
    stack = "dec" if cfg.arch == "decoder" else "enc"
    m_in, g_out = Moments(0.0, 1.0, 0.0), Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=0.0)
    states = serial(*chain).trace(m_in)
    if cfg.arch == "decoder" and cfg.norm == "postln" and max(m.corr for m in states) >= COLLAPSED_CORR:
        states = position_trace(chain, states, g_out, seq_len or cfg.max_seq_len)
    else:
        states = serial(*chain).trace(m_in, g_out)
    return [Record(layer=lab[0], sublayer=lab[1], stack=stack, source="predicted", fwd_mean=m.mean,
                   fwd_var=m.var, token_corr=m.corr, grad_var=m.grad_var)
            for lab, m in zip(labels, states[1:]) if lab is not None]
