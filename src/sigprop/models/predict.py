"""`predict(model_or_cfg)`: a model's per-sublayer moments at init, composed from the maps its own modules carry.

The prediction walks the model it predicts: every module reads its moment map off its own attributes and
the std its weights were drawn with (`sigprop.nn.maps`), in forward order (`moment_chain` of each
architecture and `Stack`), so prediction and the real model cannot drift apart. Given a config, the model is
built on the meta device (no weights allocated) and its init pass only records the stds. A module or option
without an exact map raises NotImplementedError naming it.

Forward: embeddings (token table with a collision probability, position table) → dropout → sublayers →
final norm (Pre-LN) → tied logits. Backward: starts from ∂loss/∂logits with unit variance and no token
correlation, as `sigprop.diagnostics.measure`'s default loss produces.
  pre:  x ← α x + β D(f(N(x)));  post: x ← N(α x + β D(f(x))) (`PostNormResidual`);  none: x ← α x + β D(f(x)).
Dropout maps at its rate for a module in train mode (a fresh model, as `measure` runs it) and as the
identity in eval mode.
Covered: every arch. ``encdec``: the encoder chain on the source (ending with its final norm for
Pre-LN) gives the memory; the decoder chain on the target has (causal self-attention, cross-attention
reading the memory (`QueryView`), MLP) per layer and its own final norm and head; backward through the
decoder (per position, as for ``decoder``), then the memory gradient summed
over the cross sublayers (`memory_gradient`: independent W_v, W_k, so variances and covariances add), then
through the encoder from it. ``vit``: stack "enc"
over T = 1 + (image/patch)² tokens from `PatchEmbedding`, head Linear(d, n_classes) on the class token only
(`ClassToken`), so the stack output's gradient sits on token 0: token-averaged variance n_classes σ_head²/T,
correlation 0. The exchangeable backward maps stay right for that position average in a bidirectional
stack: the joint law of the Jacobians is invariant under token permutations, so the map G ↦ E[J G Jᵀ] of the
per-feature gradient covariance commutes with them, and the average diagonal and off-diagonal of the
result depend on G only through tr G and the sum of its off-diagonal — which G = σ²e₀e₀ᵀ shares with the
exchangeable (σ²/T) I. The class token breaks the invariance (its forward variance differs): exact when its
variance equals the patch tokens' (DSLM); when it is much smaller (Xavier-like init) its Pre-LN norms
amplify the gradient it alone carries, which the token-averaged maps miss.

Cost: `predict`'s docstring (measured: bench/predict.py).
Accuracy against `sigprop.diagnostics.measure`: docs/moments.md and tests/test_predict.py. Causal rows mix
different numbers of keys, so a causal stack's positions carry different variances and gradients, which the
exchangeable-token maps average away: causal stacks are traced backward per position (`causal`: per-position
variances, the gradient the V and K paths pile on the early keys, the first-token gradient of a collapsed
Post-LN decoder) and forward with one token covariance per pair of positions (`causal.pair_forward`: early
positions are more alike than late ones, so each row's prefix is more correlated than the stack's mean and its
logits spread less), and their records carry that forward's means. A causal stack the forward per pair does not
cover (shaped attention) keeps the exchangeable forward; as a Post-LN stack short of collapse (token
correlation < COLLAPSED_CORR) it keeps the exchangeable backward too.
"""
from __future__ import annotations

import dataclasses

from torch import nn

from ..records import Record
from ..schemes.admin import omega_profile
from ..theory.moments.blocks import parts, serial
from ..theory.moments.causal import pairs_cover, position_trace
from ..theory.moments.cross_attention import MemoryView, QueryView
from ..theory.moments.postnorm import PostNormResidual, trace_bwd
from ..theory.moments.residual import Residual
from ..theory.moments.state import Component, Moments, ratio, replace
from .adapter import Chain, Label
from .build import build_model, gc_paused
from .config import ModelConfig
from .transformer import DecoderLM, EncoderDecoder

COLLAPSED_CORR = 0.9    # a Post-LN decoder whose token correlation reaches this takes the per-position backward


def _as_model(model_or_cfg: nn.Module | ModelConfig) -> nn.Module:
    """The model itself, or the model a config builds, on the meta device, with its init stds recorded."""
    if isinstance(model_or_cfg, ModelConfig):
        model_or_cfg = build_model(model_or_cfg, device="meta")
    if not isinstance(model_or_cfg, nn.Module):
        raise TypeError(f"predict takes a sigprop model or a ModelConfig, got {type(model_or_cfg).__name__}")
    if not hasattr(model_or_cfg, "moment_chain"):
        raise NotImplementedError(f"{type(model_or_cfg).__name__} has no moment chain: predict walks sigprop models "
                                  "(build_model without hf_family); for transformers models use sigprop.hf.predict "
                                  "on token ids, for other models measure")
    return model_or_cfg


