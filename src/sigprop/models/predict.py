"""`predict(cfg)`: a model's per-sublayer moments at init, composed from `sigprop.theory.moments`' component maps.

The prediction mirrors `sigprop.models.Stack` sublayer by sublayer, with the weight variances
and residual weights the config's scheme prescribes (``scheme.std``, ``scheme.residual``), so
prediction and the real model cannot drift apart. Forward: embeddings (token table with a
collision probability, position table) → dropout → sublayers → final norm (Pre-LN) → tied
logits. Backward: starts from ∂loss/∂logits with unit variance and no token correlation, as
`sigprop.diagnostics.measure`'s default loss produces.
  pre:  x ← α x + β D(f(N(x)));  post: x ← N(α x + β D(f(x))) (`PostNormResidual`);  none: x ← α x + β D(f(x)).
Covered: every arch. ``encdec``: the encoder chain on the source (ending with its final norm for
Pre-LN) gives the memory; the decoder chain on the target has (causal self-attention, cross-attention
reading the memory (`QueryView`), MLP) per layer and its own final norm and head; backward through the
decoder (per position for a collapsed Post-LN decoder, as for ``decoder``), then the memory gradient summed
over the cross sublayers (`memory_gradient`: independent W_v, W_k, so variances and covariances add), then
through the encoder from it. ``vit``: stack "enc"
over T = 1 + (image/patch)² tokens from `PatchEmbedding`, head Linear(d, n_classes) on the class token only
(`ClassToken`), so the stack output's gradient sits on token 0: token-averaged variance n_classes σ_head²/T,
correlation 0. The exchangeable backward maps stay right for that position average in a bidirectional
stack: the joint law of the Jacobians is invariant under token permutations, so the map G ↦ E[J G Jᵀ] of the
per-feature gradient covariance commutes with them, and the average diagonal and off-diagonal of the
result depend on G only through tr G and the sum of its off-diagonal — which G = σ²e₀e₀ᵀ shares with the
exchangeable (σ²/T) I. The class token breaks the invariance (its forward variance differs): exact when its
variance equals the patch tokens' (DSLM), 27% median gradient error when it is 15× smaller (Xavier-like
init: its Pre-LN norms amplify the gradient it alone carries).

Cost: each attention map evaluates the tabulated softmax functionals (`tables`), ~0.5 ms per
sublayer; the first call per (seq_len, causal) builds the table (~0.2 s at L = 128).
Accuracy against `sigprop.diagnostics.measure` (width 128, depth 48, seq 64; tests/test_predict.py,
docs/moments.md §6): Pre-LN and DSLM within ~1–9% median; causal models carry position-dependent
token correlations the exchangeable-token maps average away (attention branch variance 5–15% low
in deep layers); a rank-collapsed causal Post-LN decoder (token correlation ≥ COLLAPSED_CORR) is traced
backward per position (`causal`), which follows the standard Post-LN decoder's first-token gradient;
with the Post-LN norm's O(1/d) effects (`postnorm`) its median error is 2.2% and 3.0% against two sets
of 1000 networks, within their Monte-Carlo error (bench/postln_gradient.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..records import Record
from ..schemes import ParamInfo, Site, get_scheme
from ..theory.moments.attention import Attention
from ..theory.moments.blocks import ffn_block, parts, serial
from ..theory.moments.causal import position_trace
from ..theory.moments.cross_attention import CrossAttention, MemoryView, QueryView
from ..theory.moments.dropout import Dropout
from ..theory.moments.embedding import Embedding, PatchEmbedding, zipf_collision_probability
from ..theory.moments.linear import Linear
from ..theory.moments.norm import LayerNorm, RMSNorm
from ..theory.moments.pointwise import GeLU, ReLU, ShapedReLU
from ..theory.moments.postnorm import PostNormResidual, trace_bwd
from ..theory.moments.residual import Residual
from ..theory.moments.state import Component, Moments, ratio, replace

Label = tuple[int, str] | None          # (layer, sublayer) of a recorded point; None: not recorded
COLLAPSED_CORR = 0.9    # a decoder whose token correlation reaches this takes the per-position backward (`causal`)


def _activation(kind: str, cfg: Any) -> Component:
    if kind == "relu":
        return ReLU()
    if kind == "gelu":
        return GeLU()
    return ShapedReLU(cfg.d_model, cfg.c_plus, cfg.c_minus)


@dataclass(frozen=True)
class ClassToken:
    """The ViT head's read-out of token 0 of ``T``. Forward: the token's moments are taken as the exchangeable
    state's. Backward: a gradient on one token of T has token-averaged variance σ_g²/T and no correlation."""

    T: int

    def fwd(self, m: Moments) -> Moments:
        return m

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return replace(m_in, grad_var=g_out.grad_var / self.T, grad_corr=0.0)


