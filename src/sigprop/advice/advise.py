r"""`advise(model_or_cfg, ...)`: a signal-propagation report at init and a learning-rate advice, without a run.

For a run config (a `RunConfig` or its TOML path) the model is built and seeded as `sigprop train` builds it,
and the probe reads the run's first training batch and a validation batch; for a sigprop model, a
`ModelConfig` or a Hugging Face causal LM (plain or after `sigprop.hf.apply`) the caller gives the token
batches (B, T + 1) and the optimizer settings. Everything comes from at most a few tens of forward/backward
passes (`probe`), never from training:

1. the report at init: measured forward-variance range and gradient spread over the blocks, the exponents
   λ_a, λ_g per block and for the model from the moment maps, each beside its finite-network estimate
   (`exponents`), rank collapse (the last block's token correlation) and the attention-logit and
   correlation growth per unit lr;
2. the largest stable lr, a recommended lr and an interval (`rule`);
3. per lr asked for, the predicted outcome (``diverges``, ``stalls``, ``trains``) and the quantity that
   decides it.

The loss is the run's: the mean next-token (or masked-token) cross-entropy, plus its z-loss, in float64.
A model without an exact moment map still gets its advice, which the measured probe decides: the report's
exponents from the maps are then NaN and `Advice.unmapped` says why. Refused with an error naming the reason: a
gradient that is not finite at init, an lr that is not positive. A classifier's stall level is its class prior's
loss (`sigprop.train.levels.unigram_level`).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..console import UserError, one_line
from ..diagnostics import measure
from ..diagnostics.measure import output_tensor
from ..models import ModelConfig, build_model, calibrate
from ..models.adapter import adapter_of
from ..records import Record
from ..train.config import OptimConfig, RunConfig, load_config
from ..train.data import DataBundle, prepare_data
from ..train.levels import unigram_level, unigram_nll
from ..train.objectives import IGNORE, Batch
from ..train.optim import param_groups, param_rules
from ..train.run import seed_everything
from ..train.sampler import EpochSampler, generator
from ..train.schedules import lr_at
from ..train.trainer import EVAL_STREAM
from .exponents import angle_exponents_measured, angle_exponents_theory, gradient_exponents, main_stack, model_exponent
from .invariance import INVARIANCE_PROJECTIONS, invariant_parameters, scale_invariant_weights
from .probe import FORWARD, Group, Probe, last_corr, probe
from .rule import Rule, decide, limits, outcome, schedule_area

REPORT_PASSES = 1 + FORWARD                             # the report's measured λ_g (a pass) and λ_a (a forward)
LINE_GRID = tuple(2.0 ** k for k in range(-12, 2))     # one-step loss profile: 2.4e-4 ... 2


@dataclass(frozen=True)
class Advice:
    """The report and the advice (the module docstring and docs/advise.md derive each quantity); `table` prints
    it as `sigprop advise` does, `to_json` gives what ``--json`` writes."""

    recommended_lr: float                             # the lr to train at
    lr_interval: tuple[float, float]                  # (lo, hi) around it
    max_stable_lr: float                              # above it the first steps diverge
    decided_by: str                                   # the lr scale max_stable_lr is read from
    stall_lr: float                                   # below it a run of the config's steps stalls
    no_window: str | None                             # why no lr trains within the run's steps (None: some does)
    limits: dict[str, float]                          # the six measured lr scales (`rule.limits`)
    predictions: list[dict[str, Any]]                 # {"lr", "outcome", "reason"}
    lambda_a: float                                   # model angle exponent from the maps
    lambda_g: float                                   # model gradient exponent from the maps
    lambda_a_measured: float | None                   # the finite network's (None where not measurable)
    lambda_g_measured: float
    lambda_a_blocks: list[float]                      # per block, from the maps
    lambda_g_blocks: list[float]
    fwd_var_range: tuple[float, float]                # measured min, max of the block outputs' variance
    grad_spread: float                                # measured max/min of the block outputs' gradient variance
    rank_collapse: float                              # measured token correlation after the last block
    logit_growth: float                               # d max attention logit / d lr
    corr_growth: float                                # d (last block token correlation) / d lr
    unigram_loss: float
    init_loss: float
    passes: float                                     # forward + backward passes spent
    cost_s: float                                     # wall seconds of the advice
    probe: Probe = field(repr=False)
    caveat: str = ""                                  # what the rule's calibration cannot vouch for ("" none)
    unmapped: str | None = None                       # why the maps' exponents are missing (None: they are not)
    scale_invariant: tuple[str, ...] = ()             # weights without a stable bound (`invariance`)
    held_tensors: int = 0                             # invariant weight tensors the probe left still

    def to_json(self) -> dict[str, Any]:
        """The JSON schema of ``sigprop advise --json``, plus the report's fields under ``report``."""
        report = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in ("recommended_lr", "lr_interval", "max_stable_lr", "predictions", "cost_s", "probe")}
        return {"recommended_lr": self.recommended_lr, "lr_interval": list(self.lr_interval),
                "max_stable_lr": self.max_stable_lr, "predictions": self.predictions,
                "exponents": {"lambda_a": self.lambda_a, "lambda_g": self.lambda_g}, "cost_s": self.cost_s,
                "report": _finite(report)}

    def table(self) -> str:
        """The short terminal table."""
        meas_a = "-" if self.lambda_a_measured is None else f"{self.lambda_a_measured:+.4f}"
        rows = [
            "signal propagation at init (maps | finite network)",
            f"  lambda_a (angle)     {self.lambda_a:+.4f} | {meas_a}",
            f"  lambda_g (gradient)  {self.lambda_g:+.4f} | {self.lambda_g_measured:+.4f}",
            f"  forward variance     {self.fwd_var_range[0]:.3g} .. {self.fwd_var_range[1]:.3g}",
            f"  gradient spread      {self.grad_spread:.3g}x",
            f"  rank collapse        last-block token correlation {self.rank_collapse:.3f}",
            f"  per unit lr          attention logit {self.logit_growth:+.3g}, token correlation "
            f"{self.corr_growth:+.3g}",
            "learning rate",
            f"  max stable lr        {self.max_stable_lr:.3g}  ({self.decided_by})",
            f"  stall bound          {self.stall_lr:.3g}  (a run of the config's steps stalls below it)",
            f"  recommended lr       {self.recommended_lr:.3g}  [{self.lr_interval[0]:.3g}, {self.lr_interval[1]:.3g}]",
            f"  {'lr':>10s}  {'outcome':9s}  reason",
        ]
        if self.no_window:
            rows.append(f"  no lr trains: {self.no_window}")
        rows += [f"  {p['lr']:10.3g}  {p['outcome']:9s}  {p['reason']}" for p in self.predictions]
        rows.append(f"cost: {self.passes:.0f} forward+backward passes, {self.cost_s:.1f} s")
        if self.caveat:
            rows.append(f"caveat: {self.caveat}")
        if self.unmapped:
            rows.append(f"the maps' exponents (nan above) are missing: {self.unmapped}")
        if self.held_tensors:
            rows.append(f"the lr scales were measured with {self.held_tensors} scale-invariant weight tensors held "
                        "still")
        elif self.scale_invariant:
            rows.append(unbounded_note(self.scale_invariant))
        return "\n".join(rows)


