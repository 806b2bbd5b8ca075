"""The VeoAttention kernel's arithmetic on the host, against the numpy reference.

``plugins/veoAttention/veoAttentionTile.h`` holds the kernel's per-tile math (scores, bias, running max and
sum, output update) as ``__host__ __device__`` functions; ``plugins/tests/attentionTileHost.cpp`` drives
them in the kernel's CTA/warp/lane structure on the CPU. Built here with the host compiler, it is compared
with :func:`veo_edge.surgery.reference.attention` on random inputs, with and without a bias, FP32 and FP16
I/O, with the FlashAttention-style tolerance: K times the error of an independent float32 computation
(PyTorch's SDPA) plus a floor."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from veo_edge.export.parity import FLOOR_REL
from veo_edge.surgery import reference

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
K = 8.0
F32_LOWEST = float(np.finfo(np.float32).min)
F16_LOWEST = float(np.finfo(np.float16).min)


@pytest.fixture(scope="module")
def tile_host(tmp_path_factory: pytest.TempPathFactory):
    """The host driver, compiled from the sources of this checkout (seconds; no CMake build needed)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on this machine")
    lib = tmp_path_factory.mktemp("tile-host") / "libveo_attention_tile_host.so"
    src = PLUGINS / "tests" / "attentionTileHost.cpp"
    include = [f"-I{PLUGINS / 'veoAttention'}", f"-I{PLUGINS / 'tests'}"]
    subprocess.run(
        [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", *include, str(src), "-o", str(lib)], check=True
    )
    so = ctypes.CDLL(str(lib))
    fn = so.veoAttentionTileHost
    ptr = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [
        ptr,
        ptr,
        ctypes.c_int,
        ctypes.c_int,
        ptr,
        *[ctypes.c_int] * 4,
        ctypes.c_float,
        ctypes.c_float,
    ]
    fn.restype = ctypes.c_int
    return fn


def _run(fn, qkv, bias, heads, head_dim, scale, lowest):
    qkv = np.ascontiguousarray(qkv, dtype=np.float32)
    n, s, _ = qkv.shape
    out = np.empty((n, s, heads * head_dim), np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    rc = fn(
        qkv.ctypes.data_as(ptr),
        None if b is None else b.ctypes.data_as(ptr),
        1 if b is None else b.shape[0],
        1 if b is None else b.shape[1],
        out.ctypes.data_as(ptr),
        n,
        s,
        heads,
        head_dim,
        scale,
        lowest,
    )
    assert rc == 0
    return out


def _bias(rng, shape):
    """A relative-position-like table with masks: -100 (Swin), -inf entries, one query row masked
    entirely (it must stay finite) and one masked over the first key tile only (the running sum restarts)."""
    bias = rng.standard_normal(shape).astype(np.float32)
    bias[..., 2::3, ::2] = -100.0
    bias[..., 3::5, 1::4] = -np.inf
    bias[..., 0, :] = -np.inf
    bias[..., 1, :32] = -np.inf
    return bias


def _torch_baseline(qkv, bias, heads, head_dim, scale, lowest):
    """PyTorch SDPA in float32 on the same (rounded) inputs: the independent low-precision computation."""
    import torch
    import torch.nn.functional as F

    n, s, _ = qkv.shape
    q, k, v = (
        torch.from_numpy(qkv.astype(np.float32)).reshape(n, s, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    )
    mask = None
    if bias is not None:
        clamped = np.maximum(bias.astype(np.float32), lowest)
        mask = torch.from_numpy(clamped)[torch.arange(n) % bias.shape[0]]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale or None)
    return out.transpose(1, 2).reshape(n, s, -1).numpy()


CASES = [
    # (batch, seq, heads, head_dim, bias (B, Hb) or None)
    (1, 17, 2, 32, None),
    (3, 50, 2, 48, None),
    (2, 33, 3, 80, None),
    (1, 17, 2, 32, (1, 2)),  # BEiT: one table for the batch
    (6, 50, 2, 48, (3, 1)),  # Swin: 3 windows an image, a mask shared by the heads
    (6, 40, 3, 80, (3, 3)),
    (4, 64, 2, 64, (1, 1)),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[0]}-s{c[1]}-h{c[2]}-d{c[3]}-bias{c[4]}")
def test_the_kernel_math_matches_the_reference(case, dtype, tile_host):
    batch, seq, heads, head_dim, bias_dims = case
    rng = np.random.default_rng(seq * 100 + head_dim)
    scale = 0.0 if bias_dims is None else 0.2
    qkv = rng.standard_normal((batch, seq, 3 * heads * head_dim)).astype(dtype)
    bias = None if bias_dims is None else _bias(rng, (*bias_dims, seq, seq)).astype(dtype)
    lowest = F32_LOWEST if dtype == "float32" else F16_LOWEST
    got = _run(tile_host, qkv, bias, heads, head_dim, scale, lowest).astype(dtype)  # the kernel's store
    ref = reference.attention(qkv, bias, num_heads=heads, head_dim=head_dim, scale=scale)
    base = _torch_baseline(qkv, bias, heads, head_dim, scale, lowest).astype(dtype)
    assert np.isfinite(got).all()
    err = float(np.abs(got.astype(np.float64) - ref).max())
    tol = K * float(np.abs(base.astype(np.float64) - ref).max()) + FLOOR_REL * float(np.abs(ref).max())
    assert err <= tol, f"max abs {err:.3g} > tolerance {tol:.3g}"
    if bias is not None and dtype == "float32":  # a row masked everywhere: every key weighs the same
        v = qkv[:, :, 2 * heads * head_dim :].astype(np.float64)
        np.testing.assert_allclose(got[:, 0], v.mean(axis=1), rtol=1e-5, atol=1e-6)


def test_a_bias_that_does_not_fit_and_an_unknown_head_dim_are_refused(tile_host):
    qkv = np.zeros((6, 8, 3 * 2 * 32), np.float32)
    with pytest.raises(AssertionError):
        _run(
            tile_host, qkv, np.zeros((4, 2, 8, 8), np.float32), 2, 32, 0.0, F32_LOWEST
        )  # 4 does not divide 6
    with pytest.raises(AssertionError):
        _run(tile_host, np.zeros((1, 8, 3 * 2 * 40), np.float32), None, 2, 40, 0.0, F32_LOWEST)
