"""sigprop schemes for Hugging Face `transformers` models (optional extra: ``pip install 'sigprop[hf]'``).

    import sigprop.hf
    cfg = sigprop.hf.apply(model, "dslm")          # or "shaped", "deepnorm", "depth_mup", "completep"; in place
    cfg = sigprop.hf.apply(model, "depth_mup", parametrization="mup", base_width=256, base_depth=4)
    records = sigprop.hf.diagnose(model, batch)    # per-sublayer Records, as sigprop.diagnostics.measure
    predicted = sigprop.hf.predict(model, batch)   # the same Records at init, walked from the model's modules
    groups = sigprop.hf.param_groups(model, cfg, lr=3e-4)   # the scheme's optimizer rules, for AdamW

Supported ``config.model_type``: see `SUPPORTED`. Importing this package needs no `transformers`;
`apply` uses it only through the model it is given (and to register the shaped attention).
"""
from typing import Any

from .apply import SUPPORTED, apply, mirror_config
from .diagnose import diagnose
from .walk import predict

__all__ = ["apply", "diagnose", "mirror_config", "param_groups", "predict", "SUPPORTED"]


def __getattr__(name: str) -> Any:
    """`param_groups` (`sigprop.hf.optim`), imported when first read: it builds `sigprop.train`'s optimizer groups,
    which the family adapters (`sigprop.models.adapter.adapter_of` imports them) must not load."""
    if name == "param_groups":
        from .optim import param_groups
        return param_groups
    raise AttributeError(f"module 'sigprop.hf' has no attribute {name!r}")
