"""Feed a table of bad and edge-case inputs to every boundary and count the outcomes.

    OMP_NUM_THREADS=1 python bench/validation_probe.py [--out DIR]

Boundaries: ModelConfig, model forward (inputs), the run config (TOML/--set), the CLI subcommands,
sde.simulate / sde.drift / psd_root, ensemble.simulate, hf.apply. Outcome of one probe:
  ok        refused with ValueError (exit 2 and one stderr line for the CLI) whose message names the input
  weak      refused, but the message does not name the input
  traceback another exception type (for the CLI: an exception escaped, or a traceback on stderr)
  accepted  no error for an invalid input (a NaN result counts as ``nan``)
  nan       no error and a non-finite result
Prints one row per boundary and the probes that were not ``ok``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch

from sigprop import ModelConfig, build_model
from sigprop.cli import main
from sigprop.simulate import ensemble
from sigprop.theory import sde

NAN, INF = math.nan, math.inf
ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny_decoder.toml")
FAST = ["data.max_chars=60000", "model.d_model=16", "data.seq_len=16", "model.max_seq_len=16", "train.progress=false",
        "train.eval_batches=1", "train.steps=2", "train.batch_size=4", "optim.warmup_steps=1"]


def classify_call(fn: Callable[[], Any], needle: str) -> str:
    try:
        out = fn()
    except ValueError as e:
        return "ok" if needle.lower() in str(e).lower() else "weak"
    except Exception:  # any other exception is what this probe counts
        return "traceback"
    fields = vars(out).values() if hasattr(out, "__dict__") else []
    tensors = [out] if isinstance(out, torch.Tensor) else [v for v in fields if isinstance(v, torch.Tensor)]
    if any(t.is_floating_point() and not torch.isfinite(t).all() for t in tensors):
        return "nan"
    return "accepted"


def classify_cli(argv: list[str], needle: str) -> str:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    except SystemExit as e:          # argparse usage errors: exit 2 with usage + one error line
        rc = e.code
        return "ok" if rc == 2 else "traceback"
    except Exception:
        return "traceback"
    text = err.getvalue()
    if "Traceback" in text:
        return "traceback"
    if rc == 0:
        return "accepted"
    lines = [line for line in text.splitlines() if line.strip()]
    return "ok" if rc in (1, 2) and len(lines) == 1 and needle.lower() in text.lower() else "weak"


def model_probes() -> list[tuple[str, Callable[[], Any], str]]:
    bad = {"vocab_size": [0, -1, 2.5, None, "8", True, 5_000_000_000], "d_model": [0, None, 7.0, "64"],
           "n_layers": [0, -3, 1.5], "n_heads": [0, 3, None], "max_seq_len": [0, 2.5], "d_ff": [0, -1, 1.5],
           "dropout": [NAN, -0.1, 1.0, INF, "0"], "bias": [None, "yes", 1], "learn_residual": ["no", 0, None],
           "scheme": ["nope", None, 3], "arch": ["rnn", None], "norm_placement": ["batch", 1],
           "norm_type": ["bn", None], "activation": ["tanh", None], "shaping": ["sometimes", None],
           "qk_scaling": ["fast", None]}
    shaped = {"tau0": [NAN, INF, 0.0, -1.0, "1.0", None], "c_plus": [NAN, INF, -INF, "0", None],
              "c_minus": [NAN, INF, -INF], "residual_gamma": [NAN, 0.0, 1.5, -0.5, INF],
              "residual_lambda": [NAN, -0.1, 2.0]}
    dslm = {"dslm_k": [NAN, INF, 0.0, -1.0, "2"], "dslm_r0": [NAN, -0.1, 1.5, INF]}
    vit = {"image_size": [0, 9], "patch_size": [0, 5], "in_channels": [0, 1.5], "n_classes": [0, None]}
    ignored = [("n_dec_layers", 3, {}), ("qk_scaling", "weights", {}), ("shaping", "learn", {}), ("tau0", 2.0, {}),
               ("dslm_r0", 0.3, {}), ("dslm_k", 3.0, {}), ("shaping", "learn", {"scheme": "dslm"}),
               ("c_plus", 0.5, {"scheme": "dslm"}), ("vocab_size", 100, {"arch": "vit"}),
               ("image_size", 16, {}), ("norm_type", "rmsnorm", {"scheme": "shaped"}),
               ("residual_gamma", 0.5, {"scheme": "preln"})]
    out = []
    for base, table in (({}, bad), ({"scheme": "shaped"}, shaped), ({"scheme": "dslm"}, dslm), ({"arch": "vit"}, vit)):
        for field, values in table.items():
            for v in values:
                out.append((f"{field}={v!r} {base}", lambda f=field, v=v, b=base: _logits(ModelConfig(**b, **{f: v})),
                            field))
    for field, v, base in ignored:
        out.append((f"ignored {field}={v!r} {base}", lambda f=field, v=v, b=base: ModelConfig(**b, **{f: v}), field))
    return out


def _logits(cfg: ModelConfig) -> torch.Tensor:
    """The model's output on random inputs (so a NaN from a bad value shows)."""
    torch.manual_seed(0)
    if cfg.arch == "vit":
        return build_model(cfg)(torch.randn(2, cfg.in_channels, cfg.image_size, cfg.image_size))
    ids = torch.randint(0, cfg.vocab_size, (2, min(cfg.max_seq_len, 8)))
    return build_model(cfg)(*((ids, ids) if cfg.arch == "encdec" else (ids,)))


