"""The Shaped Transformer (Noci et al. 2023) figures at CPU scale: finite-network ensembles
(`sigprop.simulate.ensemble`) and the covariance SDE (`sigprop.theory.sde`).

* fig1: token correlation over depth for softmax (no LN), Pre-LN and shaped attention (+ SDE overlay),
  and the density of the final correlation, finite shaped network vs SDE (KS statistic).
* fig2: per-layer gradient norm ‖∂ℓ/∂X_l‖² vs depth (`ensemble.gradient_norms`, explicit weights).
* fig4: ablations of shaped attention (no centering, no identity, standard temperature) at two widths:
  collapse, freeze-and-vanish, explosion of the covariance (statistics in `compute_fig4`'s docstring).
* fig5: blow-up vs gamma for V0 = s·[[1, ρ0], [ρ0, 1]]: SDE stopped/exploded fraction and median
  stopping time, beside the fraction of finite networks (depth = width) that cross the same norm.

    from sigprop.experiments import shaped_figs
    summary = shaped_figs.run("runs/shaped_figs")      # one subfolder per figure: JSON + PNG + Markdown

Each figure is compute → table → plot: ``compute_figN`` returns (data, summary), ``table_figN(summary)`` the
table and ``plot_figN(data, summary)`` the figure; ``figN`` writes them. Sizes: ``FIGN_SIZES`` (full and
quick), any key overridden by a keyword (``sigprop reproduce figN --set samples=200``); ``FIGN`` is the
registry's entry. What the figures show and how they
compare with the paper: docs/RESULTS_shaped_figs.md.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats

from ..console.overrides import resolve_sizes
from ..simulate import ensemble
from ..theory import sde
from .outputs import progress, section, write_outputs
from .registry import Figures
from .report import Table

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


FIG1_SIZES = {"full": {"width": 128, "samples": 1000, "sde_paths": 2000, "sde_steps": 256},
              "quick": {"width": 16, "samples": 64, "sde_paths": 200, "sde_steps": 64}}
FIG2_SIZES = {"full": {"width": 64, "samples": 32}, "quick": {"width": 12, "samples": 8}}
FIG4_SIZES = {"full": {"widths": (32, 128), "samples": 1000}, "quick": {"widths": (16, 32), "samples": 100}}
FIG5_SIZES = {"full": {"sde_paths": 1000, "sde_steps": 400, "widths": (64, 128), "samples": 500},
              "quick": {"sde_paths": 200, "sde_steps": 50, "widths": (16,), "samples": 50}}


def _sizes(table: dict[str, dict[str, Any]], quick: bool, sizes: dict[str, Any]) -> dict[str, Any]:
    return resolve_sizes(table["quick" if quick else "full"], sizes)


def compute_fig1(quick: bool = False, show_progress: bool = True, **sizes: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Correlation over depth, width = depth (t = depth/width = 1), softmax / preln / shaped + SDE:
    (data: mean and 5–95 % band per block and for the SDE, summary: final statistics and KS test)."""
    n, samples, paths, steps = _sizes(FIG1_SIZES, quick, sizes).values()
    blocks = {"softmax": {}, "preln": {}, "shaped": SHAPED_KW}
    rho = {b: correlation(ensemble.simulate(b, _V0(), n, n, samples, seed=1, method="gaussian", **kw))
           for b, kw in progress(blocks.items(), "fig1: finite networks", total=len(blocks), enabled=show_progress)}
    P = sde.simulate("transformer", _V0(), t=1.0, steps=steps, paths=paths, seed=2, **SHAPED_KW)
    live = ~P.stopped.numpy()
    rho_sde = correlation(P.V)[live]
    data = {b: _band(r) for b, r in rho.items()}
    data["sde"] = {**_band(rho_sde), "times": P.times.tolist()}
    fin_shaped, fin_sde = rho["shaped"][:, -1], rho_sde[:, -1]
    data["final"] = {"shaped": fin_shaped.tolist(), "sde": fin_sde.tolist()}
    ks = stats.ks_2samp(fin_shaped, fin_sde)
    summary = {"width": n, "depth": n, "samples": samples, "sde_paths": paths, "sde_steps": steps,
               "gamma": GAMMA, "tau0": TAU0, "rho0": RHO0,
               "final_mean_corr": {**{b: float(r[:, -1].mean()) for b, r in rho.items()},
                                   "sde": float(fin_sde.mean())},
               "final_std_corr": {**{b: float(r[:, -1].std()) for b, r in rho.items()}, "sde": float(fin_sde.std())},
               "sde_stopped_fraction": float(P.stopped.float().mean()),
               "ks_shaped_vs_sde": {"statistic": float(ks.statistic), "pvalue": float(ks.pvalue)}}
    return data, summary


