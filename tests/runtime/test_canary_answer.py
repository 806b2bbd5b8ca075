"""Who answered the canary: :meth:`Runtime.run_canary` names the backend whose answer it returns (the
active one, or the standby its failed batch was retried on) and that backend's precision, and
:meth:`Runtime.reject` of a standby drops it while the active one keeps the traffic. Real OpenVINO and
ONNX Runtime runners; the wrong answers are theirs, made wrong by the fault configuration."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError
from veo_edge.export.canary import golden_canary
from veo_edge.runtime.runtime import Runtime


def test_the_canary_names_who_answered_and_a_wrong_standby_is_dropped(nano_build: Path) -> None:
    faults = {
        "openvino": {"oom_after": 0, "recover_after": 1, "error": "backend"},  # call 1 raises
        "onnxruntime": {"oom_after": 1, "error": "wrong"},  # its warm-up right, then wrong
    }
    x = golden_canary(BuildDir.open(nano_build)).input
    with Runtime(nano_build, policy=["openvino", "onnxruntime"], faults=faults) as rt:
        assert rt.standby_backend == "onnxruntime"
        out, by, precision = rt.run_canary(x)
        assert (by, precision) == ("onnxruntime", "f32")  # openvino failed the batch: the retry's answer
        right, by, _ = rt.run_canary(x)
        assert by == "openvino"
        np.testing.assert_allclose(out, right + 1.0, rtol=0, atol=1e-4)  # the injected wrong answer
        assert rt.reject("onnxruntime", "canary mismatch: off") == "openvino"
        assert rt.standby_backend is None and rt.active_backend == "openvino"
        status = {c["name"]: c for c in rt.state.to_dict()["candidates"]}["onnxruntime"]
        assert (status["status"], status["reason"]) == ("failed", "canary mismatch: off"), status
        assert rt.state.to_dict()["switches"] == []


def test_wrong_is_an_error_kind_of_the_fault_configuration() -> None:
    from veo_edge.runtime.faults import parse_faults
    from veo_edge.runtime.policy import BACKENDS

    assert (
        parse_faults({"openvino": {"every_nth": 2, "error": "wrong"}}, BACKENDS)["openvino"].error == "wrong"
    )
    with pytest.raises(UsageError, match="choose one of: oom, device_lost, backend, wrong"):
        parse_faults({"openvino": {"every_nth": 2, "error": "wrongly"}}, BACKENDS)


def test_a_dropped_standby_is_skipped_counted_and_its_return_logged(
    nano_build: Path, caplog: pytest.LogCaptureFixture
) -> None:
    faults = {
        "openvino": {"oom_after": 0, "recover_after": 1, "error": "backend"},
        "onnxruntime": {"oom_after": 1, "error": "wrong"},  # each runner: its warm-up right, then wrong
    }
    x = golden_canary(BuildDir.open(nano_build)).input
    caplog.set_level(logging.INFO, logger="veo_edge.runtime")
    # a short recovery clock: the dropped standby's backoff is over at once, and it is warmed again
    with Runtime(
        nano_build, policy=["openvino", "onnxruntime"], faults=faults, recover_interval_s=0.05
    ) as rt:
        assert rt.run_canary(x)[1] == "onnxruntime"
        rt.reject("onnxruntime", "canary mismatch: off")
        state = rt.state.to_dict()
        assert state["skipped"] == [
            {
                "backend": "onnxruntime",
                "reason": "standby dropped: it answered the canary wrongly (canary mismatch: off)",
            }
        ]
        assert rt.stats()["faults"]["onnxruntime"] == {"wrong_answer": 1}
        deadline = time.monotonic() + 60  # a bound on a hang, not a timing
        while rt.standby_backend is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.standby_backend == "onnxruntime"
    back = [r.getMessage() for r in caplog.records if "warm as a standby again" in r.getMessage()]
    assert back == ["backend onnxruntime warm as a standby again (last refused: canary mismatch: off)"], back
    # a WARNING like the drop, so `serve` (which shows the runtime's WARNINGs only) shows the return too
    assert all(
        r.levelno == logging.WARNING for r in caplog.records if "warm as a standby again" in r.getMessage()
    )