def forward_probes() -> list[tuple[str, Callable[[], Any], str]]:
    torch.manual_seed(0)
    dec = build_model(ModelConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8))
    vit = build_model(ModelConfig(arch="vit", d_model=16, n_heads=2, n_layers=1, image_size=8, patch_size=2))
    encdec = build_model(ModelConfig(arch="encdec", vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_seq_len=8))
    ids = torch.zeros(2, 4, dtype=torch.long)
    return [
        ("id = vocab", lambda: dec(torch.full((2, 4), 32)), "vocab_size"),
        ("id < 0", lambda: dec(torch.full((2, 4), -1)), "vocab_size"),
        ("float ids", lambda: dec(torch.zeros(2, 4)), "token ids"),
        ("bool ids", lambda: dec(torch.zeros(2, 4, dtype=torch.bool)), "token ids"),
        ("1-D ids", lambda: dec(torch.zeros(4, dtype=torch.long)), "token ids"),
        ("3-D ids", lambda: dec(torch.zeros(2, 4, 1, dtype=torch.long)), "token ids"),
        ("list ids", lambda: dec([[1, 2]]), "token ids"),
        ("seq > max_seq_len", lambda: dec(torch.zeros(1, 9, dtype=torch.long)), "max_seq_len"),
        ("empty seq", lambda: dec(torch.zeros(1, 0, dtype=torch.long)), "sequence length"),
        ("mask wrong shape", lambda: dec(ids, torch.ones(2, 5, dtype=torch.bool)), "attention_mask"),
        ("encdec batch mismatch", lambda: encdec(ids, torch.zeros(3, 4, dtype=torch.long)), "batch"),
        ("encdec src id = vocab", lambda: encdec(torch.full((2, 4), 40), ids), "vocab_size"),
        ("vit 9x9 image", lambda: vit(torch.randn(1, 1, 9, 9)), "image_size"),
        ("vit 3 channels", lambda: vit(torch.randn(1, 3, 8, 8)), "in_channels"),
        ("vit int image", lambda: vit(torch.zeros(1, 1, 8, 8, dtype=torch.long)), "float"),
        ("vit 3-D image", lambda: vit(torch.randn(1, 8, 8)), "image_size"),
    ]


def sim_probes() -> list[tuple[str, Callable[[], Any], str]]:
    V0 = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    base = dict(t=0.1, steps=4, paths=4, gamma=0.5)
    sde_bad = {"t": [INF, NAN, 0.0, -1.0, "1"], "steps": [0, 2.5, None], "paths": [0, -1],
               "gamma": [NAN, 0.0, 1.5, INF], "tau0": [NAN, INF, -INF, 0.0, 1e-300, 1e300], "c_plus": [NAN, INF, 1e200],
               "c_minus": [NAN, -INF], "seed": [1.5, "0"],
               "blowup": [NAN, 0.0, -1.0], "record_every": [0, 3], "method": ["euler"],
               "dtype": [torch.int64, torch.float16]}
    out = [(f"sde {k}={v!r}", lambda k=k, v=v: sde.simulate("transformer", V0, **{**base, k: v}), k)
           for k, vs in sde_bad.items() for v in vs]
    out += [("sde V0 not PSD", lambda: sde.simulate("resnet", -V0, **base), "V0"),
            ("sde V0 NaN", lambda: sde.simulate("resnet", V0 * NAN, **base), "V0"),
            ("sde V0 asymmetric", lambda: sde.simulate("resnet", torch.tensor([[1.0, 0.9], [0.1, 1.0]]), **base), "V0"),
            ("sde kind", lambda: sde.simulate("mlp", V0, **base), "kind"),
            ("drift non-PSD V", lambda: sde.drift("resnet", -V0, gamma=0.5), "V"),
            ("drift NaN V", lambda: sde.drift("attention", V0 * NAN, gamma=0.5), "V"),
            ("diffusion non-PSD V", lambda: sde.diffusion("resnet", -V0, gamma=0.5), "V"),
            ("drift c_plus=nan", lambda: sde.drift("resnet", V0, gamma=0.5, c_plus=NAN), "c_plus"),
            ("psd_root(inf) propagates", lambda: _psd_root_nan(V0), "propagates")]
    ens_bad = {"width": [0, 2.5, 1], "depth": [-1, 1.5], "samples": [0, None], "gamma": [NAN, 0.0, 2.0],
               "tau0": [NAN, INF, -1.0], "c_plus": [NAN], "c_minus": [INF], "seed": [0.5], "n_k": [0, 1.5],
               "method": ["exact"], "dtype": [torch.float16]}
    eb = dict(width=8, depth=1, samples=2, gamma=0.5)
    out += [(f"ensemble {k}={v!r}", lambda k=k, v=v: ensemble.simulate("shaped", V0, **{**eb, k: v}), k)
            for k, vs in ens_bad.items() for v in vs]
    out += [("ensemble gamma on preln", lambda: ensemble.simulate("preln", V0, width=8, depth=1, samples=2, gamma=0.5),
             "gamma"), ("ensemble block", lambda: ensemble.simulate("rnn", V0, **eb), "block")]
    return out


