"""The claim harness: a training claim is data, `run_claim` runs any of them the same way.

A `Claim` names the paper's claim, its compared `Model`s (built from the resolved sizes), its sizes
(``full``/``quick``, overridable key by key), the lr protocol and the verdict rule. `run_claim` does

1. *tune*: every model with ``tune`` trains at each lr of its grid on the tuning seed (never scored);
   the grid grows one step past an edge that holds the optimum (`sigprop.train.lr_grid.next_lr`), at most
   ``sizes["max_extend"]`` times (`sigprop.experiments.tuning.tune`);
2. *score*: the scored seeds train at the model's chosen lr, at another model's chosen lr
   (``score_at``), or, for a model that is not tuned, at every lr of its group's grid, which grows while
   the claim's ``extend`` asks for an lr (at most ``max_extend`` times);
3. *unigram*: the loss of token frequencies on each run's own evaluation tokens, once per data split;
4. *judge*: `summarize` turns the per-point records into the one summary schema below, the claim's
   ``rule`` gives (verdict, reason) from that summary alone (`sigprop.experiments.results.rejudge` recomputes it
   from NAME.json);
5. *write* NAME.json ({"summary", "data": the runs' curves}), NAME.md and NAME.png.

Summary schema (every claim): ``claim``, ``verdict``, ``verdict_reason``, ``verdicts`` (the claim's
further rules: name → [verdict, reason]), ``seeds``, ``tuning_seed``, ``sizes``, ``wall_s``,
``results`` (what the claim derives from its models: gaps, panels; `Claim.derive`), and ``models``: data
key → ``label`` (display only), ``group``, ``attrs`` (the model's facts: scheme, depth, ...), ``params``,
``lr_grid`` (floats, ascending) and ``extended`` (one line per added lr), ``tuning`` (None, or ``seed``,
``loss`` per lr of the grid, ``unigram``, ``best_lr``, ``at_edge``) and ``scored``: one block per scored lr
with ``lr``, ``seeds``, ``final_loss``, ``unigram`` and ``diverged`` (per seed), `seed_stats` of the final,
initial and best validation loss and accuracy, and ``logged`` (the claim's ``log`` quantities per seed).

A claim states only what is particular to it, in one module beside its rule in `verdicts`: its sizes (``full``,
completed by `SIZES`; ``quick``, overrides laid over ``full`` and `QUICK`), ``models(sizes)``, ``rule(summary)``,
the setup as a template, its table as `Column`s and its figure as `Panel`s, or a function for a special table or
figure; plus its line in `sigprop.experiments.registry`. The common pieces live here: columns `MODEL`, `LR`,
`FINAL`, `UNIGRAM` and cells (`seeds_cell`, `stat_cell`, `group_cell`); panels `lr_panel`, `val_panel`,
`blocks_panel`; logs `grad_stats`, `explain_log`; `bracket` (an untuned group's ``extend``); and the summary's
readers for rules (`tuned`, `scored`, `by_group`, `sweep_summary`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..console import UserError
from ..console.overrides import resolve_sizes
from ..models.build import param_count
from ..train import sweep_report
from ..train.levels import TRAIN_MARGIN, unigram_loss
from ..train.lr_grid import best_lr, next_lr
from ..train.seed_stats import seed_stats
from ..train.sweep_report import log_ticks
from .outputs import WallClock, plt, progress, write_outputs
from .report import Table
from .tuning import MAX_EXTEND, TUNING_SEED, sweep_runs, tune

RUN_SCALARS = ("lr", "seed", "final_val_loss", "initial_val_loss", "best_val_loss", "final_val_acc", "diverged",
               "error", "steps_done", "wall_s")
CURVE_KEYS = ("val_curve", "train_curve", "diag", "diag_layers")
STATS = ("final_val_loss", "initial_val_loss", "best_val_loss", "final_val_acc")
SIZES = {"jobs": 2, "max_extend": MAX_EXTEND, "tuning_seed": TUNING_SEED}    # every claim's, unless it sets them
QUICK = {"seeds": (0,), "jobs": 1, "max_extend": 0}                            # every smoke run's


@dataclass(frozen=True)
class Model:
    """One compared model: its data ``key`` (the summary's key) and display ``label``, its ``run_config``
    (the run-config sections) and lr grid ``lrs``; ``group``: the models it shares a grid or a comparison with;
    ``tune``: chosen on the tuning seed (else every lr of the group's grid is scored); ``score_at``: the key of a model
    whose chosen lr this one is scored at; ``seeds``: its scored seeds (None: ``sizes["seeds"]``);
    ``unigram``: whether its data has a unigram level (text); ``attrs``: facts kept in the summary."""

    key: str
    label: str
    run_config: Mapping[str, Any]
    lrs: Sequence[float]
    group: str = ""
    tune: bool = True
    score_at: str | None = None
    seeds: Sequence[int] | None = None
    unigram: bool = True
    attrs: Mapping[str, Any] = field(default_factory=dict)


Rule = Callable[[Mapping[str, Any]], tuple[str, str]]
Column = tuple[str, Callable[[Mapping[str, Any], Any, Mapping[str, Any]], Any]]   # header, (entry, block, summary)
Panel = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], None]              # (axes, summary, data) -> drawn


@dataclass(frozen=True)
class Claim:
    """A training claim as data. ``full``: its sizes (completed by `SIZES`); ``quick``: the smoke run's, laid over
    ``full`` and `QUICK`; ``choices``: size key → the values its items may take. ``models(sizes)`` builds the compared
    models; ``rule(summary)`` is the verdict (``rules``: further verdicts reported beside it); ``log(record)`` the
    extra per-run quantities kept per seed; ``extend(grid, points)`` the lrs to add to an untuned group's grid and
    why (None: stop); ``derive(summary)`` the claim's ``results``. Rendered by ``setup`` (a `str.format` template
    over ``s``: the sizes, ``m``: the model entries, ``r``: the results, ``t``: the tuning seed), ``table``
    (`Column`s, one row per scored block of each model, or a function of the summary), ``notes(summary)`` (Markdown
    after the table) and ``plot`` (`Panel`s in a row, or a function of (summary, data) that returns the figure)."""

    name: str
    title: str
    claim: str
    full: Mapping[str, Any]
    quick: Mapping[str, Any]
    models: Callable[[Mapping[str, Any]], list[Model]]
    rule: Rule
    setup: str
    table: Sequence[Column] | Callable[[Mapping[str, Any]], Table]
    plot: Sequence[Panel] | Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
    rules: Mapping[str, Rule] = field(default_factory=dict)
    log: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    extend: Callable[[list[float], list[dict[str, Any]]], tuple[list[float], str] | None] | None = None
    derive: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    notes: Callable[[Mapping[str, Any]], str] | None = None
    choices: Mapping[str, Collection[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Complete ``full`` with `SIZES` and lay ``quick`` over it and `QUICK`."""
        full = {**SIZES, **self.full}
        object.__setattr__(self, "full", full)
        object.__setattr__(self, "quick", {**full, **QUICK, **self.quick})


def _point(m: Model, role: str, r: Mapping[str, Any], claim: Claim) -> dict[str, Any]:
    """A run record as the summary keeps it: the model, its role ("tuning" | "scored"), the scalars, the logs."""
    return {"model": m.key, "role": role, **{k: r[k] for k in RUN_SCALARS if k in r},
            "logged": claim.log(r) if claim.log else {}, "run_dir": r["config"]["train"]["out_dir"]}


def _unigram(points: list[dict[str, Any]], models: Mapping[str, Model]) -> None:
    """Set each text point's ``unigram`` (`unigram_loss`), computed once per split and evaluation batch (data
    table, arch, batch size, evaluation batches, seed)."""
    cache: dict[str, float] = {}
    for p in points:
        m = models[p["model"]]
        if not m.unigram:
            p["unigram"] = None
            continue
        t = m.run_config["train"]
        key = json.dumps([m.run_config.get("data", {}), m.run_config["model"].get("arch"), t.get("batch_size"),
                          t.get("eval_batches"), p["seed"]], sort_keys=True)
        if key not in cache:
            cache[key] = unigram_loss(p["run_dir"])
        p["unigram"] = cache[key]


def run_points(claim: Claim, sizes: Mapping[str, Any], out: Path, show_progress: bool = True
               ) -> tuple[list[Model], list[dict[str, Any]], dict[str, list[str]], dict[str, list[dict[str, Any]]]]:
    """Steps 1–3: (models, per-point records with unigram, extensions per model key, full records per key)."""
    models = claim.models(sizes)
    by_key = {m.key: m for m in models}
    seeds, tseed, jobs = list(sizes["seeds"]), sizes["tuning_seed"], sizes["jobs"]
    sweeps = out / "sweeps"
    points: list[dict[str, Any]] = []
    records: dict[str, list[dict[str, Any]]] = {m.key: [] for m in models}
    extended: dict[str, list[str]] = {m.key: [] for m in models}
    chosen: dict[str, float | None] = {}
    for m in progress([m for m in models if m.tune], f"{claim.name}: tuning", enabled=show_progress):
        if tseed in (m.seeds or seeds):
            raise UserError(f"tuning_seed={tseed} must not be one of the scored seeds {list(m.seeds or seeds)}")
        t = tune(sweeps, m.run_config, m.lrs, tseed, [], jobs, sizes["max_extend"])
        chosen[m.key], extended[m.key] = t["best_lr"], t["extended"]
        points += [_point(m, "tuning", r, claim) for r in t["tuning_runs"]]
        records[m.key] += [{**r, "role": "tuning"} for r in t["tuning_runs"]]
    groups: dict[str, list[Model]] = {}
    for m in models:
        if not m.tune and m.score_at is None:
            groups.setdefault(m.group, []).append(m)
    for m in progress([m for m in models if m.tune or m.score_at], f"{claim.name}: scoring", enabled=show_progress):
        lr = chosen[m.score_at or m.key]
        runs = sweep_runs(sweeps, m.run_config, [lr], m.seeds or seeds, jobs) if lr is not None else []
        points += [_point(m, "scored", r, claim) for r in runs]
        records[m.key] += [{**r, "role": "scored"} for r in runs]
    for group, members in groups.items():
        grid = sorted(members[0].lrs)
        todo, lines = list(grid), []
        while todo:
            for m in progress(members, f"{claim.name} {group} lr {', '.join(f'{x:g}' for x in todo)}",
                              enabled=show_progress):
                runs = sweep_runs(sweeps, m.run_config, todo, m.seeds or seeds, jobs)
                points += [_point(m, "scored", r, claim) for r in runs]
                records[m.key] += [{**r, "role": "scored"} for r in runs]
            step = None
            if claim.extend is not None and len(lines) < sizes["max_extend"]:
                step = claim.extend(grid, [p for p in points if p["model"] in {x.key for x in members}])
            todo = []
            if step is not None:
                lines.append(step[1])
                todo = sorted(set(step[0]) - set(grid))
                grid = sorted([*grid, *todo])
        for m in members:
            extended[m.key] = lines
    _unigram(points, by_key)
    return models, points, extended, records


def _scored_block(lr: float, pts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``scored`` block of the summary (schema above) from the scored points of one model at ``lr``."""
    logged = {k: [p["logged"][k] for p in pts] for k in (pts[0]["logged"] if pts else {})}
    return {"lr": lr, "seeds": [p["seed"] for p in pts], "final_loss": [p["final_val_loss"] for p in pts],
            "unigram": [p["unigram"] for p in pts], **{k: seed_stats(p[k] for p in pts) for k in STATS},
            "diverged": [bool(p["diverged"]) for p in pts], "logged": logged}


def model_entry(m: Model, points: Sequence[Mapping[str, Any]], extended: list[str], tuning_seed: int
                ) -> dict[str, Any]:
    """One model's summary entry (schema in the module docstring) from its per-point records."""
    tp = sorted((p for p in points if p["role"] == "tuning"), key=lambda p: p["lr"])
    sp = [p for p in points if p["role"] == "scored"]
    tuning = None
    if tp:
        grid, loss = [p["lr"] for p in tp], [p["final_val_loss"] for p in tp]
        lr, edge = best_lr(grid, loss)
        tuning = {"seed": tuning_seed, "loss": loss, "unigram": tp[0]["unigram"], "best_lr": lr, "at_edge": edge,
                  "logged": {k: [p["logged"][k] for p in tp] for k in tp[0]["logged"]}}
    lrs = sorted({p["lr"] for p in sp})
    grid = [p["lr"] for p in tp] if tp else lrs
    return {"label": m.label, "group": m.group, "attrs": dict(m.attrs), "params": param_count(m.run_config["model"]),
            "lr_grid": grid, "extended": list(extended), "tuning": tuning,
            "scored": [_scored_block(lr, [p for p in sp if p["lr"] == lr]) for lr in lrs]}


def summarize(claim: Claim, sizes: Mapping[str, Any], models: Sequence[Model], points: Sequence[Mapping[str, Any]],
              extended: Mapping[str, list[str]], wall_s: float | None = None) -> dict[str, Any]:
    """Step 4: the summary (schema above) and its verdicts, from the per-point records alone."""
    summary: dict[str, Any] = {
        "claim": claim.name, "seeds": list(sizes["seeds"]), "tuning_seed": sizes["tuning_seed"],
        "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}, "wall_s": wall_s,
        "models": {m.key: model_entry(m, [p for p in points if p["model"] == m.key], extended.get(m.key, []),
                                      sizes["tuning_seed"]) for m in models}}
    summary["results"] = claim.derive(summary) if claim.derive else {}
    return {**dict(zip(("verdict", "verdict_reason"), claim.rule(summary))),
            "verdicts": {k: list(rule(summary)) for k, rule in claim.rules.items()}, **summary}


def table(claim: Claim, summary: Mapping[str, Any]) -> Table:
    """The claim's table: its function's, or its `Column`s over every scored block of every model (a model with
    none: one row, block None); a cell gets the model's entry with its ``key``, the block and the summary."""
    if callable(claim.table):
        return claim.table(summary)
    return Table([h for h, _ in claim.table], [[cell({"key": k, **e}, b, summary) for _, cell in claim.table]
                                               for k, e in summary["models"].items() for b in e["scored"] or [None]])


def bracket(grid: list[float], points: list[dict[str, Any]]) -> tuple[list[float], str] | None:
    """An untuned group's ``extend``: the lrs one grid step beyond an edge that holds a model's optimum (seed-mean
    final loss, `sigprop.train.lr_grid.next_lr`), for every model of the group (None: every optimum inside)."""
    new = set()
    for model in dict.fromkeys(p["model"] for p in points):
        loss = [seed_stats(p["final_val_loss"] for p in points if p["model"] == model and p["lr"] == lr)["mean"]
                for lr in grid]
        step = next_lr(grid, loss)
        if step is not None:
            new.add(step[0])
    if not new:
        return None
    return sorted(new), (f"best lr at an edge of {', '.join(f'{x:g}' for x in grid)}: "
                         f"added {', '.join(f'{x:g}' for x in sorted(new))}")


class _Items(list):
    """A sequence in a setup template: its items joined by ", " (floats to 6 significant digits)."""

    def __format__(self, spec: str) -> str:
        return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in self)


def _view(x: Any) -> Any:
    """``x`` for a setup template: every list or tuple in it an `_Items`."""
    if isinstance(x, Mapping):
        return {k: _view(v) for k, v in x.items()}
    return _Items(_view(v) for v in x) if isinstance(x, (list, tuple)) else x


def markdown(claim: Claim, summary: Mapping[str, Any]) -> str:
    """The results section: ``## NAME — title``, the claim, the setup, the table, the verdicts."""
    more = "".join(f" {k}: {v} ({reason})" for k, (v, reason) in summary["verdicts"].items())
    setup = claim.setup.format(**{k: _view(summary[key]) for k, key in
                                  (("s", "sizes"), ("m", "models"), ("r", "results"), ("t", "tuning_seed"))})
    return (f"## {claim.name} — {claim.title}\n\n**Claim** {claim.claim}\n\n**Setup.** {setup}\n\n"
            f"{table(claim, summary).markdown()}\n" + (f"{claim.notes(summary)}\n\n" if claim.notes else "")
            + f"**Verdict: {summary['verdict']}.** {summary['verdict_reason']}"
            f"{more}\n")


def curves(records: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The plotted data: per model key, every run's role, lr, seed, whether it diverged, and its curves
    (`CURVE_KEYS`)."""
    return {k: [{"role": r["role"], "lr": r["lr"], "seed": r["seed"], "diverged": r["diverged"],
                 **{c: r[c] for c in CURVE_KEYS}} for r in rs]
            for k, rs in records.items()}


def run_claim(claim: Claim, out: str | Path, quick: bool = False, sizes: Mapping[str, Any] | None = None,
              show_progress: bool = True) -> dict[str, Any]:
    """Run ``claim`` into ``out`` (steps 1–5 above; runs in ``out/sweeps``, resumable) and return its summary.
    ``sizes`` override the keys of ``claim.quick`` (``quick``) or ``claim.full``; an unknown key, or a value
    outside the claim's ``choices``, is a UserError."""
    out = Path(out)
    s = resolve_sizes(claim.quick if quick else claim.full, dict(sizes or {}))
    for key, valid in claim.choices.items():
        if unknown := sorted(set(s[key]) - set(valid)):
            raise UserError(f"unknown {key} {unknown}; valid: {sorted(valid)}")
    clock = WallClock(out, claim.name)
    models, points, extended, records = run_points(claim, s, out, show_progress)
    summary = summarize(claim, s, models, points, extended)
    summary["wall_s"] = clock.seconds()
    data = curves(records)
    return write_outputs(out, claim.name, data, summary, markdown(claim, summary), figure(claim, summary, data))


def figure(claim: Claim, summary: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """The claim's figure: its function's, or its `Panel`s in one row, each axes with a legend of what it drew."""
    if callable(claim.plot):
        return claim.plot(summary, data)
    fig, axes = plt.subplots(1, len(claim.plot), figsize=(5.2 * len(claim.plot), 4.3), squeeze=False)
    for ax, panel in zip(axes[0], claim.plot):
        panel(ax, summary, data)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def lr_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Tuning-seed final loss against lr per tuned model (ring: its chosen lr; dashed, when every tuning run shares
    one unigram level: unigram − `TRAIN_MARGIN`)."""
    tuned_entries = [(i, e) for i, e in enumerate(summary["models"].values()) if e["tuning"]]
    for i, e in tuned_entries:
        t = e["tuning"]
        ax.plot(e["lr_grid"], t["loss"], "o-", ms=3, color=f"C{i % 10}", label=e["label"])
        if t["best_lr"] is not None:
            ax.plot([t["best_lr"]], [t["loss"][e["lr_grid"].index(t["best_lr"])]], "o", mfc="none", ms=9,
                    color=f"C{i % 10}")
    levels = {e["tuning"]["unigram"] for _, e in tuned_entries}
    if len(levels) == 1 and None not in levels:                     # one data split: its trains line
        ax.axhline(levels.pop() - TRAIN_MARGIN, color="k", ls="--", lw=0.8, label=f"unigram − {TRAIN_MARGIN:g}")
    log_ticks(ax, [lr for _, e in tuned_entries for lr in e["lr_grid"]])
    ax.set(xlabel="peak lr", ylabel="final val loss, tuning seed", title="lr grids (ring: chosen)")


def val_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any],
              x: Callable[[Mapping[str, Any], float], float] | None = None, curve: str = "val_curve", column: int = 1,
              **axes: Any) -> None:
    """Column ``column`` of every scored run's ``curve`` (rows [step, ...]; default: the validation loss), one
    colour per model, against step (or ``x(entry, step)``); ``axes``: the axes' settings (``ylabel``, ...)."""
    for i, (key, e) in enumerate(summary["models"].items()):
        runs = [r for r in data[key] if r["role"] == "scored" and r[curve]]
        for j, r in enumerate(runs):
            ax.plot([x(e, row[0]) if x else row[0] for row in r[curve]], [row[column] for row in r[curve]],
                    color=f"C{i % 10}", lw=1, label=e["label"] if j == 0 else None)
    ax.set(**{"xlabel": "step", "ylabel": "validation loss (nats/token)", "title": "scored runs", **axes})


def blocks_panel(ax: Any, summary: Mapping[str, Any], data: Mapping[str, Any],
                 value: Callable[[Mapping[str, Any]], float] = lambda b: b["final_val_loss"]["mean"],
                 models: Sequence[str] | None = None, ls: Callable[[Mapping[str, Any]], str] = lambda e: "-",
                 **axes: Any) -> None:
    """``value`` of each scored block against its lr, one line per model (``models``: those keys only), in line
    style ``ls(entry)``; ``axes``: the axes' settings (``ylabel``, ``yscale``, ...)."""
    keys = list(summary["models"]) if models is None else models
    for i, key in enumerate(keys):
        e = summary["models"][key]
        ax.plot([b["lr"] for b in e["scored"]], [value(b) for b in e["scored"]], ls=ls(e), marker="o", ms=3,
                color=f"C{i % 10}", label=e["label"])
    log_ticks(ax, [b["lr"] for k in keys for b in summary["models"][k]["scored"]])
    ax.set(**{"xlabel": "peak lr", "ylabel": "final val loss (seed mean)", **axes})


def explain_log(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``log`` of what explains a run's curve: its largest attention logit, smallest attention entropy, median and
    largest pre-clip gradient norm."""
    return {"max_attn_logit": r["max_attn_logit"], "min_attn_entropy": r["min_attn_entropy"],
            "grad_norm_median": r["grad_norm"]["median"], "grad_norm_max": r["grad_norm"]["max"]}


def sweep_summary(entries: list[Mapping[str, Any]]) -> dict[str, Any]:
    """`sigprop.train.sweep_report.summarize` over an untuned group's model entries, their ``attrs["size"]`` the
    sweep's size: η* per size, its edge, sensitivity, transfer regret."""
    records = [{"point": {"size": e["attrs"]["size"], "optim.lr": b["lr"], "seed": seed},
                "config": {"optim": {"lr": b["lr"]}}, "final_val_loss": x, "initial_val_loss": init,
                "diverged": not math.isfinite(x)}
               for e in entries for b in e["scored"]
               for seed, x, init in zip(b["seeds"], b["final_loss"], b["initial_val_loss"]["per_seed"])]
    return sweep_report.summarize(records, "size")


def grad_stats(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``log`` of gradient norms: the median pre-clip gradient norm over the first and the last tenth of the
    steps, and the max; each block's gradient norm (bottom to top) at the first and the last evaluating step
    (``block_grads``)."""
    g = np.array([row[2] for row in r["train_curve"]], dtype=float)
    blocks = r.get("block_grads") or []
    per_block = {"first_step": blocks[0][0], "first": blocks[0][1], "last_step": blocks[-1][0],
                 "last": blocks[-1][1]} if blocks else None
    if not len(g):                                      # diverged at the first step
        return {"grad_norm": {"first": math.nan, "last": math.nan, "max": math.nan}, "block_grads": per_block}
    k = max(1, len(g) // 10)
    return {"grad_norm": {"first": float(np.median(g[:k])), "last": float(np.median(g[-k:])),
                          "max": float(np.nanmax(g))}, "block_grads": per_block}


def by_group(summary: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The summary's model entries by ``group``, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in summary["models"].values():
        out.setdefault(e["group"], []).append(e)
    return out


def scored(entry: Mapping[str, Any], block: int = 0) -> dict[str, Any]:
    """``seeds``, ``final_loss`` and ``unigram`` of a model entry's scored block ``block`` (none scored: empty)."""
    b = entry["scored"][block] if len(entry["scored"]) > block else {"seeds": [], "final_loss": [], "unigram": []}
    return {k: b[k] for k in ("seeds", "final_loss", "unigram")}


def tuned(entry: Mapping[str, Any], block: int = 0) -> dict[str, Any]:
    """A model entry as the verdict rules' *tuned model* (`sigprop.experiments.verdicts`): ``lr_grid``,
    ``tuning_loss``, ``tuning_seed``, ``tuning_unigram``, and its `scored` block ``block``."""
    t = entry["tuning"]
    return {"lr_grid": entry["lr_grid"], "tuning_loss": t["loss"], "tuning_seed": t["seed"],
            "tuning_unigram": t["unigram"], **scored(entry, block)}


def lr_text(entry: Mapping[str, Any]) -> str:
    """"lr 0.003 (grid 0.001–0.01, 3 values; extended: …)" of a tuned model entry."""
    g, t = entry["lr_grid"], entry["tuning"]
    best = "none (every lr diverged)" if t["best_lr"] is None else f"{t['best_lr']:g}"
    ext = f"; {'; '.join(entry['extended'])}" if entry["extended"] else ""
    return f"lr {best} (grid {g[0]:g}–{g[-1]:g}, {len(g)} values{', at its edge' if t['at_edge'] else ''}{ext})"


def stat_text(s: Mapping[str, float], fmt: str = ".3f") -> str:
    """"mean ± std" of a `seed_stats` result, both in format ``fmt``."""
    return f"{s['mean']:{fmt}} ± {s['std']:{fmt}}"


def _values(b: Mapping[str, Any] | None, key: str) -> Any:
    """``key`` of a scored block, else its logged ``key`` ([]: no block, or no such quantity)."""
    return [] if b is None else b[key] if key in b else b["logged"].get(key, [])


def stat_cell(key: str, fmt: str = ".3f", pick: Callable[[Any], float] | None = None) -> Callable[..., str]:
    """A `Column`'s cell: "mean ± std" over seeds of ``key`` in the scored block (else its logged ``key``), each
    seed's value through ``pick`` first (empty ones dropped); "–": no block or no values."""
    def cell(e: Mapping[str, Any], b: Mapping[str, Any] | None, s: Mapping[str, Any]) -> str:
        values = [pick(x) for x in _values(b, key) if x] if pick else _values(b, key)
        return stat_text(seed_stats(values), fmt) if len(values) else "–"
    return cell


def group_cell(show: Callable[[str, Any], Any]) -> Callable[..., Any]:
    """A `Column`'s cell on the first row of each group only: ``show(group, the results under the group's name)``."""
    def cell(e: Mapping[str, Any], b: Mapping[str, Any] | None, s: Mapping[str, Any]) -> Any:
        first = next(k for k, x in s["models"].items() if x["group"] == e["group"])
        return show(e["group"], s["results"][e["group"]]) if e["key"] == first else ""
    return cell


def seeds_cell(key: str, show: Callable[[Any], str] = "{:.3f}".format) -> Callable[..., str]:
    """A `Column`'s cell: ``show`` of each seed's ``key`` in the scored block (else its logged ``key``), joined by
    " · " ("–": no block or no values); a `seed_stats` entry (``final_val_loss``, ...) shown as "mean ± std"."""
    def cell(e: Mapping[str, Any], b: Mapping[str, Any] | None, s: Mapping[str, Any]) -> str:
        values = _values(b, key)
        if isinstance(values, Mapping):
            return stat_text(values)
        return " · ".join(show(x) for x in values) or "–"
    return cell


MODEL: Column = ("model", lambda e, b, s: e["label"])
LR: Column = ("lr (tuning seed)", lambda e, b, s: lr_text(e) if e["tuning"] else "–")
FINAL: Column = ("final val loss", lambda e, b, s: stat_text(b["final_val_loss"]) if b else "–")
UNIGRAM: Column = ("unigram", lambda e, b, s: f"{sum(b['unigram']) / len(b['unigram']):.3f}"
                   if b and b["unigram"] and None not in b["unigram"] else "–")

