"""Deep models: step time, compile time and peak memory of DSLM Pre-LN decoders across depth, and
the efficiency of a deep-thin model against a wide-shallow one of the same parameter count.

A step = forward, cross-entropy, backward, grad clipping, AdamW step (the trainer's `make_optimizer`),
on random tokens (batch B × T), run through `sigprop.train.parallel` exactly as the trainer runs it
(``train.compile``, ``train.activation_checkpointing``, ``train.precision``). FLOPs per token =
6·N + 12·L·d·T (N parameters, PaLM appendix B), the convention of bench/throughput.py.

    # deep-thin vs wide-shallow, timed in interleaved rounds (the load of a shared machine hits both)
    python bench/depth.py ratio --shapes 12x256 192x64 --rounds 5
    # where the time of one step goes, by op kind (torch.profiler self time)
    python bench/depth.py profile --shapes 12x256 192x64
    # one fresh process per case: first-step time (includes compilation), steady step time, peak memory
    python bench/depth.py cases --shapes 12x64 192x64 --modes eager blocks checkpoint
    python bench/depth.py cases --shapes 192x256 1000x256 --modes eager blocks checkpoint --device cuda --precision bf16

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (everything: weights, AdamW state, activations);
on CPU the peak of live tensor memory during one warm step above what was live before it (activations,
gradients, temporaries), from torch.profiler's allocation events.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from sigprop.models import ModelConfig, build_model
from sigprop.train.config import OptimConfig, TrainConfig
from sigprop.train.distributed import DistInfo
from sigprop.train.optim import make_optimizer
from sigprop.train.parallel import autocast, prepare_model

MODES = {"eager": {}, "blocks": {"compile": "blocks"}, "model": {"compile": "model"},
         "checkpoint": {"activation_checkpointing": True},
         "blocks+checkpoint": {"compile": "blocks", "activation_checkpointing": True}}


def shape(text: str) -> tuple[int, int]:
    """'192x64' -> (layers, width)."""
    layers, width = text.lower().split("x")
    return int(layers), int(width)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Case:
    """A decoder of ``layers`` × ``width``, prepared as ``mode`` says, with its optimizer and a batch."""

    def __init__(self, layers: int, width: int, mode: str, args: argparse.Namespace) -> None:
        self.layers, self.width, self.mode, self.args = layers, width, mode, args
        self.device = torch.device(args.device)
        torch.manual_seed(0)
        cfg = ModelConfig(arch="decoder", scheme="dslm", norm_placement="pre", vocab_size=args.vocab, d_model=width,
                          n_layers=layers, n_heads=args.heads, d_ff=4 * width, max_seq_len=args.seq)
        self.model = build_model(cfg).to(self.device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        train = TrainConfig(precision=args.precision, **MODES[mode])
        self.run = prepare_model(self.model, train, DistInfo(device=self.device))
        self.opt = make_optimizer(self.model, OptimConfig(lr=1e-4))
        self.ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=self.device)
        self.samples: list[float] = []

    @property
    def name(self) -> str:
        return f"{self.layers}x{self.width} {self.mode}"

    def flops(self) -> float:
        """Model FLOPs of one step."""
        tokens = self.args.batch * self.args.seq
        return (6 * self.n_params + 12 * self.layers * self.width * self.args.seq) * tokens

    def step(self) -> None:
        with autocast(self.args.precision, self.device):
            logits = self.run(self.ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, self.args.vocab), self.ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def timed(self) -> float:
        _sync(self.device)
        t0 = time.perf_counter()
        self.step()
        _sync(self.device)
        return time.perf_counter() - t0


def cpu_step_peak_mib(case: Case) -> float:
    """Peak of live CPU tensor memory during one (warm) step, above what was live before it: activations,
    gradients and temporaries, from torch.profiler(profile_memory=True) events in time order (each op's
    allocations net of its own frees, so a temporary freed inside one op is not counted)."""
    from torch.profiler import profile as torch_profile

    with torch_profile(profile_memory=True) as prof:
        case.step()
    # an op's own allocations net of its own frees at its start, plus allocations/frees outside any op
    events = sorted((e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
                    for e in prof.events())
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak / 2 ** 20


def run_case(layers: int, width: int, mode: str, args: argparse.Namespace) -> dict:
    """One case in this (fresh) process: first step (compilation included), then ``repeats`` steps."""
    torch._dynamo.reset()
    case = Case(layers, width, mode, args)
    if case.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first = case.timed()
    times = [case.timed() for _ in range(args.repeats)]
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if case.device.type == "cuda" else cpu_step_peak_mib(case)
    sec = min(times)
    return {"shape": f"{layers}x{width}", "mode": mode, "params_m": case.n_params / 1e6, "first_step_s": first,
            "step_s": sec, "step_median_s": statistics.median(times), "gflops": case.flops() / sec / 1e9,
            "peak_mib": peak}


def cases(args: argparse.Namespace) -> list[dict]:
    """Every (shape, mode) in its own subprocess with empty compile caches, so compile time and peak memory
    are its own."""
    rows = []
    print("| shape | mode | params | first step s (incl. compile) | step s (best) | step s (median) | "
          "GFLOP/s | peak MiB |\n|---|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for s in args.shapes:
        for mode in args.modes:
            cmd = [sys.executable, __file__, "one", s, mode, *common_argv(args)]
            with tempfile.TemporaryDirectory() as cache:      # cold compile caches: no case reuses another's
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache}
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or ["?"])[-1][:120]
                print(f"| {s} | {mode} | failed: {last} |||||", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"| {r['shape']} | {mode} | {r['params_m']:.2f} M | {r['first_step_s']:.2f} | {r['step_s']:.3f} | "
                  f"{r['step_median_s']:.3f} | {r['gflops']:.1f} | {r['peak_mib']:.0f} |", flush=True)
    return rows


def ratio(args: argparse.Namespace) -> list[dict]:
    """Interleaved rounds (A B A B ...) of every shape × mode in one process; best round per case."""
    runners = [Case(*shape(s), mode, args) for s in args.shapes for mode in args.modes]
    for r in runners:
        r.timed()                                   # warm-up (and compilation)
        r.timed()
    for _ in range(args.rounds):
        for r in runners:
            r.samples.append(r.timed())
    ref = runners[0].flops() / min(runners[0].samples)
    rows = []
    print("| shape | mode | params | s/step best | s/step median | GFLOP/s | vs first row |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    for r in runners:
        g = r.flops() / min(r.samples)
        rows.append({"shape": f"{r.layers}x{r.width}", "mode": r.mode, "params_m": r.n_params / 1e6,
                     "step_s": min(r.samples), "step_median_s": statistics.median(r.samples),
                     "gflops": g / 1e9, "ratio": g / ref})
        print(f"| {r.layers}x{r.width} | {r.mode} | {r.n_params / 1e6:.2f} M | {min(r.samples):.3f} | "
              f"{statistics.median(r.samples):.3f} | {g / 1e9:.1f} | {g / ref:.3f} |")
    return rows


GROUPS = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm")), ("attention (SDPA)", ("scaled_dot_product",)),
          ("layer norm", ("layer_norm",)), ("ReLU", ("threshold_backward", "clamp_min", "aten::relu")),
          ("mul/add (residual α, β; grad accumulation)", ("aten::mul", "aten::add", "aten::add_")),
          ("AdamW and clipping", ("_foreach", "_fused_adam", "aten::lerp", "aten::addcdiv", "aten::norm",
                                  "linalg_vector_norm")))


def profile(args: argparse.Namespace) -> list[dict]:
    """Self time of one profiled step per shape, grouped by op kind (torch.profiler, after two warm-up steps)."""
    from torch.profiler import profile as torch_profile

    rows = []
    for s in args.shapes:
        case = Case(*shape(s), args.modes[0], args)
        case.timed()
        case.timed()
        with torch_profile() as prof:
            case.step()
        groups = {name: 0.0 for name, _ in GROUPS} | {"other": 0.0}
        calls = {name: 0 for name in groups}
        for ev in prof.key_averages():
            name = next((g for g, keys in GROUPS if any(k in ev.key for k in keys)), "other")
            groups[name] += ev.self_cpu_time_total / 1e6
            calls[name] += ev.count
        rows.append({"shape": s, "seconds": groups, "calls": calls})
    print("| op kind | " + " | ".join(f"{r['shape']} s (calls)" for r in rows) + " |\n|---|"
          + "---:|" * len(rows))
    for name in rows[0]["seconds"]:
        print(f"| {name} | " + " | ".join(f"{r['seconds'][name]:.2f} ({r['calls'][name]})" for r in rows) + " |")
    print("| total | " + " | ".join(f"{sum(r['seconds'].values()):.2f}" for r in rows) + " |")
    return rows


def common_argv(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--precision", args.precision, "--batch", str(args.batch), "--seq",
            str(args.seq), "--vocab", str(args.vocab), "--heads", str(args.heads), "--repeats", str(args.repeats),
            "--threads", str(args.threads)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("ratio", "cases", "profile", "one"))
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)        # "one SHAPE MODE" (internal)
    p.add_argument("--shapes", nargs="+", default=["12x256", "192x64"], help="LAYERSxWIDTH")
    p.add_argument("--modes", nargs="+", default=["eager"], choices=list(MODES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="ratio: interleaved timing rounds")
    p.add_argument("--repeats", type=int, default=3, help="cases: timed steps after the first")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    p.add_argument("--timeout", type=int, default=1800, help="cases: seconds per case")
    p.add_argument("--json", default="", help="also write the rows to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.what == "one":
        print(json.dumps(run_case(*shape(args.rest[0]), args.rest[1], args)))
        return
    print(f"device={args.device} precision={args.precision} threads={torch.get_num_threads()} batch={args.batch} "
          f"seq={args.seq} vocab={args.vocab} heads={args.heads} torch={torch.__version__}\n", flush=True)
    rows = {"ratio": ratio, "cases": cases, "profile": profile}[args.what](args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
