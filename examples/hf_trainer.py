"""Train a small Hugging Face model with the HF `Trainer` after `sigprop.hf.apply`.

    pip install 'sigprop[hf]'
    python examples/hf_trainer.py                       # LLaMA-style, DSLM, ~1 minute on CPU
    python examples/hf_trainer.py --family gpt2 --scheme shaped

Everything is local: a tiny randomly initialized config and a byte-level dataset cut from the
text below; nothing is downloaded. `apply` re-initializes the model and rescales its residual
adds in place; the Trainer, `generate()` and the KV cache work unchanged. The script prints the
per-sublayer forward variance at init (`sigprop.hf.diagnose`), the training loss, and a sample.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import sigprop.hf

TEXT = ("Signal propagation asks how activations, gradients and token correlations travel through "
        "depth. A residual block computes lambda times x plus beta times f of x; keeping lambda squared "
        "plus beta squared equal to one keeps the variance of the stream at one. Shaped attention adds "
        "the identity and subtracts the uniform matrix so that every layer is a small perturbation. ") * 8


class ByteChunks(torch.utils.data.Dataset):
    """Fixed-length windows of the UTF-8 bytes of ``text``; labels = inputs (the model shifts them)."""

    def __init__(self, text: str, seq_len: int) -> None:
        data = torch.tensor(list(text.encode()), dtype=torch.long)
        self.windows = data.unfold(0, seq_len, seq_len // 2)                    # (N, seq_len), 50% overlap

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def tiny_model(family: str, layers: int, width: int, seq_len: int) -> torch.nn.Module:
    special = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=width, n_layer=layers, n_head=4,
                                          n_positions=seq_len, **special))
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=width, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=3 * width,
                                        max_position_embeddings=seq_len, **special))


@torch.no_grad()
def loss(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Next-byte cross-entropy on ``ids`` (eval mode: no dropout)."""
    return model.eval()(ids, labels=ids).loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("llama", "gpt2"), default="llama")
    parser.add_argument("--scheme", choices=("dslm", "shaped"), default="dslm")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = tiny_model(args.family, args.layers, args.width, args.seq_len)
    extra = {"seq_len": args.seq_len} if args.scheme == "dslm" else {}
    cfg = sigprop.hf.apply(model, args.scheme, **extra)
    data = ByteChunks(TEXT, args.seq_len)
    records = sigprop.hf.diagnose(model, data.windows[:16], attention_stats=False)
    variances = [r.fwd_var for r in records]
    print(f"{args.family} + {cfg.scheme}: {cfg.n_layers} layers, forward variance at init "
          f"in [{min(variances):.3f}, {max(variances):.3f}] over {len(records)} sublayer outputs")

    batch = data.windows[:32]
    print(f"loss at init {loss(model, batch):.3f} (uniform over 256 bytes: {torch.log(torch.tensor(256.)):.3f})")
    with tempfile.TemporaryDirectory() as out:
        train_args = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=16,
                                       learning_rate=2e-3, warmup_steps=10, weight_decay=0.01, logging_steps=25,
                                       save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
        Trainer(model=model, args=train_args, train_dataset=data).train()
    print(f"loss after {args.steps} steps {loss(model, batch):.3f}")

    prompt = torch.tensor([list(b"Signal propagation ")])
    sample = model.generate(prompt, max_new_tokens=args.seq_len - prompt.shape[1], do_sample=False)
    print("sample:", bytes(sample[0].tolist()).decode(errors="replace"))


if __name__ == "__main__":
    main()
