"""``veo-edge engine build`` on a machine without TensorRT: one line that says what to do."""

import pytest

from tests.cli.test_cli import veo


def test_engine_build_without_tensorrt_is_one_clear_line(nano_build):
    from veo_edge.runtime.probes import probe_tensorrt

    if probe_tensorrt().ok:
        pytest.skip("TensorRT is importable here")
    r = veo("engine", "build", nano_build)
    assert r.returncode == 8, r.stderr
    assert "TensorRT is not importable" in r.stderr and "--backend openvino" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_engine_help_lists_build():
    r = veo("engine", "--help")
    assert r.returncode == 0 and "build" in r.stdout


def test_inspect_shows_the_recorded_engine_choice(nano_build, copy_build):
    import json
    from pathlib import Path

    from veo_edge.engine.cache import ChoiceRecord, EngineKey
    from veo_edge.engine.selection import Measurement, decide

    build = copy_build(Path(nano_build))
    plain = EngineKey("NVIDIA A100-SXM4-40GB", "8.0", "10.3.0", None, "aa" * 32, "fp32", 8, 8)
    plugins = EngineKey("NVIDIA A100-SXM4-40GB", "8.0", "10.3.0", "bb" * 32, "cc" * 32, "fp32", 8, 8)
    decision = decide(
        "fastest",
        [
            Measurement("plain", {1: 0.5, 8: 2.0}, 1e-5, 3.0),
            Measurement("plugins", {1: 0.6, 8: 1.5}, 1e-5, 3.0),
        ],
        "fp32",
    )
    ChoiceRecord.for_keys(build / "engines", "vit-nano", plain, plugins).write(
        plain, plugins, decision, reps=50
    )
    r = veo("inspect", str(build))
    assert r.returncode == 0, r.stderr
    assert "TensorRT on NVIDIA A100-SXM4-40GB (sm 8.0, TensorRT 10.3.0, fp32, batch 1..8):" in r.stdout
    assert (
        "engine: plain (fastest): the plugin engine is not faster at batch 1 (0.600 ms vs 0.500 ms)"
        in r.stdout
    )
    assert "plugins: batch 1: 0.600 ms, batch 8: 1.500 ms" in r.stdout
    data = json.loads(veo("inspect", str(build), "--json").stdout)
    assert data["engine_choices"][0]["decision"]["chosen"] == "plain"
