"""Measure the quantities the theory predicts, on real modules, in the same `Record` schema."""
from .any_model import diagnose_model
from .measure import measure, random_projection_loss
from .statistics import attention_entropy, stable_rank, token_correlation

__all__ = ["diagnose_model", "measure", "random_projection_loss", "token_correlation", "stable_rank",
           "attention_entropy"]
