"""The surgery stage inside ``veo-edge build``: artifacts, manifest, report, ``inspect``, ``--no-plugins``,
``--onnx`` files made elsewhere, and a build where nothing matches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest
import torch
from conftest import Case

from veo_edge.builddir import BuildDir
from veo_edge.export.source import BuiltinSource, OnnxSource
from veo_edge.pipeline.build import BuildOptions, run_build
from veo_edge.surgery.report import SurgeryReport


def veo(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "veo_edge", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def _assert_fused(build, blocks: int) -> SurgeryReport:
    b = BuildDir.open(build)
    b.verify(["plugins_onnx", "surgery_report"])
    assert b.manifest["surgery"]["counts"] == {
        "VeoPatchEmbedLayerNorm": {"candidates": 1, "matched": 1, "replaced": 1},
        "VeoAttention": {"candidates": blocks, "matched": blocks, "replaced": blocks},
    }
    model = onnx.load(str(b.artifact("plugins_onnx")))
    assert len(model.functions) == 0  # TensorRT must see the plugins, not local functions
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("VeoAttention") == blocks and ops.count("VeoPatchEmbedLayerNorm") == 1
    report = SurgeryReport.read(b.artifact("surgery_report"))
    assert [c["batch"] for c in report.reference_check] == [1, b.max_batch]
    assert all(c["passed"] and c["max_abs"] <= c["tolerance"] for c in report.reference_check)
    assert b.manifest["surgery"]["reference_max_abs"] == max(c["max_abs"] for c in report.reference_check)
    return report


def test_nano_build_is_fused_and_proven(nano_build):
    report = _assert_fused(nano_build, 2)
    pe = next(r for r in report.regions if r.op == "VeoPatchEmbedLayerNorm")
    assert pe.attrs["patch_size"] == [8, 8] and pe.attrs["num_prefix_tokens"] == 1


def test_video_nano_build_fuses_the_tubelet_embedding(video_nano_build):
    report = _assert_fused(video_nano_build, 2)
    pe = next(r for r in report.regions if r.op == "VeoPatchEmbedLayerNorm")
    assert pe.attrs["patch_size"] == [2, 8, 8] and pe.attrs["num_prefix_tokens"] == 0


def test_inspect_shows_the_report(nano_build):
    r = veo("inspect", str(nano_build))
    assert r.returncode == 0, r.stderr
    assert "Plugin surgery" in r.stdout and "VeoAttention" in r.stdout
    assert "reference check batch 8" in r.stdout
    r = veo("inspect", str(nano_build), "--json")
    data = json.loads(r.stdout)
    assert data["surgery"]["counts"]["VeoAttention"]["replaced"] == 2
    assert "plugins_onnx" in data["artifacts"]


def test_inspect_of_a_non_build_says_so(tmp_path):
    r = veo("inspect", str(tmp_path))
    assert r.returncode == 7 and "is not a veo-edge build directory" in r.stderr


def test_no_plugins_skips_the_stage(tmp_path):
    res = run_build(
        BuildOptions(
            source=BuiltinSource("vit-nano"), out=tmp_path / "b", quiet=True, max_batch=2, plugins=False
        )
    )
    assert "surgery" not in res.manifest and "surgery" not in res.manifest["timings_s"]
    assert not {"plugins_onnx", "surgery_report"} & set(res.manifest["artifacts"])
    r = veo("inspect", str(tmp_path / "b"))
    assert "no plugin surgery in this build" in r.stdout


def test_a_model_where_nothing_matches_still_builds_and_says_so_loudly(tmp_path):
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    ).eval()  # fmt: skip
    from veo_edge.export.onnx_export import OnnxExport

    path = OnnxExport()(net, (3, 16, 16), tmp_path / "cnn.onnx")
    res = run_build(BuildOptions(source=OnnxSource(path), out=tmp_path / "b", quiet=True, max_batch=2))
    assert any("plugin injection matched nothing" in n for n in res.notes)
    assert "plugins_onnx" not in res.manifest["artifacts"] and "openvino_xml" in res.manifest["artifacts"]
    assert res.manifest["surgery"]["replaced"] == 0
    report = SurgeryReport.read(tmp_path / "b" / "surgery_report.json")
    (conv,) = report.regions
    assert (conv.anchor_op, conv.check) == ("Conv", "patchify_conv")
    assert "NOTHING MATCHED" in report.lines()[-1]


def test_build_from_an_onnx_made_elsewhere_fuses_an_mha_vit(export_case, tmp_path):
    path, _ = export_case(Case("test:mha", prefix=1))
    r = veo("build", "--onnx", str(path), "--out", str(tmp_path / "b"), "--max-batch", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "VeoAttention: 2 replaced of 2 matched" in r.stdout
    assert "VeoPatchEmbedLayerNorm: 1 replaced of 1 matched" in r.stdout
    _assert_fused(tmp_path / "b", 2)


@pytest.mark.slow
def test_vit_tiny_fuses_every_block(tmp_path):
    res = run_build(BuildOptions(source=BuiltinSource("vit-tiny"), out=tmp_path / "vit-tiny", quiet=True))
    _assert_fused(res.path, 12)


@pytest.mark.slow
def test_video_tiny_fuses_every_block(video_tiny_build):
    _assert_fused(video_tiny_build, 12)
