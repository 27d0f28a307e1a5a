"""Helpers several test files share (the fixtures live in conftest.py): the shipped configs folder
(`CONFIGS`), the overrides that make a training run take seconds (`FAST_TRAIN`), the `sigprop train`
argument list (`train_argv`), a run's loss curve (`loss_curve`), a callback that stops a run after a step
(`StopAt`), a training run on 2 gloo ranks under
torchrun (`torchrun`), the check of one AdamW step against the per-parameter rules
(`assert_first_adamw_step`), the check that a measurement leaves existing gradients as found
(`grads_as_found`), and tiny randomly initialized transformers models (`gpt2`, `bert`, `llama`) with their
logits in one pass (`logits`) and token by token through the KV cache (`cached_logits`). transformers is
imported by the model helpers only, so this module imports without it.
`block_series_hyp2f1`: the reference series of the norms' ₂F₁, summed in blocks only.
`shared_keys_on_every_pair`: the causal V path's same-key excess put on every pair of keys, the counterfactual to
`sigprop.theory.moments.causal_attention._shared_keys`."""
import inspect
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sigprop.diagnostics.measure import output_tensor
from sigprop.theory.moments import causal_attention
from sigprop.train import Callback, read_jsonl

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FAST_TRAIN = ("data.max_chars=100000", "model.d_model=32", "data.seq_len=32", "train.progress=false")


def set_args(sets) -> list[str]:
    """``--set`` before every override: ["a=1", "b=2"] -> ["--set", "a=1", "--set", "b=2"]."""
    return [a for s in sets for a in ("--set", s)]


def train_argv(config: str, *sets: str) -> list[str]:
    """`sigprop train` arguments for the shipped ``configs/CONFIG.toml`` with each override set."""
    return ["--config", str(CONFIGS / f"{config}.toml"), *set_args(sets)]


