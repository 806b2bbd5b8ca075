"""Plugin injection across exporters, opsets and ViT variants: every attention block and the patch
embedding are replaced, and the injected graph with function bodies computes what the plain one does."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from conftest import Case
from onnx import helper as h

from veo_edge.export.parity import TorchReference
from veo_edge.surgery.inject import PluginInjection
from veo_edge.surgery.stage import reference_check

BATCHES = (1, 4)

CASES = [
    # our models: TorchScript at opsets 17 and 18, SDPA and explicit attention, 2-D and 3-D embeddings
    (Case("vit-nano"), {"num_prefix_tokens": 1, "pos_covers": "all", "has_layernorm": 1}),
    (Case("vit-nano", fused_attn=False), {"num_prefix_tokens": 1}),
    (Case("vit-nano", opset=18, fused_attn=False), {"num_prefix_tokens": 1}),
    (Case("veo-video-nano"), {"num_prefix_tokens": 0, "pos_covers": "patches", "patch_size": [2, 8, 8]}),
    (Case("veo-video-nano", opset=18, fused_attn=False), {"num_prefix_tokens": 0}),
    # dynamo (opset 18): Slice+Squeeze head split, k transposed through reshapes
    (Case("vit-nano", exporter="dynamo", opset=18), {"num_prefix_tokens": 1}),
    (Case("vit-nano", exporter="dynamo", opset=18, fused_attn=False), {"num_prefix_tokens": 1}),
    # independent definitions
    (Case("test:separate", prefix=0, pos="patches"), {"num_prefix_tokens": 0, "pos_covers": "patches"}),
    (
        Case("test:separate-nobias", prefix=1, pos="patches"),
        {"num_prefix_tokens": 1, "pos_covers": "patches"},
    ),
    (Case("test:separate", exporter="dynamo", opset=18, prefix=1), {"num_prefix_tokens": 1}),
    (Case("test:deit", prefix=2), {"num_prefix_tokens": 2, "pos_covers": "all"}),
    (Case("test:deit", prefix=2, pre_norm=False), {"num_prefix_tokens": 2, "has_layernorm": 0}),
    (Case("test:mha", prefix=1), {"num_prefix_tokens": 1}),
    (Case("test:mha", opset=18, prefix=0, pos="patches"), {"num_prefix_tokens": 0}),
]


@pytest.mark.parametrize("case, expect", CASES, ids=[c.id for c, _ in CASES])
def test_every_block_and_the_embedding_are_fused_and_proven(case, expect, export_case):
    path, net = export_case(case)
    inj = PluginInjection(net.input_shape)(onnx.load(str(path)))
    counts = inj.report.counts()
    assert counts["VeoAttention"] == {
        "candidates": case.blocks,
        "matched": case.blocks,
        "replaced": case.blocks,
    }
    assert counts["VeoPatchEmbedLayerNorm"] == {"candidates": 1, "matched": 1, "replaced": 1}
    ops = [n.op_type for n in inj.plugin_model.graph.node]
    assert ops.count("VeoAttention") == case.blocks and ops.count("VeoPatchEmbedLayerNorm") == 1
    assert "Softmax" not in ops and "Conv" not in ops
    assert len(inj.plugin_model.functions) == 0 and len(inj.reference_model.functions) == 2
    pe = next(r for r in inj.report.regions if r.op == "VeoPatchEmbedLayerNorm")
    assert {k: pe.attrs[k] for k in expect if k in pe.attrs} == {
        k: v for k, v in expect.items() if k in pe.attrs
    }
    for r in inj.report.regions:
        assert r.max_abs <= r.tolerance
    att = [r.attrs for r in inj.report.regions if r.op == "VeoAttention"]
    assert {(a["num_heads"], a["head_dim"]) for a in att} == {(2, net_head_dim(net))}
    scale = 0.5 / np.sqrt(net_head_dim(net)) if case.model == "test:deit" else 1 / np.sqrt(net_head_dim(net))
    np.testing.assert_allclose([a["scale"] for a in att], scale, rtol=1e-5)
    _assert_reference_copy_matches(inj, path, TorchReference(net), net.input_shape)


def net_head_dim(net) -> int:
    return 32 if hasattr(net, "cfg") else 24


def _assert_reference_copy_matches(inj, path, reference, input_shape):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    checks = reference_check(
        inj.reference_model, lambda x: sess.run(None, {name: x})[0], reference, input_shape, BATCHES, seed=7
    )
    assert [c["batch"] for c in checks] == list(BATCHES)
    assert all(c["passed"] for c in checks), checks
    inj.report.reference_check = checks


def test_plugin_nodes_carry_what_the_tensorrt_importer_reads(export_case):
    path, net = export_case(Case("vit-nano"))
    model = PluginInjection(net.input_shape)(onnx.load(str(path))).plugin_model
    plugins = [n for n in model.graph.node if n.op_type.startswith("Veo")]
    for n in plugins:
        attrs = {a.name: h.get_attribute_value(a) for a in n.attribute}
        assert n.domain == "trt.plugins"
        assert attrs["plugin_version"] == b"1" and attrs["plugin_namespace"] == b"veo"
    assert any(o.domain == "trt.plugins" for o in model.opset_import)
    pe = next(n for n in plugins if n.op_type == "VeoPatchEmbedLayerNorm")
    assert len(pe.input) == 3 + 1 + 1 + 2 and len(pe.output) == 2  # x, w, b, cls, pos, ln w, ln b
    onnx.checker.check_model(model)


def test_openvino_runs_the_reference_copy_once_inlined(export_case):
    """OpenVINO ignores model-local functions: inline them first."""
    import openvino as ov
    from onnx import inliner

    path, net = export_case(Case("veo-video-nano"))
    inj = PluginInjection(net.input_shape)(onnx.load(str(path)))
    inlined = inliner.inline_local_functions(inj.reference_model)
    assert not any(n.op_type.startswith("Veo") for n in inlined.graph.node)
    from veo_edge.runtime.backends.openvino_compile import compile_config, compiled_precision

    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(inlined.SerializeToString(), b""), "CPU", compile_config("f32")
    )
    assert compiled_precision(compiled) == "f32"
    x = np.random.default_rng(3).standard_normal((2, *net.input_shape)).astype(np.float32)
    got = compiled(x)[0]
    ref, out32 = TorchReference(net)(x)
    assert np.abs(got - ref).max() <= 20 * np.abs(out32 - ref).max() + 1e-5 * np.abs(ref).max()


# --- graphs built directly: the opset-23 Attention op, and regions that must be left alone -------------

S, E, H = 10, 24, 3


def _attention_graph(kind: str, opset: int = 23) -> onnx.ModelProto:
    """input (N, S, E) -> packed projection -> attention -> output projection, for ``kind``:
    "attention4d" / "attention3d" (the ONNX Attention op on 4-D heads or 3-D packed tensors),
    "masked" (a constant additive mask before the softmax), "masked4d" (the same as the Attention op's
    float attn_mask), "input_masked" / "input_masked4d" (a key mask computed from the input's values),
    "probs_out" (the probabilities are a graph output)."""
    rng = np.random.default_rng(11)
    d = E // H
    inits = [
        h.make_tensor(
            "w_qkv", onnx.TensorProto.FLOAT, [E, 3 * E], rng.standard_normal((E, 3 * E)).ravel() * 0.3
        ),
        h.make_tensor("b_qkv", onnx.TensorProto.FLOAT, [3 * E], rng.standard_normal(3 * E) * 0.1),
        h.make_tensor("w_out", onnx.TensorProto.FLOAT, [E, E], rng.standard_normal((E, E)).ravel() * 0.3),
        h.make_tensor("split5", onnx.TensorProto.INT64, [5], [0, 0, 3, H, d]),
        h.make_tensor("merge3", onnx.TensorProto.INT64, [3], [0, 0, E]),
        h.make_tensor("scale", onnx.TensorProto.FLOAT, [], [1 / np.sqrt(d)]),
        h.make_tensor("mask", onnx.TensorProto.FLOAT, [S, S], np.triu(np.full((S, S), -1e4), 1).ravel()),
        h.make_tensor("thirds", onnx.TensorProto.INT64, [3], [E, E, E]),
    ]
    nodes = [h.make_node("MatMul", ["input", "w_qkv"], ["mm"]), h.make_node("Add", ["mm", "b_qkv"], ["qkv"])]
    outputs = []
    mask = "mask"
    if kind.startswith("input_masked"):  # (N, 1, 1, S): -1e4 where a token's features sum below zero
        inits += [
            h.make_tensor("axes_e", onnx.TensorProto.INT64, [1], [2]),
            h.make_tensor("axes_key", onnx.TensorProto.INT64, [2], [1, 2]),
            h.make_tensor("zero_f", onnx.TensorProto.FLOAT, [], [0.0]),
            h.make_tensor("big_neg", onnx.TensorProto.FLOAT, [], [-1e4]),
        ]
        nodes += [
            h.make_node("ReduceSum", ["input", "axes_e"], ["tok_sum"], keepdims=0),
            h.make_node("Less", ["tok_sum", "zero_f"], ["dropped"]),
            h.make_node("Where", ["dropped", "big_neg", "zero_f"], ["key_mask"]),
            h.make_node("Unsqueeze", ["key_mask", "axes_key"], ["input_mask"]),
        ]
        mask = "input_mask"
    masked = "masked" in kind
    if kind == "attention3d":
        nodes += [
            h.make_node("Split", ["qkv", "thirds"], ["q", "k", "v"], axis=-1),
            h.make_node("Attention", ["q", "k", "v"], ["ctx"], q_num_heads=H, kv_num_heads=H, scale=0.2),
        ]
    else:
        nodes += [
            h.make_node("Reshape", ["qkv", "split5"], ["qkv5"]),
            h.make_node("Transpose", ["qkv5"], ["heads"], perm=[2, 0, 3, 1, 4]),
            h.make_node("Split", ["heads", "ones3"], ["q1", "k1", "v1"], axis=0),
            *[h.make_node("Squeeze", [f"{t}1", "zero"], [t]) for t in "qkv"],
        ]
        inits.append(h.make_tensor("zero", onnx.TensorProto.INT64, [1], [0]))
        inits.append(h.make_tensor("ones3", onnx.TensorProto.INT64, [3], [1, 1, 1]))
        if kind == "attention4d" or kind.endswith("masked4d"):
            ins = ["q", "k", "v"] + ([mask] if masked else [])
            nodes.append(h.make_node("Attention", ins, ["ctx4"], scale=0.2))
        else:
            nodes += [
                h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                h.make_node("MatMul", ["q", "kt"], ["s0"]),
                h.make_node("Mul", ["s0", "scale"], ["s1"]),
            ]
            if masked:
                nodes += [
                    h.make_node("Add", ["s1", mask], ["s2"]),
                    h.make_node("Softmax", ["s2"], ["p"], axis=-1),
                ]
            else:
                nodes.append(h.make_node("Softmax", ["s1"], ["p"], axis=-1))
                outputs.append(h.make_tensor_value_info("p", onnx.TensorProto.FLOAT, ["batch", H, S, S]))
            nodes.append(h.make_node("MatMul", ["p", "v"], ["ctx4"]))
        nodes += [
            h.make_node("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
            h.make_node("Reshape", ["ctx_t", "merge3"], ["ctx"]),
        ]
    nodes.append(h.make_node("MatMul", ["ctx", "w_out"], ["logits"]))
    graph = h.make_graph(
        nodes,
        kind,
        [h.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", S, E])],
        [h.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", S, E]), *outputs],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


class _PlainReference:
    """No torch here: the plain ONNX in ONNX Runtime is the reference, 64 ulp its baseline."""

    def __init__(self, model):
        import onnxruntime as ort

        self.sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def __call__(self, x):
        out = self.sess.run(None, {"input": x})[0].astype(np.float64)
        return out, out + 64 * np.finfo(np.float32).eps * np.abs(out).max()


@pytest.mark.parametrize("kind", ["attention4d", "attention3d", "masked4d", "masked"])
def test_the_onnx_attention_op_and_a_constant_mask_are_replaced(kind, tmp_path):
    model = _attention_graph(kind, opset=17 if kind == "masked" else 23)
    inj = PluginInjection((S, E))(model)
    assert inj.report.counts()["VeoAttention"] == {"candidates": 1, "matched": 1, "replaced": 1}
    (region,) = inj.report.regions
    assert region.anchor_op == ("Softmax" if kind == "masked" else "Attention")
    assert (region.attrs["num_heads"], region.attrs["head_dim"]) == (H, E // H)
    assert region.attrs["scale"] == pytest.approx(1 / np.sqrt(E // H) if kind == "masked" else 0.2)
    (node,) = [n for n in inj.plugin_model.graph.node if n.op_type == "VeoAttention"]
    version = next(a.s for a in node.attribute if a.name == "plugin_version")
    if "masked" in kind:  # the mask is the version-2 node's constant bias input, (1, 1, S, S)
        assert region.attrs["bias"] == [1, 1, S, S] and version == b"2" and len(node.input) == 2
        init = {i.name: i for i in inj.plugin_model.graph.initializer}[node.input[1]]
        want = np.triu(np.full((S, S), -1e4, np.float32), 1)
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init)[0, 0], want)
    else:
        assert region.attrs["bias"] is None and version == b"1" and len(node.input) == 1
    ref = _PlainReference(model)
    checks = reference_check(inj.reference_model, lambda x: ref(x)[0], ref, (S, E), BATCHES, seed=1)
    assert all(c["passed"] for c in checks), checks


@pytest.mark.parametrize(
    "kind, check, detail",
    [
        ("input_masked", "input_bias", r"added to the scores before the softmax \(Unsqueeze .*\) depends on"),
        ("input_masked4d", "input_bias", r"attn_mask \(Unsqueeze .*\) depends on the input's values"),
        ("probs_out", "contained", r"intermediate result of the region \(Softmax"),
    ],
)
def test_regions_that_are_not_plain_attention_are_left_with_the_reason(kind, check, detail):
    model = _attention_graph(kind, opset=23 if kind.endswith("4d") else 17)
    inj = PluginInjection((S, E))(model)
    (region,) = inj.report.regions
    assert not region.replaced and region.check == check
    assert re.search(detail, region.detail), region.detail
    assert "NOTHING MATCHED" in inj.report.lines()[-1]
    anchor_op = "Attention" if kind.endswith("4d") else "Softmax"
    assert [n.op_type for n in inj.plugin_model.graph.node].count(anchor_op) == 1
    (left,) = inj.report.families()["attention"]["left_alone"]
    assert (left["check"], left["count"]) == (check, 1)
    advice = {"input_bias": "depends on the input", "contained": "read outside the region"}[check]
    assert advice in left["why"]
    assert any(line.startswith(f"  attention left alone (1×): {check}: ") for line in inj.report.lines())


def test_a_classifier_softmax_and_a_stem_conv_are_reported_not_fused(export_case, tmp_path):
    """A softmax over logits is attention-like only by its op type; the report says which check failed."""
    import torch

    _path, net = export_case(Case("vit-nano"))

    class WithProbs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 3, 3, padding=1)
            self.net = net

        def forward(self, x):
            return self.net(self.stem(x)).softmax(-1)

    from veo_edge.export.onnx_export import OnnxExport

    p = OnnxExport()(WithProbs().eval(), net.input_shape, tmp_path / "probs.onnx")
    report = PluginInjection(net.input_shape)(onnx.load(str(p))).report
    assert report.counts()["VeoAttention"] == {"candidates": 3, "matched": 2, "replaced": 2}
    assert report.counts()["VeoPatchEmbedLayerNorm"] == {"candidates": 2, "matched": 1, "replaced": 1}
    left = {(r.anchor_op, r.check) for r in report.regions if not r.replaced}
    assert left == {("Softmax", "scores_matmul"), ("Conv", "patchify_conv")}
