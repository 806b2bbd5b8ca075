"""Fault configuration and the faulty runner wrapped around a real ONNX Runtime runner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.errors import BackendError, BackendUnavailableError, CudaOutOfMemoryError, UsageError
from veo_edge.runtime.faults import (
    FaultSpec,
    FaultyRunner,
    InjectedBackendError,
    InjectedOutOfMemoryError,
    parse_faults,
)
from veo_edge.runtime.loaders import cpu_runner
from veo_edge.runtime.policy import BACKENDS


def test_specs_parse_from_dict_json_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_faults({"onnxruntime": {"oom_after": 5}}, BACKENDS) == {
        "onnxruntime": FaultSpec(oom_after=5)
    }
    assert parse_faults('{"*": {"slow_ms": 50}}', BACKENDS) == {"*": FaultSpec(slow_ms=50)}
    monkeypatch.setenv("VEO_EDGE_FAULTS", '{"openvino": {"fail_at_start": true}}')
    assert parse_faults(None, BACKENDS) == {"openvino": FaultSpec(fail_at_start=True)}
    monkeypatch.delenv("VEO_EDGE_FAULTS")
    assert parse_faults(None, BACKENDS) == {}
    assert parse_faults({"openvino": {}}, BACKENDS) == {}  # an empty spec injects nothing


@pytest.mark.parametrize(
    ("faults", "match"),
    [
        ({"every_nth": 3}, r"names backend 'every_nth'; fault specs are keyed by a backend name"),
        ({"openvino": {"oom_afer": 3}}, r"unknown fault option\(s\) \['oom_afer'\] for 'openvino'"),
        ({"openvino": {"every_nth": 0}}, r"every_nth=0 for 'openvino' is invalid; expected an integer >= 1"),
        ({"openvino": {"oom_after": -1}}, r"oom_after=-1 .* expected an integer >= 0"),
        (
            {"openvino": {"error": "segfault"}},
            r"error='segfault' .* choose one of: oom, device_lost, backend",
        ),
        ({"openvino": 3}, r"fault spec for 'openvino' is a int, expected an object"),
        ({"openvino": {"leak_bytes_per_call": -1}}, r"leak_bytes_per_call=-1 .* expected an integer >= 0"),
        ({"openvino": {"leak_bytes_per_call": 1.5}}, r"leak_bytes_per_call=1.5 .* expected an integer >= 0"),
        ("{nope", r"faults is not valid JSON"),
    ],
)
def test_bad_specs_say_what_to_write(faults: object, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_faults(faults, BACKENDS)  # type: ignore[arg-type]


def test_which_calls_fail() -> None:
    assert [FaultSpec(oom_after=2).fails_call(n) for n in range(1, 6)] == [False, False, True, True, True]
    assert [FaultSpec(every_nth=3).fails_call(n) for n in range(1, 7)] == [False, False, True] * 2
    assert not any(FaultSpec(slow_ms=1).fails_call(n) for n in range(1, 10))
    healing = FaultSpec(oom_after=1, recover_after=3)
    assert [healing.fails_call(n) for n in range(1, 6)] == [False, True, True, False, False]
    with pytest.raises(UsageError, match="recover_after=2 for 'openvino' needs oom_after below it"):
        parse_faults({"openvino": {"recover_after": 2}}, BACKENDS)


def test_faulty_runner_wraps_a_real_runner(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with cpu_runner(build, "onnxruntime") as real:
        want = real.infer(x)["logits"]
    runner = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(oom_after=1), label="onnxruntime")
    with runner:
        np.testing.assert_array_equal(runner.infer(x)["logits"], want)
        with pytest.raises(
            InjectedOutOfMemoryError, match=r"CUDA out of memory: .* call 2 \(oom_after=1\)"
        ) as e:
            runner.infer(x)
        assert isinstance(e.value, CudaOutOfMemoryError) and isinstance(e.value, BackendError)
        assert runner.calls == 2 and runner.injected == 1
    start = FaultyRunner(cpu_runner(build, "openvino"), FaultSpec(fail_at_start=True), label="openvino")
    with pytest.raises(BackendUnavailableError, match="injected start-up failure of openvino"):
        start.activate()
    assert not start.is_active and not start.inner.is_active
    plain = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(every_nth=1, error="backend"))
    with plain, pytest.raises(InjectedBackendError, match=r"injected fault on call 1 \(every_nth=1\)"):
        plain.infer(x)


def test_planted_leak_keeps_n_bytes_per_call_and_still_answers(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    assert parse_faults({"onnxruntime": {"leak_bytes_per_call": 4096}}, BACKENDS) == {
        "onnxruntime": FaultSpec(leak_bytes_per_call=4096)
    }
    with cpu_runner(build, "onnxruntime") as real:
        want = real.infer(x)["logits"]
    runner = FaultyRunner(cpu_runner(build, "onnxruntime"), FaultSpec(leak_bytes_per_call=4096))
    with runner:
        for _ in range(3):
            np.testing.assert_array_equal(runner.infer(x)["logits"], want)
    assert [a.nbytes for a in runner.leaked] == [4096] * 3 and runner.injected == 0
    assert all(int(a.min()) == int(a.max()) == 0x5A for a in runner.leaked)  # written: resident
