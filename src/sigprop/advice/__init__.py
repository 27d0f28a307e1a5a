"""`advise`: signal propagation at init and the learning rate to use, from a few passes on the run's data.

    from sigprop.advice import advise
    a = advise("configs/tiny_decoder.toml", lrs=[1e-3, 1e-2])
    a.recommended_lr, a.lr_interval, a.max_stable_lr, a.predictions, a.lambda_a, a.lambda_g

`range_test` is the peer baseline (the LR range test). docs/advise.md: the derivation and the evaluation.
"""
from .advise import Advice, advise
from .range_test import RangeTest, lr_range_test, run_range_test
from .rule import Rule

__all__ = ["Advice", "advise", "RangeTest", "lr_range_test", "run_range_test", "Rule"]
