"""TensorRT 11 FP16 with plugins: the plain ONNX is converted first, then the plugins are injected into
the converted graph (the converter runs the graph in ONNX Runtime, which cannot run the Veo ops)."""

from __future__ import annotations

import onnx

from veo_edge.builddir import BuildDir
from veo_edge.runtime.backends import tensorrt_engine as trt_engine


def test_fp16_converts_the_plain_graph_then_injects_the_plugins(nano_build, tmp_path):
    build = BuildDir.open(nano_build)
    converted = []

    def convert(src):  # stands in for ModelOpt's FP16 conversion: records what it was given
        converted.append(src)
        return onnx.load(str(src))

    out = trt_engine.fp16_sources(build, tmp_path / "fp16", convert=convert)
    assert converted == [build.artifact("onnx")]  # never plugins_onnx: ORT cannot run the Veo ops
    ops = {n.op_type for n in onnx.load(str(out["plugins"])).graph.node}
    assert {"VeoAttention", "VeoPatchEmbedLayerNorm"} <= ops  # the real injection, on the converted graph
    assert not {"VeoAttention", "VeoPatchEmbedLayerNorm"} & {
        n.op_type for n in onnx.load(str(out["plain"])).graph.node
    }


def test_an_fp16_graph_the_plugins_do_not_match_keeps_the_plain_fp16_engine(
    nano_build, tmp_path, backend_log
):
    build = BuildDir.open(nano_build)

    def refuse(model, shape):
        raise ValueError("no region matched")

    out = trt_engine.fp16_sources(
        build, tmp_path / "fp16", convert=lambda src: onnx.load(str(src)), inject=refuse
    )
    assert set(out) == {"plain"} and out["plain"].is_file()
    assert any(
        "could not inject the plugins into the FP16 graph (ValueError: no region matched)" in m
        for m in backend_log
    )
