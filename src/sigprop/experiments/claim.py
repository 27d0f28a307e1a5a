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
   ``rule`` gives (verdict, reason) from that summary alone (so `judge` recomputes it from NAME.json);
5. *write* NAME.json ({"summary", "data": the runs' curves}), NAME.md and NAME.png.

Summary schema (every claim): ``claim``, ``verdict``, ``verdict_reason``, ``verdicts`` (the claim's
further rules: name → [verdict, reason]), ``seeds``, ``tuning_seed``, ``sizes``, ``wall_s``,
``results`` (what the claim derives from its models: gaps, panels; `Claim.derive`), and ``models``: data
key → ``label`` (display only), ``group``, ``attrs`` (the model's facts: scheme, depth, ...), ``params``,
``lr_grid`` (floats, ascending) and ``extended`` (one line per added lr), ``tuning`` (None, or ``seed``,
``loss`` per lr of the grid, ``unigram``, ``best_lr``, ``at_edge``) and ``scored``: one block per scored lr
with ``lr``, ``seeds``, ``final_loss``, ``unigram`` and ``diverged`` (per seed), `seed_stats` of the final,
initial and best validation loss and accuracy, and ``logged`` (the claim's ``log`` quantities per seed).

A new claim is one module: its ``FULL``/``QUICK`` sizes (``seeds``, ``tuning_seed``, ``jobs``,
``max_extend`` and its own), ``models(sizes)``, ``rule(summary)`` (a call into `verdicts`), ``setup``,
``table`` and ``plot``, and ``CLAIM = Claim(...)``; plus its line in `sigprop.experiments.registry`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..console import UserError
from ..train.levels import unigram_loss
from ..train.lr_grid import best_lr
from ..train.seed_stats import seed_stats
from .outputs import WallClock, progress, write_outputs
from .report import Table
from .training import param_count, resolve_sizes
from .tuning import sweep_runs, tune

RUN_SCALARS = ("lr", "seed", "final_val_loss", "initial_val_loss", "best_val_loss", "final_val_acc", "diverged",
               "error", "steps_done", "wall_s")
CURVE_KEYS = ("val_curve", "train_curve", "diag", "diag_layers")
STATS = ("final_val_loss", "initial_val_loss", "best_val_loss", "final_val_acc")


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


@dataclass(frozen=True)
class Claim:
    """A training claim as data. ``models(sizes)`` builds the compared models; ``rule(summary)`` is the
    verdict (``rules``: further verdicts reported beside it); ``log(record)`` the extra per-run quantities
    kept per seed;
    ``extend(grid, points)`` the lrs to add to an untuned group's grid and why (None: stop);
    ``derive(summary)`` the claim's ``results``; ``setup``, ``table``, ``notes`` (Markdown after the table)
    and ``plot(summary, data)`` render it."""

    name: str
    title: str
    claim: str
    full: Mapping[str, Any]
    quick: Mapping[str, Any]
    models: Callable[[Mapping[str, Any]], list[Model]]
    rule: Rule
    setup: Callable[[Mapping[str, Any]], str]
    table: Callable[[Mapping[str, Any]], Table]
    plot: Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
    rules: Mapping[str, Rule] = field(default_factory=dict)
    log: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    extend: Callable[[list[float], list[dict[str, Any]]], tuple[list[float], str] | None] | None = None
    derive: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    notes: Callable[[Mapping[str, Any]], str] | None = None


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


def judge(claim: Claim, summary: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) of ``claim`` recomputed from a saved summary."""
    return claim.rule(summary)


def markdown(claim: Claim, summary: Mapping[str, Any]) -> str:
    """The results section: ``## NAME — title``, the claim, the setup, the table, the verdicts."""
    more = "".join(f" {k}: {v} ({reason})" for k, (v, reason) in summary["verdicts"].items())
    return (f"## {claim.name} — {claim.title}\n\n**Claim** {claim.claim}\n\n**Setup.** {claim.setup(summary)}\n\n"
            f"{claim.table(summary).markdown()}\n" + (f"{claim.notes(summary)}\n\n" if claim.notes else "")
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
    ``sizes`` override the keys of ``claim.quick`` (``quick``) or ``claim.full``; an unknown key is a ValueError."""
    out = Path(out)
    s = resolve_sizes(claim.quick if quick else claim.full, dict(sizes or {}))
    clock = WallClock(out, claim.name)
    models, points, extended, records = run_points(claim, s, out, show_progress)
    summary = summarize(claim, s, models, points, extended)
    summary["wall_s"] = clock.seconds()
    data = curves(records)
    return write_outputs(out, claim.name, data, summary, markdown(claim, summary), claim.plot(summary, data))


def tuned(entry: Mapping[str, Any], block: int = 0) -> dict[str, Any]:
    """A model entry as the verdict rules' *tuned model* (`sigprop.experiments.verdicts`): ``lr_grid``,
    ``tuning_loss``, ``tuning_seed``, ``tuning_unigram``, and ``seeds``, ``final_loss``, ``unigram`` of its
    scored block ``block`` (none scored: empty)."""
    t, s = entry["tuning"], entry["scored"][block] if len(entry["scored"]) > block else None
    return {"lr_grid": entry["lr_grid"], "tuning_loss": t["loss"], "tuning_seed": t["seed"],
            "tuning_unigram": t["unigram"], "seeds": s["seeds"] if s else [],
            "final_loss": s["final_loss"] if s else [],
            "unigram": s["unigram"] if s else []}


def lr_text(entry: Mapping[str, Any]) -> str:
    """"lr 0.003 (grid 0.001–0.01, 3 values; extended: …)" of a tuned model entry."""
    g, t = entry["lr_grid"], entry["tuning"]
    best = "none (every lr diverged)" if t["best_lr"] is None else f"{t['best_lr']:g}"
    ext = f"; {'; '.join(entry['extended'])}" if entry["extended"] else ""
    return f"lr {best} (grid {g[0]:g}–{g[-1]:g}, {len(g)} values{', at its edge' if t['at_edge'] else ''}{ext})"


def stat_text(s: Mapping[str, float], fmt: str = ".3f") -> str:
    """"mean ± std" of a `seed_stats` result, both in format ``fmt``."""
    return f"{s['mean']:{fmt}} ± {s['std']:{fmt}}"

