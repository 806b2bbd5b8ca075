"""The Runtime on OpenVINO's streams: THROUGHPUT batches in parallel, and ADAPTIVE's choice of compile (a
lone sample on the batch-1 LATENCY compile, a lone batch split across the streams, overlapping batches on
the streams), each with the same answers as the reference under concurrent callers."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import veo_edge
from tests.support.answers import reference, seeded, tolerance
from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError


def test_throughput_streams_serve_batches_in_parallel_with_the_same_answers(nano_build: Path) -> None:
    x = seeded(96, (3, 32, 32), seed=3)
    want = reference(nano_build, x)
    with veo_edge.Runtime(nano_build, backend="openvino", performance_hint="THROUGHPUT") as rt:
        described = rt.describe()
        assert described["performance_hint"] == "THROUGHPUT" and described["precision"] == "f32"
        slots = described["infer_requests_in_flight"]
        assert slots >= 1 and rt._batcher.slots == slots  # one batcher slot per OpenVINO infer request
        got: dict[int, np.ndarray] = {}

        def caller(t: int) -> None:
            futs = {i: rt.submit(x[i]) for i in range(t, 96, 6)}
            got.update({i: f.result(timeout=60) for i, f in futs.items()})

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = rt.stats()
    assert sorted(got) == list(range(96))
    assert max(float(np.abs(got[i] - want[i]).max()) for i in range(96)) <= tolerance(nano_build)
    assert sum(k * v for k, v in stats["batch_size_counts"].items()) == 96 == stats["requests_success"]


def test_adaptive_runs_a_lone_batch_on_the_latency_compile_and_overlapping_ones_on_streams(
    nano_build: Path,
) -> None:
    """ADAPTIVE: one client back to back never overlaps itself, so every batch runs on the LATENCY
    compile; a batch that starts while another runs takes a THROUGHPUT stream: a sample the batch-1
    streams compile, a larger batch the dynamic one. Same answers on all three."""
    from veo_edge.runtime.backends.openvino import OpenVinoRunner

    build = BuildDir.open(nano_build)
    x = seeded(24, (3, 32, 32), seed=5)
    want = reference(nano_build, x)
    runner = OpenVinoRunner(build.artifact("openvino_xml"), max_batch=8, precision="f32", hint="ADAPTIVE")
    with runner:
        described = runner.describe()
        assert described["performance_hint"] == "ADAPTIVE" and described["precision"] == "f32"
        if runner.concurrency == 1:
            pytest.skip("one OpenVINO stream on this machine: ADAPTIVE is LATENCY alone")
        # two batches per stream in flight: one computing, one queued behind it
        assert described["infer_requests_in_flight"] == 2 * described["streams"]
        lone = np.concatenate([runner.infer(x[i : i + 1])["logits"] for i in range(12)])
        assert runner.runs == {"latency": 12, "streams_b1": 0, "streams": 0}
        # another batch in flight (the runner's own count, as a concurrent caller leaves it): streams
        runner._in_flight += 1
        try:
            overlapped = np.concatenate([runner.infer(x[i : i + 1])["logits"] for i in range(12, 18)])
            overlapped_b3 = np.concatenate([runner.infer(x[i : i + 3])["logits"] for i in (18, 21)])
        finally:
            runner._in_flight -= 1
        assert runner.runs == {"latency": 12, "streams_b1": 6, "streams": 2}
        assert runner.describe()["adaptive_runs"] == {"latency": 12, "streams_b1": 6, "streams": 2}
        shape = runner._single.inputs[0].get_partial_shape()
        assert shape.is_static and shape[0].get_length() == 1
        assert runner._compiled.inputs[0].get_partial_shape()[0].is_dynamic
    got = np.concatenate([lone, overlapped, overlapped_b3])
    assert float(np.abs(got - want).max()) <= tolerance(nano_build)


def test_adaptive_runs_a_lone_sample_at_a_fixed_batch_of_one_and_splits_a_lone_batch_across_streams(
    nano_build: Path,
) -> None:
    """ADAPTIVE's LATENCY compile has its batch axis fixed at 1 (a static shape runs faster); a larger
    batch that runs alone is split across the streams, one part each, and answers as a whole batch."""
    from veo_edge.runtime.backends.openvino import OpenVinoRunner

    build = BuildDir.open(nano_build)
    x = seeded(8, (3, 32, 32), seed=9)
    want = reference(nano_build, x)
    runner = OpenVinoRunner(build.artifact("openvino_xml"), max_batch=8, precision="f32", hint="ADAPTIVE")
    with runner:
        assert runner.describe()["inference_precision_hint"] == "f32"
        if runner.concurrency == 1:
            pytest.skip("one OpenVINO stream on this machine: ADAPTIVE is LATENCY alone")
        shape = runner._latency.inputs[0].get_partial_shape()
        assert shape.is_static and shape[0].get_length() == 1
        before = runner.requests_created
        whole = {b: runner.infer(x[:b])["logits"] for b in (1, 3, 8)}
        assert runner.runs == {"latency": 1, "streams_b1": 0, "streams": 2}  # b3, b8 alone, on the streams
        # b1 on the batch-1 compile; b3 as parts of 1 and 2, b8 as two of 4 at once: a request per part
        assert runner.requests_created - before == 1 + 2 + 2
        assert sorted(k for k, idle in runner._requests.items() if idle) == [
            ("latency", 1), ("streams", 1), ("streams", 2), ("streams", 4)
        ]  # fmt: skip
    for b, got in whole.items():
        assert got.shape == (b, *want.shape[1:])
        assert float(np.abs(got - want[:b]).max()) <= tolerance(nano_build)


def _closed_loop(rt, x: np.ndarray, clients: int) -> dict[int, np.ndarray]:
    """``x``'s samples submitted by ``clients`` threads, each sending its next once the last is answered."""
    got: dict[int, np.ndarray] = {}

    def caller(t: int) -> None:
        for i in range(t, len(x), clients):
            got[i] = rt.submit(x[i]).result(timeout=60)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_adaptive_serves_concurrent_callers_with_the_same_answers(nano_build: Path) -> None:
    x = seeded(64, (3, 32, 32), seed=6)
    want = reference(nano_build, x)
    with veo_edge.Runtime(nano_build, backend="openvino", performance_hint="ADAPTIVE") as rt:
        slots = rt.describe()["infer_requests_in_flight"]
        assert rt._batcher.slots == slots
        got = _closed_loop(rt, x, clients=4)
        stats, runs = rt.stats(), rt.describe().get("adaptive_runs")
    assert sorted(got) == list(range(64))
    assert max(float(np.abs(got[i] - want[i]).max()) for i in range(64)) <= tolerance(nano_build)
    assert stats["requests_success"] == 64
    if runs is not None:  # more than one stream: every batch ran on one of the three compiles
        assert sum(runs.values()) == stats["batches"]
        assert runs["streams_b1"] > 0  # samples ran beside each other on the batch-1 streams compile


