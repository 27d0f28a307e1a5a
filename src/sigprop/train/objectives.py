"""Batch builders: indexable example sets that turn example indices into model inputs + targets.

Every set has ``len(s)`` examples and ``s.batch(idx, gen) -> Batch``; all randomness
(masking, corruption) comes from ``gen``, so a batch is a pure function of its indices and
the generator seed. The loss is a *sum* over target positions (``IGNORE`` = no loss),
which lets the trainer normalise by the global target count: any split of a batch into
ranks and micro-batches then gives the same gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..diagnostics.measure import output_tensor

IGNORE = -100   # target value with no loss


@dataclass(frozen=True)
class Batch:
    """Positional model inputs and targets; rows are examples."""

    inputs: tuple[torch.Tensor, ...]   # e.g. (input_ids,), (src_ids, tgt_ids), (images,)
    targets: torch.Tensor              # (B, T) token targets or (B,) class labels

    def rows(self, start: int, stop: int) -> "Batch":
        """Examples ``start:stop``."""
        return Batch(tuple(x[start:stop] for x in self.inputs), self.targets[start:stop])

    def to(self, device: torch.device | str) -> "Batch":
        """Copy onto ``device``."""
        return Batch(tuple(x.to(device) for x in self.inputs), self.targets.to(device))

    @property
    def n_targets(self) -> int:
        """Positions that carry a loss."""
        return int((self.targets != IGNORE).sum())


def loss_terms(model: nn.Module, batch: Batch, z_loss: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, number of correct argmax predictions) over target positions.

    ``z_loss`` > 0 adds z_loss · Σ (log Z)² over the same positions, Z = Σ_v exp(logit_v) the softmax
    normaliser (Wortsman et al. 2023, arXiv 2309.14322, §3.1.2; PaLM): it keeps the logits from
    drifting to large log Z. Evaluation calls it with 0, so validation losses are pure cross-entropy.
    """
    logits = output_tensor(model(*batch.inputs)).float()      # (B, T, V) or (B, C); a transformers model's .logits
    flat, tgt = logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)
    loss = F.cross_entropy(flat, tgt, ignore_index=IGNORE, reduction="sum")
    if z_loss > 0:
        log_z = flat.logsumexp(-1)
        loss = loss + z_loss * (log_z.square() * (tgt != IGNORE)).sum()
    correct = ((flat.argmax(-1) == tgt) & (tgt != IGNORE)).sum()
    return loss, correct


class TokenWindows:
    """Non-overlapping windows of ``seq_len + extra`` tokens from one token stream."""

    extra = 0   # tokens beyond seq_len per window

    def __init__(self, tokens: torch.Tensor, seq_len: int, vocab_size: int, mask_prob: float = 0.15,
                 span_len: int = 3, n_special: int = 4, mask_id: int = 2, bos_id: int = 3) -> None:
        self.tokens, self.seq_len, self.vocab_size = tokens, seq_len, vocab_size
        self.mask_prob, self.span_len, self.n_special = mask_prob, span_len, n_special
        self.mask_id, self.bos_id = mask_id, bos_id

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - self.extra) // self.seq_len)

    def windows(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, seq_len + extra) token windows for example indices ``idx``."""
        offsets = torch.arange(self.seq_len + self.extra)
        return self.tokens[idx[:, None] * self.seq_len + offsets]

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch:
        raise NotImplementedError


class CausalLM(TokenWindows):
    """Next-token prediction: input w[:-1], target w[1:] (decoder)."""

    extra = 1

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch:
        w = self.windows(idx)                                   # (B, T+1)
        return Batch((w[:, :-1],), w[:, 1:])


class MaskedLM(TokenWindows):
    """BERT masking (encoder): pick ``mask_prob`` of positions; 80% -> <mask>, 10% -> random
    token, 10% kept; the loss is on picked positions only."""

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch:
        w = self.windows(idx)                                   # (B, T)
        pick = torch.rand(w.shape, generator=gen) < self.mask_prob
        r = torch.rand(w.shape, generator=gen)
        rand_tok = torch.randint(self.n_special, self.vocab_size, w.shape, generator=gen)
        x = torch.where(pick & (r < 0.8), self.mask_id, w)
        x = torch.where(pick & (r >= 0.8) & (r < 0.9), rand_tok, x)
        return Batch((x,), torch.where(pick, w, IGNORE))


class Denoising(TokenWindows):
    """Span masking (encoder-decoder): spans of ``span_len`` tokens, covering ~``mask_prob`` of
    the source, become <mask>; the decoder reads <bos> + original[:-1] and predicts the original."""

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> Batch:
        w = self.windows(idx)                                   # (B, T)
        starts = torch.rand(w.shape, generator=gen) < self.mask_prob / self.span_len
        masked = starts.clone()
        for k in range(1, self.span_len):
            masked[:, k:] |= starts[:, :-k]
        src = torch.where(masked, self.mask_id, w)
        tgt_in = torch.cat([torch.full_like(w[:, :1], self.bos_id), w[:, :-1]], dim=1)
        return Batch((src, tgt_in), w)


TEXT_OBJECTIVES: dict[str, type[TokenWindows]] = {"clm": CausalLM, "mlm": MaskedLM,
                                                   "denoise": Denoising}
