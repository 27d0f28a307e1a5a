"""Monte-Carlo reference for `sigprop.theory.moments`: real torch ops on sampled Gaussian tokens.

Each family builds (label, component, input moments, upstream-gradient moments, simulator)
cases; `family_rows` runs the real op in float64 with fixed seeds, back-propagates a random
upstream gradient with the given variance/correlation, and compares pooled empirical moments
(over samples, tokens, features; fresh weights per sample) with the theory, as `ErrorRow`s
whose ``se`` is the Monte-Carlo standard error (10 blocks of samples).

    python tests/moments_mc.py [family ...]     # the error table of docs/moments.md (all families)
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from moment_errors import ErrorRow, error_table, format_error_table
from sigprop.nn import ShapedReLU as ShapedReLUModule
from sigprop.theory.moments import (
    Attention,
    Component,
    CrossAttention,
    Dropout,
    Embedding,
    GeLU,
    LayerNorm,
    Linear,
    Moments,
    PostNormResidual,
    ReLU,
    Residual,
    RMSNorm,
    ShapedReLU,
    Softmax,
    attention_block,
    ffn_block,
    serial,
    zipf_collision_probability,
)

DT = torch.float64
Sim = Callable[[torch.Tensor, torch.Generator], torch.Tensor]   # (input, gen) -> output, differentiable


def gaussian(shape: tuple[int, int, int], mean: float, var: float, corr: float, gen: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, L, d) with i.i.d. features, per-feature N(mean, var), token correlation corr (axis 1), and
    per-sample control variates (S, 2) with mean 0: the mean and mean square − 1 of the shared factor."""
    s, n, d = shape
    if corr >= 0:
        common = torch.randn(s, 1, d, generator=gen, dtype=DT)
        own = torch.randn(s, n, d, generator=gen, dtype=DT)
        x = mean + math.sqrt(var) * (math.sqrt(corr) * common + math.sqrt(1 - corr) * own)
        return x, torch.stack([common.mean((1, 2)), (common ** 2).mean((1, 2)) - 1], -1)
    cov = (1 - corr) * torch.eye(n, dtype=DT) + corr * torch.ones(n, n, dtype=DT)
    x = mean + math.sqrt(var) * (torch.linalg.cholesky(cov) @ torch.randn(s, n, d, generator=gen, dtype=DT))
    return x, torch.zeros(s, 0, dtype=DT)


