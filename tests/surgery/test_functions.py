"""The ops' ONNX-function bodies (run in ONNX Runtime) against the plain-numpy reference written from the
specs. Tolerance: K times the error of an independent float32 computation (torch) of the same op."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from veo_edge.export.parity import FLOOR_REL
from veo_edge.surgery import reference
from veo_edge.surgery.functions import (
    PatchEmbedLayout,
    attention_function,
    mark_overloads,
    op_model,
    patch_embed_function,
)
from veo_edge.surgery.spec import attention_spec, patch_embed_spec

K = 8.0


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _within(got, ref, base):
    err = float(np.abs(got.astype(np.float64) - ref).max())
    tol = K * float(np.abs(base.astype(np.float64) - ref).max()) + FLOOR_REL * float(np.abs(ref).max())
    assert err <= tol, f"max abs {err:.3g} > tolerance {tol:.3g}"


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("seq", [17, 50])
@pytest.mark.parametrize("heads, head_dim", [(3, 64), (2, 48), (4, 80)])
@pytest.mark.parametrize("scale", [0.0, 0.3])
@pytest.mark.parametrize("opset", [17, 23])
def test_attention_body_matches_the_reference(batch, seq, heads, head_dim, scale, opset):
    rng = np.random.default_rng(seq * 100 + head_dim)
    qkv = rng.standard_normal((batch, seq, 3 * heads * head_dim)).astype(np.float32)
    node = attention_spec().make_onnx_node(["qkv"], ["out"], num_heads=heads, head_dim=head_dim, scale=scale)
    (got,) = _run(op_model(node, attention_function(opset), {"qkv": qkv}, opset), {"qkv": qkv})
    ref = reference.attention(qkv, num_heads=heads, head_dim=head_dim, scale=scale)
    q, k, v = torch.from_numpy(qkv).reshape(batch, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    base = (
        F.scaled_dot_product_attention(q, k, v, scale=scale or None).transpose(1, 2).reshape(batch, seq, -1)
    )
    assert got.shape == (batch, seq, heads * head_dim)
    _within(got, ref, base.numpy())


def _masked_bias(rng, shape):
    """A relative-position-like bias with a Swin-like mask: -100 and -inf entries, and the first query
    row of every table masked entirely (such a row must come out finite, not NaN)."""
    bias = rng.standard_normal(shape).astype(np.float32)
    bias[..., 1::3, ::2] = -100.0
    bias[..., 2::5, 1::4] = -np.inf
    bias[..., 0, :] = -np.inf
    return bias


@pytest.mark.parametrize("bias_batch, bias_heads", [(1, 2), (3, 1), (3, 2)])
@pytest.mark.parametrize("opset", [17, 23])
def test_attention_v2_body_adds_the_bias_row_n_mod_b(bias_batch, bias_heads, opset):
    """Version 2: batch n adds bias row n mod B (Swin's windows of each image), heads broadcast."""
    batch, seq, heads, head_dim, scale = 6, 17, 2, 48, 0.3
    rng = np.random.default_rng(bias_batch * 10 + bias_heads)
    qkv = rng.standard_normal((batch, seq, 3 * heads * head_dim)).astype(np.float32)
    bias = _masked_bias(rng, (bias_batch, bias_heads, seq, seq))
    node = attention_spec().make_onnx_node(
        ["qkv", "bias"], ["out"], version="2", num_heads=heads, head_dim=head_dim, scale=scale
    )
    feeds = {"qkv": qkv, "bias": bias}
    (got,) = _run(op_model(node, attention_function(opset, "2"), feeds, opset), feeds)
    ref = reference.attention(qkv, bias, num_heads=heads, head_dim=head_dim, scale=scale)
    assert np.isfinite(got).all() and np.isfinite(ref).all()
    q, k, v = torch.from_numpy(qkv).reshape(batch, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    mask = torch.from_numpy(np.maximum(bias, np.finfo(np.float32).min))[torch.arange(batch) % bias_batch]
    base = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    _within(got, ref, base.transpose(1, 2).reshape(batch, seq, -1).numpy())
    # the fully masked first query row: every key gets the same weight (float32's lowest everywhere)
    v_mean = qkv[:, :, 2 * heads * head_dim :].mean(axis=1)
    np.testing.assert_allclose(got[:, 0], v_mean, rtol=1e-5, atol=1e-6)


def test_version_1_and_version_2_nodes_run_side_by_side():
    """A graph with both versions: each node runs its own body (function overloads), v1 unchanged."""
    import onnx
    from onnx import helper as h

    heads, head_dim, seq = 2, 32, 9
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((4, seq, 3 * heads * head_dim)).astype(np.float32)
    bias = _masked_bias(rng, (2, heads, seq, seq))
    att = attention_spec()
    v1 = att.make_onnx_node(["qkv"], ["out1"], version="1", num_heads=heads, head_dim=head_dim)
    v2 = att.make_onnx_node(["qkv", "bias"], ["out2"], version="2", num_heads=heads, head_dim=head_dim)
    f32 = onnx.TensorProto.FLOAT
    graph = h.make_graph(
        [v1, v2],
        "both",
        [h.make_tensor_value_info("qkv", f32, ["n", seq, 3 * heads * head_dim])],
        [h.make_tensor_value_info(o, f32, None) for o in ("out1", "out2")],
        [onnx.numpy_helper.from_array(bias, "bias")],
    )
    model = h.make_model(
        graph,
        opset_imports=[h.make_opsetid("", 17), h.make_opsetid(att.domain, 1)],
        functions=[attention_function(17, "1"), attention_function(17, "2")],
        ir_version=10,
    )
    assert mark_overloads(model)
    assert [n.overload for n in model.graph.node] == ["", "v2"]
    out1, out2 = _run(model, {"qkv": qkv})
    # each node computes exactly what its version's body computes alone
    alone1 = op_model(v1, attention_function(17, "1"), {"qkv": qkv}, 17)
    alone2 = op_model(v2, attention_function(17, "2"), {"qkv": qkv, "bias": bias}, 17)
    np.testing.assert_array_equal(out1, _run(alone1, {"qkv": qkv})[0])
    np.testing.assert_array_equal(out2, _run(alone2, {"qkv": qkv, "bias": bias})[0])
    assert np.abs(out1 - out2).max() > 0.1  # the bias matters


PE_CASES = [
    # (patch, spatial, prefix, pos, layernorm)
    ((8, 8), (32, 32), 1, "all", True),  # ViT: cls + learned table over all tokens
    ((8, 8), (24, 40), 2, "all", True),  # DeiT: cls + dist, non-square image
    ((8, 8), (32, 32), 1, "patches", True),  # table over the patches only, before the prefix
    ((2, 8, 8), (4, 32, 32), 0, "patches", True),  # video tubelets, sincos table, no prefix
    ((2, 8, 8), (4, 16, 24), 0, "", False),  # no table, no LayerNorm
    ((4, 4), (12, 12), 2, "", True),
]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case", PE_CASES, ids=lambda c: f"p{c[0]}-s{c[1]}-P{c[2]}-pos_{c[3] or 'none'}-ln{int(c[4])}"
)
def test_patch_embed_body_matches_the_reference(case, batch):
    patch, spatial, prefix, pos_covers, ln = case
    rng = np.random.default_rng(len(patch) * 10 + prefix)
    c, e = 3, 40
    x = rng.standard_normal((batch, c, *spatial)).astype(np.float32)
    w = (rng.standard_normal((e, c, *patch)) / np.sqrt(c * np.prod(patch))).astype(np.float32)
    b = rng.standard_normal(e).astype(np.float32) * 0.1
    num = int(np.prod([s // p for s, p in zip(spatial, patch, strict=True)]))
    arrays = {"x": x, "weight": w, "bias": b}
    if prefix:
        arrays["prefix_tokens"] = rng.standard_normal((1, prefix, e)).astype(np.float32)
    if pos_covers:
        arrays["pos_embed"] = rng.standard_normal(
            (1, num + (prefix if pos_covers == "all" else 0), e)
        ).astype(np.float32)
    if ln:
        arrays["ln_weight"] = rng.standard_normal(e).astype(np.float32)
        arrays["ln_bias"] = rng.standard_normal(e).astype(np.float32)
    lay = PatchEmbedLayout(prefix, bool(pos_covers), pos_covers, ln)
    node = patch_embed_spec().make_onnx_node(
        lay.input_names(), lay.output_names(), patch_size=list(patch), in_channels=c, embed_dim=e,
        num_prefix_tokens=prefix, has_pos_embed=int(bool(pos_covers)), has_layernorm=int(ln), epsilon=1e-5,
    )  # fmt: skip
    got = _run(op_model(node, patch_embed_function(lay, 17), arrays, 17), arrays)
    refs = reference.patch_embed_layernorm(
        x, w, b, arrays.get("prefix_tokens"), arrays.get("pos_embed"), arrays.get("ln_weight"),
        arrays.get("ln_bias"), patch_size=patch, epsilon=1e-5,
    )  # fmt: skip
    conv = F.conv2d if len(patch) == 2 else F.conv3d
    t = (
        conv(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=patch)
        .flatten(2)
        .transpose(1, 2)
    )
    if pos_covers == "patches":
        t = t + torch.from_numpy(arrays["pos_embed"])
    if prefix:
        t = torch.cat([torch.from_numpy(arrays["prefix_tokens"]).expand(batch, -1, -1), t], 1)
    if pos_covers == "all":
        t = t + torch.from_numpy(arrays["pos_embed"])
    bases = [t]
    if ln:
        bases.append(
            F.layer_norm(
                t, (e,), torch.from_numpy(arrays["ln_weight"]), torch.from_numpy(arrays["ln_bias"]), 1e-5
            )
        )
    assert len(got) == len(bases) == (2 if ln else 1)
    for g, r, base in zip(got, refs, bases, strict=False):
        assert g.shape == (batch, prefix + num, e)
        _within(g, r, base.numpy())
