"""Growing a model deeper: the placement rule, identity/copy/dslm blocks on sigprop and transformers models,
and `sigprop grow` on a trained run that `sigprop train --resume` continues."""
import json
import math
import statistics

import pytest
import torch

from helpers import FAST_TRAIN, cached_logits, gpt2, llama, logits, train_argv
from sigprop import ModelConfig, build_model, cli, grow
from sigprop.diagnostics import measure
from sigprop.models.grow import plan
from sigprop.nn.roles import init_std_of, role_of, site_of
from sigprop.schemes import Site, get_scheme, initialize
from sigprop.train import OptimConfig, load_config, make_optimizer, read_jsonl, train_main
from sigprop.train.checkpoint import list_checkpoints, read_states
from sigprop.train.parallel import _param_names

FAST = [*FAST_TRAIN, "train.eval_batches=1", "optim.warmup_steps=3", "train.steps=3", "model.dropout=0.1"]


def slots(*args, **kw):
    return [(s.source, s.new) for s in plan(*args, **kw)]


def test_placement_rule():
    # every J: after existing blocks J, 2J, ...; dealt from the bottom, round after round
    assert slots(4, 8, every=2) == [(0, False), (1, False), (1, True), (1, True), (2, False), (3, False),
                                    (3, True), (3, True)]
    assert slots(4, 7, every=1) == [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True), (3, False)]
    assert slots(5, 6, every=2) == [(0, False), (1, False), (1, True), (2, False), (3, False), (4, False)]
    # top (the default): the top E blocks again, cyclically when E > L
    assert slots(4, 6) == slots(4, 6, at="top") == [(0, False), (1, False), (2, False), (3, False),
                                                    (2, True), (3, True)]
    assert slots(2, 5)[2:] == [(0, True), (1, True), (0, True)]


@pytest.mark.parametrize("args, kw, field", [
    ((3, 3), {}, "n_layers"), ((3, 2), {}, "n_layers"), ((3, 4.0), {}, "n_layers"),
    ((3, 5), {"every": 4}, "every"), ((3, 5), {"every": 0}, "every"),
    ((3, 5), {"at": "bottom"}, "at"), ((3, 5), {"every": 1, "at": "top"}, "not both"),
])
def test_plan_refuses_bad_arguments(args, kw, field):
    with pytest.raises(ValueError, match=field):
        plan(*args, **kw)


def inputs(cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if cfg.arch == "vit":
        return torch.randn(3, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g, dtype=torch.float64)
    return torch.randint(0, cfg.vocab_size, (3, 16), generator=g)


def outputs(model, x):
    with torch.no_grad():
        return model.eval()(x)


SIGPROP = {
    "decoder": dict(arch="decoder"),
    "encoder": dict(arch="encoder"),
    "vit": dict(arch="vit"),
    "preln_bias_gelu": dict(scheme="preln", bias=True, activation="gelu"),
    "dslm": dict(scheme="dslm"),                          # α = λ < 1: the new blocks get α = 1
    "shaped": dict(scheme="shaped"),                      # no norms, λ < 1
    "completep": dict(scheme="completep"),
    "learned_residual": dict(scheme="dslm", learn_residual=True),
}


@pytest.mark.parametrize("placement", [dict(every=1), dict(every=2), dict()])
@pytest.mark.parametrize("name", list(SIGPROP))
def test_identity_growth_keeps_the_function_and_the_model_consistent(name, placement):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, **SIGPROP[name])
    model = build_model(cfg).double()
    x = inputs(cfg)
    before = outputs(model, x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grown = grow(model, 7, "identity", **placement)
    torch.testing.assert_close(outputs(grown, x), before, rtol=0, atol=1e-6)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())     # the input is not changed
    assert grown.cfg.n_layers == 7 and len(grown.stack.blocks) == 7 and model.cfg.n_layers == 3
    stack = "enc" if cfg.arch != "decoder" else "dec"
    for j, block in enumerate(grown.stack.blocks):
        assert block.attn.site == Site(stack, j, "attn") and block.mlp.site == Site(stack, j, "mlp")
        assert all(site_of(p) == (stack, j) and role_of(p) is not None for p in block.parameters())
    new = [s.new for s in plan(3, 7, **placement)]
    for block, is_new in zip(grown.stack.blocks, new):
        if is_new:
            assert not block.attn.fn.o_proj.weight.any() and not block.mlp.fn.fc2.weight.any()
            assert init_std_of(block.mlp.fn.fc2.weight) == 0.0 and block.attn.residual.values()[0] == 1.0
    # the grown model is one of depth 7 to the rest of sigprop: same parameter names, roles and optimizer groups
    fresh = build_model(grown.cfg).double()
    assert list(dict(grown.named_parameters())) == list(dict(fresh.named_parameters()))
    assert [role_of(p) for p in grown.parameters()] == [role_of(p) for p in fresh.parameters()]
    groups = lambda m: [len(g["params"]) for g in make_optimizer(m, OptimConfig(), grown.cfg).param_groups]
    assert groups(grown) == groups(fresh)
    fresh.load_state_dict(grown.state_dict())
    records = measure(grown, x)
    assert len({(r.layer, r.sublayer) for r in records}) == len(records) == 1 + 2 * 7
    initialize(grown, grown.cfg, get_scheme(cfg.scheme))                  # every parameter still has a role


