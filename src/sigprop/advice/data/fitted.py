r'''The `Rule` constants fitted by `sigprop.advice.fit`; `rule.Rule` takes them as its defaults.

Written by `python -m sigprop.advice.fit TABLE --write`; do not edit by hand.
'''

DATA = ("bench/advise.py's balanced split, calibration set: 24 configs, 192 (config, lr) runs of "
        'configs/sweep/depth_lr.toml, width_mup.toml, advise_eval.toml (cells 4 x 32, 24 x 64) and '
        'advise_eval_deep.toml (96 x 32); that calibration table is not in the repository')
COMMIT = '13307f2ad5062178efe934ffe2f1f93df157ddbc'
CONSTANTS = {
    'basis': 'one-step optimum',
    'best': 1.41421,
    'lo': 0.0573126,
    'hi': 1.81271,
    'edge_basis': 'edge of stability',
    'top': 5.65685,
    'kappa': 76.1093,
}