def pooled(y: torch.Tensor, controls: torch.Tensor, blocks: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled (mean, var, cov between different tokens) and their standard errors over sample blocks.

    Per-sample statistics are regressed on the zero-mean control variates (the shared factors of the
    sampled inputs/gradients, which dominate the noise when corr > 0) and the fit is subtracted: same
    expectation, several times smaller standard error.
    """
    y = y.detach()
    c = y - y.mean()
    n = y.shape[1]
    per = torch.stack([y.mean((1, 2)), (c ** 2).mean((1, 2)),
                       ((c.sum(1) ** 2 - (c ** 2).sum(1)) / (n * (n - 1))).mean(-1)], -1)   # (S, 3)
    if controls.shape[1]:
        xc = controls - controls.mean(0)
        per = per - controls @ torch.linalg.lstsq(xc, per - per.mean(0)).solution
    b = per[: per.shape[0] // blocks * blocks].reshape(blocks, -1, 3).mean(1)
    return per.mean(0), b.std(0) / math.sqrt(blocks)


@dataclass(frozen=True)
class Case:
    label: str
    component: Component
    m: Moments                 # input forward moments; grad fields = upstream gradient moments
    sim: Sim
    shape: tuple[int, int, int]
    backward: bool = True
    others: tuple[tuple[str, Component], ...] = ()     # alternative theories scored on the same samples
    normalize_input: bool = False     # feed LayerNorm(sample) (fixed norm, mean-free); theory input = LayerNorm.fwd(m)
    project_upstream: bool = False    # upstream gradient ⊥ 1 and ⊥ the output token (a next Post-LN sublayer's)


def _rows(name: str, comp: Component, m: Moments, emp: torch.Tensor, se: torch.Tensor,
          gemp: torch.Tensor | None, gse: torch.Tensor | None) -> list[ErrorRow]:
    out = comp.fwd(m)
    rows = [ErrorRow(name, "mean", out.mean, float(emp[0]), math.sqrt(float(emp[1])), float(se[0])),
            ErrorRow(name, "var", out.var, float(emp[1]), 0.0, float(se[1])),
            ErrorRow(name, "cov", out.cov, float(emp[2]), float(emp[1]), float(se[2]))]
    if gemp is not None:
        grad = comp.bwd(m, Moments(out.mean, out.var, out.corr, m.grad_var, m.grad_corr))
        rows += [ErrorRow(name, "grad_var", grad.grad_var, float(gemp[1]), 0.0, float(gse[1])),
                 ErrorRow(name, "grad_cov", grad.grad_cov, float(gemp[2]), float(gemp[1]), float(gse[2]))]
    return rows


def case_rows(family: str, case: Case, seed: int = 0) -> list[ErrorRow]:
    """Simulate one case; rows for ``family`` (our theory) and for each of ``case.others``."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)                                    # F.dropout uses the global generator
    x, cx = gaussian(case.shape, case.m.mean, case.m.var, case.m.corr, gen)
    m = case.m
    if case.normalize_input:
        x, m = F.layer_norm(x, x.shape[-1:], eps=1e-12), LayerNorm(x.shape[-1]).fwd(case.m)
    x.requires_grad_(True)
    y = case.sim(x, gen)
    emp, se = pooled(y, cx)
    gemp = gse = None
    if case.backward:
        g, cg = gaussian(y.shape, 0.0, case.m.grad_var, case.m.grad_corr, gen)
        if case.project_upstream:
            yhat = y.detach() / y.detach().norm(dim=-1, keepdim=True)
            g = g - g.mean(-1, keepdim=True)
            g = (g - (g * yhat).sum(-1, keepdim=True) * yhat) * math.sqrt(y.shape[-1] / (y.shape[-1] - 2))
        (y * g).sum().backward()
        gemp, gse = pooled(x.grad, torch.cat([cx, cg], 1))
    return [row for name, comp in ((family, case.component), *case.others)
            for row in _rows(name, comp, m, emp, se, gemp, gse)]


def family_rows(family: str, cases: list[Case]) -> list[ErrorRow]:
    return [row for i, case in enumerate(cases) for row in case_rows(family, case, seed=i)]


# ------------------------------------------------------------- the authors' coded formulas, to score
@dataclass(frozen=True)
class AuthorsLayerNorm:
    """Authors: r' = r(1 − 1/d), σ_g'² = σ_g²/σ², r_g' = r_g."""

    d: int

    def fwd(self, m: Moments) -> Moments:
        return replace(m, mean=0.0, var=1.0, corr=m.corr * (1 - 1 / self.d))

    def bwd(self, m_in: Moments, g: Moments) -> Moments:
        return replace(m_in, grad_var=g.grad_var / m_in.var, grad_corr=g.grad_corr)


@dataclass(frozen=True)
class AuthorsSoftmax:
    """Authors' V1 ("approx") or V2 ("full") softmax variance and backward variance; corr as ours."""

    L: int
    full: bool

    def _var(self, m: Moments) -> float:
        v, n = (1 - m.corr) * m.var, self.L
        if not self.full:
            return (math.exp(v) - 1) / n ** 2
        e = math.exp(v * n / (n - 1))
        return (e - 1) * e * e / ((n - 1) * math.exp(v) + 1) ** 2

    def fwd(self, m: Moments) -> Moments:
        return replace(m, mean=1 / self.L, var=self._var(m), corr=-1 / (self.L - 1))

    def bwd(self, m_in: Moments, g: Moments) -> Moments:
        v = (1 - m_in.corr) * m_in.var
        jac = self._var(m_in) + self.L ** -2 if self.full else math.exp(v) / self.L ** 2
        return replace(m_in, grad_var=g.grad_var * jac, grad_corr=-1 / (self.L - 1))


@dataclass(frozen=True)
class AuthorsAttention:
    """Authors' single-head formulas (DeepScaleLM's public code) per head, then the output projection; zero-mean
    input."""

    d: int
    L: int
    q_var: float
    k_var: float
    v_var: float
    o_var: float
    p: float = 0.0

    def fwd(self, m: Moments) -> Moments:
        d, n, p, v, r = self.d, self.L, self.p, m.var, m.corr
        s2 = d * v * self.q_var * self.k_var
        var = d * self.v_var * (((1 - r) ** 2 * (n - 1) * s2 * v * v + math.exp((1 - r) * d * s2 * v) / (1 - p)
                                 * (4 * (1 - r) ** 2 * s2 * v * v + (1 - r) * v)) / n + r * v)
        cov = d * self.v_var * (r * v + (2 * (1 - r) ** 2 * d * self.q_var * self.k_var * v ** 3 + (1 - r) * v) / n)
        return Linear(d, d, self.o_var).fwd(replace(m, mean=0.0, var=var, corr=cov / var))

    def bwd(self, m_in: Moments, g: Moments) -> Moments:
        d, n, p, rg = self.d, self.L, self.p, g.grad_corr
        head = d * self.o_var * g.grad_var
        var = head * d * self.v_var * (1 + (n - 1) * rg * (1 - p)) / (n * (1 - p))
        cov = head * d * self.v_var * (1 + (n - 1) * rg) / n
        return replace(m_in, grad_var=var, grad_corr=cov / var)


# ----------------------------------------------------------------------------------------- simulators
def linear_sim(d_in: int, d_out: int, w_var: float) -> Sim:
    def sim(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        w = torch.randn(x.shape[0], d_in, d_out, generator=gen, dtype=DT) * math.sqrt(w_var)
        return x @ w                                     # nn.Linear with fresh N(0, w_var) weights per sample
    return sim


def reference_attention(d: int, heads: int, q_var: float, k_var: float, v_var: float, o_var: float, p: float = 0.0,
                        causal: bool = False, shaped: bool = False, tau0: float = 1.0, gamma1: float = 1.0,
                        gamma2: float = 1.0) -> Sim:
    """Multi-head attention in plain torch ops, fresh weights per sample, dropout on the probabilities."""
    dk = d // heads

    def sim(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        s, n, _ = x.shape
        w = [torch.randn(s, d, d, generator=gen, dtype=DT) * math.sqrt(v) for v in (q_var, k_var, v_var, o_var)]
        q, k, v = ((x @ wi).view(s, n, heads, dk).transpose(1, 2) for wi in w[:3])     # (S, H, L, dk)
        logits = q @ k.transpose(-1, -2) / (tau0 * math.sqrt(d * dk) if shaped else math.sqrt(dk))
        visible = torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n, dtype=torch.bool)
        a = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1)           # (S, H, L, L)
        keep = (torch.rand(a.shape, generator=gen, dtype=DT) >= p).to(DT) / (1 - p)
        a = a * keep
        if shaped:
            a = a + gamma1 * torch.eye(n, dtype=DT) - gamma2 * visible.to(DT) / visible.sum(-1, keepdim=True)
        o = (a @ v).transpose(1, 2).reshape(s, n, d)
        return o @ w[3]
    return sim


def ffn_sim(d: int, d_ff: int, w1: float, w2: float, act: Callable[[torch.Tensor], torch.Tensor], p: float) -> Sim:
    def sim(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        h = act(linear_sim(d, d_ff, w1)(x, gen))
        return F.dropout(linear_sim(d_ff, d, w2)(h, gen), p, training=True)
    return sim


def residual_sim(alpha: float, beta: float, branch: Sim) -> Sim:
    return lambda x, gen: alpha * x + beta * branch(x, gen)


def then(*sims: Sim) -> Sim:
    def sim(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        for s in sims:
            x = s(x, gen)
        return x
    return sim


def pointwise(fn: Callable[[torch.Tensor], torch.Tensor]) -> Sim:
    return lambda x, gen: fn(x)


def embedding_sim(vocab: int, var: float, segment: bool) -> Sim:
    """Token table (Zipf ids) + position table (+ one segment row shared by all tokens); x gives the shape."""
    def sim(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        s, n, d = x.shape
        zipf = 1.0 / torch.arange(1, vocab + 1, dtype=DT)
        ids = torch.multinomial(zipf / zipf.sum(), s * n, replacement=True, generator=gen).view(s, n)
        table = torch.randn(s, vocab, d, generator=gen, dtype=DT) * math.sqrt(var)
        position = torch.randn(s, n, d, generator=gen, dtype=DT) * math.sqrt(var)
        y = torch.gather(table, 1, ids[..., None].expand(s, n, d)) + position
        return y + torch.randn(s, 1, d, generator=gen, dtype=DT) * math.sqrt(var) if segment else y
    return sim


# ------------------------------------------------------------------------------------------- families
def _rg(i: int) -> float:
    return (0.0, 0.4)[i % 2]


def linear_cases() -> list[Case]:
    grid = [(d_in, mu, var, r) for d_in in (16, 64) for mu in (0.0, 0.7) for var in (0.5, 2.0) for r in (0.0, 0.5, 0.9)]
    return [Case(f"d{d_in} mu{mu} var{var} r{r}", Linear(d_in, 32, 1.5 / d_in), Moments(mu, var, r, 1.5, _rg(i)),
                 linear_sim(d_in, 32, 1.5 / d_in), (2000, 8, d_in)) for i, (d_in, mu, var, r) in enumerate(grid)]


def activation_cases(name: str) -> list[Case]:
    comp, fn, means = {"relu": (ReLU(), F.relu, (0.0, 0.5, -0.5)), "gelu": (GeLU(), F.gelu, (0.0,)),
                       "shaped_relu": (ShapedReLU(16), ShapedReLUModule(16).double(), (0.0, 0.5))}[name]
    grid = [(mu, var, r) for mu in means for var in (0.25, 4.0) for r in (-0.5, 0.0, 0.5, 0.95)]
    return [Case(f"mu{mu} var{var} r{r}", comp, Moments(mu, var, r, 1.0, _rg(i)), pointwise(fn), (4096, 2, 128))
            for i, (mu, var, r) in enumerate(grid)]


def norm_cases(name: str) -> list[Case]:
    means = (0.0, 1.0) if name == "layernorm" else (0.0,)
    grid = [(d, mu, var, r) for d in (8, 32, 256) for mu in means for var in (0.5, 2.0) for r in (0.0, 0.5, 0.9)]
    out = []
    for i, (d, mu, var, r) in enumerate(grid):
        comp = LayerNorm(d) if name == "layernorm" else RMSNorm(d)
        fn = (lambda x, d=d: F.layer_norm(x, (d,), eps=1e-12)) if name == "layernorm" else \
             (lambda x, d=d: F.rms_norm(x, (d,), eps=1e-12))
        authors = (("layernorm [authors]", AuthorsLayerNorm(d)),) if name == "layernorm" else ()
        out.append(Case(f"d{d} mu{mu} var{var} r{r}", comp, Moments(mu, var, r, 1.0, 0.5 * _rg(i + 1)),
                        pointwise(fn), (max(512, 131072 // d), 4, d), others=authors))
    return out


def dropout_cases() -> list[Case]:
    grid = [(p, mu, var, r) for p in (0.1, 0.5) for mu in (0.0, 1.0) for var in (0.5, 2.0) for r in (0.0, 0.5)]
    return [Case(f"p{p} mu{mu} var{var} r{r}", Dropout(p), Moments(mu, var, r, 1.0, _rg(i)),
                 pointwise(lambda x, p=p: F.dropout(x, p, training=True)), (1024, 6, 128))
            for i, (p, mu, var, r) in enumerate(grid)]


def softmax_cases() -> list[Case]:
    grid = [(n, var, r) for n in (2, 8, 32) for var in (0.25, 1.0, 4.0) for r in (0.0, 0.5)]
    return [Case(f"L{n} var{var} r{r}", Softmax(n), Moments(0.3, var, r, 1.0, 0.0),
                 pointwise(lambda x: torch.softmax(x, 1)), (1024, n, 64),
                 others=(("softmax [authors V1]", AuthorsSoftmax(n, False)),
                         ("softmax [authors V2]", AuthorsSoftmax(n, True))))
            for n, var, r in grid]


ATTENTION_GRID = [  # (L, d, heads, var, corr, mean, grad_corr, extra Attention kwargs)
    (16, 64, 1, 1.0, 0.3, 0.0, 0.0, {}), (16, 64, 4, 1.0, 0.5, 0.5, 0.3, {}), (4, 64, 1, 1.0, 0.3, 0.0, 0.5, {}),
    (16, 64, 1, 2.0, 0.0, 0.0, 0.0, {}), (32, 32, 2, 1.5, 0.2, 0.0, 0.2, {}),
    (8, 64, 2, 1.0, 0.3, 0.0, 0.3, {"p": 0.2}), (16, 64, 2, 0.5, 0.8, 0.0, 0.0, {}), (8, 32, 4, 1.0, 0.0, 0.0, 0.3, {}),
    (16, 64, 4, 1.0, 0.3, 0.0, 0.0, {"q_var": 2 / 64}),
    (16, 64, 2, 1.0, 0.3, 0.0, 0.3, {"causal": True}), (8, 32, 1, 1.0, 0.5, 0.0, 0.3, {"causal": True, "p": 0.1}),
    (8, 64, 2, 1.0, 0.3, 0.0, 0.3, {"shaped": True}), (8, 64, 2, 1.0, 0.3, 0.0, 0.3, {"shaped": True, "tau0": 0.1}),
    (16, 64, 2, 1.0, 0.3, 0.0, 0.3, {"shaped": True, "causal": True, "tau0": 0.2}),
]


def attention_cases(samples: int = 1200) -> list[Case]:
    out = []
    for n, d, h, var, r, mu, rg, extra in ATTENTION_GRID:
        kw = {"q_var": 1 / d, "k_var": 1 / d, "v_var": 1 / d, "o_var": 1 / d, **extra}
        plain = mu == 0 and not {"causal", "shaped"} & set(extra)
        authors = (("attention [authors]", AuthorsAttention(d, n, kw["q_var"], kw["k_var"], kw["v_var"], kw["o_var"],
                                                      kw.get("p", 0.0))),) if plain else ()
        out.append(Case(f"L{n} d{d} H{h} var{var} r{r} mu{mu} rg{rg} {extra}", Attention(d, h, n, **kw),
                        Moments(mu, var, r, 1.0, rg), reference_attention(d, h, **kw), (samples, n, d), others=authors))
    return out


def residual_cases() -> list[Case]:
    """y = a x + b FFN(x), FFN = Linear 32 → 64, ReLU or GeLU, Linear 64 → 32, Dropout 0.1."""
    grid = [(a, b, mu, r, act) for a, b in ((1.0, 1.0), (0.9, 0.44)) for mu in (0.0, 0.5) for r in (0.2, 0.7)
            for act in ("relu", "gelu")]
    out = []
    for i, (a, b, mu, r, act) in enumerate(grid):
        comp_act, fn = (ReLU(), F.relu) if act == "relu" else (GeLU(), F.gelu)
        branch = ffn_block(32, 64, 1 / 32, 2 / 64, comp_act, 0.1)
        out.append(Case(f"a{a} b{b} mu{mu} r{r} {act}", Residual(a, b, branch), Moments(mu, 1.0, r, 1.0, _rg(i)),
                        residual_sim(a, b, ffn_sim(32, 64, 1 / 32, 2 / 64, fn, 0.1)), (800, 8, 32)))
    return out


def block_cases() -> list[Case]:
    d, h, n, p = 64, 4, 16, 0.1
    kw = {"q_var": 1 / d, "k_var": 1 / d, "v_var": 1 / d, "o_var": 1 / d}
    ln = pointwise(lambda x: F.layer_norm(x, (d,), eps=1e-12))
    drop = pointwise(lambda x: F.dropout(x, p, training=True))
    return [
        Case("ffn shaped_relu", ffn_block(d, 4 * d, 1 / d, 1 / (4 * d), ShapedReLU(4 * d), p),
             Moments(0.0, 1.0, 0.4, 1.0, 0.3),
             ffn_sim(d, 4 * d, 1 / d, 1 / (4 * d), ShapedReLUModule(4 * d).double(), p), (800, 8, d)),
        Case("attention block", attention_block(Attention(d, h, n, **kw), p), Moments(0.0, 1.0, 0.4, 1.0, 0.3),
             then(reference_attention(d, h, **kw), drop), (1200, n, d)),
        Case("pre-LN attention", Residual(1.0, 1.0, serial(LayerNorm(d), Attention(d, h, n, **kw), Dropout(p))),
             Moments(0.0, 2.0, 0.4, 1.0, 0.3), residual_sim(1.0, 1.0, then(ln, reference_attention(d, h, **kw), drop)),
             (1200, n, d)),
    ]


def postnorm_cases() -> list[Case]:
    """y = LN(a x + b f(x)), f an FFN or attention with fresh weights; x a LayerNorm output (fixed norm) with
    the upstream gradient of a next Post-LN sublayer (⊥ 1, ⊥ y), or Gaussian x with an isotropic gradient."""
    d, n = 64, 8
    ln = pointwise(lambda x: F.layer_norm(x, (d,), eps=1e-12))
    kw = {"q_var": 1 / d, "k_var": 1 / d, "v_var": 1 / d, "o_var": 1 / d}
    w1, w2 = 1 / d, 2 / (4 * d)
    branches = {"ffn": (ffn_block(d, 4 * d, w1, w2, ReLU()), ffn_sim(d, 4 * d, w1, w2, F.relu, 0.0)),
                "attn": (serial(Attention(d, 2, n, **kw)), reference_attention(d, 2, **kw))}
    grid = [("ffn", 1.0, 1.0, True, True, 0.3), ("ffn", 0.98, 0.2, True, True, 0.6),      # (branch, α, β, normalized,
            ("attn", 1.0, 1.0, True, True, 0.3), ("attn", 0.98, 0.2, True, True, 0.0),    #  projected upstream, r)
            ("ffn", 1.0, 1.0, False, False, 0.3), ("ffn", 1.0, 1.0, True, False, 0.5)]
    out = []
    for i, (kind, a, b, normalized, project, r) in enumerate(grid):
        comp, sim = branches[kind]
        post = PostNormResidual(a, b, comp, d, normalized_input=normalized, upstream_align=0.0 if project else 2.0)
        out.append(Case(f"{kind} a{a} b{b} normalized={normalized} projected={project} r{r}", post,
                        Moments(0.0, 1.0, r, 1.0, _rg(i)), then(residual_sim(a, b, sim), ln), (800, n, d),
                        normalize_input=normalized, project_upstream=project))
    return out


def embedding_cases() -> list[Case]:
    c = zipf_collision_probability(500)
    return [Case(f"zipf500 segment={seg}", Embedding(0.3, (c, 0.0, 1.0) if seg else (c, 0.0)), Moments(0.0, 1.0, 0.0),
                 embedding_sim(500, 0.3, seg), (400, 16, 32), backward=False) for seg in (False, True)]


# ------------------------------------------------------------- cross-attention: two inputs, two gradients
CrossSim = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]    # (x, memory, gen) -> output


def reference_cross_attention(d: int, heads: int, q_var: float, k_var: float, v_var: float, o_var: float,
                              p: float = 0.0, shaped: bool = False, tau0: float = 1.0, gamma2: float = 1.0) -> CrossSim:
    """Queries from x (N, T, d), keys/values from y (N, S, d), fresh weights per sample, dropout on the
    probabilities; shaped: Softmax − γ₂/S (no identity term), τ = τ₀√(d d_k)."""
    dk = d // heads

    def sim(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        s, t, _ = x.shape
        w = [torch.randn(s, d, d, generator=gen, dtype=DT) * math.sqrt(v) for v in (q_var, k_var, v_var, o_var)]
        q = (x @ w[0]).view(s, t, heads, dk).transpose(1, 2)                              # (N, H, T, dk)
        k, v = ((y @ wi).view(s, y.shape[1], heads, dk).transpose(1, 2) for wi in w[1:3])  # (N, H, S, dk)
        a = torch.softmax(q @ k.transpose(-1, -2) / (tau0 * math.sqrt(d * dk) if shaped else math.sqrt(dk)), -1)
        a = a * (torch.rand(a.shape, generator=gen, dtype=DT) >= p).to(DT) / (1 - p)   # (N, H, T, S)
        if shaped:
            a = a - gamma2 / y.shape[1]
        return (a @ v).transpose(1, 2).reshape(s, t, d) @ w[3]
    return sim


@dataclass(frozen=True)
class CrossCase:
    label: str
    component: CrossAttention
    m_q: Moments               # query-stream moments; grad fields = upstream gradient moments
    m_kv: Moments              # memory moments
    sim: CrossSim
    samples: int


def cross_case_rows(family: str, case: CrossCase, seed: int = 0) -> list[ErrorRow]:
    """Rows ``family`` (output), ``family → query`` and ``family → memory`` (input gradients)."""
    gen = torch.Generator().manual_seed(seed)
    c, mq, mkv = case.component, case.m_q, case.m_kv
    x, cx = gaussian((case.samples, c.T, c.d), mq.mean, mq.var, mq.corr, gen)
    y, cy = gaussian((case.samples, c.S, c.d), mkv.mean, mkv.var, mkv.corr, gen)
    x.requires_grad_(True)
    y.requires_grad_(True)
    out = case.sim(x, y, gen)
    emp, se = pooled(out, torch.cat([cx, cy], 1))
    g, cg = gaussian(out.shape, 0.0, mq.grad_var, mq.grad_corr, gen)
    (out * g).sum().backward()
    f = c.fwd(mq, mkv)
    gq, gkv = c.bwd(mq, mkv, replace(f, grad_var=mq.grad_var, grad_corr=mq.grad_corr))
    rows = [ErrorRow(family, "mean", f.mean, float(emp[0]), math.sqrt(float(emp[1])), float(se[0])),
            ErrorRow(family, "var", f.var, float(emp[1]), 0.0, float(se[1])),
            ErrorRow(family, "cov", f.cov, float(emp[2]), float(emp[1]), float(se[2]))]
    for side, grad, pred in (("query", x.grad, gq), ("memory", y.grad, gkv)):
        gemp, gse = pooled(grad, torch.cat([cx, cy, cg], 1))
        rows += [ErrorRow(f"{family} → {side}", "grad_var", pred.grad_var, float(gemp[1]), 0.0, float(gse[1])),
                 ErrorRow(f"{family} → {side}", "grad_cov", pred.grad_cov, float(gemp[2]), float(gemp[1]),
                          float(gse[2]))]
    return rows


CROSS_GRID = [  # (T, S, d, heads, (var, corr, mean) of queries, of memory, grad_corr, extra CrossAttention kwargs)
    (8, 16, 64, 1, (1.0, 0.3, 0.0), (1.0, 0.3, 0.0), 0.0, {}),
    (16, 8, 64, 4, (1.0, 0.5, 0.5), (1.5, 0.2, 0.0), 0.3, {}),
    (4, 32, 32, 2, (2.0, 0.0, 0.0), (1.0, 0.6, 0.0), 0.3, {}),
    (12, 6, 64, 2, (0.5, 0.8, 0.0), (2.0, 0.0, 0.0), 0.0, {}),
    (8, 16, 64, 4, (1.0, 0.3, 0.0), (1.0, 0.3, 0.0), 0.3, {"q_var": 2 / 64}),
    (8, 16, 64, 2, (1.0, 0.3, 0.0), (1.0, 0.3, 0.3), 0.3, {"p": 0.1}),
    (16, 8, 32, 1, (1.0, 0.0, 0.0), (1.0, 0.5, 0.0), 0.3, {"p": 0.1}),
    (8, 16, 64, 2, (1.0, 0.3, 0.0), (1.0, 0.4, 0.0), 0.3, {"shaped": True}),
    (16, 8, 64, 2, (1.0, 0.5, 0.0), (1.5, 0.2, 0.0), 0.0, {"shaped": True, "tau0": 0.1}),
    (8, 16, 64, 2, (1.0, 0.3, 0.0), (1.0, 0.3, 0.0), 0.3, {"shaped": True, "tau0": 0.2, "p": 0.1}),
]


def cross_attention_rows(samples: int = 1200) -> list[ErrorRow]:
    rows = []
    for i, (t, s, d, h, q, kv, rg, extra) in enumerate(CROSS_GRID):
        kw = {"q_var": 1 / d, "k_var": 1 / d, "v_var": 1 / d, "o_var": 1 / d, **extra}
        case = CrossCase(f"T{t} S{s} d{d} H{h} q{q} kv{kv} rg{rg} {extra}", CrossAttention(d, h, t, s, **kw),
                         Moments(q[2], q[0], q[1], 1.0, rg), Moments(kv[2], kv[0], kv[1]),
                         reference_cross_attention(d, h, **kw), samples)
        rows += cross_case_rows("cross_attention", case, seed=i)
    return rows


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "linear": linear_cases, "relu": lambda: activation_cases("relu"), "gelu": lambda: activation_cases("gelu"),
    "shaped_relu": lambda: activation_cases("shaped_relu"), "layernorm": lambda: norm_cases("layernorm"),
    "rmsnorm": lambda: norm_cases("rmsnorm"), "dropout": dropout_cases, "softmax": softmax_cases,
    "attention": attention_cases, "residual": residual_cases, "blocks": block_cases, "embedding": embedding_cases,
    "postnorm": postnorm_cases,
}


ROW_FAMILIES: dict[str, Callable[[], list[ErrorRow]]] = {"cross_attention": cross_attention_rows}   # not `Case`-shaped


def main(families: list[str]) -> None:
    rows = []
    for name in families or [*FAMILIES, *ROW_FAMILIES]:
        t = time.time()
        rows += ROW_FAMILIES[name]() if name in ROW_FAMILIES else family_rows(name, FAMILIES[name]())
        print(f"{name}: {time.time() - t:.1f}s", file=sys.stderr)
    print(format_error_table(error_table(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
