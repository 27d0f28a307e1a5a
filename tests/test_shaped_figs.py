import json
import math

import numpy as np
import pytest

from sigprop.experiments import shaped_figs


def _files(d, name):
    for ext in ("json", "png", "md"):
        p = d / f"{name}.{ext}"
        assert p.exists() and p.stat().st_size > 0, p
    data = json.loads((d / f"{name}.json").read_text())
    assert data["summary"] and data["data"]
    return data["summary"]


def test_fig1_quick(tmp_path):
    s = shaped_figs.fig1(tmp_path, quick=True)
    assert _files(tmp_path, "fig1") == s
    fc = s["final_mean_corr"]
    assert fc["softmax"] > 0.99
    assert fc["softmax"] > fc["shaped"]
    assert fc["softmax"] > fc["preln"]
    assert s["final_std_corr"]["shaped"] > 0.1          # non-degenerate distribution
    assert 0 <= s["ks_shaped_vs_sde"]["statistic"] < 0.3


def test_fig2_quick(tmp_path):
    s = shaped_figs.fig2(tmp_path, quick=True)
    _files(tmp_path, "fig2")
    r = s["ratio_first_over_last"]
    assert r["softmax"] > 10 * r["shaped"]               # softmax gradients explode towards the input


def test_fig4_quick(tmp_path):
    s = shaped_figs.fig4(tmp_path, quick=True)
    _files(tmp_path, "fig4")
    fc = s["final_mean_corr"]
    assert set(fc) == set(shaped_figs.FIG4_VARIANTS) and set(s["by_width"]) == {str(w) for w in s["widths"]}
    assert fc["no_centering"] > fc["shaped"] + 0.3       # uncentred attention drives ρ towards 1
    assert s["final_std_corr"]["no_identity"] < s["final_std_corr"]["shaped"]


# Fig. 4's three degeneracies (derived in shaped_figs.compute_fig4's docstring), at sizes that run in about a second.
# Margins: Z_MAX standard errors of the statistic, estimated from the same samples, plus, where the
# prediction is the leading order only, its O(1/n) correction bounded by 1/n.
Z_MAX = 5.0
G2 = shaped_figs.GAMMA**2


def _se(x: np.ndarray) -> float:
    return float(x.std() / np.sqrt(len(x)))


def test_fig4_no_centering_collapses_the_correlation():
    """ρ_d → 1 at t = 1, and log(tr V/m) grows at the O(1) rate log(1 + 3γ²) per layer.

    Leading order: 1 − ρ_d ≈ 2(1 − ρ0)/(1 + ρ0)(1 + 3γ²)^{−d} = 3e-7 at d = 64, so mean ρ_d > 0.99 holds
    with four orders of magnitude to spare for the O(1) log-normal spread of the growth (std of log tr V_d ≈ 1).
    The slope over layers d/2..d is a paired mean; its O(1/n) Itô correction is bounded by 1/n."""
    n = 64
    rho, lt = shaped_figs.ablation("no_centering", n, 200)
    assert rho[:, -1].mean() > 0.99
    rise = (lt[:, -1] - lt[:, n // 2]) / (n // 2)
    assert abs(rise.mean() - math.log(1 + 3 * G2)) < Z_MAX * _se(rise) + 1 / n


@pytest.mark.slow
def test_fig4_no_identity_freezes_and_vanishes():
    """V_d ≈ (1 − γ²)^d V0 (log-trace within 5 SE + 1/n) and std(ρ_d) ∝ 1/n: the ratio of the stds at
    n = 32 and 128 is 4 within 5 SE (relative SE of a std: √((κ − 1)/(4S)), κ the sample kurtosis)."""
    std = {}
    for n in (32, 128):
        rho, lt = shaped_figs.ablation("no_identity", n, 400)
        assert abs(lt[:, -1].mean() - n * math.log(1 - G2)) < Z_MAX * _se(lt[:, -1]) + 1 / n
        r = rho[:, -1]
        kurt = ((r - r.mean()) ** 4).mean() / r.var() ** 2
        std[n] = (r.std(), math.sqrt((kurt - 1) / (4 * len(r))))
    ratio = std[32][0] / std[128][0]
    assert abs(ratio / 4 - 1) < Z_MAX * math.hypot(std[32][1], std[128][1])
    assert std[128][0] < 0.02                            # shaped attention: ≈ 0.37 at every n (fig4 table)


@pytest.mark.slow
def test_fig4_standard_temperature_explodes_with_width():
    """At t = 1 the mean log(tr V/m) grows from n = 32 to n = 128 by more than 5 SE, and mean ρ rises above
    ρ0 by more than 5 SE; for shaped attention (an SDE limit) the log-trace change is within 5 SE."""
    def t1(variant, n):
        rho, lt = shaped_figs.ablation(variant, n, 400)
        return rho[:, -1], lt[:, -1]

    (_, l32), (r128, l128) = t1("standard_temperature", 32), t1("standard_temperature", 128)
    assert l128.mean() - l32.mean() > Z_MAX * math.hypot(_se(l32), _se(l128))
    assert r128.mean() - shaped_figs.RHO0 > Z_MAX * _se(r128)
    (_, a32), (_, a128) = t1("shaped_attention", 32), t1("shaped_attention", 128)
    assert abs(a128.mean() - a32.mean()) < Z_MAX * math.hypot(_se(a32), _se(a128))


def test_fig5_quick(tmp_path):
    s = shaped_figs.fig5(tmp_path, quick=True)
    _files(tmp_path, "fig5")
    rows = {(r["s"], r["gamma"]): r for r in s["rows"]}
    assert len(rows) == 8
    assert rows[(100.0, 0.8)]["stopped_fraction"] >= rows[(1.0, 0.2)]["stopped_fraction"]
    assert rows[(100.0, 0.8)]["stopped_fraction"] > 0.5
    for r in rows.values():
        assert set(r["network_blown_fraction"]) == {str(n) for n in s["network_widths"]}
        assert all(0.0 <= f <= 1.0 for f in r["network_blown_fraction"].values())


def test_first_blowup_counts_the_norm_threshold_and_overflow():
    import torch
    V = torch.ones(3, 4, 2, 2, dtype=torch.float64)
    V[1, 2:] = 1e7
    V[2, 1:] = math.nan
    assert shaped_figs.first_blowup(V, 1e6).tolist() == [math.inf, 2.0, 1.0]


@pytest.mark.slow
def test_run_quick(tmp_path):
    out = shaped_figs.run(tmp_path, quick=True)
    assert set(out) == {"fig1", "fig2", "fig4", "fig5"}
    for name in out:
        _files(tmp_path / name, name)


def test_correlation():
    import torch
    V = torch.tensor([[[4.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)
    assert shaped_figs.correlation(V)[0] == pytest.approx(0.5)
