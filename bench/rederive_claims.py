"""Re-derive every committed claim summary (docs/results/NAME.json) with the claim harness and compare.

For each claim: extract the per-point records its committed summary holds (tuning loss per lr, per-seed
final/initial/best losses and accuracies, unigram levels, the per-seed logged quantities), run the
harness's `summarize` (which builds the models from the claim's sizes, so parameter counts are
recomputed) and the claim's rule on them, map every old key to its key in the harness's schema, and
compare them key by key: numbers equal (NaN equals NaN; floats the harness re-averages may differ in the
last bits: equal within 1e-12 relative), strings and booleans identical.

Keys not compared, counted per claim: *carried* (records of the run itself, not derivable from the
points: grid-extension lines, wall times); *not in the records* (derived from data the committed summary
does not hold: deep-thin's gap curves need the per-seed validation curves; depth-transfer's panels hold
per size only η*, its edge flag and the loss at η*, so its loss-vs-lr curves, LR sensitivity and transfer
regret cannot be recomputed: its rule, which reads η* and the edge flags, is re-run on those);
*constants* (fixed setup facts of the claim's module, compared against it).

    PYTHONPATH=src python bench/rederive_claims.py [--results docs/results] [--show 5]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable

from sigprop.experiments import deep_thin, depth_transfer, dslm_depth, entropy_collapse, shaped_vs_preln
from sigprop.experiments.claim import summarize
from sigprop.experiments.shaped_setup import DATA, MODEL
from sigprop.models import ModelConfig
from sigprop.train.schedules import default_warmup

NAN = math.nan
CARRIED, MISSING = "carried", "not in the records"


def flat(x: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Every leaf of nested dicts/lists by its path."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in flat(val, (*path, key)).items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in flat(val, (*path, i)).items()}
    return {path: x}


def get(x: Any, path: tuple) -> Any:
    for k in path:
        x = x[k]
    return x


def same(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if not numbers:
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def point(model: str, role: str, lr: float, seed: int, final: float, initial: float = NAN, best: float = NAN,
          acc: float = NAN, unigram: float | None = None, logged: dict | None = None,
          diverged: bool | None = None) -> dict[str, Any]:
    """One per-point record as `run_points` builds it (from a committed summary's numbers)."""
    return {"model": model, "role": role, "lr": lr, "seed": seed, "final_val_loss": final,
            "initial_val_loss": initial, "best_val_loss": best, "final_val_acc": acc, "unigram": unigram,
            "logged": logged or {},
            "diverged": (not math.isfinite(final)) if diverged is None else diverged}


def tuned_points(key: str, m: dict, unigram: float | None = None) -> list[dict[str, Any]]:
    return [point(key, "tuning", lr, m["tuning_seed"], x, unigram=unigram)
            for lr, x in zip(m["lr_grid"], m["tuning_loss"])]


# --- per claim: (sizes, per-point records, extension lines, mapping old path -> new path | callable | tag)

def shaped(old: dict) -> tuple:
    cl, setup = shaped_vs_preln, old["setup"]
    sizes = {**cl.FULL, **{k: setup[k] for k in ("steps", "batch_size", "n_layers", "d_model", "eval_batches", "jobs",
                                                   "max_extend", "qk_scaling")},
             "seeds": old["seeds"], "tuning_seed": old["tuning_seed"]}
    keys = {m.label: m.key for m in cl.CLAIM.models(sizes)}
    points, ext = [], {}
    for label, m in old["models"].items():
        k = keys[label]
        ext[k] = m["extended"]
        points += tuned_points(k, m)
        points += [point(k, "scored", m["best_lr"], s, x, m["initial_val_loss"]["per_seed"][i],
                         m["best_val_loss"]["per_seed"][i],
                         unigram=old["unigram_val_loss"] if k == cl.BASELINE else None)
                   for i, (s, x) in enumerate(zip(m["seeds"], m["final_loss"]))]
    shaped_key = next(k for k in keys.values() if k != cl.BASELINE)
    consts = {"arch": MODEL["arch"], "vocab_size": MODEL["vocab_size"], "n_heads": MODEL["n_heads"],
              "max_seq_len": MODEL["max_seq_len"], "seq_len": DATA["seq_len"]}

    def mapping(p: tuple) -> Any:
        if p[0] in ("verdict", "verdict_reason", "seeds", "tuning_seed"):
            return p
        if p[0] == "wall_s":
            return CARRIED
        if p == ("unigram_val_loss",):
            return ("results", "unigram_val_loss")
        if p[0] == "params":
            return ("models", cl.BASELINE if p[1] == "preln" else shaped_key, "params")
        if p[0] == "setup":
            if p[1] in consts:
                return lambda new: consts[p[1]]
            if p[1] == "warmup":
                return lambda new: default_warmup(new["sizes"]["steps"])
            if p[1] == "eval_examples":
                return lambda new: new["sizes"]["eval_batches"] * new["sizes"]["batch_size"]
            return ("sizes", p[1])
        return model_path(("models", keys[p[1]]), p[2:])
    return sizes, points, ext, mapping


def model_path(base: tuple, rest: tuple) -> Any:
    """A tuned model's old field → its place in the harness schema (first scored block)."""
    f, tail = rest[0], rest[1:]
    table = {"lr_grid": ("lr_grid",), "tuning_loss": ("tuning", "loss"), "tuning_seed": ("tuning", "seed"),
             "best_lr": ("tuning", "best_lr"), "at_edge": ("tuning", "at_edge"),
             "tuning_unigram": ("tuning", "unigram"),
             "seeds": ("scored", 0, "seeds"), "final_loss": ("scored", 0, "final_loss"),
             "unigram": ("scored", 0, "unigram"), "final_val_loss": ("scored", 0, "final_val_loss"),
             "initial_val_loss": ("scored", 0, "initial_val_loss"), "best_val_loss": ("scored", 0, "best_val_loss"),
             "final_val_acc": ("scored", 0, "final_val_acc"), "params": ("params",), "lr": ("scored", 0, "lr")}
    if f == "extended":
        return CARRIED
    if f == "diverged" and not tail:                     # a count of diverged seeds
        return lambda new: sum(get(new, (*base, "scored", 0, "diverged")))
    if f == "diverged":
        return (*base, "scored", 0, "diverged", *tail)
    if f in table:
        return (*base, *table[f], *tail)
    return None


def entropy(old: dict) -> tuple:
    cl, setup = entropy_collapse, old["setup"]
    sizes = {**cl.FULL, **{k: setup[k] for k in ("steps", "batch_size", "n_layers", "d_model", "eval_batches", "jobs",
                                                   "max_extend")}, "seeds": old["seeds"]}
    keys = {m.label: m.key for m in cl.CLAIM.models(sizes)}
    grid = old["lr_grid"]
    lr_of = {f"{lr:g}": lr for lr in grid}
    j_of = {f"{lr:g}": j for j, lr in enumerate(sorted(grid))}
    fields = {"final_entropy": "entropy", "final_min_entropy": "min_entropy", "attn_entropy": "attn_entropy",
              "max_logit": "max_logit", "stream_rms": "stream_rms"}
    points = []
    for label, m in old["models"].items():
        for s_lr, losses in m["final_loss"].items():
            points += [point(keys[label], "scored", lr_of[s_lr], seed, x,
                             logged={new: m[f][s_lr][i] for f, new in fields.items()})
                       for i, (seed, x) in enumerate(zip(m["seeds"], losses))]
    ext = {k: old["extended"] for k in keys.values()}
    consts = {"arch": MODEL["arch"], "vocab_size": MODEL["vocab_size"], "n_heads": MODEL["n_heads"],
              "max_seq_len": MODEL["max_seq_len"], "seq_len": DATA["seq_len"]}

    def mapping(p: tuple) -> Any:
        if p[0] in ("verdict", "verdict_reason", "seeds"):
            return p
        if p[0] in ("wall_s", "extended"):
            return CARRIED
        if p[0] == "verdict_temperature":
            return ("verdicts", "temperature", 0)
        if p[0] == "verdict_temperature_reason":
            return ("verdicts", "temperature", 1)
        if p[0] == "lr_grid":
            return ("models", cl.BASELINE, "lr_grid", *p[1:])
        if p[0] == "threshold":
            return ("results", "threshold")
        if p[0] == "setup":
            if p[1] in consts:
                return lambda new: consts[p[1]]
            if p[1] == "warmup":
                return lambda new: default_warmup(new["sizes"]["steps"])
            if p[1] == "diag_every":
                return lambda new: max(1, new["sizes"]["steps"] // 20)
            return ("sizes", p[1])
        k, f = keys[p[1]], p[2]
        if f == "lr_grid":
            return ("models", k, "lr_grid", *p[3:])
        if f == "best_lr":
            return ("results", "models", k, "best_lr")
        if f == "seeds":
            return ("models", k, "scored", 0, "seeds", *p[3:])
        j = j_of[p[3]]
        if f == "final_loss":
            return ("models", k, "scored", j, "final_loss", *p[4:])
        if f == "collapsed_seeds":
            return ("results", "models", k, "collapsed_seeds", j)
        if f == "diverged":
            return lambda new: sum(new["models"][k]["scored"][j]["diverged"])
        return ("models", k, "scored", j, "logged", fields[f], *p[4:])
    return sizes, points, ext, mapping


def dslm(old: dict) -> tuple:
    cl = dslm_depth
    sizes = {**cl.FULL, **old["sizes"], "tuning_seed": old["tuning_seed"]}
    keys = {m.label: m.key for m in cl.CLAIM.models(sizes)}
    points, ext = [], {}
    for label, c in old["configs"].items():
        k = keys[label]
        ext[k] = c.get("extended", [])
        if "lr_grid" in c:
            points += tuned_points(k, c, c["tuning_unigram"])
        points += [point(k, "scored", c["lr"], s, x, c["initial_val_loss"]["per_seed"][i], unigram=c["unigram"][i],
                         logged={"grad_norm": c["grad_norm"][i]}, diverged=c["diverged"][i])
                   for i, (s, x) in enumerate(zip(c["seeds"], c["final_loss"]))]

    def mapping(p: tuple) -> Any:
        if p[0] in ("verdict", "verdict_reason", "seeds", "tuning_seed"):
            return p
        if p[0] == "wall_s":
            return CARRIED
        if p[0] in ("sizes", "deep_seeds"):
            return ("sizes", *p[1:]) if p[0] == "sizes" else ("sizes", "deep_seeds", *p[1:])
        k, f = keys[p[1]], p[2]
        if f in ("scheme", "norm", "depth"):
            return ("models", k, "attrs", f)
        if f in ("trains", "largest_stable_lr", "largest_stable_at_top", "tuning_trains"):
            return ("results", k, f, *p[3:])
        if f == "grad_norm":
            return ("models", k, "scored", 0, "logged", "grad_norm", *p[3:])
        return model_path(("models", k), p[2:])
    return sizes, points, ext, mapping


def thin(old: dict) -> tuple:
    cl = deep_thin
    sizes = {**cl.FULL, "seeds": old["seeds"], "tuning_seed": old["tuning_seed"]}
    points, ext = [], {}
    for name, st in old["settings"].items():
        u = st["unigram_val_loss"]
        for kind, m in st["models"].items():
            k = f"{name}/{kind}"
            ext[k] = m["extended"]
            points += tuned_points(k, m)
            points += [point(k, "scored", m["best_lr"], s, x, acc=m["final_val_acc"]["per_seed"][i],
                             unigram=u["per_seed"][i] if u else None)
                       for i, (s, x) in enumerate(zip(m["seeds"], m["final_loss"]))]

    def mapping(p: tuple) -> Any:
        if p[0] in ("verdict", "verdict_reason", "seeds", "tuning_seed"):
            return p
        if p[0] == "wall_s":
            return CARRIED
        name, f = p[1], p[2]
        if f in ("steps", "batch_size"):
            return ("models", f"{name}/deep-thin", "attrs", f)
        if f == "gap_curve":
            return MISSING
        if f != "models":
            return ("results", name, f, *p[3:])
        k, g = f"{name}/{p[3]}", p[4]
        if g == "wall_s":
            return CARRIED
        if g == "norm":                                  # the model table's field now, in its old spelling
            old_norm = ModelConfig.RENAMED_KEYS["norm"]
            return lambda new: old_norm.old_value(get(new, ("models", k, "attrs", old_norm.new)))
        if g in ("shape", "arch", "scheme", "n_layers", "d_model", "n_heads", "vocab_size", "max_seq_len",
                 "non_embedding_params"):
            return ("models", k, "attrs", g)
        return model_path(("models", k), p[4:])
    return sizes, points, ext, mapping


CLAIMS: dict[str, tuple[Any, Callable]] = {"shaped-vs-preln": (shaped_vs_preln, shaped),
                                           "entropy-collapse": (entropy_collapse, entropy),
                                           "dslm-depth": (dslm_depth, dslm), "deep-thin": (deep_thin, thin)}


def transfer(old: dict) -> dict:
    """depth-transfer: the rule on the committed panels' η* and edge flags (all its per-point data the summary
    holds), beside each panel's status."""
    cl = depth_transfer
    names = {label: (key, name, "depth") for key, (name, _) in cl.DEPTH.items() for label in [name]}
    names |= {f"width {name}": (key, name, "width") for key, (name, _) in cl.WIDTH.items()}
    panels = {names[label][0]: {"name": names[label][1], "axis": names[label][2],
                                "status": cl.verdicts.transfer_status(p["best_lr"], p["edge"])}
              for label, p in old["panels"].items()}
    verdict, reason = cl.CLAIM.rule({"results": {"panels": panels}})
    return {"verdict": verdict, "verdict_reason": reason, "panels": panels, "labels": names}


def compare_transfer(old: dict) -> tuple[int, list[str], int]:
    new = transfer(old)
    diffs, n = [], 0
    for p in (("verdict",), ("verdict_reason",)):
        n += 1
        if not same(get(old, p), get(new, p)):
            diffs.append(f"{p}: {get(old, p)!r} != {get(new, p)!r}")
    for label, panel in old["panels"].items():
        n += 1
        got = new["panels"][new["labels"][label][0]]["status"]
        if got != panel["status"]:
            diffs.append(f"panels.{label}.status: {panel['status']} != {got}")
    missing = sum(1 for k in flat(old) if k[:1] not in (("verdict",), ("verdict_reason",))) - len(old["panels"])
    return n, diffs, missing


def compare(name: str, old: dict) -> tuple[int, list[str], dict[str, int]]:
    module, extract = CLAIMS[name]
    sizes, points, ext, mapping = extract(old)
    new = json.loads(json.dumps(summarize(module.CLAIM, sizes, module.CLAIM.models(sizes), points, ext)))
    n, diffs, other = 0, [], {CARRIED: 0, MISSING: 0}
    for path, value in flat(old).items():
        target = mapping(path)
        if target in (CARRIED, MISSING):
            other[target] += 1
            continue
        if target is None:
            diffs.append(f"{'.'.join(map(str, path))}: no key in the harness schema")
            continue
        n += 1
        try:
            got = target(new) if callable(target) else get(new, target)
        except (KeyError, IndexError, TypeError) as e:
            diffs.append(f"{'.'.join(map(str, path))} -> {target}: missing ({e!r})")
            continue
        if not same(value, got):
            diffs.append(f"{'.'.join(map(str, path))}: {value!r} != {got!r}")
    return n, diffs, other


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="docs/results")
    ap.add_argument("--show", type=int, default=5, help="differences printed per claim")
    args = ap.parse_args()
    print(f"{'claim':18s} {'compared':>8s} {'equal':>6s} {'differ':>6s} {'carried':>7s} {'not in records':>14s}")
    for path in sorted(Path(args.results).glob("*.json")):
        old = json.loads(path.read_text())
        if "claim" in old:       # written by the harness itself: nothing to map, its rule recomputes from it
            continue
        if path.stem == "depth-transfer":
            n, diffs, missing = compare_transfer(old)
            other = {CARRIED: 0, MISSING: missing}
        else:
            n, diffs, other = compare(path.stem, old)
        print(f"{path.stem:18s} {n:8d} {n - len(diffs):6d} {len(diffs):6d} {other[CARRIED]:7d} {other[MISSING]:14d}")
        for d in diffs[:args.show]:
            print(f"    {d}")


if __name__ == "__main__":
    main()
