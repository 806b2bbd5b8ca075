import json
import textwrap

import numpy as np
import onnx
import pytest

from veo_edge.builddir import BuildDir, sha256_file
from veo_edge.errors import BuildDirError, InputError, OutputExistsError, ParityError, UsageError
from veo_edge.export.source import BuiltinSource, ModuleSource, OnnxSource
from veo_edge.pipeline.build import BuildOptions, run_build


@pytest.mark.parametrize(
    ("fixture", "config"),
    [
        ("nano_build", {"embed_dim": 64, "num_classes": 10}),
        ("video_nano_build", {"embed_dim": 64, "num_classes": 10, "num_frames": 4}),
        ("video_tiny_build", {"embed_dim": 192, "depth": 12, "num_classes": 400, "num_frames": 8}),
    ],
)
def test_manifest_indexes_every_artifact_with_its_checksum(fixture, config, request):
    path = request.getfixturevalue(fixture)
    build = BuildDir.open(path)
    m = build.manifest
    assert {"onnx", "openvino_xml", "openvino_bin", "canary_input", "canary_expected"} <= set(m["artifacts"])
    for kind, entry in m["artifacts"].items():
        file = path / entry["path"]
        assert file.is_file(), kind
        assert entry["bytes"] == file.stat().st_size
        assert entry["sha256"] == sha256_file(file)
    build.verify()
    assert m["max_batch"] == 8
    assert m["inputs"][0]["shape"][0] == -1 and m["inputs"][0]["dtype"] == "float32"
    assert m["outputs"][0]["shape"] == [-1, config["num_classes"]]
    assert set(m["versions"]) >= {"torch", "onnx", "onnxruntime", "openvino", "veo-edge"}
    assert set(m["timings_s"]) >= {"load", "export", "openvino", "parity", "canary"}
    assert {(p["candidate"], p["batch"]) for p in m["parity"]} == {
        ("onnxruntime", 1), ("onnxruntime", 8), ("openvino", 1), ("openvino", 8)
    }  # fmt: skip
    assert all(p["passed"] and p["max_abs"] <= p["tolerance"] for p in m["parity"])
    assert config.items() <= m["model"]["config"].items()


def test_exported_onnx_has_a_dynamic_batch_and_a_modern_opset(nano_build):
    model = onnx.load(str(nano_build / "model.onnx"))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    dim0 = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param and not dim0.dim_value


@pytest.mark.parametrize(
    ("fixture", "input_shape", "classes"),
    [("nano_build", (3, 32, 32), 10), ("video_tiny_build", (3, 8, 112, 112), 400)],
)
def test_canary_reproduces_on_both_cpu_backends(fixture, input_shape, classes, request):
    from veo_edge.runtime.loaders import cpu_runner

    path = request.getfixturevalue(fixture)
    build = BuildDir.open(path)
    x = np.load(path / "canary" / "input.npy")
    expected = np.load(path / "canary" / "expected.npy")
    assert x.shape == (1, *input_shape) and expected.shape == (1, classes)
    for backend in ("openvino", "onnxruntime"):
        with cpu_runner(build, backend) as runner:
            got = next(iter(runner.infer(x).values()))
        assert np.abs(got - expected).max() <= build.manifest["canary"]["atol"]


def test_runner_rejects_wrong_inputs(nano_build):
    from veo_edge.runtime.loaders import cpu_runner

    with cpu_runner(BuildDir.open(nano_build), "openvino") as runner:
        with pytest.raises(
            InputError, match=r"has shape \(1, 3, 16, 16\), expected input: float32\[N, 3, 32, 32\]"
        ):
            runner.infer(np.zeros((1, 3, 16, 16), np.float32))
        with pytest.raises(InputError, match=r"has dtype float64, expected float32"):
            runner.infer(np.zeros((1, 3, 32, 32)))
        with pytest.raises(InputError, match=r"has batch 9, expected 1\.\.8"):
            runner.infer(np.zeros((9, 3, 32, 32), np.float32))
        with pytest.raises(InputError, match=r"do not match the model's inputs \['input'\]"):
            runner.infer({"pixels": np.zeros((1, 3, 32, 32), np.float32)})


def test_existing_output_needs_force(nano_build, tmp_path):
    with pytest.raises(OutputExistsError, match="already exists; pass --force"):
        run_build(BuildOptions(source=BuiltinSource("vit-nano"), out=nano_build, quiet=True))