def table_fig1(summary: dict[str, Any]) -> Table:
    """Final mean and spread of ρ per block, and the KS distance of the shaped networks to the SDE."""
    fc, sd, ks = summary["final_mean_corr"], summary["final_std_corr"], summary["ks_shaped_vs_sde"]
    return Table(["block", "final mean ρ", "final std ρ"], [[b, f"{v:.4f}", f"{sd[b]:.4f}"] for b, v in fc.items()],
                 caption=f"Correlation at t = 1 (n = d = {summary['width']}, {summary['samples']} nets, "
                         f"γ = {summary['gamma']}, τ0 = {summary['tau0']}, ρ0 = {summary['rho0']}); "
                         f"KS(shaped finite vs SDE) = {ks['statistic']:.3f} (p = {ks['pvalue']:.2g}); "
                         f"SDE stopped fraction {summary['sde_stopped_fraction']:.3f}.")


def plot_fig1(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Left: ρ over t = layer/width, band per block and the SDE (dashed); right: density of the final ρ."""
    n = summary["width"]
    fin_shaped, fin_sde = np.asarray(data["final"]["shaped"]), np.asarray(data["final"]["sde"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(n + 1) / n
    for blk in ("softmax", "preln", "shaped"):
        _plot_band(a, x, data[blk], blk)
    _plot_band(a, np.asarray(data["sde"]["times"]), data["sde"], "shaped SDE", ls="--", color="k")
    a.set(xlabel="layer / width  (t)", ylabel="ρ¹²", title=f"correlation, n = d = {n}")
    a.legend()
    bins = np.linspace(min(fin_shaped.min(), fin_sde.min()), max(fin_shaped.max(), fin_sde.max()), 30)
    b.hist(fin_shaped, bins=bins, density=True, alpha=0.5, label="shaped (finite)")
    b.hist(fin_sde, bins=bins, density=True, histtype="step", color="k", label="SDE")
    b.set(xlabel="final ρ¹²", ylabel="density", title=f"KS = {summary['ks_shaped_vs_sde']['statistic']:.3f}")
    b.legend()
    return fig


FIG2_BLOCKS = {"softmax": {}, "preln": {}, "postln": {}, "shaped": SHAPED_KW}


def compute_fig2(quick: bool = False, show_progress: bool = True, **sizes: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-layer gradient norm ‖∂ℓ/∂X_l‖_F² (mean, 5–95 % band of log10) vs layer, explicit-weight networks."""
    n, samples = _sizes(FIG2_SIZES, quick, sizes).values()
    g = {b: ensemble.gradient_norms(b, _V0(), n, n, samples, seed=3, **kw).numpy()
         for b, kw in progress(FIG2_BLOCKS.items(), "fig2", total=len(FIG2_BLOCKS), enabled=show_progress)}
    data = {b: _band(np.log10(v)) for b, v in g.items()}
    summary = {"width": n, "depth": n, "samples": samples,
               "grad_norm_first_layer": {b: float(v[:, 0].mean()) for b, v in g.items()},
               "grad_norm_last_layer": {b: float(v[:, -1].mean()) for b, v in g.items()},
               "ratio_first_over_last": {b: float(v[:, 0].mean() / v[:, -1].mean()) for b, v in g.items()}}
    return data, summary


def table_fig2(summary: dict[str, Any]) -> Table:
    """Mean gradient norm at the first and last layer per block, and their ratio."""
    first, last, ratio = (summary[k] for k in ("grad_norm_first_layer", "grad_norm_last_layer",
                                                "ratio_first_over_last"))
    return Table(["block", "first layer", "last layer", "first/last"],
                 [[b, f"{first[b]:.3g}", f"{last[b]:.3g}", f"{ratio[b]:.3g}"] for b in first],
                 caption=f"Per-layer gradient norm ‖∂ℓ/∂X_l‖² (n = d = {summary['width']}, "
                         f"{summary['samples']} nets).")


def plot_fig2(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """log10 gradient norm (mean, 5–95 % band) against the layer, one band per block."""
    n = summary["width"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in FIG2_BLOCKS:
        _plot_band(ax, np.arange(n), data[b], b)
    ax.set(xlabel="layer l", ylabel="log10 ‖∂ℓ/∂X_l‖²", title=f"gradient norms, n = d = {n}")
    ax.legend()
    return fig


ABLATIONS = ("no_centering", "no_identity", "standard_temperature")
FIG4_VARIANTS = ("shaped", "shaped_attention") + ABLATIONS
# Leading-order per-layer change of log(tr V/m) (derivations in compute_fig4's docstring); O(1), not O(1/n).
LOG_TRACE_RATE = {"no_centering": math.log(1 + 3 * GAMMA**2), "no_identity": math.log(1 - GAMMA**2)}


def log_trace(V: torch.Tensor) -> np.ndarray:
    """log(tr V / m) of (..., m, m) covariances."""
    return V.diagonal(dim1=-2, dim2=-1).mean(-1).log().numpy()


def ablation(variant: str, width: int, samples: int, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(ρ¹², log(tr V/m)), each (samples, width + 1), of `variant` networks at depth = width (t = 1).

    γ = GAMMA, τ0 = TAU0, V0 = [[1, ρ0], [ρ0, 1]]; the row-space sampler (the same law as explicit weights).
    """
    V = ensemble.simulate(variant, _V0(), width, width, samples, seed=seed, **SHAPED_KW)
    return correlation(V), log_trace(V)


def final_stats(rho: np.ndarray, log_tr: np.ndarray) -> dict[str, float]:
    """Mean and std over networks of the final ρ and log(tr V/m), and `log_trace_rate`, the per-layer
    slope of mean log(tr V/m) over the second half of depth."""
    d = rho.shape[1] - 1
    return {"mean_corr": float(rho[:, -1].mean()), "std_corr": float(rho[:, -1].std()),
            "mean_log_trace": float(log_tr[:, -1].mean()), "std_log_trace": float(log_tr[:, -1].std()),
            "log_trace_rate": float((log_tr[:, -1].mean() - log_tr[:, d // 2].mean()) / (d - d // 2))}


def compute_fig4(quick: bool = False, show_progress: bool = True, **sizes: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
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
    widths, samples = _sizes(FIG4_SIZES, quick, sizes).values()
    runs = {n: {v: ablation(v, n, samples) for v in FIG4_VARIANTS}
            for n in progress(widths, "fig4", total=len(widths), enabled=show_progress)}
    n = widths[-1]
    stats = {str(w): {v: final_stats(*r) for v, r in runs[w].items()} for w in widths}
    top = stats[str(n)]
    data = {"corr": {v: _band(r[0]) for v, r in runs[n].items()},
            "mean_log_trace": {str(w): {v: r[1].mean(0).tolist() for v, r in runs[w].items()} for w in widths}}
    summary = {"width": n, "depth": n, "samples": samples, "gamma": GAMMA, "tau0": TAU0, "rho0": RHO0,
               "final_mean_corr": {v: top[v]["mean_corr"] for v in FIG4_VARIANTS},
               "final_std_corr": {v: top[v]["std_corr"] for v in FIG4_VARIANTS},
               "widths": list(widths), "by_width": stats, "predicted_log_trace_rate": LOG_TRACE_RATE}
    return data, summary


def table_fig4(summary: dict[str, Any]) -> Table:
    """Per variant and width: final mean and spread of ρ, n·std ρ, final mean log(tr V/m) and its per-layer
    rate (the leading-order prediction in brackets where `compute_fig4` derives one)."""
    rows = []
    for v in FIG4_VARIANTS:
        for w in summary["widths"]:
            st = summary["by_width"][str(w)][v]
            rate = f"{st['log_trace_rate']:.4f}" + (f" ({LOG_TRACE_RATE[v]:.4f})" if v in LOG_TRACE_RATE else "")
            rows.append([v, w, f"{st['mean_corr']:.4f}", f"{st['std_corr']:.4f}", f"{w * st['std_corr']:.3f}",
                         f"{st['mean_log_trace']:.3f}", rate])
    return Table(["variant", "n", "mean ρ", "std ρ", "n·std ρ", "mean log(tr V/m)",
                  "per-layer rate of log(tr V/m) (predicted)"], rows,
                 caption=f"Ablations at depth = width n ∈ {{{', '.join(map(str, summary['widths']))}}}, "
                         f"{summary['samples']} nets each, γ = {summary['gamma']}, τ0 = {summary['tau0']}, "
                         f"ρ0 = {summary['rho0']}.")


def plot_fig4(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Left: ρ over t per variant at the largest width; right: mean log(tr V/m) over t at every width."""
    n, widths = summary["width"], summary["widths"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for v in FIG4_VARIANTS:
        _plot_band(a, np.arange(n + 1) / n, data["corr"][v], v)
        for w, ls in zip(widths, (":", "-")):
            b.plot(np.arange(w + 1) / w, data["mean_log_trace"][str(w)][v], ls=ls, color=a.lines[-1].get_color(),
                   label=f"{v}, n = {w}")
    a.set(xlabel="layer / width  (t)", ylabel="ρ¹²", title=f"ablations, n = d = {n}, γ = {summary['gamma']}")
    a.legend(fontsize=8)
    b.set(xlabel="layer / width  (t)", ylabel="mean log(tr V / m)", title="covariance scale, n = d")
    b.legend(fontsize=7, ncol=2)
    return fig


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


def compute_fig5(quick: bool = False, show_progress: bool = True, blowup: float = 1e6, **sizes: Any
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Blow-up vs gamma and initial scale s, V0 = s·[[1, ρ0], [ρ0, 1]]: the SDE ("transformer", t = 1) and
    finite "shaped" networks at depth = width (t = 1), same γ, τ0 and threshold.

    SDE "stopped" merges two events: ‖V‖_F ≥ ``blowup`` (``exploded``, reported separately) and an
    Euler proposal that is non-finite or not PSD, i.e. the fixed step failing for the cubic drift.
    A network is blown up once some layer has ‖V_l‖_F ≥ ``blowup`` (or overflows); its time is layer/width.
    """
    paths, steps, widths, samples = _sizes(FIG5_SIZES, quick, sizes).values()
    rows = []
    for s, gm in progress([(s, g) for s in SCALES for g in GAMMAS], "fig5", enabled=show_progress):
        P = sde.simulate("transformer", _V0(s), t=1.0, steps=steps, paths=paths, seed=5, gamma=gm, tau0=TAU0,
                         blowup=blowup)
        row = {"s": s, "gamma": gm, "stopped_fraction": float(P.stopped.float().mean()),
               "exploded_fraction": float(P.exploded.float().mean()),
               "median_stop_time": _median(P.stop_time[P.stopped].numpy()),
               "network_blown_fraction": {}, "network_median_blowup_time": {}}
        for n in widths:
            t_blow = first_blowup(ensemble.simulate("shaped", _V0(s), n, n, samples, seed=6,
                                                    gamma=gm, tau0=TAU0), blowup) / n
            row["network_blown_fraction"][str(n)] = float(np.isfinite(t_blow).mean())
            row["network_median_blowup_time"][str(n)] = _median(t_blow[np.isfinite(t_blow)])
        rows.append(row)
    summary = {"paths": paths, "steps": steps, "t": 1.0, "blowup": blowup, "tau0": TAU0, "rho0": RHO0,
               "network_widths": list(widths), "network_samples": samples, "rows": rows}
    return {"rows": rows}, summary


def table_fig5(summary: dict[str, Any]) -> Table:
    """Per (s, γ): SDE stopped and exploded fractions and median stop time, the fraction of networks blown up
    per width and their median blow-up time at the largest width ("—": nothing blew up)."""
    widths = summary["network_widths"]
    t = lambda x: "—" if x is None else f"{x:.3f}"
    rows = [[f"{x['s']:g}", x["gamma"], f"{x['stopped_fraction']:.3f}", f"{x['exploded_fraction']:.3f}",
             t(x["median_stop_time"]), *(f"{x['network_blown_fraction'][str(n)]:.3f}" for n in widths),
             t(x["network_median_blowup_time"][str(widths[-1])])] for x in summary["rows"]]
    return Table(["s", "γ", "SDE stopped", "SDE ‖V‖ ≥ blow-up", "SDE median stop t",
                  *(f"nets n = {n}" for n in widths), f"nets median t (n = {widths[-1]})"], rows,
                 caption=f"Blow-up (‖V‖_F ≥ {summary['blowup']:g} or an overflow by t = 1): SDE "
                         f"({summary['paths']} paths, {summary['steps']} steps) vs shaped networks at depth = width "
                         f"({summary['network_samples']} nets each).")


def plot_fig5(data: dict[str, Any], summary: dict[str, Any]) -> Any:
    """Left: fraction blown up by t = 1 against γ; right: median blow-up time; SDE and networks, per scale s."""
    rows, widths, blowup = data["rows"], summary["network_widths"], summary["blowup"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    nan = lambda x: math.nan if x is None else x
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
    return fig


def _figure(name: str, sizes: dict[str, dict[str, Any]], heading: str, compute: Any, table: Any, plot: Any
            ) -> tuple[Any, Figures]:
    """One figure's runner and its registry entry. The runner, ``NAME(out_dir, quick=False, show_progress=True,
    **sizes)``, runs ``compute`` (``wall_s`` added to its summary), then writes ``table`` under ``heading`` and
    ``plot`` as NAME.{json,md,png} (`write_outputs`); returns the summary."""
    def write(out_dir: str | Path, quick: bool = False, show_progress: bool = True, **sizes: Any) -> dict[str, Any]:
        start = time.time()
        data, summary = compute(quick, show_progress, **sizes)
        summary["wall_s"] = round(time.time() - start, 2)
        return write_outputs(out_dir, name, data, summary, section(heading, table(summary)), plot(data, summary))
    write.__name__ = write.__qualname__ = name
    return write, Figures(name, sizes["full"], sizes["quick"], lambda out, s, show: write(out, show_progress=show, **s))


fig1, FIG1 = _figure("fig1", FIG1_SIZES, "Fig. 1 — correlation over depth", compute_fig1, table_fig1, plot_fig1)
fig2, FIG2 = _figure("fig2", FIG2_SIZES, "Fig. 2 — per-layer gradient norm", compute_fig2, table_fig2, plot_fig2)
fig4, FIG4 = _figure("fig4", FIG4_SIZES, "Fig. 4 — ablations of shaped attention", compute_fig4, table_fig4, plot_fig4)
fig5, FIG5 = _figure("fig5", FIG5_SIZES, "Fig. 5 — blow-up: SDE vs networks", compute_fig5, table_fig5, plot_fig5)


def run(out_dir: str | Path, quick: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """All four figures into out_dir/fig{1,2,4,5}; returns {name: summary}."""
    return {f.__name__: f(Path(out_dir) / f.__name__, quick=quick, show_progress=show_progress)
            for f in (fig1, fig2, fig4, fig5)}
