r"""What a model does along AdamW's first step, measured at init on a few batches (no training run).

AdamW's first bias-corrected step is m̂/(√v̂ + ε) = g/(|g| + ε) per coordinate, so the step of peak lr η is
Δθ = η d with, per parameter of optimizer group k (lr multiplier μ_k, ε_k, decoupled weight decay w_k),

    d = −μ_k (g/(|g| + ε_k) + w_k θ),                 g = ∇L(θ) on the training batch,

a direction known before any step is taken. `probe` measures along it, on a float64 copy of the model:

* ``slope`` = −∇L·d, the first-order loss decrease per unit lr (training batch);
* ``sharpness`` = λ_max(P⁻¹H) with P⁻¹ = diag(μ_k/(rms_W(g) + ε_k)), Adam's preconditioned Hessian with its
  second moment taken per tensor W (one batch's per-coordinate v̂ = g² is dominated by its near-zero
  entries, which an average over steps fills in; their scale is the tensor's), by ``iterations`` Lanczos
  steps on the symmetric S H S, S = P^{-1/2}, with central finite-difference Hessian-vector products
  Hv ≈ [∇L(θ + hv) − ∇L(θ − hv)]/2h. Adam at β₁ sits at its edge of stability when
  η λ_max(P⁻¹H) = 2(1 + β₁)/(1 − β₁) (38 for β₁ = 0.9; Cohen et al. 2022);
* ``out_change`` = ‖f(θ + η₀d) − f(θ)‖/(η₀‖f(θ)‖), the relative change of the output (logits) per unit lr
  on the held-out batch (η₀ = ``step``: the μP-style update size of the whole network);
* ``layer_change`` = max over the model's weight layers (every module whose own ``weight`` is a trainable
  matrix: linear and convolution-1D projections, embedding tables) of the same relative change of that layer's
  output, ‖h(θ + η₀d) − h(θ)‖/(η₀‖h(θ)‖), read in the same two passes: μP's criterion per layer (at the lr
  1/layer_change one step changes some layer's features by their own size), and ``median_layer_change`` its
  median over the layers (the typical layer, which μP keeps width-invariant, where the max is one layer's);
* ``logit_growth`` = d max(attention logit)/dη and ``corr_growth`` = d ρ_L/dη (the last block's token
  correlation: rank collapse) per unit lr, from the records before and after a step η₀;
* ``line``: (η, held-out loss after the step η d) at a contiguous run of the grid ``lrs`` that ends at the first
  η whose step raises the loss above its init value and starts one below the lowest point: the one-step loss
  profile around its minimum (`one_step_line`). The two scales read from it (the first rise above the init loss
  and the lowest point with its neighbours) are those of the whole grid when the profile falls to one minimum and
  then rises, as it does on every config of the advise evaluation; the walk starts at the grid η nearest
  ``LINE_START``/out_change (the median of one-step optimum × out_change there is 2^2.5), which sets only how
  many points it evaluates.

Cost: 1 + 2·``iterations`` gradients, one record pass (forward + backward) and two forwards at init, two forwards
after the step η₀d (the output and the records) and one forward per line point evaluated (a forward counted as a
third of a forward + backward), reported as ``passes``.
"""
from __future__ import annotations

import contextlib
import copy
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..records import Record

LossFn = Callable[[nn.Module, Any], torch.Tensor]          # (model, batch) -> mean loss (scalar)
OutputFn = Callable[[nn.Module, Any], torch.Tensor]        # (model, batch) -> output tensor (logits)
RecordsFn = Callable[[nn.Module, bool], list[Record]]      # (model, with gradients) -> per-sublayer records
FORWARD = 1.0 / 3.0                                         # a forward pass, in forward + backward passes
LINE_START = 4.0                                            # the line's walk starts at LINE_START / out_change