def test_force_replaces_a_build_and_leaves_no_staging_dirs(tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"schema_version": 1, "artifacts": {}}))
    (out / "stale.txt").write_text("old")
    run_build(BuildOptions(source=BuiltinSource("vit-nano"), out=out, force=True, quiet=True, max_batch=2))
    assert not (out / "stale.txt").exists()
    assert BuildDir.open(out).max_batch == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_fp16_build_compresses_the_openvino_weights(tmp_path):
    r16 = run_build(
        BuildOptions(source=BuiltinSource("vit-nano"), out=tmp_path / "f16", fp16=True, quiet=True)
    )
    r32 = run_build(BuildOptions(source=BuiltinSource("vit-nano"), out=tmp_path / "f32", quiet=True))
    assert r16.manifest["precision"] == "fp16"
    bin16 = r16.manifest["artifacts"]["openvino_bin"]["bytes"]
    bin32 = r32.manifest["artifacts"]["openvino_bin"]["bytes"]
    assert bin16 < 0.6 * bin32
    assert 'element_type="f16"' in (tmp_path / "f16" / "openvino" / "model.xml").read_text()
    # the FP16 artifact is held to the FP16-weight baseline, not the FP32 one
    p16 = [p for p in r16.manifest["parity"] if p["candidate"] == "openvino"]
    p32 = [p for p in r32.manifest["parity"] if p["candidate"] == "openvino"]
    assert all(a["baseline"] > b["baseline"] for a, b in zip(p16, p32, strict=True))


def test_max_batch_is_validated():
    with pytest.raises(UsageError, match="--max-batch 0 is out of range"):
        BuildOptions(source=BuiltinSource("vit-nano"), max_batch=0)


@pytest.fixture
def branchy_pkg(tmp_path, monkeypatch):
    """A model whose Python control flow depends on the data: tracing bakes in one branch, so the ONNX
    export is wrong for other inputs — a real parity failure."""
    (tmp_path / "branchy.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Branchy(nn.Module):
                input_shape = (4,)
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 3)
                def forward(self, x):
                    if float(x.abs().sum()) > 0:  # traced with zeros: the export keeps the else branch
                        return self.fc(x) * 3.0
                    return self.fc(x)

            def make():
                torch.manual_seed(0)
                return Branchy()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_parity_failure_refuses_the_build_and_leaves_nothing(branchy_pkg, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ParityError, match=r"parity check failed.*max abs .* \(tolerance .*\)"):
        run_build(BuildOptions(source=ModuleSource("branchy:make"), out=out, quiet=True, max_batch=4))
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_build_from_an_existing_onnx(nano_build, tmp_path):
    result = run_build(
        BuildOptions(source=OnnxSource(nano_build / "model.onnx"), out=tmp_path / "ext", quiet=True)
    )
    m = result.manifest
    assert m["model"]["name"] == "model" and m["export"]["exporter"] == "external"
    assert [p["candidate"] for p in m["parity"]] == ["openvino", "openvino"]
    expected = np.load(tmp_path / "ext" / "canary" / "expected.npy")
    # same network, same canary seed: the golden output agrees with the torch-made one
    np.testing.assert_allclose(expected, np.load(nano_build / "canary" / "expected.npy"), atol=1e-4)


def test_open_rejects_non_builds_and_corrupt_artifacts(nano_build, copy_build, tmp_path):
    with pytest.raises(BuildDirError, match="does not exist; run `veo-edge build` first"):
        BuildDir.open(tmp_path / "missing")
    with pytest.raises(BuildDirError, match=r"has no manifest\.json"):
        BuildDir.open(tmp_path)
    broken = copy_build(nano_build)
    (broken / "canary" / "expected.npy").write_bytes(b"tampered")
    with pytest.raises(BuildDirError, match=r"was modified after it was built: canary/expected\.npy has"):
        BuildDir.open(broken).verify()
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(BuildDirError, match="unreadable or corrupt"):
        BuildDir.open(broken)
    (broken / "manifest.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(BuildDirError, match="schema version 99"):
        BuildDir.open(broken)


def test_build_records_the_plugin_library_when_one_is_present(tmp_path, monkeypatch):
    from veo_edge.builddir import sha256_file

    lib = tmp_path / "libveo_edge_plugins.so"
    lib.write_bytes(b"\x7fELF stand-in for a library built where TensorRT is")
    monkeypatch.setenv("VEO_EDGE_PLUGIN_LIB", str(lib))
    out = tmp_path / "b"
    m = run_build(BuildOptions(source=BuiltinSource("vit-nano"), out=out, quiet=True, max_batch=2)).manifest
    assert m["plugin_library"] == {"path": str(lib), "sha256": sha256_file(lib), "bytes": lib.stat().st_size}
    assert BuildDir.open(out).manifest["plugin_library"]["sha256"] == sha256_file(lib)
