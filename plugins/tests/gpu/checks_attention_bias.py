"""VeoAttention version 2 on a GPU: ``veoAttentionForwardBias`` with BEiT-like (one table) and Swin-like
(a table per window, masks of -100 and -inf, a fully masked query) biases, FP32 and FP16, against
``veo_edge.surgery.reference.attention`` (float64) with the criterion of the other kernel checks: at most
2x PyTorch's SDPA error (same precision, the same clamped bias as ``attn_mask``) plus a floor. Called by
``checks_kernels.run``; torch is passed in.
"""

# The ours()/theirs() closures are called within the loop iteration that defines them.
# ruff: noqa: B023

from __future__ import annotations

import ctypes

import numpy as np

from veo_edge.surgery import reference


def bias_cases(quick: bool, tiny: bool = False):
    """(batch, seq, heads, head_dim, bias batch, bias heads): the batch of a windowed case is images x
    windows, its bias a table per window of an image."""
    if tiny:
        yield from ((8, 49, 2, 32, 4, 2), (1, 50, 2, 64, 1, 1))
        return
    yield from ((1, 197, 2, 64, 1, 2), (8, 197, 3, 64, 1, 3))  # BEiT-like: one table, batch 1 and 8
    yield from ((8, 49, 2, 32, 4, 2), (32, 49, 3, 32, 16, 1))  # Swin-like: 7x7 windows, 4 or 16 per image
    if not quick:
        yield from ((16, 64, 4, 80, 4, 4), (2, 785, 2, 128, 1, 2))


def _bias(rng: np.random.Generator, shape) -> np.ndarray:
    bias = rng.standard_normal(shape).astype(np.float32)
    bias[..., 2::3, ::2] = -100.0
    bias[..., 3::5, 1::4] = -np.inf
    bias[..., 0, :] = -np.inf  # a query that sees no key: finite output, never NaN
    return bias


def check_attention_bias(torch, lib, quick: bool, rows: list, floor: dict, timed, maxerr, tiny=False) -> bool:
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.veoAttentionForwardBias.argtypes = [vp, vp, ci, ci, vp, ci, ci, ci, ci, ci, ctypes.c_float, vp]
    f = torch.nn.functional
    ok = True
    for batch, s, h, d, nb, hb in bias_cases(quick, tiny):
        rng = np.random.default_rng(batch * 1009 + s * 31 + d)
        base = torch.from_numpy(rng.standard_normal((batch, s, 3 * h * d)).astype(np.float32)).cuda()
        bias32 = _bias(rng, (nb, hb, s, s))
        for dtype_name, dtype, code in (("float32", torch.float32, 0), ("float16", torch.float16, 1)):
            qkv = base.to(dtype)
            bias_np = bias32.astype(dtype_name)
            bias = torch.from_numpy(bias_np).cuda()
            lowest = float(np.finfo(dtype_name).min)
            mask = torch.from_numpy(np.maximum(bias_np, lowest)).cuda()[torch.arange(batch) % nb]
            ref = reference.attention(qkv.double().cpu().numpy(), bias_np, num_heads=h, head_dim=d, scale=0.2)
            out = torch.full((batch, s, h * d), float("nan"), device="cuda", dtype=dtype)
            stream = torch.cuda.current_stream().cuda_stream

            def ours():
                st = lib.veoAttentionForwardBias(
                    qkv.data_ptr(), bias.data_ptr(), nb, hb, out.data_ptr(), code, batch, s, h, d, 0.2, stream
                )
                if st != 0:
                    raise RuntimeError(lib.veoKernelLastError().decode())

            def theirs():
                q, k, v = qkv.view(batch, s, 3, h, d).permute(2, 0, 3, 1, 4)
                o = f.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(dtype), scale=0.2)
                return o.transpose(1, 2).reshape(batch, s, h * d)

            ours()
            torch.cuda.synchronize()
            written = not bool(torch.isnan(out).any())
            # both errors on the queries that see a key: SDPA's FP16 math may turn the fully masked one
            # (query 0) into NaN. That query is judged on its own: finite, and within what the clamped
            # logit allows. Its logits are score + lowest (-65504 in FP16) in FP32, whose spacing there
            # (2^-7 in log2 units) moves each weight by up to 2^-8 * ln 2 relative (2^-8 is exact in FP32,
            # whose lowest overflows the sum: every weight equal, as in the reference).
            err = maxerr(out[:, 1:], ref[:, 1:])
            err_torch = maxerr(theirs()[:, 1:], ref[:, 1:])
            err0 = maxerr(out[:, :1], ref[:, :1])
            v_max = float(qkv[..., 2 * h * d :].abs().max())
            bound0 = (2.0**-7 * np.log(2) if dtype_name == "float16" else 1e-6) * v_max
            scale = float(np.max(np.abs(ref)))
            passed = written and err <= 2 * err_torch + floor[dtype_name] * scale
            passed &= err0 <= bound0 + 2 * err_torch + floor[dtype_name] * scale
            ok &= passed
            rows.append(
                (
                    "attn+bias",
                    f"N={batch} S={s} H={h} D={d} B={nb}x{hb} q0 {err0:.0e}",
                    dtype_name,
                    err,
                    err_torch,
                    timed(torch, ours),
                    timed(torch, theirs),
                    written,
                    passed,
                )
            )
    return ok