@pytest.mark.parametrize("kw", [dict(scheme="postln"), dict(scheme="deepnorm"),
                                dict(scheme="dslm", norm_placement="post")])
def test_identity_is_refused_where_a_norm_follows_the_add(kw):
    model = build_model(ModelConfig(n_layers=2, d_model=32, **kw))
    with pytest.raises(ValueError, match="norm after the add"):
        grow(model, 4, "identity")
    assert grow(model, 4, "copy").cfg.n_layers == 4


def test_copy_duplicates_neighbours_and_changes_the_function():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=3, d_model=32)
    model = build_model(cfg).double()
    grown = grow(model, 5, "copy", every=2)
    assert [(s.source, s.new) for s in plan(3, 5, every=2)] == [(0, False), (1, False), (1, True), (1, True),
                                                                (2, False)]
    for j in (2, 3):
        for (n, a), b in zip(grown.stack.blocks[1].state_dict().items(), grown.stack.blocks[j].state_dict().values()):
            assert torch.equal(a, b), n
    x = inputs(cfg)
    assert (outputs(grown, x) - outputs(model, x)).abs().max() > 1e-2


def test_refusals():
    dslm_free = build_model(ModelConfig(n_layers=2, d_model=32))
    with pytest.raises(ValueError, match="scheme 'dslm'"):
        grow(dslm_free, 4, "dslm")
    with pytest.raises(ValueError, match="mode must be one of"):
        grow(dslm_free, 4, "stack")
    with pytest.raises(ValueError, match="two stacks"):
        grow(build_model(ModelConfig(arch="encdec", n_layers=2, d_model=32)), 4, "copy")
    with pytest.raises(ValueError, match="supports sigprop"):
        grow(torch.nn.Linear(2, 2), 4, "copy")


def branch_variances(make, seeds=(0, 1, 2, 3)) -> list[float]:
    """Measured variance of every sublayer output, averaged over networks (float64, random tokens)."""
    rows = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = make().double()
        ids = torch.randint(0, model.cfg.vocab_size, (4, model.cfg.max_seq_len))
        rows.append([r.fwd_var for r in measure(model, ids, attention_stats=False) if r.sublayer != "embed"])
    return [statistics.fmean(col) for col in zip(*rows)]


