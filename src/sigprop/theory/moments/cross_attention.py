"""Multi-head cross-attention: T queries from one stream read S keys/values of another (the memory).

Shapes: x (T, d) the decoder stream (moments m_q: μ_q, σ_q², r_q), y (S, d) the memory (m_kv), x and y
independent. Per head (d_k = d/H): q_i = W_q x_i, k_j = W_k y_j, v_j = W_v y_j, o_i = W_o Σ_j a_ij v_j with
a_ij = S'_ij − γ₂/S, S = softmax_j(q_i·k_j/τ), S' = S ⊙ mask/(1−p). Standard: γ₂ = 0, τ² = d_k; shaped
(`sigprop.nn.ShapedAttention` with ``identity=False``): no γ₁I term (queries and keys are different
tokens), τ² = τ₀² d d_k, centring C uniform over the S keys.

Derivation: `attention.Attention`'s (docs/moments.md §3), with the two roles it gives one stream split:
* Logits. y_j = m + s f_j (m shared by the memory tokens, s² = (1−r_kv)σ_kv², m₂ = μ_kv² + r_kvσ_kv²); with
  u_i = W_kᵀW_q x_i/τ the logits are u_i·m + β z_j, z_j = f_j·û_i i.i.d. N(0, 1), β² = s²|u_i|². So the key
  side gives s², m₂ and the query side |u_i|² (E|u|² = σ_q²σ_k² d² d_k (μ_q² + σ_q²)/τ²), its finite-width
  spread κ, and the correlation ρ = cos(u_i, u_i') ≈ (μ_q² + r_qσ_q²)/(μ_q² + σ_q²) of two queries' logit
  directions. Rows have S keys, none masked; the softmax functionals are those of a non-causal row of S.
* Forward: Var o = σ_v²[c² d m₂ + s²((d−1)R_s + C_s)], Cov o_i o_i' = σ_v²[(1−γ₂)² d m₂ + s²((d−2)R_c + C_c)],
  then W_o. Here the cross term m·Σa_j f_j vanishes exactly (m is independent of the queries and f),
  where self-attention needed the W → −W symmetry.
* Backward, to the decoder stream: the Q path alone, g_i = W_qᵀW_k Σ_j dY_ij y_j/τ (self-attention's
  formula, per query: it never involves T). To the memory: the V path W_vᵀ Σ_i a_ij g_i and the K path
  Σ_i dY_ij u_i, summed over the T queries and averaged over the S keys, so self-attention's per-key
  sums take the factor T/S and the pair sums T(T−1)/S:
      V: σ_v² d σ_g² (T/S)[R_s + r_g(T−1)R_c],  Cov: σ_v² d σ_g² (T/S)/(S−1)[c² − R_s + r_g(T−1)((1−γ₂)² − R_c)]
      K: H λ|u|²/d (T/S)[E w B + r_g(T−1) E w ρ̂ CK],  Cov = −Var/(S−1)  (Σ_j dY_ij = 0).
  The V–K cross term is dropped, as in self-attention (< 1% there); there are no Q–V/Q–K cross terms
  since the Q path reaches the other stream.
Approximations: those of `Attention` (Gaussian tokens, finite-width β² and ρ̂ fluctuations, dropped
cross terms); the self-attention transposed-logit effects (query i among its own keys) do not arise.
Measured against Monte Carlo: docs/moments.md §5 (family ``cross_attention``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .attention import Attention
from .state import Component, Mixing, Moments, check_size, ratio, replace


@dataclass(frozen=True)
class CrossAttention:
    """``T`` queries of width ``d`` attend to ``S`` memory tokens; Q/K/V/O weight variances, attention
    dropout ``p``, ``shaped`` (A = Softmax − γ₂C, τ = τ₀√(d·d_k)), ``exact`` as in `Attention`.

    ``fwd(m_q, m_kv)``: output moments (token correlation between two decoder tokens).
    ``bwd(m_q, m_kv, g_out)``: (m_q, m_kv) with the gradient moments sent to each input.
    """

    d: int
    n_heads: int
    T: int
    S: int
    q_var: float
    k_var: float
    v_var: float
    o_var: float
    p: float = 0.0
    shaped: bool = False
    tau0: float = 1.0
    gamma2: float = 1.0
    exact: bool = False

    def __post_init__(self) -> None:
        check_size("T", self.T)
        self.keys  # noqa: B018 - building the shared algebra validates the rest

    @cached_property
    def keys(self) -> Attention:
        """The shared algebra: a non-causal attention over the S keys, without the identity term."""
        return Attention(self.d, self.n_heads, self.S, self.q_var, self.k_var, self.v_var, self.o_var, p=self.p,
                         shaped=self.shaped, tau0=self.tau0, gamma1=0.0, gamma2=self.gamma2, exact=self.exact)

    def fwd(self, m_q: Moments, m_kv: Moments) -> Moments:
        a = self.keys
        return a.out_proj.fwd(a.mix_fwd(a.setup(m_q, m_kv), m_q))

    def bwd(self, m_q: Moments, m_kv: Moments, g_out: Moments) -> tuple[Moments, Moments]:
        a = self.keys
        st = a.setup(m_q, m_kv)
        g = a.out_proj.bwd(a.mix_fwd(st, m_q), g_out)
        q_var, q_cov = a.query_path(st, g, value_trace=True)
        v_var, v_cov = a.value_path(st, g, self.T)
        k_var, k_cov = a.key_path(st, g, self.T)
        kv_var = v_var + k_var
        return (replace(m_q, grad_var=q_var, grad_corr=ratio(q_cov, q_var)),
                replace(m_kv, grad_var=kv_var, grad_corr=ratio(v_cov + k_cov, kv_var)))


@dataclass(frozen=True)
class QueryView(Component):
    """``attention`` as a one-input map of the query stream, reading a fixed ``memory``: a `Component`."""

    attention: CrossAttention
    memory: Moments

    def fwd(self, m: Moments) -> Moments:
        return self.attention.fwd(m, self.memory)

    def token_mixing(self) -> Mixing:
        """Tokenwise over the query positions: row i reads its own query and the memory, which every row shares."""
        return Mixing.TOKENWISE

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.attention.bwd(m_in, self.memory, g_out)[0]


@dataclass(frozen=True)
class MemoryView(Component):
    """``attention`` as a one-input map of the memory, queried by a fixed ``query`` stream: a `Component`
    whose output is the query stream's (T tokens) and whose backward is the memory's gradient."""

    attention: CrossAttention
    query: Moments

    def fwd(self, m: Moments) -> Moments:
        return self.attention.fwd(self.query, m)

    def token_mixing(self) -> Mixing:
        """Every query row reads every memory position."""
        return Mixing.ALL

    def bwd(self, m_in: Moments, g_out: Moments) -> Moments:
        return self.attention.bwd(self.query, m_in, g_out)[1]
