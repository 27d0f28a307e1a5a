"""The papers' figures and claims. Every one is registered in `sigprop.experiments.registry` (``sigprop
reproduce NAME``): the training claims are `sigprop.experiments.claim.Claim` data run by `run_claim`; the
figure runners (``dslm_moments``: DeepScaleLM signal propagation vs `sigprop.models.predict`;
``shaped_figs``: The Shaped Transformer's Figs. 1, 2, 4, 5) are `registry.Figures`."""