def test_a_batch_limit_of_one_runs_every_sample_alone_on_one_fewer_compile(nano_build: Path) -> None:
    """``max_batch=1`` (serve --batch-limit 1): concurrent callers and an 8-sample infer all run as
    single samples with the reference's answers; ADAPTIVE's streams use the batch-1 compile only (no
    request on a dynamic one), so warm-up creates fewer infer requests than at the build's max batch."""
    x = seeded(32, (3, 32, 32), seed=7)
    want = reference(nano_build, x)
    created = {}
    for limit in (None, 1):
        with veo_edge.Runtime(
            nano_build, backend="openvino", performance_hint="ADAPTIVE", max_batch=limit
        ) as rt:
            created[limit] = rt.warm_up()["infer_requests"]
            got = _closed_loop(rt, x, clients=4)
            whole = rt.infer(x[:8])
            stats, runs = rt.stats(), rt.describe().get("adaptive_runs")
        assert max(float(np.abs(got[i] - want[i]).max()) for i in range(32)) <= tolerance(nano_build)
        assert float(np.abs(whole - want[:8]).max()) <= tolerance(nano_build)
        if limit == 1:
            assert rt.max_batch == 1 and set(stats["batch_size_counts"]) == {1}
            assert stats["batches"] == 32 + 8
            if runs is not None:
                assert runs["streams"] == 0  # no batch on the dynamic compile
    if runs is not None:
        assert created[1] < created[None]
    for bad in (9, 0, 1.5, True, "all"):
        with pytest.raises(
            UsageError, match=rf"max_batch must be 'auto' or lie in 1\.\.8 \(the build's\), got {bad!r}"
        ):
            veo_edge.Runtime(nano_build, max_batch=bad)