class _Builder:
    """Moment maps of one `ModelConfig`, each from the scheme's own ``std``/``residual`` (as the model's init)."""

    def __init__(self, cfg: Any, seq_len: int | None, token_collision: float | None) -> None:
        self.cfg, self.scheme, self.info = cfg, get_scheme(cfg.scheme), ParamInfo
        self.L = seq_len or cfg.max_seq_len
        self.d, self.p = cfg.d_model, cfg.dropout
        self.centered = cfg.norm_type == "layernorm"
        self.norm = LayerNorm(self.d) if self.centered else RMSNorm(self.d)
        self.placement = {"preln": "pre", "postln": "post", "none": "none"}[cfg.norm]
        self.act = _activation(self.scheme.activation(cfg), cfg)
        self.collision = zipf_collision_probability(cfg.vocab_size) if token_collision is None else token_collision

    def var(self, role: str, stack: str | None, layer: int | None, shape: tuple[int, ...]) -> float:
        return self.scheme.std(self.cfg, self.info(role, stack, layer, shape)) ** 2

    def tokens(self, recorded: bool) -> tuple[list[Label], list[Component]]:
        """Token + position tables (``token_collision``), then dropout."""
        emb = Embedding(self.var("embed", None, None, (self.cfg.vocab_size, self.d)), (self.collision, 0.0))
        return [(0, "embed") if recorded else None, None], [emb, Dropout(self.p)]

    def patches(self) -> tuple[list[Label], list[Component]]:
        """ViT patch embedding (N(0, 1) pixels), then dropout."""
        cfg, d = self.cfg, self.d
        n, fan_in = (cfg.image_size // cfg.patch_size) ** 2, cfg.in_channels * cfg.patch_size ** 2
        emb = PatchEmbedding(self.var("patch", None, None, (d, fan_in)), fan_in,
                             self.var("pos", None, None, (1, n + 1, d)), self.var("cls", None, None, (1, 1, d)), n)
        return [(0, "embed"), None], [emb, Dropout(self.p)]

    def stack(self, name: str, n_layers: int, L: int, causal: bool, memory: Moments | None = None
              ) -> tuple[list[Label], list[Component]]:
        """One sublayer map per residual site of ``Stack(name)``, in order, plus the final norm (Pre-LN);
        with ``memory`` each block has a cross-attention sublayer reading it (S = seq_len keys)."""
        cfg, d, p, scheme = self.cfg, self.d, self.p, self.scheme
        shaped = scheme.attention == "shaped"
        kinds = ("attn", "cross", "mlp") if memory is not None else ("attn", "mlp")

        def var(role: str, layer: int, shape: tuple[int, int]) -> float:
            return self.var(role, name, layer, shape)

        def branch(kind: str, layer: int) -> list[Component]:
            qkvo = [var(r, layer, (d, d)) for r in ("q", "k", "v", "o")]
            if shaped and cfg.qk_scaling == "init":      # τ² = τ₀²d_k, not the maps' τ₀²d·d_k: the maps read the
                qkvo[0] *= d                             # logit scale only through q_var·k_var/τ²
            if kind == "attn":
                return [Attention(d, cfg.n_heads, L, *qkvo, causal=causal, shaped=shaped, tau0=cfg.tau0), Dropout(p)]
            if kind == "cross":
                return [QueryView(CrossAttention(d, cfg.n_heads, L, self.L, *qkvo, shaped=shaped, tau0=cfg.tau0),
                                  memory), Dropout(p)]
            return list(ffn_block(d, cfg.d_ff, var("ffn_in", layer, (cfg.d_ff, d)),
                                  var("ffn_out", layer, (d, cfg.d_ff)), self.act, p).components)

        def sublayer(kind: str, layer: int) -> Component:
            alpha, beta = scheme.residual(cfg, Site(name, layer, kind))
            f = branch(kind, layer)
            if self.placement == "pre":
                return Residual(alpha, beta, serial(self.norm, *f))
            if self.placement == "post":
                last = (layer, kind) == (n_layers - 1, "mlp")   # its gradient comes from a random linear map
                return PostNormResidual(alpha, beta, serial(*f), d, self.centered,
                                        normalized_input=(layer, kind) != (0, "attn"),
                                        upstream_align=(2.0 if self.centered else 1.0) if last else 0.0)
            return Residual(alpha, beta, serial(*f))

        labels: list[Label] = []
        chain: list[Component] = []
        for layer in range(n_layers):
            for kind in kinds:
                labels.append((layer + 1, kind))
                chain.append(sublayer(kind, layer))
        if self.placement == "pre":
            labels.append(None)
            chain.append(self.norm)
        return labels, chain

    def lm_head(self) -> tuple[list[Label], list[Component]]:
        """Tied, scaled logits."""
        emb_var = self.var("embed", None, None, (self.cfg.vocab_size, self.d))
        return [None], [Linear(self.d, self.cfg.vocab_size, self.scheme.logit_scale(self.cfg) ** 2 * emb_var)]


def _join(*parts: tuple[list[Label], list[Component]]) -> tuple[list[Label], list[Component]]:
    return [lab for labels, _ in parts for lab in labels], [c for _, chain in parts for c in chain]


def model_chain(cfg: Any, seq_len: int | None = None, token_collision: float | None = None,
                memory: Moments | None = None) -> tuple[list[Label], list[Component]]:
    """The model as a chain of moment maps, and the record label of each map's output.

    seq_len: tokens per sequence (default ``cfg.max_seq_len``; source and target length for ``encdec``;
    unused by ``vit``, whose T = 1 + (image_size/patch_size)²). token_collision: P(two positions hold the
    same token); default the Zipf law over ``cfg.vocab_size`` (natural text); use 1/vocab_size for uniformly
    random tokens. For ``encdec`` this is the decoder (target embedding, not recorded, to logits), whose
    cross-attention sublayers read a memory with moments ``memory`` (the output of `encoder_chain`).
    """
    b = _Builder(cfg, seq_len, token_collision)
    if cfg.arch == "vit":
        T = cfg.n_tokens
        head = Linear(cfg.d_model, cfg.n_classes, b.var("head", None, None, (cfg.n_classes, cfg.d_model)))
        return _join(b.patches(), b.stack("enc", cfg.n_layers, T, False), ([None, None], [ClassToken(T), head]))
    if cfg.arch == "encdec":
        if memory is None:
            raise ValueError("model_chain of an encdec is its decoder: give the memory moments (encoder_chain's output)")
        return _join(b.tokens(False), b.stack("dec", cfg.n_dec_layers, b.L, True, memory), b.lm_head())
    decoder = cfg.arch == "decoder"
    return _join(b.tokens(True), b.stack("dec" if decoder else "enc", cfg.n_layers, b.L, decoder), b.lm_head())


def encoder_chain(cfg: Any, seq_len: int | None = None, token_collision: float | None = None
                  ) -> tuple[list[Label], list[Component]]:
    """The encoder of an ``encdec`` (source embedding to the final norm's output, the memory), as `model_chain`."""
    b = _Builder(cfg, seq_len, token_collision)
    return _join(b.tokens(True), b.stack("enc", cfg.n_layers, b.L, False))


def memory_gradient(sub: Component, m_in: Moments, g_out: Moments) -> Moments | None:
    """Gradient moments a decoder sublayer ``sub`` (input ``m_in``, output gradient ``g_out``) sends to the
    memory: None unless its branch holds a `QueryView`. The branch up to the view gives the queries; the
    same branch with the view turned to the memory (`MemoryView`), behind the residual weight β (and the
    Post-LN norm's gradient gains), gives the memory's gradient."""
    if not isinstance(sub, (Residual, PostNormResidual)):
        return None
    maps = parts(sub.branch)
    views = [i for i, c in enumerate(maps) if isinstance(c, QueryView)]
    if not views:
        return None
    i = views[0]
    view = maps[i]
    query = serial(*maps[:i]).fwd(m_in) if i else m_in
    if isinstance(sub, PostNormResidual):
        var, cov = sub.norm_grad(m_in, g_out)
        g_out = replace(g_out, grad_var=var, grad_corr=ratio(cov, var))
    to_memory = serial(MemoryView(view.attention, query), *maps[i + 1:])
    return Residual(0.0, sub.beta, to_memory).bwd(view.memory, g_out)


def _records(labels: list[Label], states: list[Moments], stack: str) -> list[Record]:
    return [Record(layer=lab[0], sublayer=lab[1], stack=stack, source="predicted", fwd_mean=m.mean,
                   fwd_var=m.var, token_corr=m.corr, grad_var=m.grad_var)
            for lab, m in zip(labels, states[1:]) if lab is not None]


def _backward(cfg: Any, chain: list[Component], states: list[Moments], g_out: Moments, L: int) -> list[Moments]:
    """The backward of a stack from ``g_out``: per position (`causal`) for a causal Post-LN stack whose token
    correlation reaches COLLAPSED_CORR, else exchangeable (`trace_bwd`)."""
    if cfg.norm == "postln" and max(m.corr for m in states) >= COLLAPSED_CORR:
        return position_trace(chain, states, g_out, L)
    return trace_bwd(chain, states, g_out)


def _predict_encdec(cfg: Any, seq_len: int | None, token_collision: float | None, m_in: Moments,
                    g_out: Moments) -> list[Record]:
    """Encoder forward → memory; decoder forward and backward; the memory gradient summed over the cross
    sublayers (independent W_v, W_k: variances and covariances add); encoder backward from it."""
    enc_labels, enc_chain = encoder_chain(cfg, seq_len, token_collision)
    enc_fwd = serial(*enc_chain).trace(m_in)
    memory = enc_fwd[-1]
    dec_labels, dec_chain = model_chain(cfg, seq_len, token_collision, memory)
    dec = _backward(cfg, dec_chain, serial(*dec_chain).trace(m_in), g_out, seq_len or cfg.max_seq_len)
    var = cov = 0.0
    for sub, m, g in zip(dec_chain, dec[:-1], dec[1:]):
        gm = memory_gradient(sub, m, g)
        if gm is not None:
            var, cov = var + gm.grad_var, cov + gm.grad_cov
    enc = trace_bwd(enc_chain, enc_fwd, replace(memory, grad_var=var, grad_corr=ratio(cov, var)))
    return _records(enc_labels, enc, "enc") + _records(dec_labels, dec, "dec")


def predict(cfg: Any, seq_len: int | None = None, token_collision: float | None = None) -> list[Record]:
    """Predicted records (layer 0 = embedding output, then one per sublayer) for ``cfg``, in the schema
    of `sigprop.diagnostics.measure`; arguments as `model_chain`. A Post-LN decoder whose forward token
    correlation reaches COLLAPSED_CORR (near-uniform causal rows, where `causal`'s maps are exact) is traced
    backward with one gradient covariance per pair of positions; other models with the exchangeable maps.
    Pre-LN stays exchangeable: its stream gradient is carried by the identity path, which does not mix
    positions, and the per-position trace over-predicts its embedding-output point (964 vs 172 measured,
    exchangeable 150) while the other points agree either way. An ``encdec`` gives the encoder's records
    (stack "enc", embedding = the source's) then the decoder's ("dec"), as `measure` orders them."""
    m_in, g_out = Moments(0.0, 1.0, 0.0), Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=0.0)
    if cfg.arch == "encdec":
        return _predict_encdec(cfg, seq_len, token_collision, m_in, g_out)
    labels, chain = model_chain(cfg, seq_len, token_collision)
    stack = "dec" if cfg.arch == "decoder" else "enc"
    states = serial(*chain).trace(m_in)
    if cfg.arch == "decoder":
        return _records(labels, _backward(cfg, chain, states, g_out, seq_len or cfg.max_seq_len), stack)
    return _records(labels, trace_bwd(chain, states, g_out), stack)