@dataclass(frozen=True)
class Group:
    """One optimizer group as AdamW sees it: its parameters, lr multiplier, ε and decoupled weight decay."""

    params: list[nn.Parameter]
    lr_mult: float = 1.0
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class Probe:
    """Measured at init along AdamW's first step (module docstring); every rate is per unit peak lr."""

    loss0: float                                  # held-out loss at init
    slope: float                                  # −∇L·d, first-order training-loss decrease per unit lr
    sharpness: float                              # λ_max(P⁻¹H): Adam's preconditioned sharpness
    out_change: float                             # relative change of the output per unit lr
    layer_change: float                           # largest relative change of a weight layer's output per unit lr
    median_layer_change: float                    # the median over the weight layers of that change
    logit_growth: float                           # d max attention logit / dη (0 without attention records)
    corr_growth: float                            # d (last block's token correlation) / dη
    line: tuple[tuple[float, float], ...]         # (η, held-out loss after one step η d)
    records: tuple[Record, ...]                   # measured at init
    passes: float                                 # forward + backward passes spent


def _flat(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


class _Params:
    """The trainable parameters of a model as one flat float64 vector, with per-coordinate group constants."""

    def __init__(self, model: nn.Module, groups: Sequence[Group]) -> None:
        by_id = {id(p): p for p in model.parameters()}
        self.params = [by_id[id(p)] for g in groups for p in g.params]
        self.mult = _flat([torch.full((p.numel(),), g.lr_mult, dtype=torch.float64) for g in groups for p in g.params])
        self.eps = _flat([torch.full((p.numel(),), g.eps, dtype=torch.float64) for g in groups for p in g.params])
        self.wd = _flat([torch.full((p.numel(),), g.weight_decay, dtype=torch.float64)
                         for g in groups for p in g.params])

    def tensor_rms(self, flat: torch.Tensor) -> torch.Tensor:
        """Each coordinate replaced by the root-mean-square of ``flat`` over its parameter tensor."""
        out, i = torch.empty_like(flat), 0
        for p in self.params:
            n = p.numel()
            out[i:i + n] = flat[i:i + n].square().mean().sqrt()
            i += n
        return out

    def get(self) -> torch.Tensor:
        return _flat([p.detach().double() for p in self.params]).cpu()

    @torch.no_grad()
    def set(self, theta: torch.Tensor) -> None:
        i = 0
        for p in self.params:
            n = p.numel()
            p.copy_(theta[i:i + n].view_as(p).to(p.dtype))
            i += n


    def first_direction(self, g: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """d = −μ_k (g/(|g| + ε_k) + w_k θ): AdamW's first step per unit peak lr (module docstring)."""
        return -self.mult * (g / (g.abs() + self.eps) + self.wd * theta)


def _twin(model: nn.Module, groups: Sequence[Group]) -> tuple[nn.Module, _Params]:
    """A float64 copy of ``model`` and its parameters as ``groups`` name the original's (the model is left as it
    is)."""
    originals = [p for g in groups for p in g.params]
    index = {id(p): i for i, p in enumerate(model.parameters())}
    if not originals or any(id(p) not in index for p in originals):
        raise ValueError("advise: the optimizer groups must hold trainable parameters of the model")
    twin = copy.deepcopy(model).double()
    twin_params = list(twin.parameters())
    return twin, _Params(twin, [Group([twin_params[index[id(p)]] for p in g.params], g.lr_mult, g.eps,
                                      g.weight_decay) for g in groups])


def _grad(model: nn.Module, params: _Params, loss_fn: LossFn, batch: Any, seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)                     # the same dropout masks at every θ (finite differences)
        loss = loss_fn(model, batch)
    grads = torch.autograd.grad(loss, params.params, allow_unused=True)
    return _flat([torch.zeros_like(p) if g is None else g for p, g in zip(params.params, grads)]).double().cpu()


def _max_logit(records: Sequence[Record]) -> float:
    logits = [r.max_logit for r in records if r.max_logit is not None]
    return max(logits) if logits else 0.0


def last_corr(records: Sequence[Record]) -> float:
    """The token correlation after the last block of the last stack (the embedding's if it has no block)."""
    blocks = [r for r in records if r.layer >= 1 and r.stack == records[-1].stack]
    return blocks[-1].token_corr if blocks else records[-1].token_corr


def _weight_layers(model: nn.Module, params: Sequence[nn.Parameter]) -> dict[str, nn.Module]:
    """The modules whose own ``weight`` is one of ``params`` and a matrix (linear, convolution-1D, embedding)."""
    ids = {id(p) for p in params}
    return {name: m for name, m in model.named_modules()
            if isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.ndim == 2 and id(m.weight) in ids}


@contextlib.contextmanager
def _outputs(layers: dict[str, nn.Module]):
    """Yields a dict that the forward passes inside fill with each layer's last output (float64 copy)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(name, out.detach().double()))
             for name, m in layers.items()]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def lanczos_max(matvec: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, k: int) -> float:
    """Largest eigenvalue of the symmetric operator ``matvec`` estimated by ``k`` Lanczos steps from ``start``
    (full reorthogonalisation): the top Ritz value of the k × k tridiagonal matrix (0 if it is negative)."""
    basis = [start / start.norm()]
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(k):
        w = matvec(basis[-1])
        alphas.append(float(w @ basis[-1]))
        for q in basis:
            w = w - (w @ q) * q
        beta = float(w.norm())
        if j == k - 1 or beta < 1e-12 * max(abs(a) for a in alphas):
            break
        betas.append(beta)
        basis.append(w / beta)
    n = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    for i, b in enumerate(betas[:n - 1]):
        t[i, i + 1] = t[i + 1, i] = b
    return max(float(torch.linalg.eigvalsh(t)[-1]), 0.0)


def one_step_line(loss_at: Callable[[float], float], grid: Sequence[float], loss0: float, start: int
                  ) -> tuple[tuple[float, float], ...]:
    """(η, loss_at(η)) over a contiguous run of the increasing ``grid``: from index ``start`` up to the first η whose
    loss rises above ``loss0`` (or is not finite: inf), down until some η's does not, and on down until the lowest
    point found has its lower neighbour (or is the grid's first); the points above the first rise are dropped. On a
    profile that falls to one minimum and then rises this holds the first rise of the whole grid, its lowest point
    and that point's neighbours, whatever the start (module docstring)."""
    values: dict[int, float] = {}

    def rises(i: int) -> bool:
        if i not in values:
            value = loss_at(grid[i])
            values[i] = value if math.isfinite(value) else math.inf
        return values[i] > loss0

    i = start
    while not rises(i) and i < len(grid) - 1:
        i += 1
    i = start
    while rises(i) and i > 0:
        i -= 1
    low = min((k for k in values if values[k] <= loss0), key=values.__getitem__, default=None)
    while low is not None and low > 0 and low - 1 not in values:
        if not rises(low - 1) and values[low - 1] < values[low]:
            low -= 1
    top = min((k for k in values if values[k] > loss0), default=len(grid) - 1)
    return tuple((float(grid[k]), values[k]) for k in sorted(values) if k <= top)


def _nearest(grid: Sequence[float], lr: float) -> int:
    """The index of the increasing, positive ``grid``'s value nearest ``lr`` in log scale (the last for inf)."""
    if not math.isfinite(lr):
        return len(grid) - 1
    return min(range(len(grid)), key=lambda i: abs(math.log(grid[i]) - math.log(lr)))


def probe(model: nn.Module, groups: Sequence[Group], loss_fn: LossFn, output_fn: OutputFn, records_fn: RecordsFn,
          train_batch: Any, heldout_batch: Any, lrs: Sequence[float], iterations: int = 4, step: float = 1e-3,
          seed: int = 0, heldout_loss: Callable[[torch.Tensor, Any], torch.Tensor] | None = None) -> Probe:
    """Measure ``model`` at its current parameters along AdamW's first step (module docstring), on a float64
    copy (the model itself is left as it is). ``groups`` name the copy's parameters by the original's order.
    ``heldout_loss(output, batch)``: the loss from ``output_fn``'s output, so that the init loss costs no forward
    of its own (default: ``loss_fn`` on the held-out batch)."""
    if iterations < 1:
        raise ValueError(f"advise: iterations={iterations} must be >= 1 (Lanczos steps)")
    twin, ps = _twin(model, groups)
    theta = ps.get()
    passes = 0.0

    g = _grad(twin, ps, loss_fn, train_batch, seed)
    passes += 1
    if not torch.isfinite(g).all():
        raise ValueError("advise: the gradient at init is not finite; the model cannot be judged at this init")
    direction = ps.first_direction(g, theta)
    slope = float(-(g @ direction))

    scale = (ps.mult / (ps.tensor_rms(g) + ps.eps)).sqrt()          # S = P^{-1/2}
    def hvp(v: torch.Tensor) -> torch.Tensor:                      # S H S v, central differences
        w = scale * v
        h = 1e-4 * theta.norm() / w.norm()
        ps.set(theta + h * w)
        g_plus = _grad(twin, ps, loss_fn, train_batch, seed)
        ps.set(theta - h * w)
        g_minus = _grad(twin, ps, loss_fn, train_batch, seed)
        return scale * (g_plus - g_minus) / (2 * h)

    sharp = lanczos_max(hvp, scale * g, iterations)
    passes += 2 * iterations
    ps.set(theta)

    layers = _weight_layers(twin, ps.params)
    with torch.no_grad(), _outputs(layers) as h0:
        out0 = output_fn(twin, heldout_batch)
        loss0 = float(heldout_loss(out0, heldout_batch) if heldout_loss is not None else loss_fn(twin, heldout_batch))
        out0 = out0.double()
    before = records_fn(twin, True)
    ps.set(theta + step * direction)
    with torch.no_grad(), _outputs(layers) as h1:
        out1 = output_fn(twin, heldout_batch).double()
    after = records_fn(twin, False)
    changes = sorted(((h1[k] - h0[k]).norm() / h0[k].norm()).item() / step for k in h0 if h0[k].norm() > 0)
    layer_change, median_change = changes[-1], statistics.median(changes)
    out_change = float((out1 - out0).norm() / out0.norm()) / step
    passes += 1 + (3 if heldout_loss is not None else 4) * FORWARD

    evaluated = 0

    def loss_at(lr: float) -> float:
        nonlocal evaluated
        evaluated += 1
        ps.set(theta + lr * direction)
        with torch.no_grad():
            return float(loss_fn(twin, heldout_batch))

    grid = sorted(lrs)
    line = one_step_line(loss_at, grid, loss0, _nearest(grid, LINE_START / out_change if out_change > 0 else math.inf))
    passes += evaluated * FORWARD
    ps.set(theta)
    return Probe(loss0=loss0, slope=slope, sharpness=sharp,
                 out_change=out_change, layer_change=layer_change, median_layer_change=median_change,
                 logit_growth=(_max_logit(after) - _max_logit(before)) / step,
                 corr_growth=(last_corr(after) - last_corr(before)) / step,
                 line=tuple(line), records=tuple(before), passes=passes)


def along_first_step(model: nn.Module, groups: Sequence[Group], loss_fn: LossFn, train_batch: Any,
                     sums: Sequence[float], measure: Callable[[nn.Module], float], seed: int = 0) -> list[float]:
    """``measure`` of a float64 copy of ``model`` at θ₀ + S·d for each S in ``sums``, d = AdamW's first direction
    on ``train_batch`` (module docstring). While every coordinate's gradient keeps its sign, Adam's update is
    m̂/√v̂ = ±1 per coordinate and t steps move θ₀ by S = Σ_{τ<t} η_τ along d, whatever schedule made the sum: this
    is then the trained model's ``measure`` after lr sum S, predicted before any step."""
    twin, ps = _twin(model, groups)
    theta = ps.get()
    direction = ps.first_direction(_grad(twin, ps, loss_fn, train_batch, seed), theta)
    out = []
    for S in sums:
        ps.set(theta + S * direction)
        with torch.no_grad():
            out.append(float(measure(twin)))
    return out
