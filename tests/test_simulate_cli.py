"""`sigprop simulate sde|ensemble`: the files it writes, its statistics against a direct call of the
simulator they wrap, and its errors (exit 2, one line on stderr naming the option)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sigprop.cli import main
from sigprop.simulate import ensemble
from sigprop.simulate.commands import QUANTILES, chunk_seed, initial_covariance
from sigprop.theory import sde


def _run(tmp_path, *argv):
    out = tmp_path / argv[0]
    assert main(["simulate", *argv, "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / f"{argv[0]}.json").read_text())
    assert (out / f"{argv[0]}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def _quantiles(x: np.ndarray) -> dict[str, list[float]]:
    """Independent reference: numpy quantiles over axis 0, keyed like the command's JSON."""
    return {f"q{round(100 * q):02d}": np.quantile(x, q, axis=0).tolist() for q in QUANTILES}


def test_sde_statistics_are_the_quantiles_of_the_simulated_paths(tmp_path):
    data = _run(tmp_path, "sde", "--kind", "shaped_attention", "--gamma", "0.5", "--paths", "300", "--steps", "40",
                "--rho0", "0.3", "--scale", "2", "--seed", "7", "--chunk", "1000")
    assert data["options"]["gamma"] == 0.5
    assert data["command"].startswith("sigprop simulate sde --kind shaped_attention")
    assert len(data["t"]) == 41 and data["t"][0] == 0 and data["t"][-1] == pytest.approx(1.0)
    P = sde.simulate("shaped_attention", initial_covariance(2, 0.3, 2.0), t=1.0, steps=40, paths=300,
                     seed=chunk_seed(7, 0), gamma=0.5, tau0=1.0)
    rho = (P.V[..., 0, 1] / (P.V[..., 0, 0] * P.V[..., 1, 1]).sqrt()).numpy()
    for key, ref in (("corr", _quantiles(rho)), ("var", _quantiles(P.V[..., 0, 0].numpy()))):
        for q, values in ref.items():
            np.testing.assert_allclose(data[key][q], values, rtol=1e-12, atol=1e-12)
    assert data["corr"]["q05"][0] == pytest.approx(0.3) and data["var"]["q95"][0] == pytest.approx(2.0)
    assert data["corr"]["q95"][-1] - data["corr"]["q05"][-1] > 0.3          # the SDE spreads ρ out
    assert data["stopped_fraction"] == float(P.stopped.double().mean())


def test_ensemble_chunks_are_reproducible_and_match_the_simulator(tmp_path):
    args = ("ensemble", "--block", "shaped", "--width", "12", "--depth", "12", "--samples", "40", "--chunk", "16")
    a, b = _run(tmp_path / "a", *args), _run(tmp_path / "b", *args)
    assert a["corr"] == b["corr"] and a["var"] == b["var"]
    assert a["options"]["gamma"] == 0.3 and a["t"] == [layer / 12 for layer in range(13)]
    V = torch.cat([ensemble.simulate("shaped", initial_covariance(2, 0.2, 1.0), 12, 12, n, seed=chunk_seed(0, i),
                                     gamma=0.3, tau0=1.0) for i, n in enumerate((16, 16, 8))])
    np.testing.assert_allclose(a["var"]["q50"], np.median(V[..., 0, 0].numpy(), axis=0), rtol=1e-12)
    for key in ("corr", "var"):                                              # quantiles are ordered
        cols = np.array([a[key][f"q{round(100 * q):02d}"] for q in QUANTILES])
        assert (np.diff(cols, axis=0) >= -1e-12).all()


def test_ensemble_softmax_collapses(tmp_path):
    """Softmax attention without LayerNorm drives every network's ρ to 1 by t = 1 (rank collapse)."""
    data = _run(tmp_path, "ensemble", "--block", "softmax", "--width", "16", "--depth", "16", "--samples", "32")
    assert data["options"]["gamma"] is None and data["corr"]["q05"][-1] > 0.95


def test_ensemble_deprecated_names_warn_and_run_as_the_new_ones(tmp_path, capsys):
    data = _run(tmp_path, "ensemble", "--block", "attention", "--method", "gram", "--width", "8", "--depth", "4",
                "--samples", "8")
    err = capsys.readouterr().err
    assert "--block attention is deprecated" in err and "--method gram is deprecated" in err
    assert data["options"]["block"] == "shaped_attention" and data["options"]["method"] == "gaussian"
    new = _run(tmp_path / "new", "ensemble", "--block", "shaped_attention", "--width", "8", "--depth", "4",
               "--samples", "8")
    assert new["corr"] == data["corr"]


def test_sde_deprecated_kind_warns_and_runs_as_shaped_attention(tmp_path, capsys):
    args = ("--gamma", "0.5", "--paths", "20", "--steps", "10")
    data = _run(tmp_path, "sde", "--kind", "attention", *args)
    assert "--kind attention is deprecated; it runs as --kind shaped_attention" in capsys.readouterr().err
    assert data["options"]["kind"] == "shaped_attention"
    new = _run(tmp_path / "new", "sde", "--kind", "shaped_attention", *args)
    assert new["corr"] == data["corr"] and new["var"] == data["var"]


@pytest.mark.parametrize("argv, option", [
    (["sde", "--paths", "0"], "--paths"),
    (["sde", "--steps", "-3"], "--steps"),
    (["sde", "--gamma", "nan"], "--gamma"),
    (["sde", "--gamma", "1.5"], "--gamma"),
    (["sde", "--tau0", "0"], "--tau0"),
    (["sde", "--t", "inf"], "--t"),
    (["sde", "--kind", "mlp"], "--kind"),
    (["sde", "--tokens", "3", "--rho0", "-0.6"], "--rho0"),
    (["ensemble", "--width", "0"], "--width"),
    (["ensemble", "--depth", "2.5"], "--depth"),
    (["ensemble", "--samples", "x"], "--samples"),
    (["ensemble", "--block", "preln", "--gamma", "0.3"], "--gamma"),
    (["ensemble", "--tokens", "4", "--width", "3"], "--width"),
    (["ensemble", "--scale", "-1"], "--scale"),
])
def test_bad_values_exit_2_with_one_line_naming_the_option(tmp_path, capsys, argv, option):
    assert main(["simulate", *argv, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}" in err, err
    assert not (tmp_path / "never").exists()
