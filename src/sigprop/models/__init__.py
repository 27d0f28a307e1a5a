"""Model configuration and the four architectures."""
from .adapter import Adapter, adapter_of
from .build import ARCHITECTURES, build_model, calibrate
from .config import ModelConfig
from .predict import predict
from .transformer import DecoderLM, EncoderDecoder, EncoderMLM, ViT

__all__ = ["ModelConfig", "build_model", "ARCHITECTURES", "DecoderLM", "EncoderMLM", "EncoderDecoder", "ViT", "predict",
           "calibrate", "Adapter", "adapter_of"]
