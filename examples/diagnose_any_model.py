"""Diagnose a transformer sigprop did not build, with `sigprop.diagnostics.diagnose_model`.

    pip install 'sigprop[plot]'
    python examples/diagnose_any_model.py                 # runs/diagnose_any_model/measured.{csv,json}, diagnose.png
    python examples/diagnose_any_model.py --layers 48 --init default --out runs/default_init

The model is a nanoGPT-style Pre-LN decoder written with `torch.nn` alone. `diagnose_model` records the
output of every module its selector picks (here the `Block` class; a list of classes, a name pattern such as
``r"blocks\\.\\d+"`` or a predicate ``(name, module) -> bool`` work too) in one forward and backward pass of
the random-projection loss and writes the files ``sigprop diagnose`` writes; the script also prints the
per-block table. Both inits show Pre-LN's signature: the stream's variance grows through depth (every branch
is added to an unnormalized stream) and the gradient variance falls with it.
"""
from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from sigprop.diagnostics import diagnose_model
from sigprop.records import format_table


class Block(nn.Module):
    """x ← x + attn(LN(x)); x ← x + mlp(LN(x)): causal multi-head attention and a GeLU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln_1(x)).split(d, -1))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)          # (B, H, T, d/H)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and a tied output head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok.weight.T


def gpt2_init(model: TinyGPT) -> None:
    """GPT-2's init: weights N(0, 0.02²), each residual branch's last projection N(0, (0.02/√(2L))²), biases 0."""
    layers = len(model.blocks)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 2:                                     # Linear weights and the embedding tables
                last = name.endswith(("proj.weight", "mlp.2.weight"))
                p.normal_(0.0, 0.02 / math.sqrt(2 * layers) if last else 0.02)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--init", choices=("gpt2", "default"), default="gpt2",
                        help="gpt2: GPT-2's N(0, 0.02²) init; default: PyTorch's module defaults")
    parser.add_argument("--out", default="runs/diagnose_any_model")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = TinyGPT(vocab=256, d=args.width, layers=args.layers, heads=4, seq_len=args.seq_len).double()
    if args.init == "gpt2":
        gpt2_init(model)
    ids = torch.randint(0, 256, (args.batch, args.seq_len))
    records = diagnose_model(model, ids, blocks=Block, out=args.out,
                             title=f"TinyGPT, {args.layers} blocks, {args.init} init")
    print(format_table(records))
    print(f"wrote {args.out}/measured.csv, measured.json and diagnose.png")


if __name__ == "__main__":
    main()
