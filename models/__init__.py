"""Models: ModelConfig, the LanguageModel and the mixer registry."""
from models.config import ModelConfig
from models.mixers import MIXERS, get_mixer
from models.lm import LanguageModel

__all__ = ["LanguageModel", "ModelConfig", "MIXERS", "get_mixer"]
