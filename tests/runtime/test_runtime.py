"""The Runtime on real CPU runners: selection, skip reasons, mid-run fallback with injected faults under
concurrent load (every request answered exactly once, answers matching the reference), the batcher."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import veo_edge
from tests.support.answers import reference, seeded, tolerance
from veo_edge.builddir import BuildDir
from veo_edge.errors import InputError, NoBackendError, UsageError
from veo_edge.runtime.batching import ClosedError
from veo_edge.runtime.faults import InjectedDeviceLostError, InjectedOutOfMemoryError

CPU_CHAIN = ["onnxruntime", "openvino"]


def test_auto_on_this_machine_picks_openvino_and_says_why(nano_build: Path, cpu_only: None) -> None:
    with veo_edge.Runtime(nano_build) as rt:
        st = rt.state
        assert st.active_backend == "openvino" and st.ready and not st.closed
        assert [s["backend"] for s in st.skipped] == ["tensorrt", "onnxruntime-cuda"]
        assert all("no usable NVIDIA GPU: NVML did not initialise" in s["reason"] for s in st.skipped)
        assert [(c.name, c.status) for c in st.candidates] == [
            ("tensorrt", "skipped"),
            ("onnxruntime-cuda", "skipped"),
            ("openvino", "active"),
            ("onnxruntime", "standby"),  # the chain ends on ONNX Runtime's CPU provider: a warm second
        ]
        json.dumps(st.to_dict())
        assert rt.input_shape == (3, 32, 32) and rt.max_batch == 8
        assert (rt.input_name, rt.output_name) == ("input", "logits")
    assert rt.state.closed and not rt.state.ready


def test_no_fallback_fails_instead_of_running_slower(nano_build: Path, cpu_only: None) -> None:
    rt = veo_edge.Runtime(nano_build, fallback=False)
    with pytest.raises(
        NoBackendError, match=r"no backend can run build .*tensorrt: no usable NVIDIA GPU.*Fallback is off"
    ):
        rt.start()
    assert [(c.name, c.status) for c in rt.state.candidates][1:] == [
        ("onnxruntime-cuda", "disabled"),
        ("openvino", "disabled"),
        ("onnxruntime", "disabled"),
    ]


def test_injected_start_failure_is_a_recorded_skip(nano_build: Path) -> None:
    faults = {"onnxruntime": {"fail_at_start": True}}
    with veo_edge.Runtime(nano_build, policy=CPU_CHAIN, faults=faults) as rt:
        assert rt.state.active_backend == "openvino"
        assert rt.state.skipped == [
            {
                "backend": "onnxruntime",
                "reason": "injected start-up failure of onnxruntime (fault configuration fail_at_start); "
                "remove it from the faults or $VEO_EDGE_FAULTS to use this backend",
            }
        ]


def test_env_faults_reach_the_runtime(nano_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEO_EDGE_FAULTS", '{"openvino": {"fail_at_start": true}}')
    with pytest.raises(
        NoBackendError, match=r"tried openvino\): openvino: injected start-up failure of openvino"
    ):
        veo_edge.Runtime(nano_build, backend="openvino").start()


@pytest.mark.parametrize(
    ("concurrency", "hint"), [(None, "LATENCY"), (3, "THROUGHPUT")], ids=["one-slot", "three-slots"]
)
def test_injected_oom_mid_run_under_concurrent_load(nano_build: Path, concurrency, hint) -> None:
    """8 threads x 25 samples; ONNX Runtime fails with OOM on its 6th batch; every sample is answered
    once, correctly, and the switch to OpenVINO is visible (also with three batches in flight at once,
    onto OpenVINO's THROUGHPUT streams)."""
    x = seeded(200, (3, 32, 32), seed=7)
    want = reference(nano_build, x)
    faults = {"onnxruntime": {"oom_after": 5}}
    rt = veo_edge.Runtime(
        nano_build,
        policy=CPU_CHAIN,
        faults=faults,
        max_queue_delay_ms=1.0,
        concurrency=concurrency,
        performance_hint=hint,
    ).start()
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def caller(t: int) -> None:
        futs = {i: rt.submit(x[i]) for i in range(t, 200, 8)}
        for i, f in futs.items():
            try:
                got[i] = f.result(timeout=60)
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats, st = rt.stats(), rt.state
    rt.close()
    assert errors == [] and sorted(got) == list(range(200))
    err = max(float(np.abs(got[i] - want[i]).max()) for i in range(200))
    assert err <= tolerance(nano_build), err
    assert stats["requests_success"] == 200 and stats["requests_failure"] == 0
    assert sum(k * v for k, v in stats["batch_size_counts"].items()) == 200  # none answered twice
    assert max(stats["batch_size_counts"]) <= rt.max_batch
    assert st.active_backend == "openvino" and st.fallback_count == 1 and stats["fallback_switches"] == 1
    (switch,) = st.switches
    assert (switch["from"], switch["to"]) == ("onnxruntime", "openvino")
    assert switch["reason"].startswith("InjectedOutOfMemoryError: CUDA out of memory: onnxruntime: injected")
    assert {c.name: c.status for c in st.candidates} == {"onnxruntime": "failed", "openvino": "active"}


def test_forced_backend_retries_a_transient_fault_on_itself_with_or_without_fallback(
    nano_build: Path,
) -> None:
    """--no-fallback means no other backend and no switch; a transient fault's batch is still run once
    more where it failed (it answered the batch's requests with the error, and readiness flapped)."""
    x = seeded(2, (3, 32, 32))
    faults = {"onnxruntime": {"every_nth": 2}}
    with veo_edge.Runtime(nano_build, backend="onnxruntime", faults=faults) as rt:
        rt.infer(x)
        rt.infer(x)  # call 2 fails (out of memory: transient), call 3 answers it
        assert rt.state.switches == [] and rt.stats()["requests_failure"] == 0
        assert rt.stats()["faults"] == {"onnxruntime": {"oom": 1}}
        assert rt.stats()["retries"] == {"onnxruntime": {"ok": 1}}
    with veo_edge.Runtime(nano_build, backend="onnxruntime", faults=faults, fallback=False) as rt:
        for _ in range(4):  # calls 2, 4 and 6 fail; 3, 5 and 7 answer them
            rt.infer(x)
        assert rt.state.switches == [] and rt.stats()["requests_failure"] == 0
        assert rt.stats()["retries"] == {"onnxruntime": {"ok": 3}} and rt.stats()["standby_backend"] is None
    faults = {"onnxruntime": {"oom_after": 1}}  # every call after the first fails: the retry too
    with veo_edge.Runtime(nano_build, backend="onnxruntime", faults=faults, fallback=False) as rt:
        rt.infer(x)
        with pytest.raises(InjectedOutOfMemoryError, match=r"injected fault on call 2"):
            rt.infer(x)
        assert rt.state.switches == [] and rt.stats()["requests_failure"] == 2
        assert rt.stats()["retries"] == {"onnxruntime": {"failed": 1}}


def test_when_every_backend_fails_the_batch_gets_the_error_once(nano_build: Path) -> None:
    """openvino fails its warm-up, so it never becomes the standby; the batch fails on onnxruntime, has
    nowhere else to go, fails once more where it failed (transient), and its request gets the first error."""
    with veo_edge.Runtime(nano_build, policy=CPU_CHAIN, faults={"*": {"oom_after": 0}}) as rt:
        assert {c.name: c.status for c in rt.state.candidates} == {
            "onnxruntime": "active",
            "openvino": "skipped",
        }
        assert rt.state.skipped[0]["reason"].startswith("warm-up failed: InjectedOutOfMemoryError")
        fut = rt.submit(seeded(1, (3, 32, 32))[0])
        with pytest.raises(InjectedOutOfMemoryError, match="onnxruntime: injected fault on call 1"):
            fut.result(timeout=60)
        stats = rt.stats()
        assert stats["requests_failure"] == 1 and stats["requests_success"] == 0
        assert stats["faults"] == {"onnxruntime": {"oom": 2}, "openvino": {"oom": 1}}
        assert stats["retries"] == {"onnxruntime": {"failed": 1}}


def test_recovery_returns_to_the_preferred_backend(nano_build: Path) -> None:
    faults = {"onnxruntime": {"every_nth": 2, "error": "device_lost"}}
    with veo_edge.Runtime(nano_build, policy=CPU_CHAIN, faults=faults) as rt:
        x = seeded(3, (3, 32, 32))
        rt.infer(x)
        rt.infer(x)  # the device is lost on onnxruntime: re-run on openvino, which takes the traffic at once
        assert rt.state.active_backend == "openvino" and rt.stats()["requests_failure"] == 0
        assert rt.try_recover() and rt.state.active_backend == "onnxruntime"
        assert [s["reason"] for s in rt.state.switches][1] == "recovered"
        assert rt.state.fallback_count == 1
        # the one left is the standby of the one returned to
        assert {c.name: c.status for c in rt.state.candidates} == {
            "onnxruntime": "active",
            "openvino": "standby",
        }


def test_recovery_when_no_backend_is_left(nano_build: Path) -> None:
    """The first loses its device once and the second cannot start: none is active; try_recover brings
    the first back (it passes its warm-up: the device was lost once)."""
    first, second = CPU_CHAIN
    faults = {first: {"once_at_s": 0, "error": "device_lost"}, second: {"fail_at_start": True}}
    with veo_edge.Runtime(nano_build, policy=CPU_CHAIN, faults=faults, fault_clock=lambda: 0.0) as rt:
        x = seeded(1, (3, 32, 32))
        with pytest.raises(InjectedDeviceLostError, match="device lost: onnxruntime"):
            rt.infer(x)  # a lost device: no retry where it failed
        assert rt.state.active_backend is None and not rt.state.ready
        with pytest.raises(NoBackendError, match="no backend is active"):
            rt.infer(x)
        assert rt.try_recover(only_if_none_active=True)
        assert rt.state.active_backend == first and rt.state.ready
        assert not rt.try_recover(only_if_none_active=True)  # one is active: nothing to do


def test_infer_splits_large_batches_and_matches_submit(nano_build: Path) -> None:
    x = seeded(19, (3, 32, 32), seed=3)
    with veo_edge.Runtime(nano_build, backend="openvino", max_queue_delay_ms=5.0) as rt:
        y = rt.infer(x)
        assert y.shape == (19, 10)
        assert rt.stats()["batch_size_counts"] == {8: 2, 3: 1}
        compute = rt.stats()["batch_compute_us"]  # per batch size: the batches' total compute time
        assert set(compute) == {8, 3} and all(us > 0 for us in compute.values())
        futs = [rt.submit(x[i]) for i in range(19)]
        sub = np.stack([f.result(timeout=60) for f in futs])
        assert np.abs(sub - y).max() <= tolerance(nano_build)
        assert rt.submit(x[:1]).result(timeout=60).shape == (10,)


def test_canary_through_the_runtime(nano_build: Path) -> None:
    build = BuildDir.open(nano_build)
    x, expected = np.load(build.artifact("canary_input")), np.load(build.artifact("canary_expected"))
    with veo_edge.Runtime(nano_build, policy=CPU_CHAIN) as rt:
        assert np.abs(rt.infer(x) - expected).max() <= build.manifest["canary"]["atol"]


def test_video_model_through_the_batcher(video_nano_build: Path) -> None:
    with veo_edge.Runtime(video_nano_build, backend="openvino") as rt:
        x = seeded(3, rt.input_shape, seed=1)
        assert len(rt.input_shape) == 4
        got = np.stack([f.result(timeout=60) for f in [rt.submit(s) for s in x]])
        assert np.abs(got - rt.infer(x)).max() <= tolerance(video_nano_build)


def test_inputs_are_checked_at_submit(nano_build: Path) -> None:
    with veo_edge.Runtime(nano_build, backend="openvino") as rt:
        with pytest.raises(
            InputError, match=r"sample has shape \(3, 32, 31\), expected one sample of shape \(3, 32, 32\)"
        ):
            rt.submit(np.zeros((3, 32, 31), np.float32))
        with pytest.raises(
            InputError, match=r"input has dtype float64, expected float32; convert it with \.astype"
        ):
            rt.submit(np.zeros((3, 32, 32)))
        with pytest.raises(
            InputError,
            match=r"input 'input' has shape \(3, 32, 32\), expected input: float32\[N, 3, 32, 32\]",
        ):
            rt.infer(np.zeros((3, 32, 32), np.float32))
        assert rt.stats()["pending"] == 0


def test_lifecycle_errors(nano_build: Path) -> None:
    rt = veo_edge.Runtime(nano_build, backend="openvino")
    with pytest.raises(UsageError, match=r"the runtime is not started; call start\(\)"):
        rt.infer(seeded(1, (3, 32, 32)))
    rt.start().close()
    with pytest.raises(ClosedError, match="the runtime is closed"):
        rt.submit(seeded(1, (3, 32, 32))[0])
    with pytest.raises(UsageError, match=r"unknown backend 'gpu'"):
        veo_edge.Runtime(nano_build, backend="gpu")


def test_stats_contract(nano_build: Path) -> None:
    with veo_edge.Runtime(nano_build, backend="openvino") as rt:
        rt.submit(seeded(1, (3, 32, 32))[0]).result(timeout=60)
        s = rt.stats()
    assert {
        "requests_success",
        "requests_failure",
        "batches",
        "batch_size_counts",
        "request_us_total",
        "queue_us_total",
        "compute_us_total",
        "pending",
        "fallback_switches",
        "active_backend",
        "memory_pool",
    } <= set(s)
    assert s["requests_success"] == 1 and s["active_backend"] == "openvino" and s["memory_pool"] is None


def test_without_nvml_on_a_machine_without_a_driver_the_gpu_skip_says_no_driver(
    nano_build: Path, cpu_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cpu image has no pynvml (nvidia-ml-py is a GPU image's package): on a host with no NVIDIA driver
    the GPU candidates' skip reason says that, not ``pip install nvidia-ml-py``."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with veo_edge.Runtime(nano_build) as rt:
        reasons = [s["reason"] for s in rt.state.skipped]
    assert len(reasons) == 2 and all("no NVIDIA driver on this machine" in r for r in reasons), reasons
    assert not any("nvidia-ml-py" in r for r in reasons)
