"""The papers' figures and claims, each a function ``run(out_dir, ...) -> dict`` writing JSON, PNGs and a
Markdown section. ``dslm_moments``: DeepScaleLM signal propagation, measured vs `moments.predict`."""
from . import dslm_moments

__all__ = ["dslm_moments"]
