"""Entry points behind ``sigprop predict --config FILE`` and ``sigprop diagnose --config FILE``.

The TOML file has a ``[model]`` table of `ModelConfig` fields and an optional ``[diagnose]`` table
(`DiagnoseConfig`). ``predict`` writes the predicted per-sublayer table (printed too), ``diagnose``
measures the freshly initialized model on random inputs and writes measured and predicted records
and one PNG with both overlaid. Every run writes the resolved config and the command line beside its
outputs. Exit codes (`sigprop.console.errors`): 0 done, 2 bad configuration or a model that ``predict`` has no
theory for (one line on stderr).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..console import EXIT_OK, USER_ERRORS, Parser, UserError, fail, read_toml
from ..fields import NONNEGATIVE, POSITIVE_INT, UNIT_CLOSED, FieldError, Range, check_fields, check_value, invalid
from ..models import ModelConfig, build_model
from ..records import Record, format_table, to_csv, to_json
from ..schemes.base import stack_layers, sublayers_per_block
from .measure import measure
from .plot import plot_records


@dataclass(frozen=True)
class DiagnoseConfig:
    seq_len: int | None = None          # tokens per sequence; None → model.max_seq_len
    batch: int = 8                      # sequences (or images) per measurement
    seed: int = 0                       # init, inputs and the random-projection loss
    out: str = "runs/diagnose"          # output folder
    token_collision: float | None = None  # P(two positions hold the same token) for predict; None → 1/vocab

    def __post_init__(self) -> None:
        check_fields(self, "diagnose.", {"seq_len": Range(2), "batch": POSITIVE_INT, "seed": NONNEGATIVE,
                                         "token_collision": UNIT_CLOSED})
        if not self.out.strip():
            raise FieldError(invalid("diagnose.out", self.out, "a folder path (not empty)"))


def load(path: str | Path) -> tuple[ModelConfig, DiagnoseConfig]:
    """Parse the TOML file; unknown tables or keys are errors naming the valid ones, and so is a
    ``diagnose.batch`` whose measurement cannot fit in this machine's memory (`measure_bytes`)."""
    raw = read_toml(path)
    unknown = sorted(set(raw) - {"model", "diagnose"})
    if unknown:
        raise UserError(f"unknown table(s) {unknown} in {path}; valid: ['diagnose', 'model']")
    if not isinstance(raw.get("model"), dict):
        raise UserError(f"{path} has no [model] table (the ModelConfig fields of the model)")
    model = ModelConfig.from_dict(raw["model"])
    diag = check_value(raw.get("diagnose", {}), DiagnoseConfig, "diagnose")
    if diag.seq_len is not None and diag.seq_len > model.max_seq_len and model.arch != "vit":
        raise UserError(f"diagnose.seq_len ({diag.seq_len}) exceeds model.max_seq_len ({model.max_seq_len})")
    _check_memory(model, diag)
    return model, diag


def measure_bytes(cfg: ModelConfig, diag: DiagnoseConfig) -> int:
    """A lower bound on the memory ``sigprop diagnose`` needs: the float64 tensors alive together when its
    backward pass ends, i.e. every recorded output (the embedding and each sublayer, (B, T, d_model)) and its
    gradient, the model output ((B, T, vocab_size) logits, (B, n_classes) for vit) and the inputs."""
    b = diag.batch
    t = cfg.n_tokens if cfg.arch == "vit" else diag.seq_len or cfg.max_seq_len
    stacks = ("enc", "dec") if cfg.arch == "encdec" else ("enc",)
    recorded = 1 + sum(stack_layers(cfg, s) * sublayers_per_block(cfg, s) for s in stacks)
    output = b * (cfg.n_classes if cfg.arch == "vit" else t * cfg.vocab_size)
    inputs = b * cfg.in_channels * cfg.image_size ** 2 if cfg.arch == "vit" else b * t * len(stacks)
    return 8 * (2 * recorded * b * t * cfg.d_model + output + inputs)


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):  # noqa: B007 - the unit the loop stops at is the answer
        if n < 1024:
            break
        n /= 1024
    return f"{n:.3g} {unit}"


