"""``veo-edge infer`` through the Runtime: the chosen backend, every skip reason, --no-fallback, faults."""

import json

import pytest

from tests.cli.test_cli import veo


@pytest.fixture(scope="module")
def cpu_only():
    from veo_edge.runtime.probes import probe_gpu

    if probe_gpu().ok:
        pytest.skip("an NVIDIA GPU is visible; these tests pin a CPU-only machine's skip reasons")


def test_auto_reports_the_backend_and_every_skip(nano_build, cpu_only):
    r = veo("infer", nano_build, "--batch", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "openvino" and out["output_shape"] == [3, 10]
    assert [s["backend"] for s in out["skipped"]] == ["tensorrt", "onnxruntime-cuda"]
    assert all(s["reason"].startswith("no usable NVIDIA GPU") for s in out["skipped"])
    text = veo("infer", nano_build)
    assert text.returncode == 0 and "on openvino" in text.stdout
    assert "skipped tensorrt: no usable NVIDIA GPU" in text.stdout
    assert "random sample 0 (seed 0): " in text.stdout  # no input given: the answer is to random data


def test_no_fallback_is_an_error_with_the_reason(nano_build, cpu_only):
    r = veo("infer", nano_build, "--no-fallback")
    assert r.returncode == 8, r.stderr
    assert "no backend can run build" in r.stderr and "Fallback is off (--no-fallback)" in r.stderr


def test_bad_backend_and_budget_are_usage_errors(nano_build):
    r = veo("infer", nano_build, "--backend", "cuda")
    assert r.returncode == 2 and "unknown backend 'cuda'; choose one of: auto, tensorrt" in r.stderr
    r = veo("infer", nano_build, "--gpu-memory-budget", "lots")
    assert r.returncode == 2 and "GPU memory budget 'lots' is not a size" in r.stderr
    for flag in ("--top-k", "--batch"):  # 0 printed empty rows (--top-k) or failed on a (0, ...) shape
        r = veo("infer", nano_build, flag, "0")
        assert r.returncode == 2 and f"Invalid value for '{flag}'" in r.stderr, r.stderr


def test_an_injected_fault_on_a_forced_backend_is_an_error(nano_build):
    faults = json.dumps({"onnxruntime": {"oom_after": 0}})
    r = veo("infer", nano_build, "--backend", "onnxruntime", env={"VEO_EDGE_FAULTS": faults})
    assert r.returncode == 9 and "CUDA out of memory: onnxruntime: injected fault on call 1" in r.stderr
