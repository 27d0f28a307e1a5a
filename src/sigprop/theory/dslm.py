"""DeepScaleLM's depth recursion of the token correlation (Kedia et al., ICML 2024), at finite length.

DSLM sets the value–output gain of block l from r_l, the token correlation entering it: the attention
output variance per unit gain is G(r_l) (`attention_gain`), so d²σ_v²σ_o² G(r_l) = 1 − p gives a unit
branch. The authors take G = r and an attention output correlation of 1 (L → ∞ keys, no mask); here
both come from the finite-length maps, for L keys per row (query i sees i keys when causal):

  G(r)     = r + (1 − r)((d − 1)F2 + Z1)/d            (`sigprop.theory.moments.attention.attention_gain`)
  r_out(r) = (r + (1 − r)((d − 2)ā e^{r(1−r)} + r(1 − r))/d) / G(r)

ā e^{ρβ²} is the mean overlap E⟨a_i, a_i'⟩ of two rows (`Attention`'s K1): ā the overlap of rows with
E a_ij = 1/n_i (`pair_overlap`), times E[e^{z+z'}]/(E e^z)² = e^{ρβ²} for two queries' logits on one key
(log-normal weights, logit variance β² = 1 − r, correlation ρ = r between queries); r(1 − r) is the
large-L value of the shared-logit term (`Attention`'s K2 → ρβ²).
Against Monte Carlo of a real layer r_out is within 0.03 of the layer's output correlation, where DSLM's r_out = 1
is not (tests/test_moments_dslm.py; the figures over L = 16–128, r = 0–0.6: docs/moments.md §7).

Recursion over the blocks of a stack, residual x ← λx + β·D(f(x)) (λ² + β² = 1, dropout p):
  r₀ given (embedding output);  per attention sublayer r ← λ²r + β²(1 − p)·r_out(r);
  MLP r ← λ²r + β²(1 − p)·κ(r), κ the MLP's normalized kernel, applied per population of token pairs
  (same token / different tokens), since κ is not linear.

**Token Gram recursion** (`gram_correlations`, used for T ≤ ``GRAM_MAX_TOKENS``). The mean recursion above sees
one number per population of token pairs; a causal stack builds position-dependent correlations (late positions
average many shared keys and grow alike) and one embedding table makes repeated tokens identical, and the gain is
not linear in the pair correlations: on GPT-2/LLaMA/sigprop decoders the mean recursion leaves attention branches
above 1 (measured in docs/hf.md). The Gram recursion carries the whole expected token Gram matrix V (T × T) of S
sampled sequences instead, with each attention sublayer evaluated on Gaussian tokens of that Gram at the model's
width:

  embedding  V_jj' = (1 − p)([t_j = t_j'] + S_sh + (T_tab − 1 − S_sh)[j = j'])/T_tab off the diagonal, 1 on it,
             tokens t drawn from the Zipf law the scheme assumes (`sigprop.theory.moments.embedding.zipf_ids`);
  attention  given V̂ = norm(V) (Pre-LN: the branch's input; Post-LN: the stream), tokens at the model's width d
             with that Gram, X = L Z (L Lᵀ = V̂, Z i.i.d. N(0, 1)), each normalized to |x|² = d; fresh N(0, 1/d)
             query/key weights, A = Softmax(QKᵀ/√d_k) under the mask; averaging over W_V, W_O exactly, the branch
             Gram is E[A X Xᵀ Aᵀ]/d and the gain G_l its mean diagonal (Monte Carlo over X and the logits:
             ``rows`` query rows per block, a fixed seed). Finite-width tokens keep the coupling between the
             logits and the values' own Gram, O(1/d), largest when r → 0 and T ~ d (its size: docs/moments.md §7);
  MLP        V̂ ↦ κ(V̂) entrywise (the MLP's normalized kernel), unit diagonal;
  residual   V ← λ²V + β²·D(branch/gain) (dropout keeps the diagonal, scales the rest by 1 − p); Post-LN
             normalizes V after each add; a norm on the branch output ("out", "sandwich") adds the branch Gram
             normalized per token, norm(branch), instead of branch/gain (its centering under LayerNorm moves a
             correlation by O((1 − r²)/d), `sigprop.theory.moments.norm`, and is left out).
Its cost is O(evaluations · samples · T²(T + d)), hence the bound on T; longer sequences take the mean recursion.

**Evaluation spacing** (`evaluation_spacing`, `_advance`). Every add moves V by β²(Y − V), Y the branch's
normalized Gram, so along the recursion the branches Y_s (attention: B(V̂)/G; MLP: κ(V̂)) and the gain change by
O(β²) per block: in depth time t = l·β² the recursion is a discretization with step β². The attention Gram is
therefore sampled only at blocks at most k = ⌊tol/β²⌋ apart (tol = ``SKIP_TOLERANCE`` bounds the branch weight
k·β² added between two samples; k = 1 is the recursion above, block by block, e.g. for 192 blocks, β² = 1/192).
Between samples at blocks a and b = a + h (h ≤ k) block a + j adds Y_s,a + j·Δ_s, Δ_s the per-block slope of Y_s
over the previous interval (0 in the first). Each add is entrywise affine, x ← c x + e·D(Y) (Pre-LN c = λ²,
e = β²; Post-LN both divided by √(ν_i ν_j), ν = λ² + β² diag Y on the unit-diagonal stream, taken at the
interval's middle), so a block is x ← q x + w + j·w' and the h blocks sum in closed form,
x_b = q^h x_a + w (1 − q^h)/(1 − q) + w' (q^h − h q + h − 1)/(1 − q)²; V̂_l and G_l in between are interpolated
linearly. Error: the second differences of Y are O(β⁴) per block², so extrapolating over j < k blocks misses Y by
≤ k²·O(β⁴), which enters V with weight β² per block: O(k²β⁴·Nβ²) = O((kβ²)²·t_N) over N blocks (t_N = Nβ², times
e^{Lipschitz · t_N}); the first interval, held, misses Y by k·O(β²) for k blocks, O((kβ²)²) once; the
interpolated G_l and V̂_l add (k²/8)·O(β⁴) = O((kβ²)²); the frozen Post-LN factor is off by O(kβ²·β²) per block,
with mean 0 over the interval. So every error is O(tol²) times depth-time derivatives of G and V, while
G_l's Monte-Carlo error is σ_h/√H (σ_h the spread of one head's gain, H = S·⌈rows/(S·T)⌉ heads per sample).
Sampling k times less often leaves that error as it is for G_l (an interpolation of two draws) and multiplies V's
by ≈ √k (N/k draws, each entering with weight ≈ kβ²).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch

from .moments.attention import attention_gain

GRAM_MAX_TOKENS = 256      # above it the O(T²(T + d)) Gram recursion costs seconds per block: the mean recursion
SKIP_TOLERANCE = 0.01      # branch weight k·β² between two Monte-Carlo evaluations of the attention Gram


def pair_overlap(L: int, causal: bool) -> float:
    """ā = mean over query pairs i ≠ i' of Σ_j E[a_ij]E[a_i'j], with E a_ij = 1/n_i (exchangeable keys):
    Σ over shared keys of 1/(n_i n_i') = 1/max(n_i, n_i'). Causal: (L − H_L)/C(L, 2), H_L the harmonic
    number; bidirectional: 1/L."""
    if L < 2:
        return 1.0
    if not causal:
        return 1.0 / L
    harmonic = sum(1.0 / m for m in range(1, L + 1))
    return (L - harmonic) / (L * (L - 1) / 2)


def attention_correlation(r: float, L: int | None, causal: bool, d: int, n_heads: int) -> tuple[float, float]:
    """(G, r_out): the attention gain at input correlation ``r`` and the output token correlation over ``L`` keys;
    ``L=None`` is the authors' limit (G = r, r_out = 1)."""
    if L is None:
        return r, 1.0
    g = attention_gain(r, L, causal, d, n_heads)
    shared = r * (1.0 - r)                       # ρβ²: logit covariance of two queries on one key
    cov = r + (1.0 - r) * ((d - 2) * pair_overlap(L, causal) * math.exp(shared) + shared) / d
    return g, min(1.0, cov / g)


