"""How a model is run at scale: data parallelism (DDP or FSDP2), activation checkpointing,
regional compilation and bf16 autocast, each switched on by one `TrainConfig` field.

The order of `prepare_model` follows PyTorch's composable recipe (torchtitan): checkpointing
wraps each block's call, compilation then sees the block, sharding comes last, so one
compiled block graph serves every block and every FSDP unit.

- ``distributed="fsdp"``: `torch.distributed.fsdp.fully_shard` on every block, then the root
  (embedding, final norm, tied head). Gradients are reduce-scattered and averaged over ranks,
  exactly as DDP averages them, so the trainer's loss normalisation holds unchanged.
  In-training diagnostics run collectively on the sharded model (`sigprop.train.Diagnostics`).
- Checkpoints stay consolidated: `gather_state` collects full, unsharded state dicts on
  rank 0 (``torch.distributed.checkpoint.state_dict``, full_state_dict + cpu_offload) and the
  optimizer state is re-keyed from parameter names to the integer order a plain
  ``optimizer.state_dict()`` uses, so the files are the ones a single process writes. A run of
  any world size (or `sigprop.train.load_run` in one process) reads them; `restore_state`
  re-shards a full state dict for the current mesh. Consolidated safetensors rather than
  torch Distributed Checkpoint: sigprop's models fit one host's memory, and one file format
  keeps hashes, atomic writes and loading with and without FSDP identical.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager, Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..fields import FieldError
from ..models.stack import Stack
from .checkpoint import load_checkpoint, read_states
from .config import TrainConfig
from .distributed import DistInfo


def stacks(model: nn.Module) -> list[Stack]:
    """The block stacks of ``model`` (one for decoder/encoder/ViT, two for encoder–decoder)."""
    return [m for m in model.modules() if isinstance(m, Stack)]


def compile_model(model: nn.Module, mode: str) -> None:
    """``"blocks"``: compile each block in place (`nn.Module.compile`). Dynamo inlines the block's
    submodules and treats their parameters and buffers as graph inputs, so every block of a stack
    reuses the first block's graph and compile time does not grow with depth. ``"model"``: the
    whole forward as one graph (every block unrolled). State-dict keys are unchanged either way."""
    if mode == "blocks":
        for stack in stacks(model):
            for block in stack.blocks:
                block.compile()
    elif mode == "model":
        model.compile()
    elif mode != "off":
        raise FieldError(f"train.compile={mode!r} is invalid: must be one of ['off', 'blocks', 'model']")


def _shard(model: nn.Module) -> nn.Module:
    """FSDP2: one unit per block, then the root. Role and site tags move to the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    tags = {name: {k: v for k, v in vars(p).items() if k.startswith("_sigprop_")}
            for name, p in model.named_parameters()}
    for stack in stacks(model):
        for block in stack.blocks:
            fully_shard(block)
    fully_shard(model)
    for name, p in model.named_parameters():
        for k, v in tags[name].items():
            setattr(p, k, v)
    return model


def prepare_model(model: nn.Module, cfg: TrainConfig, dist: DistInfo) -> nn.Module:
    """Apply ``cfg``'s activation checkpointing, compilation and data parallelism to ``model``
    (already on its device). Returns the module to call for training: ``model`` itself (one
    process, or FSDP, which shards in place) or its DDP wrapper."""
    for stack in stacks(model):
        stack.activation_checkpointing = cfg.activation_checkpointing
    compile_model(model, cfg.compile)
    if not dist.enabled:
        return model
    if cfg.distributed == "fsdp":
        return _shard(model)
    return DistributedDataParallel(model)


def is_sharded(model: nn.Module) -> bool:
    """True for a model prepared with FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def no_sync(model: nn.Module) -> ContextManager[None]:
    """Accumulate gradients locally (no all-reduce / reduce-scatter) inside the block."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if is_sharded(model):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def autocast(precision: str, device: torch.device) -> ContextManager[Any]:
    """bf16 autocast on ``device`` (CPU or CUDA) for ``precision="bf16"``, else a no-op."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order ``optimizer.state_dict()`` numbers them (groups in turn)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer
                 ) -> tuple[nn.Module | dict[str, torch.Tensor], torch.optim.Optimizer | dict[str, Any]]:
    """What `save_checkpoint` writes: the model and optimizer themselves, or for FSDP their full
    state dicts on rank 0's CPU (empty on other ranks). Collective under FSDP: every rank calls it."""
    if not is_sharded(model):
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=opts)
    named = get_optimizer_state_dict(model, optimizer, options=opts)
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    state = {index[n]: st for n, st in named.get("state", {}).items()}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named.get("param_groups", [])]
    return weights, {"state": state, "param_groups": groups}


def restore_state(path: Path, model: nn.Module, model_config: dict[str, Any],
                  optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`load_checkpoint` for a prepared model: a consolidated checkpoint is re-sharded over this
    run's ranks under FSDP (any world size), loaded as is otherwise. Returns the checkpoint record."""
    if not is_sharded(model):
        return load_checkpoint(path, model, model_config, optimizer)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    record, weights, optim = read_states(path, model_config)
    names = _param_names(model, optimizer)
    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=opts)
    named = {"state": {names[i]: st for i, st in optim["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, named, options=opts)
    return record
