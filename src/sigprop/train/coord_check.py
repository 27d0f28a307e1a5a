"""mup's coordinate check as rows: how much each block's output moves after a few Adam steps.

For a decoder built from ``cfg``, fixed random tokens x (B, T) and h_l(t) the residual stream
after block l at step t, the row of block l holds c_l = ‖h_l(t) − h_l(0)‖ / ‖h_l(0)‖ (Frobenius
over B, T, d). A parametrization transfers across a dimension when c_l does not depend on it:
μP across width (Yang et al., Tensor Programs V, §5 "coordinate check"), depth-μP and CompleteP
across depth (Yang et al. TP-VI; Dey et al. 2025). `slope` fits log c vs log size.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from ..models import ModelConfig, build_model
from .config import OptimConfig
from .objectives import Batch, loss_terms
from .optim import make_optimizer


def stream(model: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Residual stream after every block of a single-stack model, each (B, T, d)."""
    outs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _i, o: outs.append(o.detach())) for b in model.stack.blocks]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return outs


def activation_change(cfg: ModelConfig, lr: float, steps: int = 3, batch: int = 4, seed: int = 0
                      ) -> list[dict[str, Any]]:
    """Rows {layer, change} after ``steps`` AdamW steps (no decay, constant ``lr``) on one fixed batch of
    ``batch`` × ``cfg.max_seq_len`` random tokens (next-token loss)."""
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1), generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    model = build_model(cfg)
    data = Batch((ids[:, :-1],), ids[:, 1:])
    before = stream(model, ids[:, :-1])
    opt = make_optimizer(model, OptimConfig(lr=lr, weight_decay=0.0), cfg)
    for _ in range(steps):
        loss, _ = loss_terms(model, data)
        (loss / data.n_targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    after = stream(model, ids[:, :-1])
    return [{"layer": i, "change": float((a - b).norm() / b.norm())} for i, (a, b) in enumerate(zip(after, before))]


def slope(sizes: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) on log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(values), 1)[0])


def mean_change(rows: list[dict[str, Any]]) -> float:
    """Mean of c_l over the blocks (the per-block change of the coordinate check)."""
    return math.fsum(r["change"] for r in rows) / len(rows)
