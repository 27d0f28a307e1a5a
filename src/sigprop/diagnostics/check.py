"""``sigprop check``: a ten-second sanity check, the forward and gradient variance through depth at init of a
decoder under every scheme (each at the norm placements asked for that it allows, with qk-norm if asked)."""
from __future__ import annotations

from typing import Sequence

import torch

from ..console import EXIT_OK, USER_ERRORS, Parser, fail
from ..models import ModelConfig, build_model
from ..nn.block import PLACEMENTS, Block
from ..schemes import SCHEMES, get_scheme
from ..table import Table
from .measure import measure


def depth_profile(cfg: ModelConfig, batch: int = 8, seed: int = 0) -> list[tuple[int, float, float]]:
    """Measured (layer, stream variance, gradient variance) after every block at init (`measure` with the blocks
    as selector: random tokens, random-projection loss; float64)."""
    torch.manual_seed(seed)
    model = build_model(cfg).double()
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len))
    return [(r.layer, r.fwd_var, r.grad_var) for r in measure(model, ids, seed=seed, blocks=Block)]


def check_main(argv: Sequence[str]) -> int:
    """``sigprop check [--schemes ...] [--depth L] [--width D] [--seq T] [--placements ...] [--qk-norm]``: one row
    per scheme and placement, the measured variances at a quarter, half and all of the depth."""
    p = Parser(prog="sigprop check", description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    p.add_argument("--depth", type=int, default=48)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--placements", nargs="+", default=[], choices=[*PLACEMENTS, "all"],
                   help="norm placements to build, each where the scheme allows it (default: the scheme's own; "
                        "all: every one it allows)")
    p.add_argument("--qk-norm", action="store_true", help="qk-norm in every softmax attention")
    try:
        args = p.parse_args(list(argv))
        rows, layers = [], []
        for scheme in args.schemes:
            s = get_scheme(scheme)
            wanted = s.norm_placements if "all" in args.placements else args.placements or s.norm_placements[:1]
            for placement in [x for x in wanted if x in s.norm_placements]:
                cfg = ModelConfig(scheme=scheme, norm_placement=placement, d_model=args.width, n_heads=4,
                                  n_layers=args.depth, max_seq_len=args.seq, vocab_size=256,
                                  qk_norm=args.qk_norm and s.attention == "softmax")
                prof = depth_profile(cfg)
                g0 = prof[0][2]
                picks = sorted({0, len(prof) // 4, len(prof) // 2, len(prof) - 1})
                layers = [prof[i][0] for i in picks]
                rows.append([f"{scheme} ({placement}{', qk-norm' if cfg.qk_norm else ''})",
                             *(f"{prof[i][1]:.3g}" for i in picks), *(f"{prof[i][2] / g0:.3g}" for i in picks)])
    except USER_ERRORS as e:
        return fail("sigprop check", e)
    header = ["scheme (norm placement)", *(f"var@{l}" for l in layers),
              *(f"grad@{l}/grad@{layers[0]}" for l in layers)]
    print(Table(header, rows, caption=f"decoder, width {args.width}, depth {args.depth}, seq {args.seq}: "
                                      "measured at init (float64)").text())
    return EXIT_OK
