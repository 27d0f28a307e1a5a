"""The Shaped Transformer (Noci et al. 2023) figures at CPU scale: finite-network ensembles
(`sigprop.simulate.ensemble`) and the covariance SDE (`sigprop.theory.sde`).

* fig1: token correlation over depth for softmax (no LN), Pre-LN and shaped attention (+ SDE overlay),
  and the density of the final correlation, finite shaped network vs SDE (KS statistic).
* fig2: per-layer gradient norm ‖∂ℓ/∂X_l‖² vs depth (`ensemble.gradient_norms`, explicit weights).
* fig4: ablations of shaped attention (no centering, no identity, standard temperature) at two widths:
  collapse, freeze-and-vanish, explosion of the covariance (statistics in `fig4`'s docstring).
* fig5: blow-up vs gamma for V0 = s·[[1, ρ0], [ρ0, 1]]: SDE stopped/exploded fraction and median
  stopping time, beside the fraction of finite networks (depth = width) that cross the same norm.

    from sigprop.experiments import shaped_figs
    summary = shaped_figs.run("runs/shaped_figs")      # one subfolder per figure: JSON + PNG + Markdown
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from ..simulate import ensemble  # noqa: E402
from ..theory import sde  # noqa: E402
from .outputs import progress, write_outputs  # noqa: E402

RHO0 = 0.2
GAMMA, TAU0 = 0.3, 1.0
SHAPED_KW = {"gamma": GAMMA, "tau0": TAU0}


def _V0(scale: float = 1.0) -> torch.Tensor:
    return scale * torch.tensor([[1.0, RHO0], [RHO0, 1.0]], dtype=torch.float64)


def correlation(V: torch.Tensor) -> np.ndarray:
    """ρ^{12} = V12 / sqrt(V11 V22) of (..., 2, 2) covariances."""
    return (V[..., 0, 1] / (V[..., 0, 0] * V[..., 1, 1]).sqrt()).numpy()


def _band(r: np.ndarray) -> dict[str, list[float]]:
    """Mean and 5–95 % band over axis 0 of (samples, T)."""
    return {"mean": r.mean(0).tolist(), "q05": np.quantile(r, 0.05, 0).tolist(),
            "q95": np.quantile(r, 0.95, 0).tolist()}


def _plot_band(ax: Any, x: np.ndarray, b: dict[str, list[float]], label: str, **kw: Any) -> None:
    line, = ax.plot(x, b["mean"], label=label, **kw)
    ax.fill_between(x, b["q05"], b["q95"], color=line.get_color(), alpha=0.2)


def fig1(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """Correlation over depth, width = depth (t = depth/width = 1), softmax / preln / shaped + SDE."""
    start = time.time()
    n, samples, paths, steps = (16, 64, 200, 64) if quick else (128, 1000, 2000, 256)
    blocks = {"softmax": {}, "preln": {}, "shaped": SHAPED_KW}
    rho = {b: correlation(ensemble.simulate(b, _V0(), n, n, samples, seed=1, method="gaussian", **kw))
           for b, kw in progress(blocks.items(), "fig1: finite networks", total=len(blocks))}
    P = sde.simulate("transformer", _V0(), t=1.0, steps=steps, paths=paths, seed=2, **SHAPED_KW)
    live = ~P.stopped.numpy()
    rho_sde = correlation(P.V)[live]
    data = {b: _band(r) for b, r in rho.items()}
    data["sde"] = {**_band(rho_sde), "times": P.times.tolist()}
    fin_shaped, fin_sde = rho["shaped"][:, -1], rho_sde[:, -1]
    ks = stats.ks_2samp(fin_shaped, fin_sde)
    summary = {"width": n, "depth": n, "samples": samples, "sde_paths": paths, "sde_steps": steps,
               "gamma": GAMMA, "tau0": TAU0, "rho0": RHO0,
               "final_mean_corr": {**{b: float(r[:, -1].mean()) for b, r in rho.items()},
                                   "sde": float(fin_sde.mean())},
               "final_std_corr": {"shaped": float(fin_shaped.std()), "sde": float(fin_sde.std())},
               "sde_stopped_fraction": float(P.stopped.float().mean()),
               "ks_shaped_vs_sde": {"statistic": float(ks.statistic), "pvalue": float(ks.pvalue)},
               "wall_s": round(time.time() - start, 2)}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(n + 1) / n
    for blk in blocks:
        _plot_band(a, x, data[blk], blk)
    _plot_band(a, np.asarray(data["sde"]["times"]), data["sde"], "shaped SDE", ls="--", color="k")
    a.set(xlabel="layer / width  (t)", ylabel="ρ¹²", title=f"correlation, n = d = {n}")
    a.legend()
    bins = np.linspace(min(fin_shaped.min(), fin_sde.min()), max(fin_shaped.max(), fin_sde.max()), 30)
    b.hist(fin_shaped, bins=bins, density=True, alpha=0.5, label="shaped (finite)")
    b.hist(fin_sde, bins=bins, density=True, histtype="step", color="k", label="SDE")
    b.set(xlabel="final ρ¹²", ylabel="density", title=f"KS = {ks.statistic:.3f}")
    b.legend()
    fc = summary["final_mean_corr"]
    md = (f"### Fig. 1 — correlation over depth (n = d = {n}, {samples} nets, γ = {GAMMA}, τ0 = {TAU0})\n\n"
          "| block | final mean ρ |\n|---|---|\n" + "".join(f"| {k} | {v:.4f} |\n" for k, v in fc.items())
          + f"\nKS(shaped finite vs SDE, final ρ) = {ks.statistic:.3f} (p = {ks.pvalue:.2g}); "
          f"SDE stopped fraction {summary['sde_stopped_fraction']:.3f}. Softmax without LN collapses "
          "(ρ → 1); shaped attention keeps a non-degenerate correlation distribution.\n")
    return write_outputs(out_dir, "fig1", data, summary, md, fig)


def fig2(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """Per-layer gradient norm ‖∂ℓ/∂X_l‖_F² (mean, 5–95 %) vs layer, explicit-weight networks."""
    start = time.time()
    n, samples = (12, 8) if quick else (64, 32)
    blocks = {"softmax": {}, "preln": {}, "postln": {}, "shaped": SHAPED_KW}
    g = {b: ensemble.gradient_norms(b, _V0(), n, n, samples, seed=3, **kw).numpy() for b, kw in blocks.items()}
    data = {b: _band(np.log10(v)) for b, v in g.items()}
    summary = {"width": n, "depth": n, "samples": samples,
               "grad_norm_first_layer": {b: float(v[:, 0].mean()) for b, v in g.items()},
               "grad_norm_last_layer": {b: float(v[:, -1].mean()) for b, v in g.items()},
               "ratio_first_over_last": {b: float(v[:, 0].mean() / v[:, -1].mean()) for b, v in g.items()},
               "wall_s": round(time.time() - start, 2)}
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in blocks:
        _plot_band(ax, np.arange(n), data[b], b)
    ax.set(xlabel="layer l", ylabel="log10 ‖∂ℓ/∂X_l‖²", title=f"gradient norms, n = d = {n}")
    ax.legend()
    md = (f"### Fig. 2 — per-layer gradient norm (n = d = {n}, {samples} nets)\n\n"
          "| block | first layer | last layer | first/last |\n|---|---|---|---|\n"
          + "".join(f"| {b} | {summary['grad_norm_first_layer'][b]:.3g} | {summary['grad_norm_last_layer'][b]:.3g}"
                    f" | {summary['ratio_first_over_last'][b]:.3g} |\n" for b in blocks))
    return write_outputs(out_dir, "fig2", data, summary, md, fig)


ABLATIONS = ("no_centering", "no_identity", "standard_temperature")
FIG4_VARIANTS = ("shaped", "attention") + ABLATIONS
# Leading-order per-layer change of log(tr V/m) (derivations in fig4's docstring); O(1), not O(1/n).
LOG_TRACE_RATE = {"no_centering": math.log(1 + 3 * GAMMA**2), "no_identity": math.log(1 - GAMMA**2)}


def log_trace(V: torch.Tensor) -> np.ndarray:
    """log(tr V / m) of (..., m, m) covariances."""
    return V.diagonal(dim1=-2, dim2=-1).mean(-1).log().numpy()


def ablation(variant: str, width: int, samples: int, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(ρ¹², log(tr V/m)), each (samples, width + 1), of `variant` networks at depth = width (t = 1).

    γ = GAMMA, τ0 = TAU0, V0 = [[1, ρ0], [ρ0, 1]]; the exact Gram sampler (same law as explicit weights).
    """
    V = ensemble.simulate(variant, _V0(), width, width, samples, seed=seed, method="gram", **SHAPED_KW)
    return correlation(V), log_trace(V)


