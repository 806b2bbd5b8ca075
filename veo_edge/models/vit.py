"""The built-in Vision Transformer: image ViT and video ViT (tubelet patches, joint space-time attention)."""

from __future__ import annotations

import torch
from torch import nn

from veo_edge.models.config import ViTConfig
from veo_edge.models.layers import Block, PatchEmbed, sincos_pos_embed


class VisionTransformer(nn.Module):
    """patch embed -> [cls] -> + pos embed -> pre-norm blocks -> norm -> pool -> head."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.patch_embed = PatchEmbed(
            cfg.in_chans, e, cfg.patch_size, cfg.tubelet_size if cfg.is_video else None
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e)) if cfg.class_token else None
        num_tokens = cfg.num_patches + cfg.num_prefix_tokens
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, e))
        else:
            self.register_buffer("pos_embed", sincos_pos_embed(num_tokens, e), persistent=False)
        self.blocks = nn.Sequential(
            *[
                Block(e, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.layer_norm_eps, cfg.fused_attn)
                for _ in range(cfg.depth)
            ]
        )
        # timm: "norm" before a token pool; "fc_norm" after an average pool
        avg = cfg.global_pool == "avg"
        self.norm = nn.Identity() if avg else nn.LayerNorm(e, eps=cfg.layer_norm_eps)
        self.fc_norm = nn.LayerNorm(e, eps=cfg.layer_norm_eps) if avg else nn.Identity()
        self.head = nn.Linear(e, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embed
        x = self.norm(self.blocks(x))
        x = x[:, self.cfg.num_prefix_tokens :].mean(dim=1) if self.cfg.global_pool == "avg" else x[:, 0]
        return self.head(self.fc_norm(x))


def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic initialisation from ``seed`` that leaves the global RNG untouched.

    Xavier-uniform linears (timm's "jax" scheme) keep logits input-dependent and well separated, which
    makes top-1 agreement between backends a meaningful check even for an untrained model.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if ".norm" in name or name.startswith(("norm.", "fc_norm.")):
                p.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf == "bias":
                p.normal_(0.0, 1e-2, generator=gen)
            elif leaf in ("pos_embed", "cls_token"):
                p.normal_(0.0, 0.02, generator=gen)
            else:
                fan_out, fan_in = p.shape[0], p[0].numel()
                bound = (6.0 / (fan_in + fan_out)) ** 0.5
                p.uniform_(-bound, bound, generator=gen)