def model_chain(model_or_cfg: nn.Module | ModelConfig, seq_len: int | None = None,
                token_collision: float | None = None, memory: Moments | None = None) -> Chain:
    """The model as a chain of moment maps, and the record label of each map's output.

    seq_len: tokens per sequence (default the position table's size, ``max_seq_len``; source and target
    length for ``encdec``; unused by ``vit``, whose T = 1 + (image_size/patch_size)²). token_collision:
    P(two positions hold the same token); default the Zipf law over the vocabulary (natural text); use
    1/vocab_size for uniformly random tokens. For ``encdec`` this is the decoder (target embedding, not
    recorded, to logits), whose cross-attention sublayers read a memory with moments ``memory`` (the output
    of `encoder_chain`).
    """
    model = _as_model(model_or_cfg)
    return model.moment_chain(*model.default_inputs(seq_len, token_collision), memory)


def encoder_chain(model_or_cfg: nn.Module | ModelConfig, seq_len: int | None = None,
                  token_collision: float | None = None) -> Chain:
    """The encoder of an ``encdec`` (source embedding to the final norm's output, the memory), as `model_chain`."""
    model = _as_model(model_or_cfg)
    return model.encoder_chain(*model.default_inputs(seq_len, token_collision))


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


START = Moments(0.0, 1.0, 0.0)                                      # the embedding's input, as `measure`'s
START_GRAD = Moments(0.0, 1.0, 0.0, grad_var=1.0, grad_corr=0.0)    # ∂loss/∂output of the default loss


def to_records(labels: list[Label], states: list[Moments], stack: str) -> list[Record]:
    """Predicted records of stack ``stack``: one per labelled map output (``states`` starts with the chain's input)."""
    return [Record(layer=lab[0], sublayer=lab[1], stack=stack, source="predicted", fwd_mean=m.mean,
                   fwd_var=m.var, token_corr=m.corr, grad_var=m.grad_var)
            for lab, m in zip(labels, states[1:]) if lab is not None]


def trace(chain: list[Component], placement: str, causal: bool, L: int, m_in: Moments = START,
          g_out: Moments = START_GRAD) -> list[Moments]:
    """The forward and backward trace of a stack's ``chain`` (norm ``placement``, ``L`` tokens) from ``m_in`` and
    ``g_out``: the input, then each map's output, with its gradient. Bidirectional: the exchangeable maps
    (`trace_bwd`). Causal: per position (`causal`; forward per pair of positions where `pairs_cover` accepts the
    chain), except for a Post-LN stack outside it whose token correlation stays below COLLAPSED_CORR, which takes
    the exchangeable maps."""
    if not causal:
        return trace_bwd(chain, serial(*chain).trace(m_in), g_out)
    if pairs_cover(chain, L):
        return position_trace(chain, [m_in], g_out, L)
    states = serial(*chain).trace(m_in)
    if placement != "post" or max(m.corr for m in states) >= COLLAPSED_CORR:
        return position_trace(chain, states, g_out, L)
    return trace_bwd(chain, states, g_out)


def encdec_trace(model: EncoderDecoder, L: int, collision: float, m_in: Moments, g_out: Moments
                 ) -> tuple[list[Label], list[Moments], list[Label], list[Moments]]:
    """Encoder forward → memory; decoder forward and backward; the memory gradient summed over the cross
    sublayers (independent W_v, W_k: variances and covariances add); encoder backward from it. Returns the
    encoder's labels and states (input, then each component's output, the last the memory with its gradient),
    then the decoder's."""
    enc_labels, enc_chain = model.encoder_chain(L, collision)
    enc_fwd = serial(*enc_chain).trace(m_in)
    memory = enc_fwd[-1]
    dec_labels, dec_chain = model.moment_chain(L, collision, memory)
    dec = trace(dec_chain, model.decoder.placement, True, L, m_in, g_out)
    var = cov = 0.0
    for sub, m, g in zip(dec_chain, dec[:-1], dec[1:]):
        gm = memory_gradient(sub, m, g)
        if gm is not None:
            var, cov = var + gm.grad_var, cov + gm.grad_cov
    enc = trace_bwd(enc_chain, enc_fwd, replace(memory, grad_var=var, grad_corr=ratio(cov, var)))
    return enc_labels, enc, dec_labels, dec


def predicted_omegas(cfg: ModelConfig, seq_len: int | None = None, token_collision: float | None = None
                     ) -> dict[str, tuple[float, ...]]:
    """The profile `sigprop.schemes.admin.profile` gives at init in the moments (`omega_profile`), per stack ("enc",
    "dec") in sublayer order, for the model ``cfg`` builds (scheme "admin"), in eval mode; ``seq_len`` and
    ``token_collision`` as `model_chain` (default ``max_seq_len`` tokens, a ViT its own count, drawn by the Zipf law;
    1/vocab_size for uniformly random tokens).

    Raises:
        ValueError: a config of another scheme than "admin".
    """
    if cfg.scheme != "admin":
        raise ValueError(f"predicted_omegas takes a ModelConfig of scheme 'admin', got scheme {cfg.scheme!r}")
    model = build_model(dataclasses.replace(cfg, admin_mode="constant"), device="meta").eval()
    return omega_profile(cfg, lambda stack, memory: model.stack_chain(stack, memory, seq_len, token_collision))