def block_correlations(pairs: tuple[tuple[float, float], ...], n_blocks: int, lam: float, beta: float, p: float,
                       L: int | None, causal: bool, d: int, n_heads: int, ffn_kernel: Callable[[float], float],
                       attentions: int = 1) -> tuple[tuple[float, float], ...]:
    """(r_l, G_l) entering every block l < ``n_blocks``: the mean input correlation and the attention gain there.

    ``pairs``: (weight, correlation) of each population of token pairs after the embeddings, weights summing
    to 1: with Zipf tokens and T summed tables, pairs holding the same token start at (1 − p)/T and the others
    at 0. Attention mixes over all keys, so its output correlation follows the mean r̄ = Σ w_k r_k; the MLP
    kernel acts on each population (κ is convex: for one table, a single r̄ = P(same) through κ would miss
    the same-token pairs' κ(1) = 1). ``attentions``: attention sublayers per block before the MLP (2 in an
    encoder–decoder's decoder, whose cross-attention is given the self-attention's rule). ``ffn_kernel``: κ.
    """
    weights = [w for w, _ in pairs]
    rs, out = [r for _, r in pairs], []
    for _ in range(n_blocks):
        for i in range(attentions):
            mean = sum(w * r for w, r in zip(weights, rs))
            g, r_out = attention_correlation(mean, L, causal, d, n_heads)
            if i == 0:
                out.append((mean, g))
            rs = [lam ** 2 * r + beta ** 2 * (1 - p) * r_out for r in rs]
        rs = [lam ** 2 * r + beta ** 2 * (1 - p) * ffn_kernel(r) for r in rs]
    return tuple(out)


