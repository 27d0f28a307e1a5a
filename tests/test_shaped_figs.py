import json

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
    assert set(fc) == {"shaped", "no_centering", "no_identity", "standard_temperature"}
    assert fc["no_centering"] > fc["shaped"] + 0.3       # uncentred attention drives ρ towards 1
    assert s["final_std_corr"]["no_identity"] < s["final_std_corr"]["shaped"]


def test_fig5_quick(tmp_path):
    s = shaped_figs.fig5(tmp_path, quick=True)
    _files(tmp_path, "fig5")
    rows = {(r["s"], r["gamma"]): r for r in s["rows"]}
    assert len(rows) == 8
    assert rows[(100.0, 0.8)]["stopped_fraction"] >= rows[(1.0, 0.2)]["stopped_fraction"]
    assert rows[(100.0, 0.8)]["stopped_fraction"] > 0.5


def test_run_quick(tmp_path):
    out = shaped_figs.run(tmp_path, quick=True)
    assert set(out) == {"fig1", "fig2", "fig4", "fig5"}
    for name in out:
        _files(tmp_path / name, name)


def test_correlation():
    import torch
    V = torch.tensor([[[4.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)
    assert shaped_figs.correlation(V)[0] == pytest.approx(0.5)
