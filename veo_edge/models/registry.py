"""Registry of the built-in models, timm-style: one small function per variant with an explicit config."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from veo_edge.errors import UsageError
from veo_edge.models.checkpoint import load_checkpoint
from veo_edge.models.config import ViTConfig

if TYPE_CHECKING:
    from torch import nn

DEFAULT_MODEL = "vit-digits"  # trained on real data: the demo shows real accuracy

_REGISTRY: dict[str, Callable[[], ViTConfig]] = {}
#: trained weights shipped with veo-edge (in models/weights/), by model name
_WEIGHTS: dict[str, str] = {}
#: the module holding a model's own data set (calibration_set(), test_split(), describe_split())
_DATA: dict[str, str] = {}
WEIGHTS_DIR = Path(__file__).parent / "weights"


def register(
    name: str, weights: str | None = None, data: str | None = None
) -> Callable[[Callable[[], ViTConfig]], Callable[[], ViTConfig]]:
    def deco(fn: Callable[[], ViTConfig]) -> Callable[[], ViTConfig]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        _REGISTRY[name] = fn
        if weights is not None:
            _WEIGHTS[name] = weights
        if data is not None:
            _DATA[name] = data
        return fn

    return deco


def pretrained_weights(name: str) -> Path | None:
    """The shipped weights of a trained built-in, or None for one initialised from a seed."""
    return WEIGHTS_DIR / _WEIGHTS[name] if name in _WEIGHTS else None


def builtin_data(name: str) -> ModuleType | None:
    """The data module of a built-in trained on real data (``calibration_set()``, ``test_split()``)."""
    return importlib.import_module(_DATA[name]) if name in _DATA else None


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def get_config(name: str) -> ViTConfig:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(list_models())}") from None


@dataclass(frozen=True)
class BuiltModel:
    name: str
    config: ViTConfig
    module: nn.Module


def create_model(name: str, seed: int = 0, pretrained: bool = True) -> BuiltModel:
    """Instantiate a registered variant in eval mode: its shipped weights when it has some (and
    ``pretrained``), else weights initialised from ``seed``."""
    cfg = get_config(name)
    import torch

    from veo_edge.models.vit import VisionTransformer, init_weights

    # torch's default layer init draws from the global RNG; fork it so a build leaves the caller's alone
    with torch.random.fork_rng(devices=[]):
        module = VisionTransformer(cfg)
    init_weights(module, seed)
    weights = pretrained_weights(name) if pretrained else None
    if weights is not None:
        load_checkpoint(module, weights)
    return BuiltModel(name=name, config=cfg, module=module.eval())


@register("vit-nano")
def vit_nano() -> ViTConfig:
    """A 2-block ViT on 32x32 images for fast tests."""
    return ViTConfig(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=2, num_heads=2)


@register("vit-tiny")
def vit_tiny() -> ViTConfig:
    """ViT-Ti/16 at 224x224 (DeiT-Tiny shape): 192-dim, 12 blocks, 3 heads."""
    return ViTConfig(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3)


@register("vit-digits", weights="vit-digits.safetensors", data="veo_edge.models.digits")
def vit_digits() -> ViTConfig:
    """A 4-block ViT trained on scikit-learn's handwritten digits (real 8x8 scans upscaled to 32x32,
    one channel; models/digits.py has the split, models/train_digits.py trained the shipped weights)."""
    return ViTConfig(
        img_size=32,
        patch_size=8,
        in_chans=1,
        num_classes=10,
        embed_dim=64,
        depth=4,
        num_heads=2,
        class_token=False,
        global_pool="avg",
    )


@register("veo-video-tiny")
def veo_video_tiny() -> ViTConfig:
    """Video ViT, 8 frames of 112x112, 2x16x16 tubelets, joint space-time attention, VideoMAE-style:
    no cls token, fixed sinusoidal positions, mean pooling."""
    return ViTConfig(
        img_size=112,
        patch_size=16,
        num_frames=8,
        tubelet_size=2,
        num_classes=400,
        embed_dim=192,
        depth=12,
        num_heads=3,
        class_token=False,
        pos_embed="sincos",
        global_pool="avg",
    )


@register("veo-video-nano")
def veo_video_nano() -> ViTConfig:
    """A 2-block video ViT (4 frames of 32x32) for fast tests."""
    return ViTConfig(
        img_size=32,
        patch_size=8,
        num_frames=4,
        tubelet_size=2,
        num_classes=10,
        embed_dim=64,
        depth=2,
        num_heads=2,
        class_token=False,
        pos_embed="sincos",
        global_pool="avg",
    )