def embedding_grams(tokens: torch.Tensor | None, n_tokens: int, n_tables: int, shared: int, p: float,
                    r0: float | None = None) -> torch.Tensor:
    """(S, T, T) float64 expected Gram matrices of the embedding output (module docstring), unit diagonal.

    ``tokens``: (S, T) ids (their equalities matter), or None with ``r0``: one sequence of uniform correlation
    (1 − p)·r0 (``dslm_r0``; 0 for a ViT's independent patches)."""
    eye = torch.eye(n_tokens, dtype=torch.float64)
    if tokens is None:
        off = (1 - p) * (r0 or 0.0)
        return (off * (1 - eye) + eye)[None]
    same = (tokens[:, :, None] == tokens[:, None, :]).to(torch.float64)
    positional = n_tables - 1 - shared
    v = (1 - p) * (same + shared + positional * eye) / n_tables
    return v * (1 - eye) + eye


def _normalized(v: torch.Tensor) -> torch.Tensor:
    d = v.diagonal(dim1=-2, dim2=-1).clamp_min(1e-300).sqrt()
    return v / d[..., :, None] / d[..., None, :]


def _mean_offdiagonal(v: torch.Tensor) -> float:
    n = v.shape[-1]
    diag = v.diagonal(dim1=-2, dim2=-1).sum(-1)
    return float(((v.sum((-2, -1)) - diag) / (n * (n - 1))).mean()) if n > 1 else 1.0


def _cholesky(v: torch.Tensor) -> torch.Tensor:
    """L with L Lᵀ = V + εI for the smallest ε ∈ {1e-9, 1e-7, 1e-5} that factors: repeated tokens (one embedding
    table) make a Gram singular; ε ≤ 1e-5 moves each correlation by at most 1e-5."""
    eye = torch.eye(v.shape[-1], dtype=v.dtype)
    for eps in (1e-9, 1e-7, 1e-5):
        chol, info = torch.linalg.cholesky_ex(v + eps * eye)
        if not bool(info.any()):
            return chol
    raise ValueError("gram_correlations: a token Gram matrix is not positive semi-definite")


def attention_gram(vhat: torch.Tensor, d: int, n_heads: int, causal: bool, draws: int,
                   generator: torch.Generator) -> torch.Tensor:
    """E[A X Xᵀ Aᵀ]/d for (S, T, T) normalized Grams ``vhat``, ``draws`` heads per sequence: tokens X = L Z, L Lᵀ =
    V̂, Z ∈ R^{T×d} i.i.d. N(0, 1), each row rescaled to |x|² = d (the norm in front of the branch), logits
    (X W_q)(X W_k)ᵀ/√d_k with fresh N(0, 1/d) weights, A = Softmax under the mask; W_V W_O averaged exactly.
    Sampling the tokens at the model's width keeps the coupling between the logits and the values' own
    finite-width Gram X Xᵀ/d (the Z1/d term of `sigprop.theory.moments.attention.attention_gain`), largest at
    r → 0 and T comparable to d."""
    s, t, _ = vhat.shape
    dk = d // n_heads
    chol = _cholesky(vhat).to(torch.float32)[:, None]                                  # (S, 1, T, T)
    x = chol @ torch.randn(s, draws, t, d, generator=generator)                       # (S, draws, T, d)
    x = x * (math.sqrt(d) / x.norm(dim=-1, keepdim=True))
    wq, wk = (torch.randn(s, draws, d, dk, generator=generator) / math.sqrt(d) for _ in range(2))
    logits = (x @ wq) @ (x @ wk).transpose(-1, -2) / math.sqrt(dk)                    # (S, draws, T, T)
    if causal:
        logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    ax = logits.softmax(-1) @ x                                                        # (S, draws, T, d)
    return (ax @ ax.transpose(-1, -2) / d).mean(1).to(torch.float64)


