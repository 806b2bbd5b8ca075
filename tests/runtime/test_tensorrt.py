"""The TensorRT backend as far as it runs without TensorRT: the skip path, the engine source, the key."""

import json
from pathlib import Path

import pytest

import veo_edge
from veo_edge.builddir import BuildDir
from veo_edge.engine.config import EngineConfig
from veo_edge.errors import BackendUnavailableError, NoBackendError
from veo_edge.runtime.backends import tensorrt as trt_backend
from veo_edge.runtime.policy import check_gpu_memory

MIB = 1 << 20


@pytest.fixture(scope="module")
def no_tensorrt():
    from veo_edge.runtime.probes import probe_tensorrt

    if probe_tensorrt().ok:
        pytest.skip("TensorRT is importable here; these tests pin the machine without it")


def test_constructing_the_runner_touches_nothing(nano_build):
    runner = trt_backend.TensorRtRunner.for_build(BuildDir.open(nano_build), gpu_memory_budget=MIB)
    assert not runner.is_active and runner.config.max_batch == 8 and runner.config.precision == "fp32"


def test_activation_without_tensorrt_says_what_to_do(nano_build, no_tensorrt):
    runner = trt_backend.TensorRtRunner(BuildDir.open(nano_build))
    with pytest.raises(
        BackendUnavailableError,
        match=r"TensorRT is not importable .*No module named 'tensorrt'.*--backend openvino",
    ):
        runner.activate()


def test_probe_without_tensorrt_is_a_skip_with_the_reason(nano_build, no_tensorrt):
    v = trt_backend.probe(BuildDir.open(nano_build), free=64 << 30, budget=None, check=check_gpu_memory)
    assert not v.ok and v.reason.startswith("TensorRT is not importable")


def test_forced_tensorrt_on_this_machine_fails_cleanly_without_fallback(nano_build, cpu_only):
    with pytest.raises(NoBackendError, match=r"\(tried tensorrt\): tensorrt: no usable NVIDIA GPU"):
        veo_edge.Runtime(nano_build, backend="tensorrt", fallback=False).start()


def test_forced_tensorrt_on_this_machine_falls_back_to_the_cpu_chain(nano_build, cpu_only):
    with veo_edge.Runtime(nano_build, backend="tensorrt").start() as rt:
        state = rt.state.to_dict()
    assert state["active_backend"] == "openvino"
    assert state["skipped"][0]["backend"] == "tensorrt"


def test_engine_source_prefers_the_plugin_onnx(nano_build, copy_build):
    src, note = trt_backend.model_source(BuildDir.open(nano_build))
    assert src.name == "model.plugins.onnx" and note is None
    # a build without the injected graph (e.g. --no-plugins) falls back to the plain ONNX and says so
    path = copy_build(Path(nano_build))
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["artifacts"]["plugins_onnx"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    src, note = trt_backend.model_source(BuildDir.open(path))
    assert src.name == "model.onnx" and "has no plugins_onnx artifact" in note


def test_the_key_follows_the_model_and_the_plugin_library(nano_build):
    build = BuildDir.open(nano_build)

    class Lib:
        sha256 = "ab" * 32

    key = trt_backend.engine_key(build, EngineConfig(max_batch=8), "10.3.0", ("Orin", "8.7"), Lib())
    assert (
        key.model_sha256 == build.manifest["artifacts"]["plugins_onnx"]["sha256"]
    )  # what the engine is built from
    assert key.plugin_sha256 == "ab" * 32 and key.compute_capability == "8.7"
    assert (
        trt_backend.engine_key(
            build, EngineConfig(max_batch=8), "10.3.0", ("Orin", "8.7"), None
        ).plugin_sha256
        is None
    )


def test_backends_do_not_import_the_policy():
    """The TensorRT backend reaches for nothing above it: importing it loads no runtime.policy."""
    import subprocess
    import sys

    code = "import sys, veo_edge.runtime.backends.tensorrt; print('veo_edge.runtime.policy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from veo_edge.runtime import policy
    from veo_edge.runtime.backends import base

    assert policy.Verdict is base.Verdict  # one type, defined below both


def test_a_gpu_index_that_does_not_exist_is_refused(monkeypatch):
    from veo_edge.errors import UsageError
    from veo_edge.runtime import probes
    from veo_edge.runtime.backends import tensorrt_engine

    devices = [{"name": "NVIDIA A100", "compute_capability": "8.0"}]
    monkeypatch.setattr(probes, "probe_gpu", lambda: probes.Probe("gpu", True, data={"devices": devices}))
    assert tensorrt_engine.gpu_identity(0) == ("NVIDIA A100", "8.0")
    with pytest.raises(UsageError, match=r"--gpu 2: this machine has 1 GPU\(s\), numbered 0..0"):
        tensorrt_engine.gpu_identity(2)


def test_fastest_without_the_plugin_library_builds_tensorrts_own_engine(
    nano_build, monkeypatch, tmp_path, backend_log
):
    from veo_edge.engine import plugin_library
    from veo_edge.engine.selection import variants_to_build
    from veo_edge.runtime.backends import tensorrt_engine

    build = BuildDir.open(nano_build)
    monkeypatch.delenv(plugin_library.ENV_VAR, raising=False)
    monkeypatch.setattr(plugin_library, "find_plugin_library", lambda search_dirs=None: None)
    assert tensorrt_engine.plugin_engine_possible(build, "fastest") is False
    assert any(
        "libveo_edge_plugins.so is not built here: only TensorRT's own engine" in m for m in backend_log
    )
    assert variants_to_build("fastest", False) == ["plain"]
    assert tensorrt_engine.required_plugin_library(build, "plain") is None  # the plain engine needs none
    # forcing the plugin engine without the library is an error that says what to do
    assert tensorrt_engine.plugin_engine_possible(build, "plugins") is True
    with pytest.raises(BackendUnavailableError, match=r"needs libveo_edge_plugins.so.*or use --engine plain"):
        tensorrt_engine.required_plugin_library(build, "plugins")
    lib = tmp_path / "libveo_edge_plugins.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(
        plugin_library,
        "find_plugin_library",
        lambda search_dirs=None: plugin_library.PluginLibrary.from_path(lib),
    )
    assert tensorrt_engine.plugin_engine_possible(build, "fastest") is True
