"""What the runtime takes: its constructor's numbers and warm-up sizes checked, and each request's input checked against
the build's one input (shape, dtype) before it reaches the batcher or a backend. Pure checks, each a
:class:`~veo_edge.errors.UsageError` or :class:`~veo_edge.errors.InputError` that says what to send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from veo_edge.errors import InputError, UsageError
from veo_edge.runtime.backends.base import TensorMeta


def check_options(
    *,
    gpu: Any,
    max_queue_delay_ms: float,
    max_queue: int,
    threads: Any,
    recover_interval_s: float | None,
    concurrency: int | None,
    performance_hint: str,
    hints: tuple[str, ...],
) -> None:
    """Refuse a runtime option out of its range (one line naming the option and what it takes)."""
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
        raise UsageError(f"gpu must be a device index >= 0, got {gpu!r}")
    if max_queue_delay_ms < 0 or max_queue < 1:
        raise UsageError(
            f"max_queue_delay_ms must be >= 0 and max_queue >= 1, got {max_queue_delay_ms} and {max_queue}"
        )
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 0):
        raise UsageError(f"threads must be a count >= 0 (0 or None: the backend's), got {threads!r}")
    if recover_interval_s is not None and not recover_interval_s > 0:
        raise UsageError(f"recover_interval_s must be > 0 seconds (or None: never), got {recover_interval_s}")
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"concurrency must be >= 1 (batches in flight at once), got {concurrency}")
    if performance_hint not in hints:
        raise UsageError(f"unknown performance hint {performance_hint!r}; choose one of: {', '.join(hints)}")


def warm_sizes(sizes: Sequence[int] | None, max_batch: int) -> list[int]:
    """The batch sizes a warm-up runs (None: ``1..max_batch``), sorted, each refused outside that range."""
    out = sorted(set(int(b) for b in (range(1, max_batch + 1) if sizes is None else sizes)))
    if not out or not 1 <= out[0] <= out[-1] <= max_batch:
        raise UsageError(
            f"warm-up batch sizes must lie in 1..{max_batch} (the build's --max-batch or max_batch)"
        )
    return out


class InputCheck:
    """The build's input (name, per-sample shape, dtype) and the checks of a batch or one sample."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.name, self.shape, self.dtype = name, shape, dtype

    def _batch_shape_ok(self, x: np.ndarray) -> bool:
        return x.ndim == len(self.shape) + 1 and tuple(x.shape[1:]) == self.shape and bool(x.shape[0])

    def batch(self, x: Any) -> None:
        """A batch ``(N, *shape)`` for a synchronous infer."""
        if not isinstance(x, np.ndarray):
            raise InputError(f"input is a {type(x).__name__}, expected a numpy array")
        if not self._batch_shape_ok(x):
            meta = TensorMeta(self.name, (None, *self.shape), self.dtype.name)
            raise InputError(
                f"input {self.name!r} has shape {tuple(x.shape)}, expected {meta.describe()} "
                "(N >= 1 is the batch axis)"
            )
        self.check_dtype(x)

    def many(self, x: Any) -> None:
        """A batch ``(N, *shape)`` whose samples are queued at once."""
        if not isinstance(x, np.ndarray):
            raise InputError(f"input is a {type(x).__name__}, expected a numpy array")
        if not self._batch_shape_ok(x):
            raise InputError(
                f"input has shape {tuple(x.shape)}, expected (N, {', '.join(map(str, self.shape))}) "
                "with N >= 1"
            )
        self.check_dtype(x)

    def sample(self, sample: Any) -> np.ndarray:
        """One sample (``shape`` or ``(1, *shape)``), checked, shaped ``shape``."""
        if not isinstance(sample, np.ndarray):
            raise InputError(f"sample is a {type(sample).__name__}, expected a numpy array")
        got = tuple(sample.shape)
        if got not in (self.shape, (1, *self.shape)):
            raise InputError(
                f"sample has shape {got}, expected one sample of shape {self.shape} "
                f"(or (1, {', '.join(map(str, self.shape))})); use infer() for batches"
            )
        self.check_dtype(sample)
        return sample.reshape(self.shape)

    def check_dtype(self, x: np.ndarray) -> None:
        if x.dtype != self.dtype:
            raise InputError(
                f"input has dtype {x.dtype}, expected {self.dtype}; convert it with .astype(np.{self.dtype})"
            )
