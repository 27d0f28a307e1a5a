"""Corpus, split, tokenizer, objectives, data order and LR schedule."""
import importlib.util
from pathlib import Path

import pytest
import torch

from sigprop.train import BPETokenizer, load_config, load_documents, lr_at, prepare_data, split_documents
from sigprop.train.config import OptimConfig
from sigprop.train.objectives import IGNORE, CausalLM, Denoising, MaskedLM
from sigprop.train.sampler import EpochSampler, generator, shard_bounds

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny_decoder.toml"


@pytest.fixture(scope="module")
def pydoc_tok():
    docs = load_documents("pydoc", max_chars=100_000)
    return docs, BPETokenizer.train(docs, 512)


def test_builtin_corpora_need_no_download():
    docs = load_documents("pydoc")
    assert len(docs) > 50 and sum(map(len, docs)) > 300_000
    assert "assert" in " ".join(docs)
    code = load_documents("stdlib", max_chars=50_000)
    assert sum(map(len, code)) == 50_000 and "def " in code[0] + code[-1]


def test_split_is_by_document_seeded_and_order_free():
    docs = load_documents("pydoc")
    train, val = split_documents(docs, 0.1, seed=0)
    assert sorted(train + val) == sorted(docs) and not set(train) & set(val)
    assert 0.03 < len(val) / len(docs) < 0.25
    assert split_documents(docs[::-1], 0.1, seed=0)[1] == val[::-1]
    assert split_documents(docs, 0.1, seed=1)[1] != val


def test_file_and_folder_sources(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("first paragraph\n\nsecond one\n\n\n")
    assert load_documents(str(f)) == ["first paragraph", "second one"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("bee")
    (tmp_path / "skip.md").write_text("not matched")
    assert load_documents(str(tmp_path)) == ["first paragraph\n\nsecond one\n\n\n", "bee"]
    with pytest.raises(ValueError, match="'nowhere'.*allowed: 'pydoc'"):
        load_documents("nowhere")


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_hf_source_without_datasets_gives_install_hint():
    with pytest.raises(ImportError, match="pip install datasets"):
        load_documents("hf:/some/dir")


def test_empty_and_too_small_corpus_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.txt").write_text("  \n")
    with pytest.raises(ValueError, match=r"is empty: 0 non-empty document\(s\), 0 characters"):
        load_documents(str(tmp_path / "empty"))
    small = tmp_path / "small"
    small.mkdir()
    for i in range(6):
        (small / f"{i}.txt").write_text(f"document number {i} is short. " * 3)
    cfg = load_config(TINY, [f"data.source={small}", f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=rf"'{small}' is too small: its train split has \d+ tokens, "
                                         r"need at least 1025 \(16 example\(s\) of data.seq_len=64\)"):
        prepare_data(cfg, tmp_path)


def test_tokenizer_specials_round_trip_and_determinism(pydoc_tok, tmp_path):
    docs, tok = pydoc_tok
    assert (tok.pad_id, tok.eos_id, tok.mask_id, tok.bos_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 512
    text = "def f(x):\n    return x ** 2  # ünïcode ✓"
    assert tok.decode(tok.encode(text)) == text
    tok.save(tmp_path / "tokenizer.json")
    assert BPETokenizer.load(tmp_path / "tokenizer.json").encode(text) == tok.encode(text)
    assert BPETokenizer.train(docs, 512).tok.to_str() == tok.tok.to_str()
    stream = tok.encode_corpus(docs[:3])
    assert (stream == tok.eos_id).sum() == 3 and stream[-1] == tok.eos_id


def test_causal_lm_shift():
    tokens = torch.arange(100)
    b = CausalLM(tokens, 8, 512).batch(torch.tensor([0, 3]), generator(0))
    assert torch.equal(b.inputs[0][1], torch.arange(24, 32)) and torch.equal(b.targets[1], torch.arange(25, 33))
    assert len(CausalLM(tokens, 8, 512)) == 12


def test_masked_lm_80_10_10():
    tokens = torch.randint(4, 512, (64 * 2000,))
    s = MaskedLM(tokens, 64, 512, mask_prob=0.15)
    b = s.batch(torch.arange(len(s)), generator(0))
    x, t, orig = b.inputs[0], b.targets, s.windows(torch.arange(len(s)))
    picked = t != IGNORE
    assert torch.equal(t[picked], orig[picked]) and torch.equal(x[~picked], orig[~picked])
    n = picked.sum().item()
    assert abs(n / t.numel() - 0.15) < 0.005
    masked = (x[picked] == 2).sum().item() / n
    kept = (x[picked] == orig[picked]).sum().item() / n
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01
    assert x[picked & (x != 2)].min() >= 4    # random replacements avoid special tokens


def test_denoising_spans():
    tokens = torch.randint(4, 512, (64 * 500,))
    s = Denoising(tokens, 64, 512, mask_prob=0.15, span_len=3)
    b = s.batch(torch.arange(len(s)), generator(0))
    src, tgt_in = b.inputs
    assert abs((src == 2).float().mean().item() - 0.15) < 0.02
    assert torch.equal(b.targets, s.windows(torch.arange(len(s))))
    assert (tgt_in[:, 0] == 3).all() and torch.equal(tgt_in[:, 1:], b.targets[:, :-1])


def test_sampler_epochs_and_sharding():
    s = EpochSampler(10, seed=0)
    first, second = s.indices(0, 10), s.indices(10, 10)
    assert sorted(first.tolist()) == list(range(10)) and sorted(second.tolist()) == list(range(10))
    assert not torch.equal(first, second)
    assert torch.equal(EpochSampler(10, 0).indices(7, 6), torch.cat([first[7:], second[:3]]))
    for world, accum in [(1, 1), (1, 4), (2, 1), (2, 2), (4, 1)]:
        rows = [r for rank in range(world) for a, b in shard_bounds(16, world, rank, accum) for r in range(a, b)]
        assert rows == list(range(16))
    with pytest.raises(ValueError, match="multiple of world_size"):
        shard_bounds(10, 4, 0, 1)


def test_lr_schedule():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    lin = OptimConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0, decay="linear")
    assert lr_at(50, 101, lin) == pytest.approx(0.5)


def test_digits_split():
    pytest.importorskip("sklearn")
    cfg = load_config(TINY.with_name("vit_digits.toml"))
    data = prepare_data(cfg, Path("."), save_tokenizer=False)
    assert len(data.train) + len(data.val) == 1797 and len(data.val) == 359
    b = data.train.batch(torch.arange(5), generator(0))
    assert b.inputs[0].shape == (5, 1, 8, 8) and b.targets.shape == (5,)
