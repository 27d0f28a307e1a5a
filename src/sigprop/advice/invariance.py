r"""Weights whose scale a norm removes, for which the rule at init has no stable bound.

A weight W is *scale-invariant* when every path from it to the loss passes a norm that removes its scale:
L(cW) = L(W) for every c > 0. Here: W_Q and W_K under qk-norm (each head's queries and keys normalized), and,
under a norm on the branch's output (placements "out" and "sandwich", x + N(b(x))), every weight on a positively
homogeneous path to that norm: N(c b) = N(b) up to the norm's ε, and b scales with W_O and W_V (attention is
linear in its values), with W_down, and with W_up under ReLU or the linear half of a GLU; not with a GLU's gate
under SiLU/GELU, which is not homogeneous. `scale_invariant_weights` names the kinds from the modules;
`invariant_parameters` measures which tensors are, on the model itself.

What the rule at init misses there. Euler's relation gives ⟨∇_W L, W⟩ = 0, so a step W' = W − η u with u ⟂ W
turns W by the angle θ = arctan(η‖u‖/‖W‖) and grows its norm, ‖W'‖² = ‖W‖² + η²‖u‖². Adam's first updates are
±1 per entry, ‖u‖ ≈ √(nm) for an (n, m) weight at init std σ (‖W₀‖ = σ√(nm)), so θ₁ ≈ arctan(η/σ): the first
step's change is linear in η only for η ≪ σ and saturates at π/2 above it, where the rule's first-step scales
(linear in η) keep growing. Over the run the steps pile up in the norm, ‖W_t‖² ≈ ‖W₀‖² + nm Σ_{s<t} η_s², and
every later step turns W by about η_t/√(σ² + Σ_{s<t} η_s²): a run at a large lr lowers its own effective lr until
its steps are stable (the auto rate-tuning of normalized weights, Arora, Li & Lyu 2019), and the Hessian along W
falls as 1/‖W‖², so the sharpness at init (`sigprop.advice.probe`'s edge-of-stability scale, the rule's default
bound) does not bound the lrs such a weight survives. With AdamW's decoupled decay λ the norm settles where the
growth η²nm balances the decay 2ηλ‖W‖², and the angle per step is √(2ηλ) (Wan et al. 2021; Kosson et al. 2024):
it grows as √η, not η. No map of this is derived here, so the rule's largest stable lr is not one for these
stacks: on the lr benchmark's qk-norm families it is 10–100× below the largest lr that trains (docs/advise.md).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..models.adapter import adapter_of

INVARIANCE_PROJECTIONS = 3   # random output projections, one backward pass each (`invariant_parameters`)
INVARIANCE_TOL = 0.05      # ⟨∇_W f, W⟩ against ∇_W f along a random direction of W's scale (`invariant_parameters`)


def scale_invariant_weights(model: nn.Module) -> tuple[str, ...]:
    """The kinds of scale-invariant weight in ``model`` (module docstring), read from its modules through its
    adapter: "qk-norm" (some attention normalizes its queries and keys: a ``q_norm`` module, sigprop's or a
    `transformers` family's) and "branch-output norm" (some residual site's branch ends in a norm,
    `sigprop.models.adapter.Adapter.output_norm`). Empty for a model with neither."""
    adapter = adapter_of(model)
    found = []
    if any(isinstance(getattr(m, "q_norm", None), nn.Module) for m in model.modules()):
        found.append("qk-norm")
    if any(not isinstance(adapter.output_norm(b, s.kind), nn.Identity)
           for b in adapter.blocks(model) for s in adapter.sites(b)):
        found.append("branch-output norm")
    return tuple(found)


def invariant_parameters(model: nn.Module, output_fn: Callable[[nn.Module, Any], torch.Tensor], batch: Any,
                         tol: float = INVARIANCE_TOL, projections: int = INVARIANCE_PROJECTIONS,
                         seed: int = 0) -> tuple[str, ...]:
    """The names of ``model``'s trainable weight tensors (two or more dimensions) that the output does not scale
    with, measured on ``batch`` at the current parameters by Euler's relation: f(cW) = f(W) for all c makes
    d f(cW)/dc = ⟨∇_W f, W⟩ vanish. For ``projections`` random directions r (standard normal, seeded) of the
    output f = ``output_fn``, g = ∇_W ⟨r, f⟩ by one backward pass each, and W is invariant when every
    |⟨g, W⟩| ≤ ``tol`` · ‖g‖ rms(W): the derivative along W against its typical size along a random direction of
    W's own scale (a random Z of i.i.d. entries, rms(W) each, gives ⟨g, Z⟩ of standard deviation ‖g‖ rms(W)).
    A norm's ε keeps ⟨g, W⟩ from vanishing exactly: a branch output small against √ε fails the test, as it
    should (its norm then scales it), and so does a GLU's gate under SiLU or GELU (not homogeneous). Cost: one
    forward and ``projections`` backward passes."""
    weights = {n: w for n, w in model.named_parameters() if w.requires_grad and w.ndim >= 2}
    gen = torch.Generator().manual_seed(seed)
    out = output_fn(model, batch)
    invariant = dict.fromkeys(weights, True)
    for k in range(projections):
        r = torch.randn(out.shape, generator=gen, dtype=out.dtype)
        grads = torch.autograd.grad((r * out).sum(), list(weights.values()), retain_graph=k < projections - 1,
                                    allow_unused=True)
        for (name, w), g in zip(weights.items(), grads):
            size = 0.0 if g is None else float(g.norm() * w.detach().square().mean().sqrt())
            invariant[name] &= size > 0 and abs(float((g * w.detach()).sum())) <= tol * size
    return tuple(n for n, yes in invariant.items() if yes)


__all__ = ["INVARIANCE_PROJECTIONS", "INVARIANCE_TOL", "invariant_parameters", "scale_invariant_weights"]
