"""Plain-numpy reference of the plugin ops, written from their specs (``plugins/<op>/spec.json``).

This is the yardstick for everything else that computes these ops: the ONNX function bodies the
surgery attaches, and the CUDA kernels of the plugin library. It computes in float64 unless told
otherwise and depends on nothing but numpy.
"""

from __future__ import annotations

import math

import numpy as np


def attention(
    qkv: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    num_heads: int,
    head_dim: int,
    scale: float = 0.0,
) -> np.ndarray:
    """``VeoAttention``: packed (N, S, 3*H*D) -> merged heads (N, S, H*D), ``softmax(Q Kᵀ·scale + bias) V``.

    ``bias`` (version 2) is (B, 1|H, S, S) with N a multiple of B: attention batch n adds row n mod B.
    Its values are first clamped to the lowest finite value of its dtype (a -inf mask in float16 is
    -65504), as the kernels do, so no row turns into NaN."""
    x = np.asarray(qkv, dtype=np.float64)
    n, s, three_e = x.shape
    e = num_heads * head_dim
    if three_e != 3 * e:
        raise ValueError(
            f"qkv last dim is {three_e}, expected 3*num_heads*head_dim = {3 * e}; "
            "check num_heads and head_dim"
        )
    scale = scale or 1.0 / math.sqrt(head_dim)
    heads = x.reshape(n, s, 3, num_heads, head_dim).transpose(2, 0, 3, 1, 4)  # (3, N, H, S, D)
    q, k, v = heads[0], heads[1], heads[2]
    logits = np.einsum("nhsd,nhtd->nhst", q, k) * scale
    if bias is not None:
        logits = logits + _periodic(clamp_bias(bias), n, num_heads, s)
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("nhst,nhtd->nhsd", p, v)  # (N, H, S, D)
    return out.transpose(0, 2, 1, 3).reshape(n, s, e)


def clamp_bias(bias: np.ndarray) -> np.ndarray:
    """``bias`` in float64 with values below its dtype's lowest finite value (-inf) raised to it."""
    b = np.asarray(bias)
    lowest = np.finfo(b.dtype).min if np.issubdtype(b.dtype, np.floating) else np.finfo(np.float32).min
    return np.maximum(b.astype(np.float64), float(lowest))


def _periodic(bias: np.ndarray, n: int, num_heads: int, s: int) -> np.ndarray:
    """(B, Hb, S, S) -> (N, H, S, S) with row n = bias[n mod B]."""
    if bias.ndim != 4 or bias.shape[1] not in (1, num_heads) or bias.shape[2:] != (s, s):
        raise ValueError(f"bias has shape {bias.shape}, expected (B, 1 or {num_heads}, {s}, {s})")
    b = bias.shape[0]
    if b < 1 or n % b:
        raise ValueError(f"the attention batch {n} is not a multiple of the bias batch {b}")
    return np.broadcast_to(bias[np.arange(n) % b], (n, num_heads, s, s))


def _patchify(x: np.ndarray, patch_size: tuple[int, ...]) -> np.ndarray:
    """(N, C, *spatial) -> (N, L, C*prod(patch)) in row-major order of the patch grid."""
    n, c, *spatial = x.shape
    if len(spatial) != len(patch_size):
        raise ValueError(
            f"input has {len(spatial)} spatial dims {tuple(spatial)} but patch_size has "
            f"{len(patch_size)} {tuple(patch_size)}"
        )
    grid = []
    for extent, p in zip(spatial, patch_size, strict=True):
        if extent % p:
            raise ValueError(f"spatial extent {extent} is not divisible by patch size {p}")
        grid.append(extent // p)
    shape = [n, c]
    for g, p in zip(grid, patch_size, strict=True):
        shape += [g, p]
    k = len(patch_size)
    blocks = x.reshape(shape)
    # axes: n, c, g0, p0, g1, p1, ... -> n, g0, g1, ..., c, p0, p1, ...
    order = [0] + [2 + 2 * i for i in range(k)] + [1] + [3 + 2 * i for i in range(k)]
    blocks = blocks.transpose(order)
    return blocks.reshape(n, int(np.prod(grid)), c * int(np.prod(patch_size)))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, epsilon: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * weight + bias


def patch_embed_layernorm(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    prefix_tokens: np.ndarray | None = None,
    pos_embed: np.ndarray | None = None,
    ln_weight: np.ndarray | None = None,
    ln_bias: np.ndarray | None = None,
    *,
    patch_size: tuple[int, ...] | list[int],
    epsilon: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``VeoPatchEmbedLayerNorm``: returns (tokens, LayerNorm(tokens) or None)."""
    f64 = np.float64
    x = np.asarray(x, dtype=f64)
    weight = np.asarray(weight, dtype=f64)
    patch_size = tuple(int(p) for p in patch_size)
    e = weight.shape[0]
    patches = _patchify(x, patch_size)  # (N, L, C*prod(p))
    tokens = patches @ weight.reshape(e, -1).T + np.asarray(bias, dtype=f64)
    n, num_patches, _ = tokens.shape
    pos = None if pos_embed is None else np.asarray(pos_embed, dtype=f64)
    if pos is not None and pos.shape[1] == num_patches:
        tokens = tokens + pos  # timm's no_embed_class: patch tokens only, before the prefix
        pos = None
    if prefix_tokens is not None:
        prefix = np.broadcast_to(np.asarray(prefix_tokens, dtype=f64), (n, prefix_tokens.shape[1], e))
        tokens = np.concatenate([prefix, tokens], axis=1)
    if pos is not None:
        if pos.shape[1] != tokens.shape[1]:
            raise ValueError(
                f"pos_embed covers {pos.shape[1]} tokens, expected {tokens.shape[1]} (prefix + patches) "
                f"or {num_patches} (patches only)"
            )
        tokens = tokens + pos
    if ln_weight is None:
        return tokens, None
    normed = layer_norm(tokens, np.asarray(ln_weight, dtype=f64), np.asarray(ln_bias, dtype=f64), epsilon)
    return tokens, normed
