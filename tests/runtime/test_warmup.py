"""Runtime.warm_up on real OpenVINO: every infer request the traffic can use is created and run before
the traffic, so traffic of every batch size, alone and concurrent, creates none (without the warm-up
the same traffic does); warming is not traffic (no batch counted, no injected fault consumed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import veo_edge
from veo_edge.errors import UsageError, VeoEdgeError
from veo_edge.export.parity import seeded_inputs
from veo_edge.runtime.batching import ClosedError


def _traffic(rt: veo_edge.Runtime, x: np.ndarray) -> dict[int, np.ndarray]:
    """Every batch size once on its own, then four closed-loop callers of mixed sizes at once."""
    got: dict[int, np.ndarray] = {}
    for b in range(1, rt.max_batch + 1):
        got[b] = rt.infer(x[:b])

    def caller(t: int) -> None:
        for b in range(1 + t, rt.max_batch + 1, 2):
            futures = rt.submit_many(x[:b])
            got[100 * (t + 1) + b] = np.stack([f.result(timeout=60) for f in futures])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(caller, range(4)))  # a caller's error is raised here
    return got


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT", "ADAPTIVE"])
@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "cold"])
def test_after_the_warm_up_traffic_of_every_batch_size_creates_no_infer_request(
    nano_build: Path, hint: str, warm: bool
) -> None:
    with veo_edge.Runtime(nano_build, backend="openvino", performance_hint=hint) as rt:
        described = rt.describe()
        assert described["precision"] == "f32" and described["inference_precision_hint"] == "f32"
        in_flight, streams = described["infer_requests_in_flight"], described["streams"]
        if hint == "ADAPTIVE" and streams > 1:
            # one on the batch-1 LATENCY compile, one per slot on the batch-1 streams compile; per size
            # on the dynamic one, a lone batch split across the streams while a batch per other stream
            # starts beside it
            expected = 1 + in_flight + rt.max_batch * (2 * streams - 1)
        else:
            expected = rt.max_batch * in_flight
        x = seeded_inputs(rt.input_shape, rt.max_batch, 3)
        if warm:
            report = rt.warm_up()
            assert report["backend"] == "openvino"
            assert report["batch_sizes"] == list(range(1, rt.max_batch + 1))
            assert report["infer_requests"] == expected == rt.describe()["infer_requests"]
            assert rt.stats()["batches"] == 0  # warming ran no batch through the batcher
        else:
            assert rt.describe()["infer_requests"] == 0
        got = _traffic(rt, x)
        created = rt.describe()["infer_requests"]
        want = rt.infer(x)  # the same samples at the largest batch, on a request the traffic warmed
    for key, y in got.items():
        b = key % 100
        np.testing.assert_allclose(y, want[:b], atol=2e-4, rtol=0)
    if warm:
        assert created == expected
    else:
        assert 0 < created <= expected  # the traffic made its own, as it first met each size


def test_warming_is_not_traffic_for_the_fault_schedule(nano_build: Path) -> None:
    """An injected fault counts calls of the traffic only: two calls run after any warm-up, the third fails."""
    faults = {"openvino": {"oom_after": 2, "error": "backend"}}
    with veo_edge.Runtime(nano_build, backend="openvino", faults=faults, fallback=False) as rt:
        rt.warm_up()
        assert rt.injected_faults() == {}
        x = seeded_inputs(rt.input_shape, 1, 4)
        rt.infer(x)
        rt.infer(x)
        with pytest.raises(VeoEdgeError, match="injected fault on call 3"):
            rt.infer(x)
        assert list(rt.injected_faults().values()) == [2]  # call 3 and its retry, call 4


def test_warm_up_refuses_sizes_outside_the_build_and_a_closed_runtime(nano_build: Path) -> None:
    rt = veo_edge.Runtime(nano_build, backend="openvino").start()
    try:
        with pytest.raises(UsageError, match=rf"1\.\.{rt.max_batch}"):
            rt.warm_up([0, 1])
        with pytest.raises(UsageError, match="max-batch"):
            rt.warm_up([rt.max_batch + 1])
        assert rt.warm_up([2])["batch_sizes"] == [2]
    finally:
        rt.close()
    with pytest.raises(ClosedError):
        rt.warm_up()
