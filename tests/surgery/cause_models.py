"""Small ViTs written for these tests, one per pattern that kept real exports from fusing before the
graph was canonicalized. Each reproduces one cause the way the model families people ship write it;
none is a copy of any library's code.

- ``softmax_cast``: ``softmax(x, dtype=float32).to(dtype)`` (a float Cast between Softmax and MatMul)
- ``zero_mask``: an all-ones attention mask turned into an additive ``where(mask, 0, min)`` bias
- ``pos_resize``: the position table bicubically resized to the patch grid read off the input (traced
  even when the size does not change)
- ``grid_reads``: the patch grid's (N, E, H, W) read with ``.shape`` after the conv and used later
- ``ln_bias_zero``: LayerNorms with all-zero biases (de-duplicated initializers behind ``Identity``)
- ``cls_1d``: a class token stored as an (E,) vector and expanded to (N, 1, E)
- ``qkv_bias_zero``: separate Q/K/V projections with all-zero (de-duplicated) biases
- ``divided``: a video ViT with a tubelet Conv3d and divided space-time attention (temporal, then spatial)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CAUSES = (
    "softmax_cast",
    "zero_mask",
    "pos_resize",
    "grid_reads",
    "ln_bias_zero",
    "cls_1d",
    "qkv_bias_zero",
)
DIM, HEADS, PATCH, SIDE = 32, 2, 4, 20  # 5x5 grid: 25 patches (+1 cls = 26, not a multiple of 8)


class CauseAttention(nn.Module):
    def __init__(self, causes: frozenset[str]) -> None:
        super().__init__()
        self.causes = causes
        self.h, self.d = HEADS, DIM // HEADS
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))
        self.o = nn.Linear(DIM, DIM)
        if "qkv_bias_zero" in causes:
            for lin in (self.q, self.k, self.v):
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = (f(x).view(b, n, self.h, self.d).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        if "zero_mask" in self.causes:
            keep = torch.ones(b, n, dtype=torch.bool, device=x.device)
            mask = keep[:, None, None, :].expand(b, 1, n, n)
            scores = scores + torch.where(mask, 0.0, -3.4e38)  # float32 min: fine in float64 too
        if "softmax_cast" in self.causes:
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            probs = scores.softmax(-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, c)
        return self.o(ctx)


class CauseBlock(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM, eps=1e-6), nn.LayerNorm(DIM, eps=1e-6)
        self.attn = attn
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class CauseViT(nn.Module):
    """conv patches -> cls token -> + position table -> 2 pre-norm blocks -> mean-pooled head."""

    def __init__(self, causes: frozenset[str]) -> None:
        super().__init__()
        self.causes = causes
        self.input_shape = (3, SIDE, SIDE)
        grid = SIDE // PATCH
        self.patch = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.cls = nn.Parameter(
            torch.randn(DIM) * 0.02 if "cls_1d" in causes else torch.randn(1, 1, DIM) * 0.02
        )
        self.pos = nn.Parameter(torch.randn(1, 1 + grid * grid, DIM) * 0.02)
        # registered before the blocks: the final norm's parameters come first, so the exporter keeps
        # them and de-duplicates the blocks' equal ones behind Identity nodes
        self.norm = nn.LayerNorm(DIM, eps=1e-6)
        self.blocks = nn.ModuleList(CauseBlock(CauseAttention(causes)) for _ in range(2))
        self.head = nn.Linear(DIM, 5)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm) and "ln_bias_zero" not in causes:  # trained-looking, all distinct
                nn.init.normal_(m.weight, 1.0, 0.1)
                nn.init.normal_(m.bias, 0.0, 0.1)

    def _pos(self, h: int, w: int) -> torch.Tensor:
        if "pos_resize" not in self.causes:
            return self.pos
        cls_pos, grid_pos = self.pos[:, :1], self.pos[:, 1:]
        side = int(math.sqrt(grid_pos.shape[1]))
        grid_pos = grid_pos.reshape(1, side, side, DIM).permute(0, 3, 1, 2)
        grid_pos = F.interpolate(grid_pos, size=(h, w), mode="bicubic", align_corners=False)
        return torch.cat([cls_pos, grid_pos.permute(0, 2, 3, 1).reshape(1, h * w, DIM)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2] // PATCH, x.shape[-1] // PATCH
        t = self.patch(x)
        if "grid_reads" in self.causes:
            b, c, h, w = t.shape
        t = t.flatten(2).transpose(1, 2)
        cls = (
            self.cls.expand(t.shape[0], 1, DIM)
            if "cls_1d" in self.causes
            else self.cls.expand(t.shape[0], -1, -1)
        )
        t = torch.cat([cls, t], dim=1) + self._pos(h, w)
        for blk in self.blocks:
            t = blk(t)
        t = self.norm(t)
        if "grid_reads" in self.causes:  # pool over the grid read back from the conv's shape
            pooled = t[:, 1:].reshape(b, h, w, c).mean(dim=(1, 2))
        else:
            pooled = t[:, 1:].mean(1)
        return self.head(pooled)


class DividedBlock(nn.Module):
    """TimeSformer-style: attention over time per patch, then over space per frame, then the MLP."""

    def __init__(self, frames: int, patches: int) -> None:
        super().__init__()
        self.t, self.s = frames, patches
        self.nt, self.ns, self.nm = (nn.LayerNorm(DIM, eps=1e-6) for _ in range(3))
        self.time_qkv, self.time_out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.space_qkv, self.space_out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    @staticmethod
    def _attend(x: torch.Tensor, qkv: nn.Linear, out: nn.Linear) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = qkv(x).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = F.scaled_dot_product_attention(q, k, v)
        return out(ctx.transpose(1, 2).reshape(b, n, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        # temporal: (N, T*S, E) -> (N*S, T, E)
        xt = self.nt(x).reshape(b, self.t, self.s, c).transpose(1, 2).reshape(b * self.s, self.t, c)
        xt = self._attend(xt, self.time_qkv, self.time_out)
        x = x + xt.reshape(b, self.s, self.t, c).transpose(1, 2).reshape(b, self.t * self.s, c)
        # spatial: (N, T*S, E) -> (N*T, S, E)
        xs = self.ns(x).reshape(b * self.t, self.s, c)
        x = x + self._attend(xs, self.space_qkv, self.space_out).reshape(b, self.t * self.s, c)
        return x + self.fc2(F.gelu(self.fc1(self.nm(x))))


class DividedVideoViT(nn.Module):
    """8 frames of 16x16, 2x4x4 tubelets (4 time steps x 16 patches), divided space-time attention."""

    def __init__(self) -> None:
        super().__init__()
        self.input_shape = (3, 8, 16, 16)
        self.tubelet = nn.Conv3d(3, DIM, (2, 4, 4), (2, 4, 4))
        self.pos = nn.Parameter(torch.randn(1, 4 * 16, DIM) * 0.02)
        self.blocks = nn.ModuleList(DividedBlock(4, 16) for _ in range(2))
        self.norm = nn.LayerNorm(DIM, eps=1e-6)
        self.head = nn.Linear(DIM, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.tubelet(x).flatten(2).transpose(1, 2) + self.pos
        for blk in self.blocks:
            t = blk(t)
        return self.head(self.norm(t).mean(1))


def build(causes: str) -> nn.Module:
    """``"divided"``, one cause, or several joined by ``+`` (``"all"``: every one of :data:`CAUSES`)."""
    torch.manual_seed(0)
    if causes == "divided":
        return DividedVideoViT().eval()
    picked = frozenset(CAUSES if causes == "all" else causes.split("+"))
    unknown = picked - set(CAUSES)
    if unknown:
        raise ValueError(f"unknown causes {sorted(unknown)}; choose from {CAUSES}")
    return CauseViT(picked).eval()
