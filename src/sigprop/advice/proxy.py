r"""Advice by a small proxy: train a smaller copy of the run over a short lr grid and carry its optimum to the run.

μP (Yang et al. 2022, Tensor Programs V) and its depth extensions (Yang et al. 2023; Dey et al. 2025,
CompleteP) make the best peak lr the same for two models whose first Adam step changes each layer's output by
the same relative amount. The absolute level of the best lr depends on the data, the batch, the horizon and the
schedule, which no measurement at init sees; its *ratio* between two close relatives is what the first step
measures. So:

1. **Proxy** (`plan`): the run's config with a smaller width (``d_model`` and ``d_ff`` by the same factor, the
   heads kept while each is at least `MIN_HEAD` wide) and fewer blocks (``n_layers``, ``n_dec_layers``), every
   other field equal: scheme, parametrization and its base sizes, data, batch, steps, schedule, seed. Of the
   shapes whose `MAX_RUNS` runs fit in ``budget`` × one run of the target (training FLOPs,
   `sigprop.models.flops`), the largest; if none fits, the smallest shape with its steps (and warmup) cut to fit
   (never below `MIN_STEPS`: a smaller budget is refused, naming the least that would do).
2. **Grid**: `FIRST_RUNS` lrs `SPACING` apart, centred on the proxy's own rule-based advice
   (`sigprop.advice.advise`), then one step beyond the edge that holds the lowest final loss while it does, up
   to `MAX_RUNS` runs (`sigprop.train.lr_grid.next_lr`); the runs go through `sigprop.train.sweep` (resumable).
3. **Transfer**: r = η_T / η_P, the ratio of the target's and the proxy's *layer-change* lr scale (the peak lr at
   which the first Adam step changes some weight layer's output by its own size, `sigprop.advice.rule.limits`: a
   quantity μP keeps O(1) as width grows, so r → 1 between two μP models that differ in width alone). Of the three
   first-step scales scored as the basis on the lr benchmark (the output's change, the largest layer's, the median
   layer's), the largest layer's had the least held-out regret (docs/advise.md). The target's recommended
   lr is r × the proxy's optimum (the vertex of a parabola in log lr through the lowest grid point and its
   neighbours, the grid point itself at an edge); its largest stable lr is r × the largest proxy lr that trains; its
   outcome at lr η is the proxy's achieved outcome at the grid lr nearest η / r in log lr. The grid goes on upward
   while its top lr still trains (to find the divergence edge); past its top or bottom, the edge's outcome if it
   already failed that way, else the run's own rule-based prediction (`sigprop.advice.rule.outcome`).
4. A target whose stack is rank-collapsed at init (its last block's token correlation at least the rule's
   ``collapse``) stalls at every lr, whatever its shallower proxy does.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..console import UserError
from ..models import build_model
from ..models.flops import train_flops_per_token
from ..train.config import RunConfig, from_mapping
from ..train.levels import trains, unigram_loss
from ..train.lr_grid import best_lr, next_lr
from ..train.run_summary import ended_at
from ..train.sweep import SweepSpec, run_sweep
from .advise import DEFAULT_RULE, Advice, advise, with_target

MIN_WIDTH, MIN_HEAD, MIN_DEPTH = 32, 8, 2       # the smallest proxy: width, head width, blocks
FIRST_RUNS, MAX_RUNS, SPACING = 3, 6, 3.0        # the proxy's first grid, its most runs, the ratio of neighbours
MIN_STEPS = 20                                   # a proxy's horizon is never cut below this
BASIS = "layer change"                           # the lr scale whose ratio carries the optimum


def tokens_per_example(cfg: RunConfig) -> int:
    """T: a text example's ``data.seq_len``, a ViT's patches and class token."""
    m = cfg.model
    return (m.image_size // m.patch_size) ** 2 + 1 if m.arch == "vit" else cfg.data.seq_len


def run_flops(cfg: RunConfig) -> float:
    """Training FLOPs of the whole run: steps × batch × T × FLOPs per token (its model on the meta device)."""
    T = tokens_per_example(cfg)
    return cfg.train.steps * cfg.train.batch_size * T * train_flops_per_token(build_model(cfg.model, "meta"), T)


def shrunk(cfg: RunConfig, width: int, depth: int, steps: int | None = None) -> RunConfig:
    """``cfg`` with ``d_model`` = ``width`` (``d_ff`` and, where a head would fall below `MIN_HEAD`, the head count
    scaled with it), ``n_layers`` (and ``n_dec_layers``) ``depth`` / the target's times their own, and ``steps``
    (warmup scaled with it) if given; every other field as it is."""
    m = cfg.model
    scale = width / m.d_model
    heads = m.n_heads
    while heads > 1 and width // heads < MIN_HEAD:
        heads //= 2
    fields = {"d_model": width, "d_ff": max(1, round(m.d_ff * scale)), "n_heads": heads, "n_layers": depth}
    if m.n_dec_layers is not None:
        fields["n_dec_layers"] = max(1, round(m.n_dec_layers * depth / m.n_layers))
    raw = cfg.to_dict()
    raw["model"].update(fields)
    if steps is not None:
        raw["optim"]["warmup_steps"] = max(1, round(cfg.optim.warmup_steps * steps / cfg.train.steps))
        raw["train"]["steps"] = steps
    return from_mapping(RunConfig, raw)


@dataclass(frozen=True)
class Plan:
    """The proxy of a run and what its grid costs."""

    proxy: RunConfig
    runs: int                       # the most proxy runs the grid may take
    run_cost: float                 # one proxy run / one target run (training FLOPs)

    @property
    def cost(self) -> float:
        """All the proxy runs, in target runs."""
        return self.runs * self.run_cost

    def text(self, cfg: RunConfig) -> str:
        """What the plan trains and what it costs, in one line."""
        p, t = self.proxy, cfg
        return (f"proxy: width {p.model.d_model} (run: {t.model.d_model}), {p.model.n_layers} blocks "
                f"(run: {t.model.n_layers}), {p.train.steps} steps (run: {t.train.steps}); up to {self.runs} runs = "
                f"{self.cost:.2g} of one training run")


def plan(cfg: RunConfig, budget: float, runs: int = MAX_RUNS, keep_depth: bool = False) -> Plan:
    """The proxy of ``cfg`` (module docstring, 1.) for a grid of ``runs`` runs within ``budget`` target runs;
    ``keep_depth``: only the width shrinks (the proxy has the run's blocks, its steps cut where even the narrowest
    does not fit), so the ratio carries the optimum across width alone."""
    if not (math.isfinite(budget) and budget > 0):
        raise UserError(f"--budget {budget!r}: must be a positive fraction of one training run")
    target, m = run_flops(cfg), cfg.model
    widths = [m.d_model]
    while widths[-1] // 2 >= MIN_WIDTH and (widths[-1] // 2) % 2 == 0:
        widths.append(widths[-1] // 2)
    depths = [m.n_layers]
    while depths[-1] // 2 >= MIN_DEPTH and not keep_depth:
        depths.append(depths[-1] // 2)
    shapes = [(run_flops(p) / target, p) for p in (shrunk(cfg, w, d) for w in widths for d in depths)]
    fitting = [s for s in shapes if s[0] * runs <= budget]
    if fitting:
        c, p = max(fitting, key=lambda s: s[0])
        return Plan(p, runs, c)
    c, p = min(shapes, key=lambda s: s[0])
    steps = math.floor(cfg.train.steps * budget / (runs * c))
    if steps < MIN_STEPS:
        least = runs * c * MIN_STEPS / cfg.train.steps
        raise UserError(f"--budget {budget:g}: the smallest proxy (width {p.model.d_model}, {p.model.n_layers} blocks) "
                        f"needs at least {least:.2g} of one training run for {runs} runs of {MIN_STEPS} steps; give "
                        "a larger budget, or --budget 0 for the rule at init alone")
    p = shrunk(cfg, p.model.d_model, p.model.n_layers, steps)
    return Plan(p, runs, run_flops(p) / target)


def transfer_ratio(target: Advice, proxy: Advice, basis: str | None = BASIS) -> float:
    """η_T / η_P of the ``basis`` lr scale (module docstring, 3.); 1 for ``basis`` None (the proxy's lrs as they
    are)."""
    if basis is None:
        return 1.0
    r = target.limits[basis] / proxy.limits[basis]
    if not (math.isfinite(r) and r > 0):
        raise ValueError(f"the {basis} scales of the run and its proxy give no ratio: {target.limits[basis]}, "
                         f"{proxy.limits[basis]}")
    return r


def vertex(lrs: Sequence[float], losses: Sequence[float]) -> float:
    """The lr of the lowest finite loss, moved to the vertex of the parabola in log lr through it and its two
    neighbours when both are finite and the parabola opens upward (kept within those neighbours)."""
    lr, _ = best_lr(lrs, losses)
    if lr is None:
        return min(lrs)
    i = list(lrs).index(lr)
    if 0 < i < len(lrs) - 1 and all(math.isfinite(losses[j]) for j in (i - 1, i + 1)):
        x = [math.log(lrs[j]) for j in (i - 1, i, i + 1)]
        y = [losses[j] for j in (i - 1, i, i + 1)]
        den = (x[0] - x[1]) * (x[0] - x[2]) * (x[1] - x[2])
        a = (x[2] * (y[1] - y[0]) + x[1] * (y[0] - y[2]) + x[0] * (y[2] - y[1])) / den
        b = (x[2] ** 2 * (y[0] - y[1]) + x[1] ** 2 * (y[2] - y[0]) + x[0] ** 2 * (y[1] - y[2])) / den
        if a > 0:
            return math.exp(min(max(-b / (2 * a), x[0]), x[2]))
    return lr


@dataclass(frozen=True)
class ProxyAdvice:
    """The proxy's grid and what it says of the run (module docstring)."""

    recommended_lr: float
    max_stable_lr: float | None                      # None: no proxy lr trains
    ratio: float                                     # η_T / η_P of the `BASIS` scale
    plan: str                                        # `Plan.text`
    grid: list[dict[str, Any]]                       # the proxy runs: lr, final_loss, outcome
    predictions: list[dict[str, Any]]                # per asked lr of the run: lr, outcome, reason
    cost: float                                      # the proxy runs, in training runs of the run
    cost_s: float                                    # wall seconds, probes and proxy runs
    collapsed: bool = False
    target: Advice | None = field(default=None, repr=False)

    def table(self, plan: bool = True) -> str:
        """The terminal table (``plan``: its first line, what the proxy trained and its most cost)."""
        rows = [self.plan] * plan + ["proxy lr grid"] + [f"  {g['lr']:10.3g}  {g['final_loss']:.4f}  {g['outcome']}"
                                               for g in self.grid]
        stable = "none" if self.max_stable_lr is None else f"{self.max_stable_lr:.3g}"
        rows += [f"transfer ratio       {self.ratio:.3g}  (first-step lr scale, run / proxy)",
                 f"recommended lr       {self.recommended_lr:.3g}", f"max stable lr        {stable}"]
        if self.collapsed:
            rows.append("the run's stack is rank-collapsed at init: it stalls at every lr")
        rows += [f"  {'lr':>10s}  {'outcome':9s}  reason"]
        rows += [f"  {p['lr']:10.3g}  {p['outcome']:9s}  {p['reason']}" for p in self.predictions]
        rows.append(f"cost: {self.cost:.2g} of one training run, {self.cost_s:.0f} s")
        return "\n".join(rows)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (the run's own rule-based report under ``target``)."""
        return with_target(self)


def _predict(lr: float, ratio: float, grid: Sequence[dict[str, Any]], rule: dict[str, Any]) -> tuple[str, str]:
    """The outcome at the run's ``lr``: the proxy's at the grid lr nearest lr / ratio; more than half a grid step
    past the grid, the edge's if it already failed that way (diverges above, stalls below), else the run's own
    rule-based prediction ``rule``."""
    x = lr / ratio
    g = min(grid, key=lambda g: abs(math.log(g["lr"] / x)))
    above, below = x > grid[-1]["lr"] * SPACING ** 0.5, x < grid[0]["lr"] / SPACING ** 0.5
    if (above and g["outcome"] != "diverges") or (below and g["outcome"] != "stalls"):
        return rule["outcome"], f"past the proxy's grid (lr / ratio = {x:.3g}); at init: {rule['reason']}"
    return g["outcome"], f"the proxy {g['outcome']} at {g['lr']:.3g} (lr / ratio = {x:.3g})"


def proxy_grid(p: RunConfig, centre: float, out: Path, runs: int, progress: bool = True) -> list[dict[str, Any]]:
    """Train ``p`` at `FIRST_RUNS` lrs `SPACING` apart around ``centre``, then one step beyond the edge holding
    the best final loss while it does, to ``runs`` runs (sweeps in ``out``); each run's lr, final loss (NaN if it
    diverged) and outcome (`sigprop.train.levels.trains` against its unigram level; else *diverges* above the
    largest lr that trains, *stalls* below)."""
    half = (FIRST_RUNS - 1) / 2
    lrs = sorted(float(f"{centre * SPACING ** (k - half):.3g}") for k in range(FIRST_RUNS))
    base = p.to_dict()
    done: dict[float, dict[str, Any]] = {}
    level = math.nan
    while True:
        spec = SweepSpec(base, {"optim.lr": sorted(set(lrs) | set(done))}, out)
        for r in run_sweep(spec, resume=True, progress=progress):
            done[r["point"]["optim.lr"]] = r
        grid = sorted(done)
        losses = [math.nan if done[x]["diverged"] else done[x]["final_val_loss"] for x in grid]
        if math.isnan(level):
            level = unigram_loss(done[grid[0]]["config"]["train"]["out_dir"])
        step = next_lr(grid, losses)
        if step is None and trains(losses[-1], level):      # bracketed, but the top still trains: find the edge
            step = (float(f"{grid[-1] * SPACING:.3g}"), "up")
        if step is None or len(grid) >= runs:
            break
        lrs = [step[0]]
    ok = [trains(x, level) for x in losses]
    top = max((x for x, t in zip(grid, ok) if t), default=None)
    return [{"lr": x, "final_loss": loss, "outcome": "trains" if t else "diverges" if top is not None and x > top
             else "stalls"} for x, loss, t in zip(grid, losses, ok)]


def proxy_folder(p: RunConfig, out: str | Path) -> Path:
    """The folder under ``out`` of the proxy ``p``'s runs, named by the hash of its run tables (a rerun reuses it)."""
    tables = p.to_dict()
    del tables["train"]["out_dir"]                          # the proxy's folder names the run, not where it was
    tag = json.dumps(tables, sort_keys=True)
    return Path(out) / f"proxy-{hashlib.sha1(tag.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Pick:
    """The candidate lr whose proxy run ended lowest, and the proxy runs that chose it."""

    lr: float
    grid: list[dict[str, Any]]                       # per candidate: lr, final_loss (its initial loss if diverged)
    plan: str                                        # `Plan.text`
    cost: float                                      # the proxy runs, in training runs of the run


def pick_by_proxy(cfg: RunConfig, candidates: Sequence[float], budget: float = 0.5,
                  out: str | Path = "runs/advise-proxy", progress: bool = True) -> Pick:
    """Train the proxy of ``cfg`` (`plan` for one run per candidate within ``budget``) at each candidate peak lr,
    as it is, and pick the candidate whose run ends at the lowest validation loss (a diverged run counts its
    initial loss: it ends no better than it started). The candidates are few lrs far apart (a ×3–×10 pair), so
    the proxy only has to rank them, not to place the optimum."""
    if not candidates:
        raise ValueError("pick_by_proxy needs at least one candidate lr")
    pl = plan(cfg, budget, runs=len(candidates))
    spec = SweepSpec(pl.proxy.to_dict(), {"optim.lr": sorted(set(candidates))}, proxy_folder(pl.proxy, out))
    grid = [{"lr": r["point"]["optim.lr"],
             "final_loss": ended_at(r)}
            for r in run_sweep(spec, resume=True, progress=progress)]
    best = min(grid, key=lambda g: g["final_loss"])
    return Pick(best["lr"], grid, pl.text(cfg), len(grid) * pl.run_cost)


def advise_by_proxy(cfg: RunConfig, budget: float = 0.5, lrs: Sequence[float] | None = None,
                    out: str | Path = "runs/advise-proxy", progress: bool = True, basis: str | None = BASIS,
                    keep_depth: bool = False) -> ProxyAdvice:
    """The advice of the module docstring for the run ``cfg`` within ``budget`` of one of its training runs;
    ``lrs``: the run's peak lrs to predict (default its ``optim.lr``); the proxy runs go under ``out`` (a rerun
    reuses them); ``basis``: the lr scale whose ratio carries the optimum (None: none, ratio 1); ``keep_depth``:
    a proxy of the run's depth (`plan`)."""
    start = time.perf_counter()
    pl = plan(cfg, budget, keep_depth=keep_depth)
    asked = [cfg.optim.lr] if lrs is None else list(lrs)
    target, proxy = advise(cfg, lrs=asked), advise(pl.proxy)
    ratio = transfer_ratio(target, proxy, basis)
    grid = proxy_grid(pl.proxy, proxy.recommended_lr, proxy_folder(pl.proxy, out), pl.runs, progress)
    lrs_, losses = [g["lr"] for g in grid], [g["final_loss"] for g in grid]
    stable = [g["lr"] for g in grid if g["outcome"] == "trains"]
    collapsed = target.rank_collapse >= DEFAULT_RULE.collapse
    predictions = []
    for lr, rule in zip(asked, target.predictions):
        name, reason = ("stalls", "rank-collapsed at init") if collapsed else _predict(lr, ratio, grid, rule)
        predictions.append({"lr": lr, "outcome": name, "reason": reason})
    return ProxyAdvice(recommended_lr=ratio * vertex(lrs_, losses), max_stable_lr=ratio * max(stable) if stable
                       else None, ratio=ratio, plan=pl.text(cfg), grid=grid, predictions=predictions,
                       cost=len(grid) * pl.run_cost, cost_s=time.perf_counter() - start, collapsed=collapsed,
                       target=target)


__all__ = ["Pick", "Plan", "ProxyAdvice", "advise_by_proxy", "pick_by_proxy", "plan", "proxy_folder", "run_flops",
           "shrunk", "transfer_ratio", "vertex"]
