r'''The `Rule` constants fitted by `sigprop.advice.fit`; `rule.Rule` takes them as its defaults.

Written by `python -m sigprop.advice.fit TABLE --write` at COMMIT from the calibration table DATA names
(the lr benchmark's: `python -m sigprop.advice.benchmark --runs runs/advise-bench --table TABLE`); do
not edit by hand.
'''

DATA = ('src/sigprop/advice/data/calibration.json (sha256 00f0860363bef262): 27 configs, 216 runs')
COMMIT = '900cd636befb94b7d9eb4ee4f2d320df3b6c004d'
CONSTANTS = {
    'basis': 'layer change',
    'best': 4.0,
    'lo': 2.20961738920653,
    'hi': 10.459553890716796,
    'edge_basis': 'edge of stability',
    'top': 8.0,
    'kappa': 64.0,
}
