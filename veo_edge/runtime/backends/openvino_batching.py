"""Whether batching pays on this CPU for this model, measured when ADAPTIVE activates (``serve
--batch-limit auto``, the default).

On the CPU the answer depends on the model (and on the machine). Measured on one 2-vCPU AMD EPYC
(docs/benchmarks.md, "Does batching pay on the CPU?", ``python bench/runtime.py pays``), the dynamic
streams at batch 4 ran 1.35-1.46x the samples/s of the batch-1 streams on the small models (vit-digits,
vit-nano, ViTs at 48² and 64²), 1.32x and 1.14x on ViTs at 96² and 128², and 0.96-1.04x on 160², vit-tiny
and the video model. Where batches run no faster, batching only makes a batch's first samples wait for its
last (at eight clients a third of vit-tiny's p99) and its compile and per-size infer requests hold about
half the server's memory. The model's latency did not predict it (an 8 ms model gained 1.32x, a 7 ms one
1.14x, a 3 ms one 1.35x), so the runner measures: both compiles kept full in short alternating windows,
on zeros, before any traffic; one window of each per round, the median of the rounds' ratios decides.
A median within ``UNSETTLED`` of the threshold is measured again (as many rounds more, the median of all
decides): single rounds' ratios spread widely (0.70-1.38 on one 96² ViT start on an AVX2 EPYC), and
three rounds' median chose batch 1 in 2 of 10 starts of that model whose sweeps read 1.10-1.33x at batch 4
(six rounds: 1 of 10, docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: batching is kept when batches run at least this many times the samples/s of single samples: below
#: it, what batching buys is inside a start-up window's noise and its tail and memory cost are not
PAYS = 1.10
#: the batch measured on the dynamic compile (or the build's max batch, if smaller)
MEASURED_BATCH = 4
#: the compiles are measured in turn, this many windows each (the machine's speed drifts within seconds)
ROUNDS = 3
#: a median ratio within this fraction of ``PAYS`` (0.99-1.21x) is too close to call on ``ROUNDS``: as many
#: rounds again are measured, and the median of all of them decides. It costs start-up time only there
#: (AVX2 EPYC: measuring took 5.4 s instead of 3.0 s on vit-tiny, 1.8 s instead of 0.9 s on a 96² ViT)
UNSETTLED = 0.10
#: each window keeps its compile full for at least this long (and for as many samples as one run of each
#: request at the measured batch: a slow model's windows are as long as its batched runs need)
MIN_SECONDS = 0.1


@dataclass(frozen=True)
class BatchingMeasure:
    """Samples/s of the batch-1 streams (``single``, the median window) and the dynamic streams' samples/s
    at ``batch`` over theirs (``ratio``, the median of the ``rounds`` rounds' ratios), each compile kept
    full."""

    batch: int
    single: float
    ratio: float
    rounds: int

    @property
    def pays(self) -> bool:
        return self.ratio >= PAYS

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured_batch": self.batch,
            "single_samples_per_s": round(self.single, 1),
            "batched_over_single": round(self.ratio, 3),
            "batching_pays": self.pays,
            "rounds": self.rounds,
            "summary": self.describe(),
        }

    def describe(self) -> str:
        return (
            f"batches of {self.batch} ran {self.ratio:.2f}x the samples/s of single samples on this CPU "
            f"(median of {self.rounds} rounds)"
        )


class _KeptFull:
    """``jobs`` infer requests of ``compiled`` (OpenVINO's ``AsyncInferQueue``) on one feed, each run once
    untimed (its first run sets up its memory)."""

    def __init__(self, compiled: Any, feed: dict[str, np.ndarray], jobs: int) -> None:
        import openvino as ov

        self.queue, self.feed, self.jobs = ov.AsyncInferQueue(compiled, jobs), feed, jobs
        self.batch = next(iter(feed.values())).shape[0]
        self.window(0.0)

    def window(self, seconds: float, samples: int = 0) -> float:
        """Samples/s with every request kept busy for ``seconds``, at least one run each and at least
        ``samples`` samples."""
        runs, start = 0, time.perf_counter()
        while runs < max(self.jobs, -(-samples // self.batch)) or time.perf_counter() - start < seconds:
            self.queue.start_async(self.feed)
            runs += 1
        self.queue.wait_all()
        return runs * self.batch / (time.perf_counter() - start)


def measure(single: Any, dynamic: Any, inputs: list[Any], max_batch: int, jobs: int) -> BatchingMeasure:
    """The batch-1 streams compile (``single``) against the dynamic one at ``min(MEASURED_BATCH,
    max_batch)``, ``jobs`` batches in flight on each as the runner keeps them when serving, in
    alternating windows."""
    from veo_edge.runtime.backends.base import zeros_feed

    batch = min(MEASURED_BATCH, max_batch)
    one, many = (
        _KeptFull(single, zeros_feed(inputs, 1), jobs),
        _KeptFull(dynamic, zeros_feed(inputs, batch), jobs),
    )
    n = batch * jobs  # as many samples in each window: one run of each request at the measured batch
    rates: list[tuple[float, float]] = []
    for _ in range(2):  # a second pass of as many rounds only where the first is too close to call
        rates += [(one.window(MIN_SECONDS, n), many.window(MIN_SECONDS, n)) for _ in range(ROUNDS)]
        # paired by round: the drift between rounds cancels
        ratio = statistics.median(b / a for a, b in rates)
        if abs(ratio - PAYS) > UNSETTLED * PAYS:
            break
    return BatchingMeasure(batch, statistics.median(a for a, _ in rates), ratio, len(rates))
