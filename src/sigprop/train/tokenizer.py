"""Byte-level BPE tokenizer (Hugging Face ``tokenizers``), trained on the train split.

Byte-level means every string is encodable (no unknown token). The special tokens come
first, so their ids are fixed: ``<pad>``=0, ``<eos>``=1, ``<mask>``=2, ``<bos>``=3.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..console.errors import UserError
from ..fields import invalid

SPECIALS = ("<pad>", "<eos>", "<mask>", "<bos>")


class BPETokenizer:
    """A trained byte-level BPE with the special ids sigprop's objectives use.

    Args:
        tok: a ``tokenizers.Tokenizer`` whose special tokens (pad, eos, mask, bos) hold ids 0..3; `train` and
            `load` make one.

    Raises:
        UserError: the special tokens are not at ids 0..3.
    """

    def __init__(self, tok: Tokenizer) -> None:
        ids = [tok.token_to_id(s) for s in SPECIALS]
        if ids != list(range(len(SPECIALS))):
            raise UserError(f"tokenizer must have special tokens {SPECIALS} at ids 0..3, got {ids}")
        self.tok = tok
        self.pad_id, self.eos_id, self.mask_id, self.bos_id = ids

    @classmethod
    def train(cls, docs: list[str], vocab_size: int) -> "BPETokenizer":
        """Learn merges on ``docs`` up to ``vocab_size`` tokens (deterministic)."""
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + len(SPECIALS):
            raise UserError(f"model.vocab_size={vocab_size} is too small for a byte-level BPE; "
                            f"need >= {len(alphabet) + len(SPECIALS)}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                      initial_alphabet=alphabet, show_progress=False)
        tok.train_from_iterator(docs, trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path, field: str = "data.tokenizer") -> "BPETokenizer":
        """Read a tokenizer.json written by `save`; ValueError naming ``field`` if ``path`` is not a file that
        ``tokenizers`` can read."""
        if not Path(path).is_file():
            raise UserError(invalid(field, str(path), "an existing tokenizer.json file (no such file)"))
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for unreadable or non-JSON files
            raise UserError(invalid(field, str(path), f"a tokenizer.json file that tokenizers can read ({e})")) from e
        try:
            return cls(tok)
        except ValueError as e:
            raise UserError(f"{field}={str(path)!r}: {e}") from e

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json."""
        self.tok.save(str(path))

    @property
    def vocab_size(self) -> int:
        """Number of tokens, specials included."""
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        return self.tok.decode(ids)

    def encode_corpus(self, docs: list[str]) -> torch.Tensor:
        """All documents as one int64 stream, each followed by ``<eos>``: (N,)."""
        stream: list[int] = []
        for enc in self.tok.encode_batch(docs):
            stream += enc.ids
            stream.append(self.eos_id)
        return torch.tensor(stream, dtype=torch.long)