def evaluation_spacing(beta: float, tolerance: float = SKIP_TOLERANCE) -> int:
    """k = max(1, ⌊tolerance/β²⌋): the blocks between two Monte-Carlo evaluations of the attention Gram, so that
    the branch weight k·β² added between them stays ≤ ``tolerance`` (module docstring, "Evaluation spacing")."""
    return max(1, math.floor(tolerance / beta ** 2 + 1e-9))


def gram_blocks(grams: torch.Tensor, n_blocks: int, lam: float, beta: float, p: float, causal: bool, d: int,
                n_heads: int, ffn_kernel: Callable[[torch.Tensor], torch.Tensor], attentions: int = 1,
                post: bool = False, branch_norm: bool = False, rows: int = 2048, seed: int = 0,
                tolerance: float = SKIP_TOLERANCE) -> Iterator[tuple[torch.Tensor, float]]:
    """(V̂_l, G_l) entering every block: the (S, T, T) normalized Gram of the attention input and its gain, by the
    Gram recursion of the module docstring from the embedding ``grams`` (S, T, T). ``ffn_kernel`` acts entrywise
    on a tensor of correlations; ``post``: Post-LN (the stream is normalized after every add); ``branch_norm``: a
    norm on each branch's output (the branch Gram is added normalized per token); ``rows``: query
    rows sampled per attention sublayer, in heads of T rows (Monte Carlo error of G_l: the spread of one head's
    gain over √heads). ``tolerance``: the branch weight k·β² between two samples (`evaluation_spacing`); between
    them V̂_l and G_l are interpolated linearly (module docstring)."""
    yield from _per_block(_samples(grams, n_blocks, lam, beta, p, causal, d, n_heads, ffn_kernel, attentions, post,
                                   branch_norm, rows, seed, evaluation_spacing(beta, tolerance)), lambda vhat: vhat)


def _per_block(samples: Iterator[tuple[int, torch.Tensor, float]], reduce: Callable[[torch.Tensor], Any]
               ) -> Iterator[tuple[Any, float]]:
    """(reduce(V̂_l), G_l) for every block from the sampled blocks' (l, V̂_l, G_l), linearly interpolated between
    two samples (``reduce`` is linear: the Gram itself, or its mean correlation)."""
    last = None
    for block, vhat, g in samples:
        x = reduce(vhat)
        if last is not None:
            b0, x0, g0 = last
            for j in range(1, block - b0):
                w = j / (block - b0)
                yield (1 - w) * x0 + w * x, (1 - w) * g0 + w * g
        yield x, g
        last = block, x, g


