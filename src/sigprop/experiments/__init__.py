"""The papers' figures and claims, each a function ``(out_dir, ..., quick=False) -> dict`` writing JSON,
PNGs and a Markdown section. ``dslm_moments``: DeepScaleLM signal propagation, measured vs
`sigprop.models.predict`; ``shaped_figs``: The Shaped Transformer's Figs. 1, 2, 4, 5 (finite networks vs SDE)."""
from . import dslm_moments, shaped_figs

__all__ = ["dslm_moments", "shaped_figs"]
