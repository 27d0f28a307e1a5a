"""The Shaped Transformer (Noci et al. 2023) figures at CPU scale: finite-network ensembles
(`sigprop.simulate.ensemble`) and the covariance SDE (`sigprop.theory.sde`).

* fig1: token correlation over depth for softmax (no LN), Pre-LN and shaped attention (+ SDE overlay),
  and the density of the final correlation, finite shaped network vs SDE (KS statistic).
* fig2: per-layer gradient norm ‖∂ℓ/∂X_l‖² vs depth (`ensemble.gradient_norms`, explicit weights).
* fig4: ablations of the shaped block (no centering, no identity, standard temperature) vs shaped.
* fig5: SDE blow-up: stopped fraction and median stopping time vs gamma for V0 = s·[[1, ρ0], [ρ0, 1]].

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
from .outputs import write_outputs  # noqa: E402

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
           for b, kw in blocks.items()}
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


def fig4(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """Ablations of the shaped block: correlation over depth, width = depth."""
    start = time.time()
    n, samples = (16, 64) if quick else (128, 1000)
    variants = ("shaped", "no_centering", "no_identity", "standard_temperature")
    rho = {v: correlation(ensemble.simulate(v, _V0(), n, n, samples, seed=4, method="gaussian", **SHAPED_KW))
           for v in variants}
    data = {v: _band(r) for v, r in rho.items()}
    summary = {"width": n, "depth": n, "samples": samples, "gamma": GAMMA, "tau0": TAU0,
               "final_mean_corr": {v: float(r[:, -1].mean()) for v, r in rho.items()},
               "final_std_corr": {v: float(r[:, -1].std()) for v, r in rho.items()},
               "wall_s": round(time.time() - start, 2)}
    fig, ax = plt.subplots(figsize=(6, 4))
    for v in variants:
        _plot_band(ax, np.arange(n + 1), data[v], v)
    ax.set(xlabel="layer", ylabel="ρ¹²", title=f"ablations, n = d = {n}, γ = {GAMMA}")
    ax.legend()
    md = (f"### Fig. 4 — ablations (n = d = {n}, {samples} nets)\n\n| variant | final mean ρ | std |\n|---|---|---|\n"
          + "".join(f"| {v} | {summary['final_mean_corr'][v]:.4f} | {summary['final_std_corr'][v]:.4f} |\n"
                    for v in variants))
    return write_outputs(out_dir, "fig4", data, summary, md, fig)


GAMMAS = (0.2, 0.4, 0.6, 0.8)
SCALES = (1.0, 100.0)


def fig5(out_dir: str | Path, quick: bool = False, blowup: float = 1e6) -> dict[str, Any]:
    """SDE ("transformer", t = 1) blow-up: stopped fraction and median stop time vs gamma and initial scale s.

    "Stopped" merges two events: ‖V‖_F ≥ ``blowup`` (``exploded``, reported separately) and an
    Euler proposal that is non-finite or not PSD, i.e. the fixed step failing for the cubic drift.
    """
    start = time.time()
    paths, steps = (200, 50) if quick else (2000, 400)
    rows = []
    for s in SCALES:
        for gm in GAMMAS:
            P = sde.simulate("transformer", _V0(s), t=1.0, steps=steps, paths=paths, seed=5, gamma=gm, tau0=TAU0,
                             blowup=blowup)
            st = P.stop_time[P.stopped].numpy()
            rows.append({"s": s, "gamma": gm, "stopped_fraction": float(P.stopped.float().mean()),
                         "exploded_fraction": float(P.exploded.float().mean()),
                         "median_stop_time": float(np.median(st)) if len(st) else None})
    summary = {"paths": paths, "steps": steps, "t": 1.0, "blowup": blowup, "tau0": TAU0, "rows": rows,
               "wall_s": round(time.time() - start, 2)}
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for s in SCALES:
        r = [x for x in rows if x["s"] == s]
        a.plot(GAMMAS, [x["stopped_fraction"] for x in r], "o-", label=f"s = {s:g}")
        b.plot(GAMMAS, [math.nan if x["median_stop_time"] is None else x["median_stop_time"] for x in r], "o-",
               label=f"s = {s:g}")
    a.set(xlabel="γ", ylabel="stopped fraction", title=f"blow-up (‖V‖_F ≥ {blowup:g} or not PSD)")
    b.set(xlabel="γ", ylabel="median stopping time", title="median stop time (stopped paths)")
    a.legend()
    b.legend()
    md = (f"### Fig. 5 — SDE blow-up ({paths} paths, {steps} steps, t = 1)\n\n"
          "| s | γ | stopped | of which ‖V‖ ≥ blow-up | median stop t |\n|---|---|---|---|---|\n" + "".join(
              f"| {x['s']:g} | {x['gamma']} | {x['stopped_fraction']:.3f} | {x['exploded_fraction']:.3f} | "
              f"{'—' if x['median_stop_time'] is None else format(x['median_stop_time'], '.3f')} |\n" for x in rows)
          + "\n\"Stopped\" counts ‖V‖_F ≥ blow-up and Euler proposals that lost PSD (or overflowed) alike; the"
            " next column is the explosions alone. Stops that are not explosions are the fixed step failing"
            " for the cubic drift, not the SDE's own finite-time blow-up.\n")
    return write_outputs(out_dir, "fig5", {"rows": rows}, summary, md, fig)


def run(out_dir: str | Path, quick: bool = False) -> dict[str, Any]:
    """All four figures into out_dir/fig{1,2,4,5}; returns {name: summary}."""
    out = Path(out_dir)
    return {name: f(out / name, quick=quick)
            for name, f in (("fig1", fig1), ("fig2", fig2), ("fig4", fig4), ("fig5", fig5))}