def _psd_root_nan(V0: torch.Tensor) -> torch.Tensor:
    R, ok = sde.psd_root(V0 * INF)
    if bool(ok) or bool(torch.isfinite(R).any()):
        return torch.zeros(1)           # a finite root of a non-finite matrix: counted as accepted
    raise ValueError("non-finite input propagates (R is NaN, ok is False)")


def hf_probes() -> list[tuple[str, Callable[[], Any], str]]:
    """hf.apply on a tiny GPT-2 built from its config (no download); its values reach ModelConfig's checks."""
    import transformers

    from sigprop import hf

    def gpt2() -> torch.nn.Module:
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                                    n_positions=16))
    return [(f"hf.apply {scheme} {kw}", lambda s=scheme, k=kw: hf.apply(gpt2(), s, **k), next(iter(kw)))
            for scheme, kw in (("dslm", {"k": NAN}), ("shaped", {"c_plus": NAN}), ("dslm", {"shaping": "learn"}),
                               ("shaped", {"tau0": INF}), ("dslm", {"gamma": 1.5}), ("dslm", {"r0": -1.0}))]


def cli_probes(tmp: Path) -> list[tuple[str, list[str], str]]:
    sets = lambda *s: [a for x in [*FAST, *s] for a in ("--set", x)]
    run = tmp / "run"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--config", TINY, *sets(f"train.out_dir={run}")]) == 0
    norun = tmp / "norun"
    norun.mkdir()
    (norun / "config.toml").write_text("# mine\n")
    (norun / "metrics.jsonl").write_text("{}\n")
    bare = tmp / "bare.toml"
    bare.write_text("[diagnose]\nbatch = 2\n")
    notoml = tmp / "bad.toml"
    notoml.write_text("[model\n")
    tau = tmp / "tau.toml"
    tau.write_text("[model]\nscheme = 'shaped'\ntau0 = inf\n")
    ign = tmp / "ign.toml"
    ign.write_text("[model]\nqk_scaling = 'weights'\n")
    notok = tmp / "notok"
    import shutil
    shutil.copytree(run, notok)
    (notok / "tokenizer.json").unlink()
    out = [("train optim." + s, ["train", "--config", TINY, *sets(f"train.out_dir={tmp / 'x'}", f"optim.{s}")],
            s.split("=")[0])
           for s in ("lr=inf", "lr=nan", "lr=0", "weight_decay=nan", "weight_decay=-1", "beta1=1.5", "beta2=-0.1",
                     "eps=-1", "eps=0", "grad_clip=-1", "grad_clip=inf", "min_lr_ratio=2", "warmup_steps=-1",
                     "decay='step'", "lr='x'")]
    out += [("train " + s, ["train", "--config", TINY, *sets(f"train.out_dir={tmp / 'y'}", s)], s.split("=")[0])
            for s in ("train.steps=0", "train.steps=1.5", "train.batch_size=0", "train.seed=-1", "train.keep_last=0",
                      "data.val_fraction=1", "data.seq_len=1", "data.mask_prob=nan", "model.vocab_size=5e9",
                      "model.vocab_size=5000000000", "model.tau0=inf", "model.c_plus=nan", "model.dslm_k=nan",
                      "model.n_dec_layers=3", "model.learn_residual='no'", "train.progress=1", "model.widht=3",
                      "train.device='tpu'", "train.resume_from='x.json'")]
    out = [(name, argv, needle.split(".")[-1]) for name, argv, needle in out]   # ModelConfig.X or section.X
    out += [
        ("train out_dir ''", ["train", "--config", TINY, *sets("train.out_dir=''")], "out_dir"),
        ("train out_dir .", ["train", "--config", TINY, *sets("train.out_dir=.")], "current directory"),
        ("train out_dir non-run folder", ["train", "--config", TINY, *sets(f"train.out_dir={norun}")], "did not write"),
        ("train out_dir a file", ["train", "--config", TINY, *sets(f"train.out_dir={bare}")], "existing file"),
        ("train out_dir /proc/x", ["train", "--config", TINY, *sets("train.out_dir=/proc/x")], "cannot be written"),
        ("train fresh into a run", ["train", "--config", TINY, *sets(f"train.out_dir={run}")], "already holds"),
        ("train --resume nothing", ["train", "--config", TINY, *sets(f"train.out_dir={tmp / 'z'}"), "--resume"],
         "nothing to resume"),
        ("train --resume-from missing", ["train", "--config", TINY, *sets(f"train.out_dir={run}", "train.steps=3"),
                                         "--resume-from", str(tmp / "nope.json")], "does not exist"),
        ("train missing config", ["train", "--config", str(tmp / "nope.toml")], "nope.toml"),
        ("train config is a folder", ["train", "--config", str(tmp)], "config"),
        ("train bad TOML", ["train", "--config", str(notoml)], "expected"),
        ("train no [model]", ["train", "--config", str(bare)], "[model]"),
        ("eval not a run", ["eval", "--run", str(norun / "sub")], "run folder"),
        ("eval eval_batches=0", ["eval", "--run", str(run), "--set", "train.eval_batches=0"], "eval_batches"),
        ("eval bad checkpoint", ["eval", "--run", str(run), "--checkpoint", str(bare)], "checkpoint"),
        ("generate --max-new-tokens -5", ["generate", "--run", str(run), "--max-new-tokens", "-5"], "max-new-tokens"),
        ("generate --temperature nan", ["generate", "--run", str(run), "--temperature", "nan"], "temperature"),
        ("generate --top-k -1", ["generate", "--run", str(run), "--top-k", "-1"], "top-k"),
        ("generate no tokenizer.json", ["generate", "--run", str(notok)], "tokenizer"),
        ("predict no [model]", ["predict", "--config", str(bare), "--out", str(tmp / "p")], "[model]"),
        ("predict tau0=inf", ["predict", "--config", str(tau), "--out", str(tmp / "p")], "tau0"),
        ("predict ignored field", ["predict", "--config", str(ign), "--out", str(tmp / "p")], "qk_scaling"),
        ("predict missing config", ["predict", "--config", str(tmp / "nope.toml")], "nope.toml"),
        ("predict --out /proc/x", ["predict", "--config", str(ROOT / "configs/diagnose/dslm.toml"), "--out", "/proc/x"],
         "/proc/x"),
        ("diagnose config folder", ["diagnose", "--config", str(tmp)], "directory"),
        ("diagnose bad TOML", ["diagnose", "--config", str(notoml)], "expected"),
        ("demo --out /proc/x", ["demo", "--quick", "--out", "/proc/x"], "/proc/x"),
        ("reproduce --out /proc/x", ["reproduce", "fig1", "--quick", "--out", "/proc/x"], "/proc/x"),
        ("reproduce unknown", ["reproduce", "fig9"], "fig9"),
        ("check --depth 0", ["check", "--depth", "0", "--schemes", "preln"], "n_layers"),
        ("check --width 6", ["check", "--width", "6", "--schemes", "preln"], "d_model"),
    ]
    return out


