"""GPT-2-style init, the one most users run: Pre-LN, every weight N(0, 0.02²), the output projections
of each block (attention O and FFN down) N(0, (0.02/√(2L))²), tied logits h·Eᵀ without a multiplier.

Source: GPT-2 (Radford et al. 2019, §2.3: "we scale the weights of residual layers at initialization by
a factor of 1/√N where N is the number of residual layers") as implemented in nanoGPT (Karpathy,
``model.py``: ``std=0.02`` for every Linear and Embedding, ``0.02/math.sqrt(2 * n_layer)`` for the
``c_proj`` weights) and Hugging Face ``GPT2Model._init_weights``. N = 2L residual layers, L = blocks in
the stack (`stack_layers`: an encoder-decoder's decoder uses its own count).

Invariant it keeps: each block adds 2 branches whose output projections have variance 0.02²/(2L)
per weight, so the residual-stream variance added by all blocks, Σ_l 2·d·0.02²/(2L)·Var(input),
does not grow with L at init (it is that of one branch without the 1/√(2L)). The std is fixed, not
width-aware: 0.02 ≈ 1/√d only near d = 2500 (GPT-2's widths 768–1600 are close to it; at width 64 it
is 8× smaller than 1/√d), which is why this baseline is worth comparing as it is used.

Placement "pre" only: a norm on the branch output ("out", "sandwich") would undo the 1/√(2L) of the output
projections, the one rule this scheme adds to a plain Pre-LN init.
"""
from __future__ import annotations

import math
from typing import Any

from . import mup
from .base import ParamInfo, Scheme, stack_layers

STD = 0.02
OUTPUT_PROJECTIONS = ("o", "ffn_out")
WEIGHT_ROLES = ("q", "k", "v", "o", "ffn_in", "ffn_out", "embed", "pos", "cls", "patch", "head")


class GPT2(Scheme):
    name = "gpt2"
    norm_placements = ("pre",)

    def std(self, cfg: Any, p: ParamInfo) -> float:
        """0.02 for every weight; 0.02/√(2L) for the attention O and FFN down projections of a block."""
        if p.role in OUTPUT_PROJECTIONS:
            return STD / math.sqrt(2 * stack_layers(cfg, p.stack))
        if p.role in WEIGHT_ROLES:
            return STD
        raise KeyError(f"scheme {self.name!r} has no init rule for role {p.role!r}")

    def logit_scale(self, cfg: Any) -> float:
        """1 (GPT-2 ties the head to the embedding table with no multiplier); μP's readout rule on top."""
        return mup.readout_mult(cfg)