@pytest.mark.parametrize(
    ("pays", "faults"),
    [(False, None), (False, {"openvino": {"once_at_s": 3600}}), (True, None)],
    ids=["batch-1", "batch-1-behind-a-fault-wrapper", "batched"],
)
def test_max_batch_auto_measures_whether_batches_pay_and_answers_the_same(
    nano_build: Path, monkeypatch: pytest.MonkeyPatch, pays: bool, faults
) -> None:
    """``max_batch="auto"`` (serve's default): ADAPTIVE keeps its compiles full at batch 4 and at batch 1
    when it activates; where batches reach ``PAYS`` times the samples/s it keeps the build's max batch,
    else it runs batch 1 only and lets the dynamic compile go. The threshold is set here to force each
    outcome (which one a CPU gets is timing: bench/); the answers are the reference's either way, also
    behind the fault wrapper (the warm check's canary runs at the limit the backend settled on)."""
    from veo_edge.runtime.backends import openvino_batching

    monkeypatch.setattr(openvino_batching, "PAYS", 0.0 if pays else float("inf"))
    x = seeded(32, (3, 32, 32), seed=8)
    want = reference(nano_build, x)
    with veo_edge.Runtime(
        nano_build,
        backend="openvino",
        performance_hint="ADAPTIVE",
        max_batch="auto",
        faults=faults,
        fault_clock=lambda: 0.0,
    ) as rt:
        described = rt.describe()
        measured = described.get("batching")
        if described["streams"] == 1:
            assert measured is None and rt.max_batch == 8  # one stream: ADAPTIVE is LATENCY alone
            pytest.skip("one OpenVINO stream on this machine: nothing to measure")
        assert measured["measured_batch"] == 4 and measured["batching_pays"] is pays
        assert measured["single_samples_per_s"] > 0 and measured["batched_over_single"] > 0
        assert rt.max_batch == (8 if pays else 1)
        warmed = rt.warm_up()
        got = _closed_loop(rt, x, clients=4)
        whole = rt.infer(x[:8])
        stats, runs = rt.stats(), rt.describe()["adaptive_runs"]
    assert warmed["batch_sizes"] == list(range(1, rt.max_batch + 1))
    assert max(float(np.abs(got[i] - want[i]).max()) for i in range(32)) <= tolerance(nano_build)
    assert float(np.abs(whole - want[:8]).max()) <= tolerance(nano_build)
    if not pays:
        assert set(stats["batch_size_counts"]) == {1} and runs["streams"] == 0


def test_unknown_performance_hint_is_refused(nano_build: Path) -> None:
    with pytest.raises(
        UsageError, match="unknown performance hint 'FAST'; choose one of: LATENCY, THROUGHPUT, ADAPTIVE"
    ):
        veo_edge.Runtime(nano_build, performance_hint="FAST")


def test_a_negative_thread_count_is_refused_before_openvino_sees_it(nano_build: Path) -> None:
    """OpenVINO answered -2 with an internal check failure ('val_i >= 0'), which serve printed as an
    internal error; 0 stays the backend's own choice."""
    for bad in (-2, 1.5, True):
        with pytest.raises(UsageError, match=r"threads must be a count >= 0 \(0 or None: the backend's\)"):
            veo_edge.Runtime(nano_build, threads=bad)
    with veo_edge.Runtime(nano_build, backend="openvino", threads=0) as rt:
        assert rt.infer(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)


def test_a_runner_measures_batching_once_and_keeps_its_limit_when_reactivated(
    nano_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime takes its batch limit from the first activation; a runner deactivated and activated
    again (a fallback that comes back) does not measure again, so it cannot settle on less than the
    batches its runtime sends."""
    from veo_edge.runtime.backends import openvino_batching
    from veo_edge.runtime.backends.openvino import OpenVinoRunner

    build = BuildDir.open(nano_build)
    monkeypatch.setattr(openvino_batching, "PAYS", 0.0)
    runner = OpenVinoRunner(
        build.artifact("openvino_xml"), max_batch=8, hint="ADAPTIVE", measure_batching=True
    )
    with runner:
        first = runner.measured
    if first is None:
        pytest.skip("one OpenVINO stream on this machine: nothing to measure")
    monkeypatch.setattr(openvino_batching, "PAYS", float("inf"))  # a second measurement would choose 1
    x = seeded(8, (3, 32, 32), seed=9)
    with runner:
        assert runner.measured is first and runner.max_batch == 8
        got = runner.infer(x)["logits"]
    assert float(np.abs(got - reference(nano_build, x)).max()) <= tolerance(nano_build)


@pytest.mark.parametrize(("unsettled", "rounds"), [(0.0, 3), (float("inf"), 6)], ids=["settled", "too-close"])
def test_a_ratio_too_close_to_the_threshold_is_measured_again_and_all_rounds_decide(
    nano_build: Path, monkeypatch: pytest.MonkeyPatch, unsettled: float, rounds: int
) -> None:
    """Three rounds decide where their median lies clear of ``PAYS``; within ``UNSETTLED`` of it three more
    are measured and the median of all six decides. The band is set here to force each case (where a CPU's
    ratio lands is timing: bench/runtime.py pays); ``describe()`` says how many rounds were run."""
    from veo_edge.runtime.backends import openvino_batching

    monkeypatch.setattr(openvino_batching, "UNSETTLED", unsettled)
    with veo_edge.Runtime(
        nano_build, backend="openvino", performance_hint="ADAPTIVE", max_batch="auto"
    ) as rt:
        described = rt.describe()
        measured = described.get("batching")
        if described["streams"] == 1:
            pytest.skip("one OpenVINO stream on this machine: nothing to measure")
        assert measured["rounds"] == rounds
        assert measured["batching_pays"] is (measured["batched_over_single"] >= openvino_batching.PAYS)
        assert rt.max_batch == (8 if measured["batching_pays"] else 1)
        x = seeded(4, (3, 32, 32), seed=10)
        assert float(np.abs(rt.infer(x) - reference(nano_build, x)).max()) <= tolerance(nano_build)