def main_probe() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the probe's scratch runs (default: a temporary folder)")
    args = p.parse_args()
    rows: dict[str, Counter] = {}
    misses: list[str] = []

    def record(boundary: str, name: str, outcome: str) -> None:
        rows.setdefault(boundary, Counter())[outcome] += 1
        if outcome != "ok":
            misses.append(f"{boundary:10s} {outcome:9s} {name}")

    for boundary, probes in (("ModelConfig", model_probes()), ("forward", forward_probes()),
                             ("simulation", sim_probes()), ("hf.apply", hf_probes())):
        for name, fn, needle in probes:
            record(boundary, name, classify_call(fn, needle))
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        for name, argv, needle in cli_probes(Path(tmp)):
            record("CLI", name, classify_cli(argv, needle))
    print(f"{'boundary':12s} {'probes':>6s} {'ok':>4s} {'weak':>5s} {'accepted-invalid':>17s} {'traceback':>10s} "
          f"{'NaN':>4s}")
    for boundary, c in rows.items():
        print(f"{boundary:12s} {sum(c.values()):6d} {c['ok']:4d} {c['weak']:5d} {c['accepted']:17d} "
              f"{c['traceback']:10d} {c['nan']:4d}")
    total = sum(rows.values(), Counter())
    print(f"{'total':12s} {sum(total.values()):6d} {total['ok']:4d} {total['weak']:5d} {total['accepted']:17d} "
          f"{total['traceback']:10d} {total['nan']:4d}")
    for line in misses:
        print(line)


if __name__ == "__main__":
    main_probe()