@pytest.mark.parametrize("placement", [dict(), dict(every=1)])
def test_dslm_growth_keeps_unit_moments_and_freezes_old_branch_scales(placement):
    cfg = ModelConfig(scheme="dslm", n_layers=4, d_model=64, max_seq_len=64)
    deep = ModelConfig(scheme="dslm", n_layers=8, d_model=64, max_seq_len=64)
    for make in (lambda: build_model(deep), lambda: grow(build_model(cfg), 8, "dslm", **placement)):
        var = branch_variances(make)
        assert len(var) == 16
        assert 0.9 <= statistics.median(var) <= 1.1 and all(0.7 <= v <= 1.4 for v in var), var
    grown = grow(build_model(cfg), 8, "dslm", **placement)
    scheme = get_scheme("dslm")
    for j, s in enumerate(plan(4, 8, **placement)):
        want = scheme.residual(deep if s.new else cfg, Site("dec", s.source if not s.new else j, "attn"))
        got = grown.stack.blocks[j].attn.residual.values()
        assert got == pytest.approx(want, rel=1e-6), (j, s)
    assert scheme.residual(cfg, Site("dec", 0, "attn")) != pytest.approx(scheme.residual(deep, Site("dec", 0, "attn")))
    reloaded = build_model(grown.cfg)                           # what a resumed run builds, then loads
    reloaded.load_state_dict(grown.state_dict())
    expected = scheme.residual(cfg, Site("dec", 0, "attn"))
    assert reloaded.stack.blocks[0].attn.residual.values() == pytest.approx(expected)


# --- transformers models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_identity_growth_of_transformers_models(family):
    pytest.importorskip("transformers")

    torch.manual_seed(0)
    model = (gpt2(3) if family == "gpt2" else llama(3, model_type=family)).eval()
    ids = torch.randint(0, 256, (2, 12))
    before = logits(model, ids)
    grown = grow(model, 6, "identity", every=1).eval()
    assert grown.config.num_hidden_layers == 6 and model.config.num_hidden_layers == 3
    torch.testing.assert_close(logits(grown, ids), before, rtol=0, atol=1e-6)
    torch.testing.assert_close(cached_logits(grown, ids), before, rtol=0, atol=1e-5)   # renumbered KV-cache slots
    copied = grow(model, 6, "copy", every=1).eval()
    assert (logits(copied, ids) - before).abs().max() > 1e-3
    with pytest.raises(ValueError, match="no sigprop scheme"):
        grow(model, 6, "dslm")


def test_transformers_refusals():
    pytest.importorskip("transformers")
    import sigprop.hf as hf

    with pytest.raises(ValueError, match="inverse_layer_idx"):
        grow(gpt2(2, scale_attn_by_inverse_layer_idx=True), 4, "identity")
    applied = gpt2(2)
    hf.apply(applied, "dslm")
    with pytest.raises(ValueError, match="sigprop.hf.apply"):
        grow(applied, 4, "identity")


# --- sigprop grow on a run ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 3-step tiny decoder run (2 blocks)."""
    out = tmp_path_factory.mktemp("grow") / "base"
    assert train_main(train_argv("tiny_decoder", *FAST, f"train.out_dir={out}")) == 0
    return out


