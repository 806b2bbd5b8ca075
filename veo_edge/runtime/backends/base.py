"""The runner interface every backend implements (Polygraphy-style ``activate / infer / deactivate``).

Constructing a runner is cheap and touches nothing: libraries are imported, models loaded and devices
claimed only in :meth:`Runner.activate`. :meth:`Runner.infer` checks its inputs against the runner's
declared input metadata before anything runs, so a wrong name, rank, shape or dtype is an
:class:`~veo_edge.errors.InputError` that says what was expected.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from veo_edge.errors import InputError, VeoEdgeError


@dataclass(frozen=True)
class Verdict:
    """A candidate's probe: usable or not, and why not. Lives here, below both the backends that probe
    and the policy that reads the verdicts, so no backend imports the policy."""

    ok: bool
    reason: str | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class TensorMeta:
    """Name, shape (``None`` for a dynamic axis) and numpy dtype name of one model input or output."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def describe(self) -> str:
        dims = ", ".join("N" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def check_feed(
    feed: dict[str, np.ndarray], inputs: list[TensorMeta], max_batch: int | None
) -> dict[str, np.ndarray]:
    """Validate ``feed`` against ``inputs``; returns it with arrays made C-contiguous."""
    expected = {m.name for m in inputs}
    if set(feed) != expected:
        raise InputError(
            f"inputs {sorted(feed)} do not match the model's inputs {sorted(expected)}; "
            f"expected: {'; '.join(m.describe() for m in inputs)}"
        )
    checked = {}
    for meta in inputs:
        arr = feed[meta.name]
        if not isinstance(arr, np.ndarray):
            raise InputError(f"input {meta.name!r} is a {type(arr).__name__}, expected a numpy array")
        if arr.dtype != np.dtype(meta.dtype):
            raise InputError(
                f"input {meta.name!r} has dtype {arr.dtype}, expected {meta.dtype}; "
                f"convert it with .astype(np.{meta.dtype})"
            )
        want = meta.shape
        fits = arr.ndim == len(want) and all(
            w is None or w == g for w, g in zip(want, arr.shape, strict=True)
        )
        if not fits:
            raise InputError(
                f"input {meta.name!r} has shape {tuple(arr.shape)}, expected {meta.describe()} "
                "(N is the batch axis)"
            )
        if max_batch is not None and arr.ndim and not 1 <= arr.shape[0] <= max_batch:
            raise InputError(
                f"input {meta.name!r} has batch {arr.shape[0]}, expected 1..{max_batch} "
                "(the build's --max-batch); split the batch or rebuild with a larger --max-batch"
            )
        checked[meta.name] = np.ascontiguousarray(arr)
    return checked


def zeros_feed(inputs: list[TensorMeta], batch: int) -> dict[str, np.ndarray]:
    """A feed of zeros at ``batch`` for inputs whose other axes are static (a warm-up's input)."""
    return {m.name: np.zeros((batch, *m.shape[1:]), m.dtype) for m in inputs}


class Runner(abc.ABC):
    """A backend that runs one model. Use as a context manager or call activate/deactivate."""

    #: short backend name, e.g. "openvino", "onnxruntime", "tensorrt"
    name: str = "runner"

    def __init__(self, max_batch: int | None = None) -> None:
        self.max_batch = max_batch
        self.is_active = False
        self._inputs: list[TensorMeta] | None = None
        self._outputs: list[TensorMeta] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def activate(self) -> Runner:
        if not self.is_active:
            self._activate()
            self.is_active = True
        return self

    def deactivate(self) -> None:
        if self.is_active:
            try:
                self._deactivate()
            finally:
                self.is_active = False

    def __enter__(self) -> Runner:
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.deactivate()

    # -- metadata -------------------------------------------------------------------------------
    def input_metadata(self) -> list[TensorMeta]:
        self._require_active()
        assert self._inputs is not None
        return self._inputs

    def output_metadata(self) -> list[TensorMeta]:
        self._require_active()
        assert self._outputs is not None
        return self._outputs

    # -- inference ------------------------------------------------------------------------------
    def infer(self, feed: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        """Run one batch. A bare array is accepted for single-input models."""
        self._require_active()
        inputs = self.input_metadata()
        if isinstance(feed, np.ndarray):
            if len(inputs) != 1:
                raise InputError(
                    f"the model has {len(inputs)} inputs; pass a dict of name -> array: "
                    f"{'; '.join(m.describe() for m in inputs)}"
                )
            feed = {inputs[0].name: feed}
        return self._infer(check_feed(feed, inputs, self.max_batch))

    def warm_up(self, sizes: Sequence[int], in_flight: int = 1) -> int:
        """Run each batch size in ``sizes`` once on zeros, so that the first real batch of a size does not
        pay for what the backend sets up at its first sight of that size (shape-specific kernels, memory).
        ``in_flight``: the most batches the caller runs at once. Returns the infer requests (or
        contexts) created for it; 0 for a backend that keeps none of its own."""
        inputs = self.input_metadata()
        if any(d is None for m in inputs for d in m.shape[1:]):
            return 0  # a dynamic non-batch axis: no one shape stands for the traffic
        for b in sizes:
            self.infer(zeros_feed(inputs, b))
        return 0

    def _require_active(self) -> None:
        if not self.is_active:
            raise VeoEdgeError(f"{self.name} runner is not active; call activate() or use it in a with-block")

    @abc.abstractmethod
    def _activate(self) -> None: ...

    @abc.abstractmethod
    def _deactivate(self) -> None: ...

    @abc.abstractmethod
    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def measured_batch_limit(self) -> int | None:
        """The largest batch worth running here, as the backend measured it when it activated (None: it
        measured nothing; OpenVINO ADAPTIVE with ``measure_batching``)."""
        return None

    def describe(self) -> dict[str, Any]:
        """What this runner is running on (device, providers, precision ...), for reports."""
        return {"backend": self.name}
