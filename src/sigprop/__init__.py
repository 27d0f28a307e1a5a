"""sigprop: signal propagation in deep transformers."""
from .models import ModelConfig, build_model

__version__ = "0.1.0"
__all__ = ["ModelConfig", "build_model", "__version__"]
