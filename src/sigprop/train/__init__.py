"""Training: data, tokenizer, objectives, the trainer loop, schedules, checkpoints, DDP.

Needs the ``train`` extra (tokenizers, safetensors, tqdm): ``pip install 'sigprop[train]'``.
"""
from .callbacks import Callback, Diagnostics
from .checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint
from .commands import eval_main, generate_main, train_main
from .config import DataConfig, OptimConfig, RunConfig, TrainConfig, load_config
from .corpus import load_documents, split_documents
from .data import DataBundle, prepare_data
from .logging import read_jsonl
from .optim import make_optimizer
from .run import load_run, train
from .schedules import RecoverSchedule, lr_at
from .tokenizer import BPETokenizer
from .trainer import NonFiniteLossError, Trainer, TrainState

__all__ = ["Callback", "Diagnostics", "CheckpointError", "list_checkpoints", "load_checkpoint",
           "save_checkpoint", "eval_main", "generate_main", "train_main", "DataConfig", "OptimConfig",
           "RunConfig", "TrainConfig", "load_config", "load_documents", "split_documents", "DataBundle",
           "prepare_data", "read_jsonl", "make_optimizer", "load_run", "train", "RecoverSchedule", "lr_at",
           "BPETokenizer", "NonFiniteLossError", "Trainer", "TrainState"]