def _samples(grams: torch.Tensor, n_blocks: int, lam: float, beta: float, p: float, causal: bool, d: int,
             n_heads: int, ffn_kernel: Callable[[torch.Tensor], torch.Tensor], attentions: int, post: bool,
             branch_norm: bool, rows: int, seed: int, every: int) -> Iterator[tuple[int, torch.Tensor, float]]:
    """(l, V̂_l, G_l) at the blocks l where the attention Gram is sampled: every block when ``every`` is 1, else
    blocks at most ``every`` apart, the first and the last among them, with the stream carried from one to the
    next by `_advance` (module docstring)."""
    s, t, _ = grams.shape
    draws = max(1, math.ceil(rows / (s * t)))
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(t, dtype=torch.float64)
    mask = (1 - p) * (1 - eye) + eye                  # dropout keeps the diagonal, scales the rest by 1 − p
    v = grams.clone()

    def add(v: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        v = lam ** 2 * v + beta ** 2 * (branch * mask)
        return _normalized(v) if post else v

    def branches(v: torch.Tensor) -> tuple[torch.Tensor, float, list[torch.Tensor], torch.Tensor]:
        """V̂ and G at the input of a block with stream Gram ``v``, each sublayer's normalized branch Gram Y_s,
        and the stream before the MLP's add."""
        found = []
        for i in range(attentions):
            vhat = _normalized(v)
            branch = attention_gram(vhat, d, n_heads, causal, draws, gen)
            g = float(branch.diagonal(dim1=-2, dim2=-1).mean())
            if i == 0:
                first = vhat, g
            found.append(_normalized(branch) if branch_norm else branch / g)
            v = add(v, found[-1])
        found.append(ffn_kernel(_normalized(v)) * (1 - eye) + eye)
        return *first, found, v

    if every == 1:
        for block in range(n_blocks):
            vhat, g, found, v = branches(v)
            yield block, vhat, g
            v = add(v, found[-1])
        return
    if n_blocks == 0:
        return
    intervals = math.ceil((n_blocks - 1) / every)
    sampled = [i * (n_blocks - 1) // intervals for i in range(intervals + 1)] if intervals else [0]
    previous: list[torch.Tensor] = []
    for i, block in enumerate(sampled):
        vhat, g, found, _ = branches(v)
        yield block, vhat, g
        if i == intervals:
            return
        slopes = [(y - y0) / (block - sampled[i - 1]) for y, y0 in zip(found, previous)] if i else None
        v = _advance(v, found, slopes, sampled[i + 1] - block, lam, beta, mask, post)
        previous = found


def _advance(v: torch.Tensor, found: list[torch.Tensor], slopes: list[torch.Tensor] | None, h: int, lam: float,
             beta: float, mask: torch.Tensor, post: bool) -> torch.Tensor:
    """The stream Gram after ``h`` blocks from ``v`` when block j's sublayer s adds the branch Gram Y_s + j·Δ_s
    (``found``: the Y_s, attention sublayers then the MLP; ``slopes``: the Δ_s, None for 0). Each add is entrywise
    affine, x ← c_s x + e_s D(Y) (``mask``: the dropout factor D), so a block is x ← q x + w + j·w' and the h blocks
    sum in closed form (module docstring, "Evaluation spacing"). Under Post-LN c_s and e_s carry the rank-one factor
    1/√(ν_a ν_b), so q and the weights of w, w' are outer products of per-token vectors."""
    n = len(found)
    # weights[s] = e_s Π_{s' > s} c_s' and q = Π_s c_s, as scalars (Pre-LN) or per-token vectors t with entry (a, b)
    # carrying t_a t_b (Post-LN: t = Π_{s' ≥ s} 1/√ν_s', ν = λ² + β² Y_s,aa on the unit-diagonal stream)
    scalars = [beta ** 2 * lam ** (2 * (n - 1 - i)) for i in range(n)]
    if post:
        diagonals = [y.diagonal(dim1=-2, dim2=-1) for y in found]
        if slopes is not None:                          # Y_s at the interval's middle
            diagonals = [y + (h - 1) / 2 * dy.diagonal(dim1=-2, dim2=-1) for y, dy in zip(diagonals, slopes)]
        tails, acc = [], None
        for y in reversed(diagonals):
            acc = (lam ** 2 + beta ** 2 * y).rsqrt() if acc is None else acc * (lam ** 2 + beta ** 2 * y).rsqrt()
            tails.insert(0, acc)                                                                # (S, T)

        def weighted(x: torch.Tensor, i: int) -> torch.Tensor:
            t = tails[i] * math.sqrt(scalars[i])
            return x * t[..., :, None] * t[..., None, :]

        q = lam ** (2 * n) * (tails[0][..., :, None] * tails[0][..., None, :])
        qh = lam ** (2 * n * h) * (tails[0] ** h)[..., :, None] * (tails[0] ** h)[..., None, :]
    else:
        def weighted(x: torch.Tensor, i: int) -> torch.Tensor:
            return scalars[i] * x

        q = lam ** (2 * n)
        qh = q ** h
    v = qh * v + (1 - qh) / (1 - q) * (sum(weighted(y, i) for i, y in enumerate(found)) * mask)   # Σ_{j<h} q^{h−1−j}
    if slopes is not None:
        ramp = (qh - h * q + (h - 1)) / (1 - q) ** 2                                            # Σ_{j<h} j q^{h−1−j}
        v = v + ramp * (sum(weighted(dy, i) for i, dy in enumerate(slopes)) * mask)
    return _normalized(v) if post else v


def gram_correlations(grams: torch.Tensor, n_blocks: int, lam: float, beta: float, p: float, causal: bool, d: int,
                      n_heads: int, ffn_kernel: Callable[[torch.Tensor], torch.Tensor], attentions: int = 1,
                      post: bool = False, branch_norm: bool = False, rows: int = 2048, seed: int = 0,
                      tolerance: float = SKIP_TOLERANCE) -> tuple[tuple[float, float], ...]:
    """(r_l, G_l) entering every block: `gram_blocks` with each Gram reduced to its mean token correlation."""
    return tuple(_per_block(_samples(grams, n_blocks, lam, beta, p, causal, d, n_heads, ffn_kernel, attentions, post,
                                     branch_norm, rows, seed, evaluation_spacing(beta, tolerance)),
                            _mean_offdiagonal))
