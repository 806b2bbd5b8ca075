"""Lone requests on the event loop's thread (veo_edge/serve/alone.py), on real servers: one client's
requests run there after a streak and answer what the batcher answers; two concurrent clients are seen
within one probe and go back to the batcher; a model whose lone requests take over --lone-max-ms
(their median) never runs there, and one slow request does not stop it; 0 turns it off."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest

from tests.serve.conftest import serve_to_exit
from veo_edge.serve.alone import LoneRequests
from veo_edge.serve.protocol import encode_infer_request

STREAK, PROBE_EVERY = 8, 16  # LoneRequests' defaults
SHAPE = (1, 3, 32, 32)


def infer(port: int, x: np.ndarray) -> np.ndarray:
    body, hlen = encode_infer_request({"input": x}, binary=True)
    headers = {"Inference-Header-Content-Length": str(hlen)}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v2/models/vit-nano/infer", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, data[:300]
    finally:
        conn.close()
    hlen = int(resp.getheader("Inference-Header-Content-Length"))
    head = json.loads(data[:hlen])
    return np.frombuffer(data[hlen:], np.float32).reshape(head["outputs"][0]["shape"])


def closed(server) -> dict[str, float]:
    """veo_edge_batches_closed_total by reason."""
    status, _, body = server.request("GET", "/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith('veo_edge_batches_closed_total{model="vit-nano"'):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def test_one_client_runs_on_the_loop_and_gets_the_batchers_answers(serve, nano_build):
    xs = np.random.default_rng(0).standard_normal((40, *SHAPE)).astype(np.float32)
    on, off = serve(nano_build), serve(nano_build, "--lone-max-ms", "0")
    got_on = [infer(on.port, x) for x in xs]
    got_off = [infer(off.port, x) for x in xs]
    for a, b in zip(got_on, got_off, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # one compile either way (f32, batch 1)
    c_on, c_off = closed(on), closed(off)
    # the first STREAK requests build the streak; after it every PROBE_EVERY-th one is a probe
    assert c_on.get("alone", 0) >= len(xs) - STREAK - len(xs) // PROBE_EVERY - 1, c_on
    assert c_off.get("alone", 0) == 0 and sum(c_off.values()) >= len(xs), c_off


def test_concurrency_is_seen_within_a_probe_and_goes_back_to_the_batcher(serve, nano_build):
    """Each compute takes 30 ms (slow_ms), so two clients overlap for sure: once a probe leaves the loop
    free, the other client's request arrives while one is in progress and the streak ends."""
    server = serve(nano_build, env={"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 30}})})
    x = np.zeros(SHAPE, np.float32)
    want = infer(server.port, x)
    for _ in range(STREAK + 2):  # one client: the streak, then requests on the loop
        np.testing.assert_allclose(infer(server.port, x), want, rtol=0, atol=1e-6)
    before = closed(server)
    assert before.get("alone", 0) >= 1, before
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(20):
                np.testing.assert_allclose(infer(server.port, x), want, rtol=0, atol=1e-6)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    after = closed(server)
    on_loop = after.get("alone", 0) - before.get("alone", 0)
    batched = sum(after.values()) - sum(before.values()) - on_loop
    # at most the requests before the first probe ran on the loop; the rest went to the batcher
    assert on_loop <= PROBE_EVERY and batched >= 40 - PROBE_EVERY, (before, after)


def test_a_model_over_the_bound_never_runs_on_the_loop(serve, nano_build):
    server = serve(
        nano_build, "--lone-max-ms", "20", env={"VEO_EDGE_FAULTS": json.dumps({"*": {"slow_ms": 40}})}
    )
    x = np.zeros(SHAPE, np.float32)
    for _ in range(STREAK + 6):
        infer(server.port, x)
    closes = closed(server)
    assert closes.get("alone", 0) == 0 and sum(closes.values()) >= STREAK + 6, closes
    assert "over --lone-max-ms 20: they go through the batcher" in server.log.read_text()


def test_one_slow_request_does_not_turn_it_off(caplog):
    """The bound is judged on the median of the model's last lone requests (real time, slept here): one
    slow request leaves it on, a slow run turns it off (logged once), a fast one back on."""
    lone = LoneRequests(max_ms=20, streak=1, probe_every=1000)

    def request(ms: float, model: str = "m") -> bool:
        began = lone.begin()
        allowed = lone.on_loop(model)
        time.sleep(ms / 1e3)
        lone.end(model, began)
        return allowed

    assert [request(1) for _ in range(4)] == [False, False, False, True]  # judged after 3
    assert request(60) and request(1)  # one slow request: the median is still 1 ms
    assert [request(60) for _ in range(4)] == [True, True, False, False]  # the median of 5 turns
    assert not request(1, "other")  # another model is judged on its own requests
    assert [request(1) for _ in range(4)] == [False, False, False, True]
    assert sum("over --lone-max-ms 20" in r.getMessage() for r in caplog.records) == 1
    began = lone.begin()
    overlapping = lone.begin()  # a request that overlaps another: neither counts
    lone.end("m", began)
    lone.end("m", overlapping)
    assert began is not None and overlapping is None


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--lone-max-ms", "-1", "--lone-max-ms -1.0 must be 0 (never) or more"),
        ("--max-queue", "0", "--max-queue 0 must be at least 1"),  # was the runtime's Python names
        ("--max-queue-delay-ms", "-1", "--max-queue-delay-ms -1.0 must be 0 (no batching window) or more"),
        ("--infer-timeout", "0", "--infer-timeout 0.0 must be positive"),  # was accepted: every infer 504
        ("--drain-timeout", "-1", "--drain-timeout -1.0 must be 0 (no wait) or more"),
        ("--batch-limit", "0", "--batch-limit 0 must be auto or a count of at least 1 (1: no batching)"),
        (
            "--batch-limit",
            "some",
            "--batch-limit some must be auto or a count of at least 1 (1: no batching)",
        ),
    ],
)
def test_a_bad_bound_is_refused_in_one_line_by_its_flag(nano_build, tmp_path, flag, value, message):
    done = serve_to_exit(nano_build, flag, value, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
