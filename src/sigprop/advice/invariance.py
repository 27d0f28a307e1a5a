r"""Weights whose scale a norm removes, for which the rule at init has no stable bound.

A weight W is *scale-invariant* when every path from it to the loss passes a norm that removes its scale:
L(cW) = L(W) for every c > 0. Here: W_Q and W_K under qk-norm (each head's queries and keys normalized), and a
branch's output projection (W_O, W_down) under a norm on the branch's output (placements "out" and "sandwich",
x + N(W h): N(cWh) = N(Wh) up to the norm's ε).

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

from torch import nn

from ..models.adapter import adapter_of


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


__all__ = ["scale_invariant_weights"]
