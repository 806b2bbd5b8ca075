"""Canonicalization before matching: each pattern that kept real exports from fusing (tests/surgery/
cause_models.py) now fuses fully with both exporters, and the injected graph computes what PyTorch does.

The matrix is lean on purpose: dynamo exports take seconds each, so TorchScript exports every cause on
its own and dynamo exports one model with all of them (plus the divided space-time video ViT)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from cause_models import CAUSES, build

from veo_edge.export.parity import TorchReference
from veo_edge.surgery.canonical import Canonicalize
from veo_edge.surgery.inject import PluginInjection
from veo_edge.surgery.stage import reference_check

BATCHES = (1, 4)
MATRIX = [(c, "torchscript") for c in CAUSES] + [
    ("all", "torchscript"),
    ("all", "dynamo"),
    ("divided", "torchscript"),
    ("divided", "dynamo"),
]

#: what each cause leaves in a TorchScript export, and how the graph as exported fails to fuse
RAW = {
    "softmax_cast": ("Cast", "context_matmul"),
    "zero_mask": ("Where", None),  # as exported it fuses too: an all-zero bias (v2) is no bias (v1)
    "pos_resize": ("Resize", None),
    "grid_reads": ("Shape", "contained"),
    "ln_bias_zero": ("Identity", "has_layernorm"),
    "cls_1d": ("Expand", "prefix_tokens"),
    "qkv_bias_zero": ("Identity", "separate_projections"),
}


@pytest.fixture(scope="module")
def cause_export(tmp_path_factory: pytest.TempPathFactory):
    """``cause_export(causes, exporter) -> (onnx path, module)``, each exported once per module."""
    import torch

    from veo_edge.export.onnx_export import OnnxExport

    cache: dict[tuple[str, str], tuple[Path, torch.nn.Module]] = {}
    root = tmp_path_factory.mktemp("cause-exports")

    def _export(causes: str, exporter: str):
        key = (causes, exporter)
        if key not in cache:
            net = build(causes)
            path = root / f"{causes}-{exporter}.onnx"
            opset = 18 if exporter == "dynamo" else 17
            OnnxExport(opset=opset, exporter=exporter, max_batch=4)(net, net.input_shape, path)
            cache[key] = (path, net)
        return cache[key]

    return _export


@pytest.mark.parametrize("causes, exporter", MATRIX, ids=[f"{c}-{e}" for c, e in MATRIX])
def test_every_region_fuses_and_the_injected_graph_matches_pytorch(causes, exporter, cause_export):
    path, net = cause_export(causes, exporter)
    inj = PluginInjection(net.input_shape)(onnx.load(str(path)))
    counts = inj.report.counts()
    blocks = 4 if causes == "divided" else 2
    assert counts["VeoAttention"] == {"candidates": blocks, "matched": blocks, "replaced": blocks}, (
        inj.report.lines()
    )
    assert counts["VeoPatchEmbedLayerNorm"] == {"candidates": 1, "matched": 1, "replaced": 1}
    (pe,) = (r for r in inj.report.regions if r.op == "VeoPatchEmbedLayerNorm")
    assert pe.attrs["has_layernorm"] == 1
    assert pe.attrs["num_prefix_tokens"] == (0 if causes == "divided" else 1)
    ops = Counter(n.op_type for n in inj.plugin_model.graph.node)
    assert ops["VeoAttention"] == blocks and ops["VeoPatchEmbedLayerNorm"] == 1
    assert not {"Softmax", "Conv", "Identity", "Dropout", "Resize"} & set(ops)
    # the artifact keeps the dynamic batch axis, and the checks run at batch 1 and 4
    dim0 = inj.plugin_model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.dim_value
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    checks = reference_check(
        inj.reference_model,
        lambda x: sess.run(None, {name: x})[0].astype(np.float64),
        TorchReference(net),
        net.input_shape,
        BATCHES,
        seed=5,
    )
    assert [c["batch"] for c in checks] == list(BATCHES) and all(c["passed"] for c in checks)


@pytest.mark.parametrize("cause", CAUSES)
def test_the_torchscript_export_holds_the_cause(cause, cause_export):
    """The matrix tests what it claims: the export carries the pattern, and (where the pattern did block
    fusion) the graph as exported, not canonicalized, does not fuse fully."""
    path, net = cause_export(cause, "torchscript")
    model = onnx.load(str(path))
    op, check = RAW[cause]
    assert op in {n.op_type for n in model.graph.node}
    canon = Canonicalize(net.input_shape)(model)
    canonical_ops = Counter(n.op_type for n in canon.model.graph.node)
    assert canonical_ops["Identity"] == 0 and canonical_ops["Resize"] == 0
    if check is None:
        return
    raw = PluginInjection(net.input_shape, canonicalize=False)(model).report
    if check == "has_layernorm":
        (pe,) = (r for r in raw.regions if r.op == "VeoPatchEmbedLayerNorm")
        assert pe.attrs["has_layernorm"] == 0
    else:
        assert check in {r.check for r in raw.regions if not r.replaced}, raw.lines()


def test_canonicalization_keeps_what_the_model_computes(cause_export):
    """The canonical graph (what model.plugins.onnx is made from) computes what the export computes, at
    batches other than the ones its shapes were analysed at."""
    import onnxruntime as ort

    path, net = cause_export("all", "torchscript")
    model = onnx.load(str(path))
    canon = Canonicalize(net.input_shape)(model)
    assert canon.node_count() < len(model.graph.node) / 2
    assert canon.removed["no-op Add"] >= 2 and canon.removed["no-op Cast"] >= 2
    plain = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(canon.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, *net.input_shape)).astype(np.float32)
        want = plain.run(None, {"input": x})[0]
        got = ours.run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # batch-dependent dims are known as such, static ones are numbers
    assert canon.shapes["input"] == [None, *net.input_shape]


def _noop_graph() -> onnx.ModelProto:
    """x (N, 4, 6) through every no-op the passes remove, then a real Mul; plus Shape(x, start=1) read
    into a Reshape (the opset-15 attributes onnx-graphsurgeon's folding ignores)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    f = lambda n, v: h.make_tensor(n, T.FLOAT, [len(v)], v)  # noqa: E731
    i = lambda n, v: h.make_tensor(n, T.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        h.make_node("Identity", ["x"], ["a"]),
        h.make_node("Dropout", ["a", "ratio"], ["b"]),
        h.make_node("Cast", ["b"], ["c"], to=T.FLOAT),
        h.make_node("Expand", ["c", "ones3"], ["d"]),
        h.make_node("Shape", ["x"], ["shape"]),
        h.make_node("ConstantOfShape", ["shape"], ["zeros"], value=h.make_tensor("z", T.FLOAT, [1], [0.0])),
        h.make_node("Add", ["d", "zeros"], ["e"]),
        h.make_node("ConstantOfShape", ["shape"], ["yes"], value=h.make_tensor("t", T.BOOL, [1], [True])),
        h.make_node("Where", ["yes", "e", "minus"], ["g"]),
        h.make_node("Mul", ["g", "two"], ["m"]),
        h.make_node("Shape", ["m"], ["tail"], start=1),
        h.make_node("Concat", ["minus_one", "tail"], ["flat_shape"], axis=0),
        h.make_node("Reshape", ["m", "flat_shape"], ["y"]),
    ]
    inits = [i("ones3", [1, 1, 1]), f("minus", [-1.0]), f("two", [2.0]), i("minus_one", [-1])]
    inits.append(h.make_tensor("ratio", T.FLOAT, [], [0.3]))
    graph = h.make_graph(
        nodes,
        "noops",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 4, 6])],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def test_the_passes_remove_every_no_op_and_keep_the_values():
    import onnxruntime as ort

    model = _noop_graph()
    canon = Canonicalize((4, 6))(model)
    ops = Counter(n.op_type for n in canon.model.graph.node)
    assert not {"Identity", "Dropout", "Cast", "Expand", "Add", "Where", "ConstantOfShape"} & set(ops), ops
    assert ops["Mul"] == 1
    for key in ("no-op Identity", "no-op Dropout", "no-op Cast", "no-op Expand", "no-op Add", "no-op Where"):
        assert canon.removed.get(key) == 1, canon.removed
    assert canon.shapes["m"] == [None, 4, 6]
    x = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    sess = ort.InferenceSession(canon.model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(want[0], 2 * x)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])
    np.testing.assert_array_equal(sess.run(None, {"x": x[:1]})[0], 2 * x[:1])  # the batch stays dynamic
