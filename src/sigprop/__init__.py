"""sigprop: signal propagation in deep transformers."""
from .models import ModelConfig, build_model
from .models.grow import grow

__version__ = "0.1.0"
__all__ = ["ModelConfig", "advise", "build_model", "grow", "__version__"]


def __getattr__(name: str):
    """``sigprop.advise``, imported on first use (it pulls in the training and diagnostics layers)."""
    if name == "advise":
        from .advice import advise
        return advise
    raise AttributeError(f"module 'sigprop' has no attribute {name!r}")
