"""Typed, validated run configuration: TOML file + dotted ``--set a.b=c`` overrides (`sigprop.console.overrides`).

A run is ``RunConfig(model, data, optim, train)``; every section is a dataclass whose
fields carry a comment. `load_config` reads TOML, applies overrides to the raw tables and
builds the dataclasses through one checker (`from_mapping`), so unknown keys and wrong
types are rejected the same way whether they come from the file or the command line.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from ..console.overrides import apply_sets, read_toml
from ..fields import (
    NONNEGATIVE,
    POSITIVE,
    UNIT_CLOSED,
    UNIT_OPEN,
    FieldError,
    Range,
    check_fields,
    from_mapping,
    invalid,
)
from ..models import ModelConfig
from ..models.grow import MODES
from ..models.native import check_growth
from .distributed import check_device_name

ARCH_OBJECTIVE = {"decoder": "clm", "encoder": "mlm", "encdec": "denoise", "vit": "digits"}
DISTRIBUTED, COMPILE, PRECISIONS = ("ddp", "fsdp"), ("off", "blocks", "model"), ("fp32", "bf16")


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it becomes examples."""

    source: str = "pydoc"            # "pydoc" | "stdlib" | "digits" (vit) | "hf:DIR" | a text file or folder
    pattern: str = "**/*.txt"        # glob for the files of a folder source
    text_column: str = "text"        # column of a Hugging Face dataset saved with save_to_disk
    max_chars: int = 0               # keep documents up to this many characters in total (0 = all)
    val_fraction: float = 0.1        # share of documents held out for validation (seeded hash)
    seq_len: int = 64                # tokens per example
    tokenizer: str = ""              # an existing tokenizer.json ("" = train BPE on the train split)
    mask_prob: float = 0.15          # corruption rate for MLM and denoising
    span_len: int = 3                # length of each masked span for denoising

    def __post_init__(self) -> None:
        check_fields(self, "data.", {"val_fraction": UNIT_OPEN, "seq_len": Range(2), "max_chars": NONNEGATIVE,
                                     "mask_prob": UNIT_OPEN}, int_range=Range(1))


@dataclass(frozen=True)
class OptimConfig:
    """AdamW (or Prodigy) with linear warmup and a decay to ``min_lr_ratio * lr``."""

    optimizer: Literal["adamw", "prodigy"] = "adamw"   # prodigy: Prodigy (Mishchenko & Defazio 2024), its step
    #                                    size estimated; lr = 1 is its default (`sigprop.train.optim.make_optimizer`)
    lr: float = 1e-3                 # peak learning rate
    min_lr_ratio: float = 0.1        # final lr as a fraction of the peak
    warmup_steps: int = 100          # linear warmup from 0
    decay: Literal["cosine", "linear", "constant"] = "cosine"   # shape after warmup
    weight_decay: float = 0.1        # applied to matrices (ndim >= 2) only
    beta1: float = 0.9               # AdamW beta1
    beta2: float = 0.95              # AdamW beta2
    eps: float = 1e-8                # AdamW epsilon
    grad_clip: float = 1.0           # max global grad norm (0 = no clipping)
    z_loss: float = 0.0              # coefficient of log²Z (Z = the output softmax normaliser) in the training loss

    def __post_init__(self) -> None:
        check_fields(self, "optim.", {"lr": POSITIVE, "min_lr_ratio": UNIT_CLOSED, "weight_decay": NONNEGATIVE,
                                      "beta1": Range(0.0, 1.0, hi_open=True), "beta2": Range(0.0, 1.0, hi_open=True),
                                      "eps": POSITIVE}, int_range=NONNEGATIVE, float_range=NONNEGATIVE)