def predict(model_or_cfg: nn.Module | ModelConfig, seq_len: int | None = None,
            token_collision: float | None = None) -> list[Record]:
    """Predicted records (layer 0 = embedding output, then one per sublayer) for a sigprop model, or for the
    model a `ModelConfig` builds (on the meta device), in the schema of `sigprop.diagnostics.measure`;
    arguments as `model_chain`. The model is read as it is: its init stds, residual weights, shaping values
    and train/eval mode (dropout). A causal stack is traced forward with one token covariance per pair of
    positions and backward with one gradient covariance per pair (`causal`; one without the forward per pair,
    shaped attention, forward with the exchangeable maps, and, as a Post-LN stack whose token correlation stays
    below COLLAPSED_CORR, backward with them too); bidirectional stacks with the exchangeable maps. An ``encdec``
    gives the encoder's records (stack "enc", embedding = the source's) then the decoder's ("dec"), as
    `measure` orders them.

    Args:
        model_or_cfg: a sigprop model, read as it is, or a `ModelConfig` (built on the meta device).
        seq_len: tokens per sequence (default the position table's size, ``max_seq_len``; source and target
            length for ``encdec``; unused by ``vit``).
        token_collision: P(two positions hold the same token); default the Zipf law over the vocabulary
            (natural text); 1/vocab_size for uniformly random tokens.

    Returns:
        One `Record` per map output, with the predicted ``fwd_mean``, ``fwd_var``, ``token_corr``, ``grad_var``.

    Raises:
        NotImplementedError: a module or option without an exact map, named (`docs/architectures.md` lists
            the knobs and what is refused).

    Cost, for N blocks (2N sublayers; 3N in an encdec decoder), L tokens, width d, head width d_k:
      * the model from a config: O(N) module constructions on the meta device and one init pass, which records
        each weight's std; the cyclic garbage collector is paused throughout (`gc_paused`), since each of its
        full collections would rescan these objects and all of torch, and resumes only once they are freed
        (else its first collection would scan them all on the way out);
      * the maps: O(N) scalar maps, forward then backward; an attention map is O(1) in L, its softmax
        functionals read at 6 + 12 fluctuation nodes off the Chebyshev table of (L, causal), which the first call
        per process builds from the exact quadrature: 20 row nodes over the L key counts and 10 × 10 pair nodes
        over the causal query pairs (their O(L²) key counts histogrammed once, then a Horner recursion over the
        L first counts);
      * a causal stack's per-position backward: O(N·L²), one L × L gradient covariance per sublayer;
      * a causal stack's forward per pair of positions: O(N·L²), one L × L token covariance per sublayer (per
        attention three prefix sums and its rows' softmax profiles at their own key spreads, 6 × L Chebyshev
        evaluations; per run of tokenwise maps its correlation map evaluated at 3 nodes and applied to every pair
        as the quadratic through them; per Post-LN sublayer the normalization of every pair);
      * DSLM's init rule (`sigprop.schemes.dslm`, cached per config, paid by `build_model` as well): the Monte
        Carlo token-Gram recursion at the config's T tokens, sampled at every k-th block (k = ⌊0.01/β²⌋ with
        β² = 1/N: every block up to 192 blocks, every 10th at 1000), R = 2048 query rows per sample in
        S·⌈R/(S·T)⌉ heads of T rows (S = 8 sampled Zipf sequences): per sample O(R·d·(T + d_k)) multiply-adds,
        O(R·d·(1 + 2d_k/T)) Gaussian draws, an O(T³) Cholesky factor per sequence and the MLP kernel on the S·T²
        Gram entries; between samples the stream in closed form, O(S·T²) per sample. For a deep DSLM model it
        is the largest part of a first call, at any T ≤ GRAM_MAX_TOKENS."""
    with gc_paused():
        return _predict(model_or_cfg, seq_len, token_collision)     # its model and maps are freed before gc resumes


def _predict(model_or_cfg: nn.Module | ModelConfig, seq_len: int | None, token_collision: float | None
             ) -> list[Record]:
    model = _as_model(model_or_cfg)
    L, collision = model.default_inputs(seq_len, token_collision)
    if isinstance(model, EncoderDecoder):
        enc_labels, enc, dec_labels, dec = encdec_trace(model, L, collision, START, START_GRAD)
        return to_records(enc_labels, enc, "enc") + to_records(dec_labels, dec, "dec")
    labels, chain = model_chain(model, seq_len, token_collision)
    causal = isinstance(model, DecoderLM)
    return to_records(labels, trace(chain, model.stack.placement, causal, L), "dec" if causal else "enc")