def unbounded_note(kinds: Sequence[str]) -> str:
    """The report's line for a stack with scale-invariant weights (`sigprop.advice.invariance`)."""
    return (f"no stable bound: weights whose scale a norm removes ({', '.join(kinds)}) lower their own effective "
            "lr as they grow, so lrs above the max stable lr may train; on the lr benchmark's qk-norm stacks the "
            "bound is 10-100x low (docs/advise.md)")


def _finite(x: Any) -> Any:
    """JSON-safe: inf/nan floats become None, tuples lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def with_target(result: Any) -> dict[str, Any]:
    """A trained advice's fields (a dataclass with a ``target``, the run's own `Advice`), JSON-safe, the run's
    rule-based report under ``target``."""
    out = {k: v for k, v in dataclasses.asdict(result).items() if k != "target"}
    return _finite({**out, "target": result.target.to_json() if result.target else None})


def lm_loss(z_loss: float = 0.0):
    """The run's loss on a `Batch`, in the model's dtype: mean cross-entropy over target positions (+ z-loss)."""
    of_logits = logits_loss(z_loss)

    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        return of_logits(output_tensor(model(*batch.inputs)), batch)
    return loss


def logits_loss(z_loss: float = 0.0):
    """`lm_loss` from the model's logits (B, T, V) on a `Batch`."""
    def loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        flat, tgt = logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)
        keep = tgt != IGNORE
        value = F.cross_entropy(flat, tgt, ignore_index=IGNORE, reduction="sum")
        if z_loss > 0:
            value = value + z_loss * (flat.logsumexp(-1).square() * keep).sum()
        return value / keep.sum().clamp_min(1)
    return loss


