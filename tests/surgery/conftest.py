"""Test ViTs written independently of veo_edge.models (separate Q/K/V, DeiT-style cls + dist tokens,
nn.MultiheadAttention, post-norm without a LayerNorm after the embedding) and a session cache of their
ONNX exports, so each (model, exporter, opset) is exported once per test session."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch import nn


class SeparateQkvAttention(nn.Module):
    """q, k, v from three Linear layers; the scale applied as a Div after Q K^T."""

    def __init__(self, dim: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=bias) for _ in range(3))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = (f(x).reshape(b, n, self.h, self.d).transpose(1, 2) for f in (self.q, self.k, self.v))
        attn = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


class DeitAttention(nn.Module):
    """Packed qkv, explicit attention with the scale as a Mul on the scores."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * (0.5 / math.sqrt(self.d))  # a non-default scale
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))


class MhaAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


class Block(nn.Module):
    def __init__(self, dim: int, attn: nn.Module, pre_norm: bool = True) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = attn
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))
        x = self.n1(x + self.attn(x))
        return self.n2(x + self.mlp(x))


class TestViT(nn.Module):
    """patch conv -> [prefix tokens] -> + pos (before or after the prefix) -> blocks -> head."""

    __test__ = False  # not a pytest class

    def __init__(self, attn: str, prefix: int = 1, pos: str = "all", pre_norm: bool = True, dim=48, heads=2):
        super().__init__()
        self.input_shape = (3, 24, 24)
        self.pe = nn.Conv2d(3, dim, 6, 6)
        self.prefix = nn.Parameter(torch.randn(1, prefix, dim) * 0.02) if prefix else None
        self.pos_mode = pos
        self.pos = nn.Parameter(torch.randn(1, 16 + (prefix if pos == "all" else 0), dim) * 0.02)
        make = {
            "separate": lambda: SeparateQkvAttention(dim, heads, bias=True),
            "separate-nobias": lambda: SeparateQkvAttention(dim, heads, bias=False),
            "deit": lambda: DeitAttention(dim, heads),
            "mha": lambda: MhaAttention(dim, heads),
        }[attn]
        self.blocks = nn.Sequential(*[Block(dim, make(), pre_norm) for _ in range(2)])
        self.head = nn.Linear(dim, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pe(x).flatten(2).transpose(1, 2)
        if self.pos_mode == "patches":
            x = x + self.pos
        if self.prefix is not None:
            x = torch.cat([self.prefix.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_mode == "all":
            x = x + self.pos
        return self.head(self.blocks(x).mean(1))


@dataclass(frozen=True)
class Case:
    """One model and exporter of the matrix, with what the surgery must find in it."""

    model: str  # a built-in name or "test:<attn>"
    exporter: str = "torchscript"
    opset: int = 17
    fused_attn: bool = True
    prefix: int = 1
    pos: str = "all"
    pre_norm: bool = True
    blocks: int = 2

    @property
    def id(self) -> str:
        extra = "" if self.model.startswith("test:") else ("-sdpa" if self.fused_attn else "-explicit")
        if self.model.startswith("test:"):
            extra = f"-p{self.prefix}-{self.pos}" + ("" if self.pre_norm else "-postnorm")
        return f"{self.model}{extra}-{self.exporter}{self.opset}"


def build_module(case: Case) -> nn.Module:
    torch.manual_seed(0)
    if case.model.startswith("test:"):
        return TestViT(case.model[5:], case.prefix, case.pos, case.pre_norm).eval()
    from veo_edge.models import get_config
    from veo_edge.models.vit import VisionTransformer, init_weights

    cfg = replace(get_config(case.model), fused_attn=case.fused_attn)
    net = VisionTransformer(cfg)
    init_weights(net, 0)
    net.input_shape = cfg.input_shape
    return net.eval()


@pytest.fixture(scope="session")
def export_case(tmp_path_factory: pytest.TempPathFactory):
    """``export_case(case) -> (onnx path, module)``, exported once per session."""
    from veo_edge.export.onnx_export import OnnxExport

    cache: dict[Case, tuple[Path, nn.Module]] = {}
    root = tmp_path_factory.mktemp("surgery-exports")

    def _export(case: Case) -> tuple[Path, nn.Module]:
        if case not in cache:
            net = build_module(case)
            path = root / f"{case.id}.onnx"
            fastpath = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)  # MHA's fused fast path has no ONNX export
            try:
                OnnxExport(opset=case.opset, exporter=case.exporter, max_batch=4)(net, net.input_shape, path)
            finally:
                torch.backends.mha.set_fastpath_enabled(fastpath)
            cache[case] = (path, net)
        return cache[case]

    return _export