def _check_memory(cfg: ModelConfig, diag: DiagnoseConfig) -> None:
    need, have = measure_bytes(cfg, diag), physical_memory()
    if have is not None and need > have:
        raise FieldError(invalid("diagnose.batch", diag.batch,
                                 f"small enough to fit in memory: measuring it needs at least {_size(need)} "
                                 f"(float64 outputs of every sublayer and their gradients, the model output and the "
                                 f"inputs) and this machine has {_size(have)}"))


def random_batch(cfg: ModelConfig, diag: DiagnoseConfig) -> Any:
    """Inputs for ``cfg.arch``: uniform token ids (B, T), (src, tgt) for encdec, N(0,1) images for vit."""
    g = torch.Generator().manual_seed(diag.seed)
    if cfg.arch == "vit":
        return torch.randn(diag.batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g,
                           dtype=torch.float64)
    shape = (diag.batch, diag.seq_len or cfg.max_seq_len)
    ids = [torch.randint(0, cfg.vocab_size, shape, generator=g) for _ in range(2 if cfg.arch == "encdec" else 1)]
    return tuple(ids) if cfg.arch == "encdec" else ids[0]


def _predicted(cfg: ModelConfig, diag: DiagnoseConfig) -> list[Record]:
    from ..models.predict import predict
    collision = 1.0 / cfg.vocab_size if diag.token_collision is None else diag.token_collision
    return predict(cfg, seq_len=diag.seq_len, token_collision=collision)


def _write(out: Path, name: str, records: list[Record]) -> None:
    to_csv(records, out / f"{name}.csv")
    to_json(records, out / f"{name}.json")


def _start(prog: str, argv: Sequence[str]) -> tuple[ModelConfig, DiagnoseConfig, Path]:
    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="TOML file: [model] (ModelConfig fields), optional [diagnose]")
    p.add_argument("--out", help="output folder (overrides diagnose.out)")
    args = p.parse_args(list(argv))
    cfg, diag = load(args.config)
    out = Path(args.out or diag.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = {"model": cfg.to_dict(), "diagnose": dataclasses.asdict(diag)}
    (out / "config.json").write_text(json.dumps(resolved, indent=1))
    (out / "command.txt").write_text(" ".join([prog, *argv]) + "\n")
    return cfg, diag, out


def predict_main(argv: Sequence[str]) -> int:
    """``sigprop predict --config FILE [--out DIR]``: predicted.{csv,json,png} and the table on stdout."""
    try:
        cfg, diag, out = _start("sigprop predict", argv)
        records = _predicted(cfg, diag)
    except (*USER_ERRORS, NotImplementedError) as e:    # NotImplementedError: a component without its theory
        return fail("sigprop predict", e)
    print(format_table(records))
    _write(out, "predicted", records)
    plot_records({"predicted": records}, out / "predicted.png",
                 title=f"{cfg.arch} {cfg.scheme} (norm {cfg.norm_placement}), predicted")
    print(f"sigprop predict: wrote {out}/predicted.{{csv,json,png}}", file=sys.stderr)
    return EXIT_OK


def diagnose_main(argv: Sequence[str]) -> int:
    """``sigprop diagnose --config FILE [--out DIR]``: measured and predicted records, one overlay PNG."""
    try:
        cfg, diag, out = _start("sigprop diagnose", argv)
    except USER_ERRORS as e:
        return fail("sigprop diagnose", e)
    torch.manual_seed(diag.seed)
    measured = measure(build_model(cfg).double(), random_batch(cfg, diag), seed=diag.seed)
    _write(out, "measured", measured)
    curves = {"measured": measured}
    try:
        curves["predicted"] = predicted = _predicted(cfg, diag)
        _write(out, "predicted", predicted)
    except NotImplementedError as e:
        print(f"sigprop diagnose: no prediction: {e}", file=sys.stderr)
    print(format_table(measured))
    plot_records(curves, out / "diagnose.png",
                 title=f"{cfg.arch} {cfg.scheme} (norm {cfg.norm_placement}), seed {diag.seed}")
    print(f"sigprop diagnose: wrote {out}/{{measured,predicted}}.{{csv,json}}, diagnose.png", file=sys.stderr)
    return EXIT_OK
