"""Built-in Vision Transformers (``models/``): the first stage of the data's way through veo-edge."""

from veo_edge.models.config import ViTConfig
from veo_edge.models.registry import DEFAULT_MODEL, BuiltModel, create_model, get_config, list_models

__all__ = ["DEFAULT_MODEL", "BuiltModel", "ViTConfig", "create_model", "get_config", "list_models"]