def _output(model: nn.Module, batch: Batch) -> torch.Tensor:
    return output_tensor(model(*batch.inputs))


def _groups(optimizer_groups: Sequence[dict[str, Any]]) -> list[Group]:
    return [Group(list(g["params"]), g.get("lr_mult", 1.0), g["eps"], g["weight_decay"]) for g in optimizer_groups]


def _next_token(ids: torch.Tensor) -> Batch:
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[1] < 3:
        raise ValueError("advise: batches must be (B, T + 1) token-id tensors with T + 1 >= 3 (inputs and their "
                         "next tokens) or sigprop Batch objects")
    return Batch((ids[:, :-1],), ids[:, 1:])


@dataclass
class _Inputs:
    model: nn.Module
    groups: list[Group]
    train: Batch
    heldout: Batch
    unigram: float
    optim: OptimConfig
    steps: int
    data: DataBundle | None = None                # a run config's data (train split, for the range test)


def run_inputs(cfg: RunConfig) -> _Inputs:
    """The model, optimizer groups, first training batch, held-out batch and unigram loss of a run config, as
    `sigprop train` sets them up (same seeds, same batches). The held-out batch is the validation split's first
    ``batch_size`` sequences (its loss is read at every point of the one-step profile: a batch the size of a
    training step's keeps that profile a few training steps' worth of compute); the unigram loss is read on its
    targets."""
    data = prepare_data(cfg, Path(cfg.train.out_dir), save_tokenizer=False)
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model)
    sampler = EpochSampler(len(data.train), cfg.train.seed)
    train = data.train.batch(sampler.indices(0, cfg.train.batch_size), generator(cfg.train.seed, 0))
    calibrate(model, train.inputs)
    n = min(len(data.val), cfg.train.batch_size)
    heldout = data.val.batch(torch.arange(n), generator(cfg.train.seed, EVAL_STREAM))
    unigram = unigram_level(cfg, data, heldout.targets)
    groups = _groups(param_groups(param_rules(model, cfg.model), cfg.optim))
    return _Inputs(model, groups, _float64(train), _float64(heldout), unigram, cfg.optim, cfg.train.steps, data)


def _float64(b: Batch) -> Batch:
    """``b`` with its floating inputs (images) in float64, as the float64 copies that advise measures read them."""
    return Batch(tuple(x.double() if x.is_floating_point() else x for x in b.inputs), b.targets)


def _plain_groups(model: nn.Module, optim: OptimConfig) -> list[Group]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [Group([p for p in params if p.ndim >= 2], 1.0, optim.eps, optim.weight_decay),
            Group([p for p in params if p.ndim < 2], 1.0, optim.eps, 0.0)]


def model_inputs(model: nn.Module, batches: Sequence[Any], optim: OptimConfig, steps: int,
                 unigram: float | None, hf_config: ModelConfig | None) -> _Inputs:
    """The same for a model and caller-given batches: the first trains, the last is held out."""
    if len(batches) < 2:
        raise ValueError(f"advise: give at least two batches (one to train on, one held out), got {len(batches)}")
    train, heldout = [b if isinstance(b, Batch) else _next_token(b) for b in (batches[0], batches[-1])]
    if unigram is None:
        unigram = unigram_nll(train.inputs[0], heldout.targets, adapter_of(model).vocab_size(model))
    cfg = hf_config if hf_config is not None else adapter_of(model).config(model)
    groups = _plain_groups(model, optim) if cfg is None else _groups(param_groups(param_rules(model, cfg), optim))
    return _Inputs(model, groups, _float64(train), _float64(heldout), unigram, optim, steps)


def first_stack(records: Sequence[Record]) -> list[Record]:
    """The records of the stack that starts at the embedding (an encoder–decoder's encoder: the decoder's blocks also
    read the memory)."""
    return [r for r in records if r.stack == records[0].stack]