@dataclass(frozen=True)
class TrainConfig:
    """The loop: length, batch, cadence of eval/logging/checkpoints, faults, schedules."""

    steps: int = 1000                # optimizer steps (the lr schedule's length)
    stop_at: int = 0                 # end the run after this step, with a checkpoint (0 = steps): a stage of a
                                     # longer schedule that a later run resumes, e.g. after `sigprop grow`
    grow_at: int = 0                 # deepen the model after this step (0 = never; sigprop.train.growth) ...
    grow_to: int = 0                 # ... to this many blocks ...
    grow_mode: str = "identity"      # ... by this mode of sigprop.models.grow: identity | copy | dslm ...
    grow_every: int = 0              # ... new blocks after every grow_every-th block (0 = on top)
    batch_size: int = 32             # global examples per optimizer step (all ranks, all micro-steps)
    grad_accum: int = 1              # micro-steps per optimizer step
    eval_every: int = 100            # evaluate every k steps (and at the end); 0 = only at the end
    eval_batches: int = 4            # validation size, in global batches (0 = no evaluation)
    diag_every: int = 0              # attention entropy + token correlation every k steps (0 = off)
    block_grads: bool = False        # log each block's gradient norm (before clipping) and each post-norm
    #                                    sublayer's shortcut factor on the steps that evaluate
    ckpt_every: int = 500            # checkpoint every k steps (and at the end); 0 = only at the end
    ckpt_minutes: float = 0.0        # also checkpoint once this many minutes have passed since the last one (0 = off)
    keep_last: int = 3               # checkpoints kept on disk
    seed: int = 0                    # seeds init, data order, corruption
    out_dir: str = "runs/default"    # run folder: config, tokenizer, metrics.jsonl, checkpoints/
    device: str = "auto"             # "auto" | "cpu" | "cuda" | "cuda:N"
    resume: bool = False             # continue from the newest checkpoint in out_dir
    recover_steps: int = 4000        # model.shaping="recover": steps over which γ₁, γ₂, s₋ decay to 0
    progress: bool = True            # tqdm progress bar on rank 0
    tensorboard: bool = False        # also log to TensorBoard (extra: sigprop[tensorboard])
    resume_from: str = ""            # with resume: this checkpoint JSON of out_dir/checkpoints ("" = the newest)
    fresh_if_none: bool = False      # with resume: start from step 0 when out_dir has no checkpoint (else an error)
    distributed: str = "ddp"         # under torchrun: "ddp" (replicated) | "fsdp" (FSDP2, one shard unit per block)
    activation_checkpointing: bool = False   # recompute each block's activations in backward (non-reentrant)
    compile: str = "off"             # torch.compile: "off" | "blocks" (one block graph, reused) | "model"
    precision: str = "fp32"          # "fp32" | "bf16" (autocast; parameters and optimizer stay fp32)
    flush_denormal: bool = False     # CPU: subnormal floats read and computed as 0 during the run (x86 only)

    def __post_init__(self) -> None:
        check_fields(self, "train.", {name: NONNEGATIVE for name in ("eval_every", "eval_batches", "diag_every",
                                                                    "ckpt_every", "seed", "stop_at", "grow_at",
                                                                    "grow_to", "grow_every")},
                     int_range=Range(1))
        _require(math.isfinite(self.ckpt_minutes) and self.ckpt_minutes >= 0, "train.ckpt_minutes",
                 self.ckpt_minutes, "a number of minutes >= 0 (0 = no time-based checkpoints)")
        _require(self.stop_at <= self.steps, "train.stop_at", self.stop_at,
                 f"0 (train to train.steps) or a step in [1, train.steps={self.steps}]")
        _require(not (self.block_grads and self.distributed == "fsdp"), "train.block_grads", self.block_grads,
                 "false under train.distributed='fsdp' (its gradients are sharded per block)")
        _require(self.grow_at < self.steps, "train.grow_at", self.grow_at,
                 f"0 (no growth) or a step in [1, train.steps - 1 = {self.steps - 1}]")
        _require(self.grow_mode in MODES, "train.grow_mode", self.grow_mode, f"one of {list(MODES)}")
        _require(self.out_dir.strip() != "", "train.out_dir", self.out_dir, "a folder path (not empty)")
        for name in ("resume_from", "fresh_if_none"):
            _require(self.resume or not getattr(self, name), f"train.{name}", getattr(self, name),
                     "left at its default unless train.resume=true (it only chooses where a resume starts)")
        check_device_name(self.device)        # whether this machine has it is checked where the run starts
        for name, allowed in (("distributed", DISTRIBUTED), ("compile", COMPILE), ("precision", PRECISIONS)):
            _require(getattr(self, name) in allowed, f"train.{name}", getattr(self, name), f"one of {list(allowed)}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; the resolved copy is written beside the run as config.toml.

    Raises:
        FieldError: a section's invalid value, or a combination the run cannot honour, named.
    """

    model: ModelConfig               # architecture and scheme (sigprop.models)
    data: DataConfig = field(default_factory=DataConfig)      # the corpus, tokenizer and sequence length
    optim: OptimConfig = field(default_factory=OptimConfig)   # AdamW (or Prodigy) and the lr schedule
    train: TrainConfig = field(default_factory=TrainConfig)   # the loop, its cadences, devices and output folder

    @property
    def objective(self) -> str:
        """Training task implied by the architecture: clm, mlm, denoise or digits."""
        return ARCH_OBJECTIVE[self.model.arch]

    def __post_init__(self) -> None:
        images = self.model.arch == "vit"
        if images != (self.data.source == "digits"):
            raise FieldError(f"data.source={self.data.source!r} does not fit model.arch="
                             f"{self.model.arch!r}: 'digits' is the (only) source for arch 'vit'")
        if not images and self.data.seq_len > self.model.max_seq_len:
            raise FieldError(f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len="
                             f"{self.model.max_seq_len}")
        if self.train.grow_at:
            self._check_growth()

    def _check_growth(self) -> None:
        t, n = self.train, self.model.n_layers
        _require(t.grow_to > n, "train.grow_to", t.grow_to, f"more blocks than model.n_layers={n}")
        _require(t.grow_every <= n, "train.grow_every", t.grow_every, f"0 (on top) or a block in [1, {n}]")
        _require(t.compile == "off", "train.compile", t.compile, "'off' with train.grow_at (the model changes)")
        _require(self.model.shaping != "recover", "model.shaping", self.model.shaping,
                 "'fixed' or 'learn' with train.grow_at (the recover schedule holds the model it was built for)")
        try:
            check_growth(self.model, t.grow_mode)
        except ValueError as e:
            raise FieldError(f"train.grow_mode={t.grow_mode!r} / train.grow_to={t.grow_to} / "
                             f"train.grow_every={t.grow_every}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (TOML/JSON-ready)."""
        return {f.name: _as_dict(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _as_dict(section: Any) -> dict[str, Any]:
    return section.to_dict() if hasattr(section, "to_dict") else dataclasses.asdict(section)


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise FieldError(invalid(name, value, allowed))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a TOML run config (or start empty), apply overrides, validate everything.

    Args:
        path: the TOML file; None: start from no tables (the overrides must then give ``[model]``).
        overrides: ``section.key=value`` strings, as ``--set`` takes them.

    Returns:
        The validated `RunConfig`.

    Raises:
        FieldError: no ``[model]`` table, an unknown table or key, or an invalid value, named.
        UserError: a file that cannot be read or is not TOML, or a malformed override.
    """
    raw = apply_sets({} if path is None else read_toml(path), list(overrides))
    if "model" not in raw:
        raise FieldError("the config has no [model] table (set it in the TOML file or with --set model.KEY=...)")
    return from_mapping(RunConfig, raw)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {v!r} as TOML")


def dump_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """Write ``{section: {key: scalar|list}}`` as TOML (None values are left out)."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
        lines.append("")
    return "\n".join(lines)
