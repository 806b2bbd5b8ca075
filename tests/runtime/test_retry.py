"""Retries, the warm standby and the switch rules, on real CPU runners with injected faults: a failed
batch is re-run on the standby before any request sees an error, a lost device moves traffic at once,
transient faults only after SWITCH_AFTER in a row, and a standby that fails for good is dropped."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

import veo_edge
from veo_edge.builddir import BuildDir
from veo_edge.export.parity import seeded_inputs
from veo_edge.runtime.fallback import SWITCH_AFTER
from veo_edge.runtime.loaders import cpu_runner

CHAIN = ["openvino", "onnxruntime"]  # auto's CPU chain


def reference(build_dir: Path, x: np.ndarray) -> np.ndarray:
    with cpu_runner(BuildDir.open(build_dir), "onnxruntime") as r:
        return np.concatenate([r.infer(x[i : i + 8])["logits"] for i in range(0, len(x), 8)])


def load(rt: veo_edge.Runtime, x: np.ndarray, threads: int = 8) -> tuple[dict[int, np.ndarray], list]:
    """Every sample of ``x`` submitted from ``threads`` callers at once; (answers by index, errors)."""
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def caller(t: int) -> None:
        futures = {i: rt.submit(x[i]) for i in range(t, len(x), threads)}
        for i, f in futures.items():
            try:
                got[i] = f.result(timeout=60)
            except BaseException as e:
                errors.append(e)

    workers = [threading.Thread(target=caller, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return got, errors


def test_transient_faults_on_every_backend_under_concurrent_load_lose_nothing(nano_build: Path) -> None:
    """Every 5th call of each backend fails: each failed batch is re-run (on the standby, or where it
    failed when the standby's own call failed too); all 200 samples are answered, correctly, once."""
    x = seeded_inputs((3, 32, 32), 200, 11)
    want = reference(nano_build, x)
    rt = veo_edge.Runtime(nano_build, policy=CHAIN, faults={"*": {"every_nth": 5}}, max_queue_delay_ms=1.0)
    with rt:
        got, errors = load(rt, x)
        stats, state = rt.stats(), rt.state
    assert errors == [] and sorted(got) == list(range(200))
    tol = 2 * BuildDir.open(nano_build).manifest["canary"]["atol"]
    assert max(float(np.abs(got[i] - want[i]).max()) for i in range(200)) <= tol
    assert stats["requests_success"] == 200 and stats["requests_failure"] == 0
    faults = sum(n for kinds in stats["faults"].values() for n in kinds.values())
    retries = sum(n for outcomes in stats["retries"].values() for n in outcomes.values())
    assert stats["faults"]["openvino"]["oom"] >= 1
    assert retries == faults  # every failed call was followed by a re-run, and the last one answered
    assert stats["fallback_switches"] == 0 and state.active_backend == "openvino"


def test_a_lost_device_moves_traffic_at_once_to_the_warm_standby(nano_build: Path) -> None:
    faults = {"onnxruntime": {"oom_after": 1, "error": "device_lost"}}
    x = seeded_inputs((3, 32, 32), 2, 3)
    with veo_edge.Runtime(nano_build, policy=["onnxruntime", "openvino"], faults=faults) as rt:
        # before any traffic: openvino is active-ready, warmed at the largest batch with the canary
        assert rt.stats()["standby_backend"] == "openvino"
        warm = rt.state.verified["openvino"]
        assert warm["ok"] and warm["atol"] == BuildDir.open(nano_build).manifest["canary"]["atol"]
        rt.infer(x)
        assert rt.active_backend == "onnxruntime"
        np.testing.assert_allclose(rt.infer(x), reference(nano_build, x), atol=1e-3)  # lost, re-run
        stats, state = rt.stats(), rt.state
    assert state.active_backend == "openvino" and stats["standby_backend"] is None
    assert stats["faults"] == {"onnxruntime": {"device_lost": 1}}
    assert stats["retries"] == {"openvino": {"ok": 1}}
    assert stats["fallback_switches"] == 1 and stats["requests_failure"] == 0
    (switch,) = state.switches
    assert (switch["from"], switch["to"]) == ("onnxruntime", "openvino")
    assert switch["reason"].startswith("InjectedDeviceLostError: device lost: onnxruntime")


def test_transient_faults_move_traffic_only_after_switch_after_in_a_row(nano_build: Path) -> None:
    x = seeded_inputs((3, 32, 32), 1, 5)
    with veo_edge.Runtime(nano_build, policy=CHAIN, faults={"openvino": {"oom_after": 2}}) as rt:
        rt.infer(x), rt.infer(x)
        active = []
        for _ in range(SWITCH_AFTER):
            rt.infer(x)  # fails on openvino (out of memory), answered by onnxruntime
            active.append(rt.active_backend)
        stats = rt.stats()
    assert active == ["openvino"] * (SWITCH_AFTER - 1) + ["onnxruntime"]
    assert stats["faults"] == {"openvino": {"oom": SWITCH_AFTER}}
    assert stats["retries"] == {"onnxruntime": {"ok": SWITCH_AFTER}}
    assert stats["fallback_switches"] == 1 and stats["requests_failure"] == 0


def test_a_standby_that_fails_for_good_is_dropped_and_nothing_is_lost(nano_build: Path) -> None:
    """onnxruntime passes its warm-up (call 1) and is dead from then on; openvino fails every 2nd call.
    Each failed batch tries the standby, then once more on openvino, which answers; after SWITCH_AFTER
    failed retries the standby is dropped and later failures go straight to the re-run on openvino."""
    faults = {"openvino": {"every_nth": 2}, "onnxruntime": {"dead_after": 1}}
    x = seeded_inputs((3, 32, 32), 1, 9)
    n = SWITCH_AFTER + 5
    with veo_edge.Runtime(nano_build, policy=CHAIN, faults=faults) as rt:
        for _ in range(n):
            rt.infer(x)
        stats, state = rt.stats(), rt.state
    # openvino's calls alternate fail / re-run, so every batch after the first fails once there
    assert stats["requests_failure"] == 0 and stats["fallback_switches"] == 0
    assert stats["faults"] == {"openvino": {"oom": n - 1}, "onnxruntime": {"oom": SWITCH_AFTER}}
    assert stats["retries"] == {"onnxruntime": {"failed": SWITCH_AFTER}, "openvino": {"ok": n - 1}}
    assert stats["standby_backend"] is None and state.active_backend == "openvino"
    statuses = {c.name: (c.status, c.reason) for c in state.candidates}
    assert statuses["onnxruntime"][0] == "failed" and "dead_after=1" in statuses["onnxruntime"][1]


def test_run_alone_runs_on_the_caller_only_while_the_backends_are_steady(nano_build: Path) -> None:
    """A lone sample runs on the caller's thread (serve: the event loop) with a warm standby; after a
    fault of the active backend it goes through the batcher until a call there succeeds again, then
    runs on the caller once more (one transient fault does not turn lone runs off for good)."""
    x = seeded_inputs((3, 32, 32), 1, 5)
    want = reference(nano_build, x)[0]
    with veo_edge.Runtime(nano_build, policy=CHAIN, faults={"openvino": {"every_nth": 3}}) as rt:
        ran = [rt.run_alone(x[0]) for _ in range(2)]  # calls 1 and 2 succeed, here
        assert all(f is not None and f.done() for f in ran)
        np.testing.assert_allclose(ran[0].result(), want, rtol=1e-4, atol=1e-4)
        third = rt.run_alone(x[0])  # the 3rd call fails on OpenVINO and is retried on the standby
        assert third is not None
        np.testing.assert_allclose(third.result(), want, rtol=1e-4, atol=1e-4)
        assert rt.run_alone(x[0]) is None  # OpenVINO's last call failed: not steady
        np.testing.assert_allclose(rt.submit(x[0]).result(timeout=60), want, rtol=1e-4, atol=1e-4)
        fifth = rt.run_alone(x[0])  # call 4 succeeded on OpenVINO: steady again
        assert fifth is not None and fifth.done()
        np.testing.assert_allclose(fifth.result(), want, rtol=1e-4, atol=1e-4)
        assert rt.stats()["close_reasons"] == {"alone": 4, "nothing_expected": 1}
