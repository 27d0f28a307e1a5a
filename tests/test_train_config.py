"""Run-config validation: unknown keys and wrong types are refused with the key named."""
import pytest

from helpers import CONFIGS
from sigprop.train import load_config
from sigprop.train.config import dump_toml

TINY = CONFIGS / "tiny_decoder.toml"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_configs_load_and_round_trip(path, tmp_path):
    cfg = load_config(path)
    out = tmp_path / "resolved.toml"
    out.write_text(dump_toml(cfg.to_dict()))
    assert load_config(out) == cfg


def test_unknown_key_in_set_names_key_and_valid_keys():
    with pytest.raises(ValueError, match=r"'train\.lr'.*valid keys in train: .*'batch_size'"):
        load_config(TINY, ["train.lr=1e-3"])
    with pytest.raises(ValueError, match=r"'bogus'.*valid keys: .*'optim'"):
        load_config(TINY, ["bogus.x=1"])
    with pytest.raises(ValueError, match=r"'model\.widht'.*'d_model'"):
        load_config(TINY, ["model.widht=3"])


def test_unknown_key_in_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.read_text().replace("[optim]\n", "[optim]\nlearning_rate = 0.1\n"))
    with pytest.raises(ValueError, match=r"'optim\.learning_rate'.*valid keys in optim: .*'lr'"):
        load_config(bad)


@pytest.mark.parametrize("override, key", [
    ("train.steps=1.5", "train.steps"),
    ('optim.lr="fast"', "optim.lr"),
    ("train.progress=1", "train.progress"),
    ("train.batch_size=true", "train.batch_size"),
    ("model.d_model=64.0", "d_model"),
    ("train=3", "train"),
])
def test_wrong_type_is_refused(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_config(TINY, [override])


def test_values_are_checked():
    with pytest.raises(ValueError, match=r"optim\.decay='step'.*allowed values: \['cosine', 'linear', 'constant'\]"):
        load_config(TINY, ["optim.decay=step"])
    with pytest.raises(ValueError, match=r"train\.steps=0"):
        load_config(TINY, ["train.steps=0"])
    with pytest.raises(ValueError, match="scheme"):
        load_config(TINY, ["model.scheme=nope"])
    with pytest.raises(ValueError, match="data.seq_len=128 exceeds model.max_seq_len=64"):
        load_config(TINY, ["data.seq_len=128"])
    with pytest.raises(ValueError, match="'digits'"):
        load_config(TINY, ["data.source=digits"])
    with pytest.raises(ValueError, match="section.key=value"):
        load_config(TINY, ["train.steps"])


def test_overrides_parse_toml_literals():
    cfg = load_config(TINY, ["optim.lr=1", "train.out_dir=runs/x", 'data.source="stdlib"',
                             "train.resume=true", "optim.weight_decay=0"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.out_dir == "runs/x" and cfg.data.source == "stdlib" and cfg.train.resume is True
    with pytest.raises(ValueError, match=r"no \[model\] table"):
        load_config(None, ["train.steps=3"])


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")),
                         ids=lambda p: p.name)
def test_shipped_training_configs_validate(path):
    cfg = load_config(path)
    assert cfg.train.out_dir.startswith("runs/")


def test_a_missing_required_table_is_a_field_error():
    from sigprop.fields import FieldError, from_mapping
    from sigprop.train.config import RunConfig

    with pytest.raises(FieldError, match=r"missing config key 'model' \(it has no default\)"):
        from_mapping(RunConfig, {"optim": {"lr": 1e-3}})


def test_old_norm_key_in_toml_and_set_reads_as_norm_placement(tmp_path):
    """`norm = "preln"` in a file and `--set model.norm=postln` warn and give the config of norm_placement;
    the resolved TOML writes only norm_placement; both names at once are refused naming both."""
    old = tmp_path / "old.toml"
    old.write_text(TINY.read_text().replace('scheme = "preln"\n', 'scheme = "dslm"\nnorm = "postln"\n'))
    with pytest.warns(DeprecationWarning, match=r"model\.norm is deprecated; it is called model\.norm_placement"):
        from_file = load_config(old)
    with pytest.warns(DeprecationWarning, match=r"model\.norm is deprecated"):
        from_set = load_config(TINY, ["model.scheme=dslm", "model.norm=postln"])
    new = load_config(TINY, ["model.scheme=dslm", "model.norm_placement=post"])
    assert from_file == from_set == new and new.model.norm_placement == "post"
    text = dump_toml(from_file.to_dict())
    assert 'norm_placement = "post"' in text and "\nnorm =" not in text
    with pytest.raises(ValueError, match=r"model\.norm and model\.norm_placement are one field"):
        load_config(old, ["model.norm_placement=post"])
    with pytest.warns(DeprecationWarning, match=r"ModelConfig\.qk_scaling='init' is deprecated"):
        assert load_config(TINY, ["model.scheme=shaped", "model.qk_scaling=init"]).model.qk_scaling == "weights"
