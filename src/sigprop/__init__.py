"""sigprop: signal propagation in deep transformers."""
from .models import ModelConfig, build_model
from .models.grow import grow

__version__ = "0.1.0"
__all__ = ["ModelConfig", "build_model", "grow", "__version__"]
