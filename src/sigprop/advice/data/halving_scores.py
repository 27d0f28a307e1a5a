"""The halving schedules scored on the lr benchmark's 27 configs (`sigprop.advice.benchmark.schedule_table`):
per schedule its arms, rungs, keeps, extra cost in runs, and mean regret and share within 0.05 nats of the
grid's best over every config, each bracket centred by the rule refitted without the config's family.

Written by
    python -m sigprop.advice.benchmark --runs runs/advise-bench --schedules src/sigprop/advice/data/halving_scores.py
do not edit by hand.
"""

SCORES = [
    {'arms': 3, 'rungs': (0.05,), 'keep': (1,), 'extra': 0.1, 'mean_regret': 0.1703, 'near': 0.4444},
    {'arms': 3, 'rungs': (0.1,), 'keep': (1,), 'extra': 0.2, 'mean_regret': 0.1152, 'near': 0.5556},
    {'arms': 3, 'rungs': (0.2,), 'keep': (1,), 'extra': 0.4, 'mean_regret': 0.1369, 'near': 0.5926},
    {'arms': 3, 'rungs': (0.05, 0.2), 'keep': (2, 1), 'extra': 0.25, 'mean_regret': 0.0924, 'near': 0.6667},
    {'arms': 3, 'rungs': (0.1, 0.3), 'keep': (2, 1), 'extra': 0.4, 'mean_regret': 0.0538, 'near': 0.7037},
    {'arms': 5, 'rungs': (0.05,), 'keep': (1,), 'extra': 0.2, 'mean_regret': 0.2735, 'near': 0.2593},
    {'arms': 5, 'rungs': (0.1,), 'keep': (1,), 'extra': 0.4, 'mean_regret': 0.2577, 'near': 0.4074},
    {'arms': 5, 'rungs': (0.05, 0.2), 'keep': (2, 1), 'extra': 0.35, 'mean_regret': 0.2084, 'near': 0.4074},
    {'arms': 5, 'rungs': (0.05, 0.25), 'keep': (2, 1), 'extra': 0.4, 'mean_regret': 0.1601, 'near': 0.4444},
    {'arms': 7, 'rungs': (0.05,), 'keep': (1,), 'extra': 0.3, 'mean_regret': 0.294, 'near': 0.2222},
]
