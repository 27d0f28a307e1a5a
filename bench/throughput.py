"""Training throughput of sigprop's decoder vs a plain reference GPT (bench/reference_gpt.py), side by side.

One training step = forward, cross-entropy, backward, grad clipping, AdamW step. The models
are timed in interleaved rounds (A B C A B C ...) so a load change on a shared machine hits
all of them alike; each reports its best and median round, and the ratios use the best
(other processes only ever slow a round down). Also timed: the sigprop Trainer's own step
(batch building, loss normalisation, clipping) on the built-in corpus, and model FLOP utilization
(MFU) against the best fp32 matmul rate measured between rounds:

    FLOPs/token = 6·N + 12·L·d·T     (N parameters incl. the tied embedding, PaLM appendix B)

    python bench/throughput.py                      # defaults: d=256, L=4, H=4, T=128, B=16
    python bench/throughput.py --threads 1 --rounds 25     # a shared machine: more, single-thread rounds
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_gpt import ReferenceGPT
from sigprop.models import ModelConfig, build_model
from sigprop.train import Trainer, load_config, prepare_data


def matmul_peak(device: torch.device, reps: int = 5) -> float:
    """Best observed fp32 FLOP/s over square matmuls of a few sizes."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Runner:
    """A model, its optimizer and a fixed batch; `time` runs k training steps."""

    def __init__(self, name: str, model: nn.Module, ids: torch.Tensor, vocab: int) -> None:
        self.name, self.model, self.ids, self.vocab = name, model, ids, vocab
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.samples: list[float] = []

    def step(self) -> None:
        logits = self.model(self.ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), self.ids[:, 1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def time(self, steps: int) -> None:
        _sync(self.ids.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        _sync(self.ids.device)
        self.samples.append((time.perf_counter() - t0) / steps)


class TrainerRunner(Runner):
    """The sigprop Trainer's own step (data, loss normalisation, clip, AdamW) on the pydoc corpus."""

    def __init__(self, args: argparse.Namespace, scheme: str, out: Path) -> None:
        cfg = load_config(None, [
            "model.arch=decoder", f"model.scheme={scheme}", f"model.vocab_size={args.vocab}",
            f"model.d_model={args.d_model}", f"model.n_layers={args.n_layers}", f"model.n_heads={args.n_heads}",
            f"model.max_seq_len={args.seq}", f"data.seq_len={args.seq}", f"train.batch_size={args.batch}",
            "optim.lr=1e-4", f"train.device={args.device}", f"train.out_dir={out}"])
        self.trainer = Trainer(cfg, build_model(cfg.model), prepare_data(cfg, out, save_tokenizer=False), out)
        super().__init__(f"sigprop Trainer.train_step, scheme={scheme}", self.trainer.model, torch.empty(0), 0)

    def step(self) -> None:
        self.trainer.train_step()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in [("--d-model", 256), ("--n-layers", 4), ("--n-heads", 4), ("--seq", 128),
                          ("--batch", 16), ("--vocab", 4096), ("--steps", 1), ("--rounds", 15), ("--threads", 0)]:
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    ids = torch.randint(4, args.vocab, (args.batch, args.seq + 1), device=device)
    d_ff = 4 * args.d_model
    runners = [Runner("reference GPT (Pre-LN, SDPA)",
                      ReferenceGPT(args.vocab, args.seq, args.d_model, args.n_layers, args.n_heads, d_ff), ids,
                      args.vocab)]
    for scheme in ("preln", "shaped"):
        cfg = ModelConfig(arch="decoder", scheme=scheme, vocab_size=args.vocab, d_model=args.d_model,
                          n_layers=args.n_layers, n_heads=args.n_heads, d_ff=d_ff, max_seq_len=args.seq)
        runners.append(Runner(f"sigprop decoder, scheme={scheme}", build_model(cfg), ids, args.vocab))
    tmp = tempfile.TemporaryDirectory()
    runners += [TrainerRunner(args, s, Path(tmp.name)) for s in ("preln", "shaped")]
    for r in runners:
        r.model.to(device)
        r.time(2)                                   # warm-up
        r.samples.clear()
    peak = 0.0
    for _ in range(args.rounds):
        for r in runners:
            r.time(args.steps)
        peak = max(peak, matmul_peak(device))
    tmp.cleanup()
    tokens = args.batch * args.seq

    ref = min(runners[0].samples)
    print(f"device={device} threads={torch.get_num_threads()} d_model={args.d_model} n_layers={args.n_layers} "
          f"n_heads={args.n_heads} seq={args.seq} batch={args.batch} vocab={args.vocab} "
          f"steps/round={args.steps} rounds={args.rounds}")
    print(f"measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s\n")
    print("| model | params | s/step best | s/step median | tokens/s (best) | vs reference | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runners:
        sec = min(r.samples)
        flops = (6 * r.n_params + 12 * args.n_layers * args.d_model * args.seq) * tokens / sec
        print(f"| {r.name} | {r.n_params / 1e6:.2f} M | {sec:.4f} | {statistics.median(r.samples):.4f} | "
              f"{tokens / sec:,.0f} | {ref / sec:.3f}x | {flops / peak:.1%} |")



if __name__ == "__main__":
    main()
