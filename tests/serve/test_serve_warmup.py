"""``veo-edge serve`` warms every batch size before it listens (``--no-warmup`` does not): with it, HTTP
traffic of every batch size, one client and four at once, creates no OpenVINO infer request (the
``veo_edge_openvino_infer_requests`` gauge stays where the warm-up left it); without it, it does."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.http as tritonclient_http

from veo_edge.builddir import BuildDir
from veo_edge.export.parity import seeded_inputs

GAUGE = 'veo_edge_openvino_infer_requests{model="vit-nano",version="1"}'
_WARMED = re.compile(r"warmed batch sizes 1\.\.(\d+) on openvino \((\d+) infer requests held\)")


def _infer_requests(server) -> int:
    _, _, body = server.request("GET", "/metrics")
    m = re.search(rf"^{re.escape(GAUGE)} (\S+)$", body.decode(), re.MULTILINE)
    assert m, body.decode()
    return int(float(m.group(1)))


def _traffic(server, max_batch: int) -> None:
    """Every batch size alone, then four requests of each size at once; every answer checked."""
    x = seeded_inputs((3, 32, 32), max_batch, 8)
    with tritonclient_http.InferenceServerClient(server.url, concurrency=4) as client:

        def request(b: int):
            inp = tritonclient_http.InferInput("input", [b, 3, 32, 32], "FP32")
            inp.set_data_from_numpy(x[:b], binary_data=True)
            return [inp]

        alone = {b: client.infer("vit-nano", request(b)).as_numpy("logits") for b in range(1, max_batch + 1)}
        for b in range(1, max_batch + 1):
            pending = [client.async_infer("vit-nano", request(b)) for _ in range(4)]
            for p in pending:
                np.testing.assert_allclose(p.get_result().as_numpy("logits"), alone[b], atol=2e-4, rtol=0)
    for b in range(1, max_batch):
        np.testing.assert_allclose(alone[b], alone[max_batch][:b], atol=2e-4, rtol=0)


@pytest.mark.parametrize("warm", [True, False], ids=["warmup", "no-warmup"])
def test_a_warmed_server_creates_no_infer_request_under_traffic(serve, nano_build, warm: bool) -> None:
    max_batch = BuildDir.open(nano_build).max_batch
    # every size batched: the build's max batch stated (auto could measure batch 1 worth more on a CPU)
    server = serve(nano_build, "--batch-limit", str(max_batch), *([] if warm else ["--no-warmup"]))
    log = server.log.read_text()
    warmed = _WARMED.search(log)
    before = _infer_requests(server)
    if warm:
        assert warmed, log
        assert int(warmed.group(1)) == max_batch
        # the line counts what the gauge counts: the canary's request, made before the warm-up, too
        assert before == int(warmed.group(2))
        assert before >= max_batch  # at least one per size
    else:
        assert warmed is None and 0 < before < max_batch  # what the canary created: its own batch size
    _traffic(server, max_batch)
    after = _infer_requests(server)
    if warm:
        assert after == before
    else:
        assert after > before


def test_a_batch_limit_of_one_runs_every_batch_size_as_single_samples(serve, nano_build) -> None:
    """``--batch-limit 1``: warm-up runs batch 1 only; requests of every size up to the build's max batch
    are still accepted and answered as the build answers them, each run as single samples (Triton's
    batch statistics have size 1 alone), creating no infer request; the config says so. Set through
    the environment, as ``deploy --env VEO_EDGE_BATCH_LIMIT=1`` sets it in a container."""
    max_batch = BuildDir.open(nano_build).max_batch
    server = serve(nano_build, env={"VEO_EDGE_BATCH_LIMIT": "1"})
    warmed = _WARMED.search(server.log.read_text())
    assert warmed and warmed.group(1) == "1"
    before = _infer_requests(server)
    _traffic(server, max_batch)
    assert _infer_requests(server) == before
    status, config = server.get_json("/v2/models/vit-nano/config")
    assert status == 200
    assert config["max_batch_size"] == max_batch and config["dynamic_batching"]["preferred_batch_size"] == [1]
    status, stats = server.get_json("/v2/models/vit-nano/stats")
    assert status == 200
    sizes = {int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]}
    assert sizes == {1}


def test_the_default_batch_limit_is_measured_at_start_and_stated(serve, nano_build) -> None:
    """``--batch-limit auto`` (the default): OpenVINO ADAPTIVE measures batches of 4 against single
    samples before traffic; the warm-up line states the limit it chose with the measured ratio, the
    config's preferred batch size and the batches that traffic runs agree with it, and requests of every
    size are answered as the build answers them. Which limit this CPU gets is timing (bench/), not
    asserted; tests/runtime/test_runtime_streams.py sets the threshold to force each."""
    max_batch = BuildDir.open(nano_build).max_batch
    server = serve(nano_build)
    log = server.log.read_text()
    chosen = re.search(
        r"warmed batch sizes 1\.\.(\d+) on openvino .*; batch limit (\d+): batches of 4 ran "
        r"(\d+\.\d+)x the samples/s of single samples on this CPU \(median of (3|6) rounds\)",
        log,
    )
    assert chosen, log
    limit = int(chosen.group(2))
    assert int(chosen.group(1)) == limit and limit in (1, max_batch)
    assert (float(chosen.group(3)) >= 1.1) == (limit == max_batch)
    status, config = server.get_json("/v2/models/vit-nano/config")
    assert status == 200 and config["dynamic_batching"]["preferred_batch_size"] == [limit]
    _traffic(server, max_batch)
    status, stats = server.get_json("/v2/models/vit-nano/stats")
    assert status == 200
    assert max(int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]) <= limit


def test_a_batch_limit_above_the_builds_max_batch_is_said_and_capped(serve, nano_build) -> None:
    max_batch = BuildDir.open(nano_build).max_batch
    server = serve(nano_build, "--batch-limit", "100")
    assert (
        f"--batch-limit 100 is above the build's max batch {max_batch}: batches of {max_batch} at most"
        in server.log.read_text()
    )
    status, config = server.get_json("/v2/models/vit-nano/config")
    assert status == 200 and config["dynamic_batching"]["preferred_batch_size"] == [max_batch]
