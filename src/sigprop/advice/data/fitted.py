r'''The `Rule` constants fitted by `sigprop.advice.fit`; `rule.Rule` takes them as its defaults.

Written by `python -m sigprop.advice.fit TABLE --write` at COMMIT from the calibration table DATA names
(the lr benchmark's: `python -m sigprop.advice.benchmark --runs runs/advise-bench --table TABLE`); do
not edit by hand.
'''

DATA = ('src/sigprop/advice/data/calibration.json (sha256 2b505b392cf969c4): 23 configs, 184 runs')
COMMIT = '8bc59f66592ae7bf28e5e0150277bccc94d6c024'
CONSTANTS = {
    'basis': 'window',
    'best': 0.8408964152537145,
    'lo': 0.5640362230793161,
    'hi': 2.413841900655904,
    'edge_basis': 'edge of stability',
    'top': 8.0,
    'kappa': 64.0,
}