class StopAt(Callback):
    """Ask the trainer to stop (checkpoint, then return) once it has done ``step`` steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == self.step:
            trainer.request_stop("test")


def loss_curve(out: Path) -> list[tuple[str, int, float]]:
    """(kind, step, loss) of every train and eval row of the run in ``out``, in the order logged."""
    return [(r["kind"], r["step"], r["loss"]) for r in read_jsonl(out / "metrics.jsonl")
            if r["kind"] in ("train", "eval")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path: Path, config: str, sets: list[str], timeout_s: float = 300) -> None:
    """`sigprop train` of the shipped ``configs/CONFIG.toml`` with ``sets`` on 2 gloo ranks under torchrun. On a
    timeout (e.g. a collective one rank never enters) torchrun is terminated, which stops its ranks, and the test
    fails."""
    script = tmp_path / "entry.py"
    script.write_text("import sys\nfrom sigprop.train import train_main\nsys.exit(train_main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *train_argv(config, *sets)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        _, err = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout_s} s: {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]


def assert_first_adamw_step(rules, before, grads, after, lr: float, eps: float, weight_decay: float) -> set:
    """First AdamW step of every (name, parameter, rule): Δp = −lr·m_lr·(wd·m_wd·p·[ndim ≥ 2] + g/(|g| + ε·m_ε)),
    to rtol 1e-6, and the gradient part of Δp over the one with unit multipliers equals m_lr to rtol 1e-6.
    Returns the distinct rules seen."""
    seen = set()
    for (name, p, rule), p0, g, p1 in zip(rules, before, grads, after):
        step = lr * rule.lr
        wd = weight_decay * rule.weight_decay if p.ndim >= 2 else 0.0
        expected = p0 * (1 - step * wd) - step * g / (g.abs() + eps * rule.eps)
        torch.testing.assert_close(p1, expected, rtol=1e-6, atol=1e-12, msg=name)
        ratio = (p0 * (1 - step * wd) - p1) / (lr * g / (g.abs() + eps * rule.eps))
        mask = g.abs() > 1e-12
        torch.testing.assert_close(ratio[mask], torch.full_like(ratio[mask], rule.lr), rtol=1e-6, atol=0, msg=name)
        seen.add(rule)
    return seen


def fill_grads(model: torch.nn.Module, fill: str) -> None:
    """"zeros": a training step's gradients, then ``zero_grad(set_to_none=False)``; "random": N(0, 1) on every
    parameter but the first, whose ``.grad`` stays None."""
    if fill == "zeros":
        output_tensor(model(torch.randint(0, 64, (2, 16)))).square().mean().backward()
        model.zero_grad(set_to_none=False)
        return
    for i, p in enumerate(model.parameters()):
        p.grad = None if i == 0 else torch.randn_like(p)


def grads_as_found(model: torch.nn.Module, fill: str, run) -> None:
    """Fill the grads, ``run()``, and check each ``.grad`` is the same object (or None) with the same values."""
    fill_grads(model, fill)
    before = [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()]
    assert any(g is not None for g, _ in before)
    run()
    for p, (grad, values) in zip(model.parameters(), before):
        assert p.grad is grad
        assert grad is None or torch.equal(grad, values)


def block_series_hyp2f1(a: float, b: float, c: float, z: float) -> float:
    """₂F₁(a, b; c; z) for 0 <= z < 1, every term summed in numpy blocks of 64, 128, 256, ... terms, up to 10⁶
    terms or the tail bound term/(1 − z) < 1e-17 of the sum: the reference for
    `sigprop.theory.moments.norm.hyp2f1`, which sums its first 64 terms one by one."""
    total, term, start, block = 0.0, 1.0, 0, 64
    while start < 10 ** 6:
        n = np.arange(start, start + block)
        ratios = (a + n) * (b + n) / ((c + n) * (n + 1)) * z
        terms = term * np.cumprod(np.concatenate([[1.0], ratios[:-1]]))
        total += float(terms.sum())
        term, start = float(terms[-1] * ratios[-1]), start + block
        if ratios[-1] < 1 and abs(term) <= 1e-17 * (1 - z) * abs(total):
            break
        block *= 2
    assert math.isfinite(total)
    return total


HF_VOCAB = 256                  # the vocabulary of the tiny transformers models below
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def shared_keys_on_every_pair(G: np.ndarray, n: np.ndarray, c: float) -> np.ndarray:
    """c·Uᵀ G_off U (G_off: G without its diagonal): two causal rows' same-key weight covariance c put on every pair
    of keys they read, without the −c/(n − 1) each row's sum to 1 puts on two different shared keys
    (`causal_attention._shared_keys`, same signature, which this replaces to show what that compensation holds)."""
    return c * causal_attention._times_u(causal_attention._times_u(G - np.diag(np.diag(G)), n).T, n).T


def gpt2(layers: int, d: int = 32, **kw) -> torch.nn.Module:
    """A GPT-2 LM of ``layers`` blocks, width ``d``, 4 heads, no dropout; ``kw`` overrides the config."""
    import transformers
    cfg = dict(vocab_size=HF_VOCAB, n_embd=d, n_layer=layers, n_head=4, n_positions=64, resid_pdrop=0.0,
               embd_pdrop=0.0, attn_pdrop=0.0, **NO_SPECIAL) | kw
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))


def bert(layers: int, d: int = 32, **kw) -> torch.nn.Module:
    """A BERT masked LM of ``layers`` blocks, width ``d``, 4 heads, no dropout; ``kw`` overrides the config."""
    import transformers
    cfg = dict(vocab_size=HF_VOCAB, hidden_size=d, num_hidden_layers=layers, num_attention_heads=4,
               intermediate_size=4 * d, max_position_embeddings=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, **NO_SPECIAL) | kw
    return transformers.BertForMaskedLM(transformers.BertConfig(**cfg))


def llama(layers: int, d: int = 32, model_type: str = "llama", **kw) -> torch.nn.Module:
    """A causal LM of ``model_type`` (LLaMA or a relative: mistral, qwen2, …) of ``layers`` blocks, width ``d``,
    4 query and 2 key-value heads; ``kw`` overrides the config."""
    import transformers
    cfg = dict(vocab_size=HF_VOCAB, hidden_size=d, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=3 * d, max_position_embeddings=64, **NO_SPECIAL) | kw
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    return transformers.AutoModelForCausalLM.from_config(config)


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def logits(model: torch.nn.Module, ids: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kw).logits


def cached_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of ``ids`` fed token by token through the KV cache (``past_key_values`` became ``cache`` in 5.x)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache, steps = None, []
    with torch.no_grad():
        for i in range(ids.shape[1]):
            out = model(ids[:, i:i + 1], use_cache=True, **{name: cache})
            cache, steps = getattr(out, name), steps + [out.logits]
    return torch.cat(steps, 1)
