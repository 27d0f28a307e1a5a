"""Growth during training: a run that deepens its model at a fixed step (``train.grow_at``).

With ``train.grow_at = S`` and ``train.grow_to = N`` the run trains the configured ``model.n_layers`` blocks
for S steps, then `sigprop.models.grow.grow` inserts blocks up to N (``train.grow_mode``, placement
``train.grow_every`` — every J-th block, or 0 for the top), and training continues on the same lr schedule to
``train.steps``. AdamW state follows each existing parameter to its new name; the new blocks' parameters
start with zero moments and step 0 (as ``sigprop grow`` does to a run folder). The draws of new blocks
(mode "dslm") come from a generator seeded with ``train.seed + S``, so the training RNG stream is the one a
run without growth would have, and a resumed run rebuilds the same structure before loading its checkpoint.
Checkpoints from step S on hold the grown model and the config in force after growth (``model.n_layers = N``,
``train.grow_at = 0``); the run folder's config.toml stays the one the run was started with.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import nn

from ..console import UserError
from ..models.grow import Slot, grow, plan
from .config import RunConfig
from .optim import make_optimizer
from .parallel import _param_names


def placement(cfg: RunConfig) -> tuple[int | None, str | None]:
    """(every, at) of `sigprop.models.grow.plan` for the run's ``train.grow_every`` (0: at the top)."""
    return (cfg.train.grow_every, None) if cfg.train.grow_every else (None, "top")


def renamer(slots: list[Slot]) -> dict[int, int]:
    """Old block index -> its index in the grown stack."""
    return {s.source: j for j, s in enumerate(slots) if not s.new}


def moved_name(name: str, prefix: str, index: dict[int, int]) -> str:
    """``name`` of an old parameter as the grown model calls it (``PREFIXi.`` -> ``PREFIXj.``)."""
    m = re.match(rf"{re.escape(prefix)}(\d+)\.", name)
    return name if m is None else f"{prefix}{index[int(m.group(1))]}.{name[m.end():]}"


def grown_optimizer_state(old: nn.Module, old_state: dict[str, Any], grown: nn.Module, cfg: RunConfig,
                          new_cfg: RunConfig, slots: list[Slot]) -> dict[str, Any]:
    """The AdamW state dict of ``grown`` (as ``optimizer.state_dict()`` numbers it under ``new_cfg``): each old
    parameter's state under its new index, zero moments and step 0 for the new blocks' parameters."""
    names = _param_names(old, make_optimizer(old, cfg.optim, cfg.model))
    optimizer = make_optimizer(grown, new_cfg.optim, new_cfg.model)
    new_names = _param_names(grown, optimizer)
    if old_state["state"] and max(old_state["state"]) >= len(names):
        raise UserError(f"the checkpoint's optimizer state has entries for {max(old_state['state']) + 1} "
                        f"parameters, the run's model has {len(names)}")
    index, where = renamer(slots), {n: i for i, n in enumerate(new_names)}
    state = {where[moved_name(names[i], "stack.blocks.", index)]: st for i, st in old_state["state"].items()}
    template = next(iter(old_state["state"].values()), None)
    params = dict(grown.named_parameters())
    for i, name in enumerate(new_names):
        if i not in state and template is not None:
            p = params[name]
            state[i] = {k: torch.zeros_like(v) if k == "step" else torch.zeros(p.shape, dtype=v.dtype)
                        for k, v in template.items()}
    return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


def grown(cfg: RunConfig, model: nn.Module) -> tuple[RunConfig, nn.Module, list[Slot]]:
    """The run's config in force after growth (``model.n_layers = train.grow_to``, no growth left), the grown
    model (``model`` is not changed) and the layout of its blocks; the new blocks' draws are seeded with
    ``train.seed + grow_at``."""
    t = cfg.train
    every, at = placement(cfg)
    slots = plan(cfg.model.n_layers, t.grow_to, every, at)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(t.seed + t.grow_at)
        deeper = grow(model, t.grow_to, t.grow_mode, every, at)
    done = dataclasses.replace(t, grow_at=0, grow_to=0)
    return dataclasses.replace(cfg, model=deeper.cfg, train=done), deeper, slots