def _report(model: nn.Module, batch: Batch) -> tuple[list[float], list[float], float | None, float, list[Record]]:
    """(λ_a per block, λ_g per block from the maps, measured λ_a, measured λ_g, measured records) of the stack that
    starts at the embedding (`first_stack`), on the token batch, in float64, through the model's adapter: its maps
    read the init stds off the model itself; the measured λ_a where the adapter names the stack's input module
    (`Adapter.stack_input`), else None."""
    adapter = adapter_of(model)
    predicted = adapter.predict(model, batch.inputs)
    twin = _twin(model)
    la = angle_exponents_theory(adapter.chain(model, batch.inputs))
    la_m = None
    if adapter.stack_input(model) is not None:
        la_m = model_exponent(angle_exponents_measured(twin, batch.inputs, predicted[0].fwd_var))
    measured = measure(twin, batch.inputs, attention_stats=False, stable_ranks=False, mode=adapter.measured_mode)
    return (la, gradient_exponents(first_stack(predicted)), la_m,
            model_exponent(gradient_exponents(first_stack(measured))), measured)


def _twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).double()


def _records_fn(model: nn.Module, batch: Batch):
    mode = adapter_of(model).measured_mode
    return lambda m, grads: measure(m, batch.inputs, backward=grads, stable_ranks=False, mode=mode)


def run_area(optim: OptimConfig, steps: int) -> float:
    """`schedule_area` of a run of ``steps`` steps under ``optim``'s warmup and decay."""
    unit = dataclasses.replace(optim, lr=1.0)
    return schedule_area([lr_at(t, steps, unit) for t in range(steps)])


DEFAULT_RULE = Rule()


