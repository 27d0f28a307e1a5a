"""`advise`: signal propagation at init and the learning rate to use, from a few passes on the run's data.

    from sigprop.advice import advise
    a = advise("configs/tiny_decoder.toml", lrs=[1e-3, 1e-2])
    a.recommended_lr, a.lr_interval, a.max_stable_lr, a.predictions, a.lambda_a, a.lambda_g

`advise_by_halving` (what ``sigprop advise`` runs by default) trains the run itself at a bracket of lrs around
that advice and keeps the best (successive halving); `advise_by_proxy` trains a small proxy of it instead.
`range_test` is the peer baseline (the LR range test). docs/advise.md: the derivation and the evaluation.
"""
from .advise import Advice, advise
from .halving import HalvingAdvice, advise_by_halving
from .proxy import ProxyAdvice, advise_by_proxy
from .range_test import RangeTest, lr_range_test, run_range_test
from .rule import Rule

__all__ = ["Advice", "advise", "HalvingAdvice", "advise_by_halving", "ProxyAdvice", "advise_by_proxy", "RangeTest",
           "lr_range_test", "run_range_test", "Rule"]
