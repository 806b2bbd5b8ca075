"""Typed configuration of the built-in Vision Transformers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of a pre-norm ViT; ``num_frames`` set makes it a video ViT with tubelet patches."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    # "learned": a trained parameter; "sincos": fixed sinusoidal table (a buffer, VideoMAE style)
    pos_embed: Literal["learned", "sincos"] = "learned"
    # "token": classify the cls token; "avg": mean of the patch tokens through fc_norm
    global_pool: Literal["token", "avg"] = "token"
    layer_norm_eps: float = 1e-6
    # video: frames and the temporal extent of one tubelet (kernel = stride = (tubelet, patch, patch))
    num_frames: int | None = None
    tubelet_size: int = 2
    # use F.scaled_dot_product_attention (timm's fused_attn) instead of explicit matmul+softmax
    fused_attn: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.img_size % self.patch_size:
            raise ValueError(f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}")
        if self.num_frames is not None and self.num_frames % self.tubelet_size:
            raise ValueError(
                f"num_frames {self.num_frames} is not divisible by tubelet_size {self.tubelet_size}"
            )

    @property
    def is_video(self) -> bool:
        return self.num_frames is not None

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def grid(self) -> tuple[int, ...]:
        g = self.img_size // self.patch_size
        return (self.num_frames // self.tubelet_size, g, g) if self.is_video else (g, g)

    @property
    def num_patches(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, without the batch axis: (C, H, W) or (C, T, H, W)."""
        hw = (self.img_size, self.img_size)
        return (self.in_chans, self.num_frames, *hw) if self.is_video else (self.in_chans, *hw)

    def to_dict(self) -> dict:
        return asdict(self)
