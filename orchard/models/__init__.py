"""Decoder-only transformers (Llama, Qwen2, Qwen3, Qwen3-MoE) and Qwen3-VL in Flax NNX, and their weight I/O."""

from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer
from orchard.models.vision import VisionConfig
from orchard.models.vlm import VisionLanguageModel, VLMConfig
from orchard.models.weights import from_pretrained, save_pretrained

__all__ = ["ModelConfig", "Transformer", "VLMConfig", "VisionConfig", "VisionLanguageModel", "from_pretrained",
           "save_pretrained"]