def final_stats(rho: np.ndarray, log_tr: np.ndarray) -> dict[str, float]:
    """Mean and std over networks of the final ρ and log(tr V/m), and `log_trace_rate`, the per-layer
    slope of mean log(tr V/m) over the second half of depth."""
    d = rho.shape[1] - 1
    return {"mean_corr": float(rho[:, -1].mean()), "std_corr": float(rho[:, -1].std()),
            "mean_log_trace": float(log_tr[:, -1].mean()), "std_log_trace": float(log_tr[:, -1].std()),
            "log_trace_rate": float((log_tr[:, -1].mean() - log_tr[:, d // 2].mean()) / (d - d // 2))}


def fig4(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """Ablations of shaped attention (attention-only blocks; "shaped" adds the MLP) at depth = width n
    for two widths: each ablation leaves the O(1/n)-per-layer regime of the SDE, so its law at t = 1
    has no non-degenerate n → ∞ limit.

    * no centering, A = I + Softmax: as τ → ∞, A → I + 11ᵀ/m, so E[V'] = λ²V + γ²(I + 11ᵀ/m)V(I + 11ᵀ/m):
      the mean-token direction grows by 1 + 3γ² per layer, the others by 1. log(tr V/m) grows at
      log(1 + 3γ²) per layer and 1 − ρ ≈ 2(1 − ρ0)/(1 + ρ0)·(1 + 3γ²)^{−d} → 0 (rank collapse).
    * no identity, A = Softmax − 11ᵀ/m = O(n^{-1/2}): V' = (1 − γ²)V + O(1/n), so V_d ≈ (1 − γ²)^d V0
      vanishes and ρ freezes at ρ0; its spread comes from O(1/n) per-layer terms damped by (1 − γ²)^l,
      so std(ρ_d) ∝ 1/n → 0 (a point mass).
    * standard temperature τ = τ0√n_k: logits O(1), Softmax − 11ᵀ/m = O(1), the per-layer change of V
      is O(1) with E[S V Sᵀ] ⪰ 0 feeding the norm: mean log(tr V/m) at t = 1 grows with n (explodes).
    Tests: tests/test_shaped_figs.py (`test_fig4_*`).
    """
    start = time.time()
    widths, samples = ((16, 32), 100) if quick else ((32, 128), 1000)
    runs = {n: {v: ablation(v, n, samples) for v in FIG4_VARIANTS} for n in widths}
    n = widths[-1]
    stats = {str(w): {v: final_stats(*r) for v, r in runs[w].items()} for w in widths}
    top = stats[str(n)]
    data = {"corr": {v: _band(r[0]) for v, r in runs[n].items()},
            "mean_log_trace": {str(w): {v: r[1].mean(0).tolist() for v, r in runs[w].items()} for w in widths}}
    summary = {"width": n, "depth": n, "samples": samples, "gamma": GAMMA, "tau0": TAU0, "rho0": RHO0,
               "final_mean_corr": {v: top[v]["mean_corr"] for v in FIG4_VARIANTS},
               "final_std_corr": {v: top[v]["std_corr"] for v in FIG4_VARIANTS},
               "widths": list(widths), "by_width": stats, "predicted_log_trace_rate": LOG_TRACE_RATE,
               "wall_s": round(time.time() - start, 2)}
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for v in FIG4_VARIANTS:
        _plot_band(a, np.arange(n + 1) / n, data["corr"][v], v)
        for w, ls in zip(widths, (":", "-")):
            b.plot(np.arange(w + 1) / w, data["mean_log_trace"][str(w)][v], ls=ls, color=a.lines[-1].get_color(),
                   label=f"{v}, n = {w}")
    a.set(xlabel="layer / width  (t)", ylabel="ρ¹²", title=f"ablations, n = d = {n}, γ = {GAMMA}")
    a.legend(fontsize=8)
    b.set(xlabel="layer / width  (t)", ylabel="mean log(tr V / m)", title="covariance scale, n = d")
    b.legend(fontsize=7, ncol=2)
    lo, hi = (stats[str(w)] for w in widths)
    md = (f"### Fig. 4 — ablations (depth = width n ∈ {{{widths[0]}, {n}}}, {samples} nets each, γ = {GAMMA}, "
          f"τ0 = {TAU0}, ρ0 = {RHO0})\n\n"
          "| variant | n | mean ρ | std ρ | n·std ρ | mean log(tr V/m) | per-layer rate of log(tr V/m) "
          "(predicted) |\n|---|---|---|---|---|---|---|\n"
          + "".join(f"| {v} | {w} | {st[v]['mean_corr']:.4f} | {st[v]['std_corr']:.4f} | "
                    f"{w * st[v]['std_corr']:.3f} | {st[v]['mean_log_trace']:.3f} | {st[v]['log_trace_rate']:.4f}"
                    + (f" ({LOG_TRACE_RATE[v]:.4f})" if v in LOG_TRACE_RATE else "") + " |\n"
                    for v in FIG4_VARIANTS for w, st in ((w, stats[str(w)]) for w in widths))
          + "\nPredicted (docstring): shaped attention, with or without the MLP, has an n-independent law at t = 1 "
            "(the SDE); each ablation leaves the O(1/n)-per-layer regime and degenerates as n = d grows. Measured:\n\n"
          f"* **no centering → collapse** (mean token × (1 + 3γ²) per layer): log-trace rate "
          f"{hi['no_centering']['log_trace_rate']:.3f} (predicted {LOG_TRACE_RATE['no_centering']:.3f}); "
          f"1 − mean ρ = {1 - lo['no_centering']['mean_corr']:.1e} (n = {widths[0]}), "
          f"{1 - hi['no_centering']['mean_corr']:.1e} (n = {n}).\n"
          f"* **no identity → frozen, vanishing** (V_d ≈ (1 − γ²)^d V0, std ρ ∝ 1/n): log-trace rate "
          f"{hi['no_identity']['log_trace_rate']:.4f} (predicted {LOG_TRACE_RATE['no_identity']:.4f}); mean ρ "
          f"{hi['no_identity']['mean_corr']:.4f} (ρ0 = {RHO0}); n·std ρ = "
          f"{widths[0] * lo['no_identity']['std_corr']:.2f} (n = {widths[0]}), "
          f"{n * hi['no_identity']['std_corr']:.2f} (n = {n}).\n"
          f"* **standard temperature → explosion** (O(1) change per layer): mean log(tr V/m) at t = 1 "
          f"{lo['standard_temperature']['mean_log_trace']:.2f} (n = {widths[0]}) → "
          f"{hi['standard_temperature']['mean_log_trace']:.2f} (n = {n}), shaped attention "
          f"{lo['attention']['mean_log_trace']:.2f} → {hi['attention']['mean_log_trace']:.2f}; mean ρ "
          f"{lo['standard_temperature']['mean_corr']:.3f} → {hi['standard_temperature']['mean_corr']:.3f} "
          f"(shaped attention {lo['attention']['mean_corr']:.3f} → {hi['attention']['mean_corr']:.3f}).\n")
    return write_outputs(out_dir, "fig4", data, summary, md, fig)


GAMMAS = (0.2, 0.4, 0.6, 0.8)
SCALES = (1.0, 100.0)


def first_blowup(V: torch.Tensor, blowup: float) -> np.ndarray:
    """Per network of V (samples, depth+1, m, m): the first layer with ‖V_l‖_F ≥ blowup or a non-finite
    V_l (an overflow), +inf if none."""
    norm = torch.linalg.matrix_norm(V)
    hit = ~torch.isfinite(norm) | (norm >= blowup)
    return torch.where(hit.any(1), hit.double().argmax(1).double(), math.inf).numpy()


def _median(x: np.ndarray) -> float | None:
    return float(np.median(x)) if len(x) else None


def fig5(out_dir: str | Path, quick: bool = False, blowup: float = 1e6) -> dict[str, Any]:
    """Blow-up vs gamma and initial scale s, V0 = s·[[1, ρ0], [ρ0, 1]]: the SDE ("transformer", t = 1) and
    finite "shaped" networks at depth = width (t = 1), same γ, τ0 and threshold.

    SDE "stopped" merges two events: ‖V‖_F ≥ ``blowup`` (``exploded``, reported separately) and an
    Euler proposal that is non-finite or not PSD, i.e. the fixed step failing for the cubic drift.
    A network is blown up once some layer has ‖V_l‖_F ≥ ``blowup`` (or overflows); its time is layer/width.
    """
    start = time.time()
    paths, steps, widths, samples = (200, 50, (16,), 50) if quick else (1000, 400, (64, 128), 500)
    rows = []
    for s, gm in progress([(s, g) for s in SCALES for g in GAMMAS], "fig5", enabled=not quick):
        P = sde.simulate("transformer", _V0(s), t=1.0, steps=steps, paths=paths, seed=5, gamma=gm, tau0=TAU0,
                         blowup=blowup)
        row = {"s": s, "gamma": gm, "stopped_fraction": float(P.stopped.float().mean()),
               "exploded_fraction": float(P.exploded.float().mean()),
               "median_stop_time": _median(P.stop_time[P.stopped].numpy()),
               "network_blown_fraction": {}, "network_median_blowup_time": {}}
        for n in widths:
            t_blow = first_blowup(ensemble.simulate("shaped", _V0(s), n, n, samples, seed=6, method="gram",
                                                    gamma=gm, tau0=TAU0), blowup) / n
            row["network_blown_fraction"][str(n)] = float(np.isfinite(t_blow).mean())
            row["network_median_blowup_time"][str(n)] = _median(t_blow[np.isfinite(t_blow)])
        rows.append(row)
    summary = {"paths": paths, "steps": steps, "t": 1.0, "blowup": blowup, "tau0": TAU0, "rho0": RHO0,
               "network_widths": list(widths), "network_samples": samples, "rows": rows,
               "wall_s": round(time.time() - start, 2)}
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    nan = lambda x: math.nan if x is None else x  # noqa: E731
    for s in SCALES:
        r = [x for x in rows if x["s"] == s]
        line, = a.plot(GAMMAS, [x["exploded_fraction"] for x in r], "o-", label=f"SDE ‖V‖ ≥ {blowup:g}, s = {s:g}")
        c = line.get_color()
        a.plot(GAMMAS, [x["stopped_fraction"] for x in r], ":", color=c, label=f"SDE stopped, s = {s:g}")
        b.plot(GAMMAS, [nan(x["median_stop_time"]) for x in r], "o-", color=c, label=f"SDE, s = {s:g}")
        for n, mk in zip(widths, "s^"):
            a.plot(GAMMAS, [x["network_blown_fraction"][str(n)] for x in r], mk + "--", color=c,
                   label=f"networks n = d = {n}, s = {s:g}")
            b.plot(GAMMAS, [nan(x["network_median_blowup_time"][str(n)]) for x in r], mk + "--", color=c,
                   label=f"networks n = d = {n}, s = {s:g}")
    a.set(xlabel="γ", ylabel="fraction blown up by t = 1", title=f"blow-up (‖V‖_F ≥ {blowup:g})")
    b.set(xlabel="γ", ylabel="median blow-up time (blown paths)", yscale="log", title="median blow-up time")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    head = " | ".join(f"nets n = {n}" for n in widths)
    md = (f"### Fig. 5 — blow-up: SDE ({paths} paths, {steps} steps, t = 1) vs networks (depth = width, "
          f"{samples} nets each)\n\n"
          f"| s | γ | SDE stopped | SDE ‖V‖ ≥ blow-up | SDE median stop t | {head} | "
          f"nets median t (n = {widths[-1]}) |\n"
          f"|{'---|' * (5 + len(widths) + 1)}\n" + "".join(
              f"| {x['s']:g} | {x['gamma']} | {x['stopped_fraction']:.3f} | {x['exploded_fraction']:.3f} | "
              f"{'—' if x['median_stop_time'] is None else format(x['median_stop_time'], '.3f')} | "
              + " | ".join(f"{x['network_blown_fraction'][str(n)]:.3f}" for n in widths) + " | "
              + ("—" if (t := x["network_median_blowup_time"][str(widths[-1])]) is None else f"{t:.3f}") + " |\n"
              for x in rows)
          + f"\nBlow-up: ‖V‖_F ≥ {blowup:g} (or an overflow) at some t ≤ 1. \"SDE stopped\" also counts Euler "
            "proposals that lost PSD, the fixed step failing for the cubic drift, not the SDE's own blow-up. "
            "Networks are the exact Gram sampler of the shaped block (attention + shaped-ReLU MLP) with the "
            "same γ, τ0 and V0.\n")
    return write_outputs(out_dir, "fig5", {"rows": rows}, summary, md, fig)


def run(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """All four figures into out_dir/fig{1,2,4,5}; returns {name: summary}."""
    out = Path(out_dir)
    return {name: f(out / name, quick=quick)
            for name, f in (("fig1", fig1), ("fig2", fig2), ("fig4", fig4), ("fig5", fig5))}