def advise(model_or_cfg: RunConfig | str | Path | nn.Module | ModelConfig, lrs: Sequence[float] | None = None,
           *, batches: Sequence[Any] = (), optim: OptimConfig | None = None, steps: int | None = None,
           unigram: float | None = None, hf_config: ModelConfig | None = None, rule: Rule = DEFAULT_RULE,
           iterations: int = 3, seed: int = 0, hold_invariant: bool = False) -> Advice:
    """The report and lr advice (module docstring) for a run config (`RunConfig` or TOML path), or for a model
    (sigprop model, `ModelConfig`, or HF causal LM) with ``batches`` (two or more (B, T + 1) id tensors or
    `Batch` objects: the first trains, the last is held out), ``optim`` (default `OptimConfig()`), ``steps``
    (default 1000) and optionally the ``unigram`` loss (default: from the batches). ``lrs``: the peak lrs to
    predict (default: the config's ``optim.lr``). ``hf_config``: what `sigprop.hf.apply` returned (its optimizer
    rules), if the model was applied.

    Args:
        model_or_cfg: a `RunConfig`, the path of a run's TOML file, a `ModelConfig` (built with its seed) or a
            model (a sigprop model or a `transformers` causal LM).
        lrs: the peak learning rates to give an outcome for; default the config's ``optim.lr``.
        batches: for a model or `ModelConfig`: two or more batches, the first trains, the last is held out.
        optim: for a model: the optimizer settings the run will use (default `OptimConfig()`).
        steps: for a model: the run's length in optimizer steps (default 1000).
        unigram: the unigram loss of the data in nats (default: from the batches).
        hf_config: for a `transformers` model that went through `sigprop.hf.apply`: what it returned.
        rule: the advice's constants (`Rule`; the default is the fitted one).
        iterations: refinement passes of each lr scale's line search along the first step.
        seed: seed of the probes' random directions.
        hold_invariant: measure the lr scales along a first step that leaves the scale-invariant weights still
            (`sigprop.advice.invariance.invariant_parameters`, on the held-out batch): their own step turns them
            by at most a right angle whatever the lr, so the bounds come from the weights whose scale the loss
            sees. Not the default: the rule's constants were fitted on whole steps (docs/advise.md).

    Returns:
        The `Advice`: the report at init, the recommended lr with its interval, the largest stable lr and one
        outcome per lr in ``lrs``.

    Raises:
        TypeError: ``model_or_cfg`` is none of the above.
        NotImplementedError: a model that is neither a sigprop nor a `transformers` model (no moment maps), or
            a ViT run config (the stall level needs token data).
        ValueError: fewer than two ``batches``, or batches that are not (B, T + 1) id tensors with T + 1 >= 3.
        UserError: an lr that is not a positive finite number, or a config file that cannot be read or holds
            an invalid value (`FieldError`).
    """
    start = time.perf_counter()
    if isinstance(model_or_cfg, (str, Path)):
        model_or_cfg = load_config(model_or_cfg)
    if isinstance(model_or_cfg, RunConfig):
        inputs = run_inputs(model_or_cfg)
    else:
        model = build_model(model_or_cfg) if isinstance(model_or_cfg, ModelConfig) else model_or_cfg
        if not isinstance(model, nn.Module):
            raise TypeError(f"advise takes a RunConfig, a TOML path, a ModelConfig or a model, got "
                            f"{type(model_or_cfg).__name__}")
        try:
            adapter_of(model)
        except ValueError:
            raise NotImplementedError(f"advise: {type(model).__name__} is neither a sigprop model nor a "
                                      "transformers model; its moment maps are unknown") from None
        inputs = model_inputs(model, batches, optim or OptimConfig(), steps or 1000, unigram, hf_config)
    optim_cfg = inputs.optim
    asked = [optim_cfg.lr] if lrs is None else [float(x) for x in lrs]
    bad = [x for x in asked if not (math.isfinite(x) and x > 0)]
    if bad or not asked:
        raise UserError(f"advise: lrs must be positive finite numbers, got {list(lrs or [])}")
    try:
        la, lg, la_m, lg_m, _ = _report(inputs.model, inputs.train)
        unmapped = None
    except NotImplementedError as e:       # no exact maps: the report's exponents are left out, the advice stands
        la, lg, la_m, lg_m, unmapped = [], [], None, math.nan, one_line(e)
    groups, held, held_passes = inputs.groups, (), 0.0
    if hold_invariant:
        held = invariant_parameters(_twin(inputs.model), _output, inputs.heldout, seed=seed)
        groups = held_still(inputs.model, groups, held)
        held_passes = FORWARD + INVARIANCE_PROJECTIONS
    p = probe(inputs.model, groups, lm_loss(optim_cfg.z_loss), _output,
              _records_fn(inputs.model, inputs.heldout), inputs.train, inputs.heldout,
              LINE_GRID, iterations=iterations, seed=seed, heldout_loss=logits_loss(optim_cfg.z_loss))
    d = decide(p, optim_cfg.beta1, run_area(optim_cfg, inputs.steps), inputs.unigram, rule)
    predictions = []
    for lr in asked:
        name, reason = outcome(lr, d)
        predictions.append({"lr": lr, "outcome": name, "reason": reason})
    blocks = [r for r in main_stack(list(p.records)) if r.layer >= 1]
    grads = [r.grad_var for r in blocks if r.grad_var is not None and r.grad_var > 0]
    return Advice(
        recommended_lr=d.recommended, lr_interval=d.interval, max_stable_lr=d.eta_max, decided_by=d.decided_by,
        stall_lr=d.eta_min, no_window=d.no_window, limits=limits(p, optim_cfg.beta1), predictions=predictions,
        lambda_a=model_exponent(la) if la else math.nan, lambda_g=model_exponent(lg) if lg else math.nan,
        lambda_a_measured=la_m, lambda_g_measured=lg_m, unmapped=unmapped,
        lambda_a_blocks=la, lambda_g_blocks=lg,
        fwd_var_range=(min(r.fwd_var for r in blocks), max(r.fwd_var for r in blocks)),
        grad_spread=max(grads) / min(grads) if grads else math.nan, rank_collapse=last_corr(p.records),
        logit_growth=p.logit_growth, corr_growth=p.corr_growth, unigram_loss=inputs.unigram, init_loss=p.loss0,
        passes=p.passes + REPORT_PASSES + held_passes, cost_s=time.perf_counter() - start, probe=p,
        caveat=rule.caveat, scale_invariant=scale_invariant_weights(inputs.model), held_tensors=len(held))


def held_still(model: nn.Module, groups: Sequence[Group], names: Sequence[str]) -> list[Group]:
    """``groups`` with the parameters of ``model`` named in ``names`` moved to groups of lr multiplier 0 (AdamW's
    first step leaves them where they are; each keeps its ε and weight decay)."""
    held = set(names)
    still = {id(w) for n, w in model.named_parameters() if n in held}
    out = []
    for g in groups:
        moving, kept = [], []
        for w in g.params:
            (kept if id(w) in still else moving).append(w)
        out += [Group(params, mult, g.eps, g.weight_decay) for params, mult in ((moving, g.lr_mult), (kept, 0.0))
                if params]
    return out


def write_json(advice: Advice, path: str | Path) -> None:
    """Write `Advice.to_json` to ``path``."""
    Path(path).write_text(json.dumps(advice.to_json(), indent=2) + "\n")
