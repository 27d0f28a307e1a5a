import math

import pytest

from sigprop.experiments import shaped_vs_preln as svp


@pytest.mark.slow
def test_quick_run_writes_outputs(tmp_path, claim_outputs):
    s = svp.run(tmp_path, quick=True, show_progress=False)
    claim_outputs(tmp_path, svp.NAME, s, ("configs",))
    assert len(s["configs"]) == len(svp.PRELN_LRS) + len(svp.SHAPINGS) * len(svp.GAMMAS)
    for label, c in s["configs"].items():          # tiny runs: every config trains and its loss falls
        final, initial = c["final_val_loss"]["mean"], c["initial_val_loss"]["mean"]
        assert math.isfinite(final) and final < initial, label
    assert 3.0 < s["unigram_val_loss"] < math.log(512)


@pytest.mark.parametrize("shaped, preln, expected", [(4.0, 4.0, "reproduced"), (4.3, 4.0, "partly"),
                                                     (4.5, 4.0, "not reproduced"), (3.5, 4.0, "reproduced"),
                                                     (math.nan, 4.0, "not reproduced")])
def test_verdict_rule(shaped, preln, expected):
    assert svp.verdict(shaped, preln)[0] == expected


def test_recover_follows_warmup():
    cfgs = svp.configs(500)
    _, lr, extra = cfgs["shaped recover γ=0.1"]
    assert extra == {"recover_steps": svp.warmup(500)} == {"recover_steps": 50}
    assert lr == svp.SHAPED_LR and cfgs["shaped learn γ=0.2"][2] == {}