def grow_cli(capsys, *args):
    rc = cli.main(["grow", *map(str, args)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def optimizer_names(run_dir):
    cfg = load_config(run_dir / "config.toml")
    model = build_model(cfg.model)
    return _param_names(model, make_optimizer(model, cfg.optim, cfg.model)), cfg


@pytest.fixture(scope="module")
def grown_identity(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("grown") / "identity"
    rc = cli.main(["grow", "--run", str(run), "--to", "4", "--every", "1", "--mode", "identity", "--out", str(out)])
    assert rc == 0
    return out


def test_identity_growth_of_a_run_keeps_loss_and_optimizer_state(run, grown_identity):
    out = grown_identity
    cfg = load_config(out / "config.toml")
    assert cfg.model.n_layers == 4 and cfg.train.out_dir == str(out) and (out / "tokenizer.json").is_file()
    (old_json,), (new_json,) = list_checkpoints(run / "checkpoints"), list_checkpoints(out / "checkpoints")
    assert new_json.name == old_json.name                                           # the same step
    old_cfg = load_config(run / "config.toml")
    old_rec, old_w, old_opt = read_states(old_json, old_cfg.model.to_dict())
    new_rec, new_w, new_opt = read_states(new_json, cfg.model.to_dict())
    summary = new_rec["grown_from"]
    assert summary["val_loss_after"] == pytest.approx(summary["val_loss_before"], abs=1e-6)
    assert new_rec["data_position"] == old_rec["data_position"]
    old_names, _ = optimizer_names(run)
    new_names, _ = optimizer_names(out)
    moved = {"stack.blocks.0.": "stack.blocks.0.", "stack.blocks.1.": "stack.blocks.2."}   # every=1: 0 n 1 n
    rename = lambda n: next((moved[p] + n[len(p):] for p in moved if n.startswith(p)), n)
    for i, name in enumerate(old_names):
        j = new_names.index(rename(name))
        assert torch.equal(new_w[rename(name)], old_w[name]), name
        for key, value in old_opt["state"][i].items():
            assert torch.equal(new_opt["state"][j][key], value), (name, key)
    kept = {rename(n) for n in old_names}
    fresh = [j for j, n in enumerate(new_names) if n not in kept]
    assert fresh and all(new_names[j].startswith(("stack.blocks.1.", "stack.blocks.3.")) for j in fresh)
    for j in fresh:
        assert all(not v.any() for v in new_opt["state"][j].values()), new_names[j]      # zero moments, step 0


def test_grown_run_resumes_and_trains(grown_identity):
    out = grown_identity
    assert train_main(["--config", str(out / "config.toml"), "--resume", "--set", "train.steps=6"]) == 0
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["event"] for r in records if r["kind"] == "event"][0] == "resumed"
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 5, 6] and all(math.isfinite(r["loss"]) for r in train)
    start = json.loads(list_checkpoints(out / "checkpoints")[0].read_text())["grown_from"]["val_loss_after"]
    assert [r for r in records if r["kind"] == "eval"][-1]["loss"] < start


def test_copy_growth_of_a_run_reports_the_loss_jump(run, tmp_path, capsys):
    rc, out, err = grow_cli(capsys, "--run", run, "--to", "3", "--at", "top", "--mode", "copy", "--out", tmp_path / "c")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["n_layers_before"] == 2 and summary["n_layers"] == 3
    assert abs(summary["loss_jump"]) > 1e-4 and summary["loss_jump"] == pytest.approx(
        summary["val_loss_after"] - summary["val_loss_before"])
    assert "validation loss" in err and "--resume" in err
    assert load_config(tmp_path / "c" / "config.toml").model.n_layers == 3


@pytest.mark.parametrize("args, field", [
    (["--to", "2", "--mode", "identity"], "--to"),
    (["--to", "four", "--mode", "identity"], "--to"),
    (["--to", "4", "--mode", "stack"], "mode"),
    (["--to", "4", "--mode", "dslm"], "scheme 'dslm'"),
    (["--to", "4", "--every", "3", "--mode", "copy"], "every"),
    (["--to", "4", "--at", "bottom", "--mode", "copy"], "at must be"),
    (["--to", "4", "--every", "1", "--at", "top", "--mode", "copy"], "--at"),
    (["--to", "4"], "--mode"),
])
def test_cli_refuses_bad_input(run, tmp_path, capsys, args, field):
    rc, _, err = grow_cli(capsys, "--run", run, *args, "--out", tmp_path / "new")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and field in err, err
    assert not (tmp_path / "new").exists()


def test_cli_refuses_a_missing_run_and_a_used_out(run, tmp_path, capsys):
    rc, _, err = grow_cli(capsys, "--run", tmp_path / "nope", "--to", "4", "--mode", "copy", "--out", tmp_path / "n")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--run" in err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    rc, _, err = grow_cli(capsys, "--run", run, "--to", "4", "--mode", "copy", "--out", tmp_path / "used")
    assert rc == 2 and "train.out_dir" in err and len(err.strip().splitlines()) == 1
    rc, _, err = grow_cli(capsys, "--run", run, "--to", "4", "--mode", "copy", "--out", run)
    assert rc == 2 and "already holds checkpoints" in err
