"""OpenVINO backend: the CPU fallback, running the IR from the build directory.

With ``hint="THROUGHPUT"`` the CPU plugin splits the cores into streams, each running its own infer
request; the runner then reports ``concurrency`` (OpenVINO's optimal number of infer requests) and runs
that many batches in parallel when called from as many threads (the runtime's batcher slots). Each call
takes an idle infer request of its batch size from a pool, so steady state creates no new requests.

``hint="ADAPTIVE"`` compiles the model three times: LATENCY and THROUGHPUT with the batch axis fixed at
1 (a static shape runs faster than the dynamic batch: 4-7 % on vit-tiny), and THROUGHPUT with the
dynamic batch. A sample that runs alone runs on the batch-1 LATENCY compile (all cores on it: a lone
client's latency); a larger batch that runs alone is split across the streams, one part each, run at
once (every core on it, as fast as a LATENCY compile runs it whole); a batch that starts while another
runs goes to one THROUGHPUT stream: a sample on the batch-1 streams compile, a larger batch on the
dynamic one (the streams keep every core busy under concurrent load, where one LATENCY request at a
time leaves them waiting on each other). ADAPTIVE keeps two batches in flight per stream
(``QUEUED_PER_STREAM``): one computing and one queued behind it, so that a stream that finishes starts
the next batch at once, while the callers of the one it finished are still on their way back (with one
per stream, 4 closed-loop clients on 2 streams leave each stream idle for that round trip after every
batch). At most one batch per stream runs on the dynamic compile (its infer requests keep their own
memory per batch size); the batch-1 compile's requests share their stream's memory. Measured on
vit-tiny on 2 cores (docs/benchmarks.md, `bench/serve.py limit`): LATENCY alone serves 1 client as fast and 4
clients at about 85 % of the machine's limit, THROUGHPUT alone 4 clients faster but 1 client at half
the speed. With ``measure_batching`` ADAPTIVE first measures whether batches pay (openvino_batching.py).
How each model is compiled (the stated precision and hint, bf16 where the CPU has it) is openvino_compile.py.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, BackendUnavailableError, ModelLoadError, UsageError
from veo_edge.runtime.backends.base import Runner, TensorMeta, zeros_feed
from veo_edge.runtime.backends.openvino_compile import (
    batch_of_one,
    compile_config,
    compiled_precision,
    resolve_precision,
)

log = logging.getLogger(__name__)

#: OpenVINO's performance hints: LATENCY (one stream, all cores on each request) or THROUGHPUT (streams);
#: ADAPTIVE is veo-edge's: LATENCY for a batch that runs alone, streams under load (see the module doc)
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "ADAPTIVE")
#: ADAPTIVE: batches in flight per THROUGHPUT stream, one computing and one queued (see the module doc)
QUEUED_PER_STREAM = 2


def _write(request: Any, inputs: Sequence[TensorMeta], feed: dict[str, np.ndarray]) -> None:
    """``feed`` written into ``request``'s own input tensors, shapes compared through numpy: OpenVINO's
    ``infer(feed)`` reads ``Tensor.shape``, 68 µs right after a compute (docs/benchmarks.md)."""
    for i, m in enumerate(inputs):
        tensor, x = request.get_input_tensor(i), feed[m.name]
        data = tensor.data
        if data.shape != x.shape:  # a new request of the dynamic compile
            tensor.shape = x.shape
            data = tensor.data
        data[...] = x


def _run_at_once(
    requests: list[Any], feeds: list[dict[str, np.ndarray]], inputs: Sequence[TensorMeta]
) -> None:
    """Start every infer request on its feed, then wait for every one that started (so none is reused
    while it runs); raise the first error."""
    started, error = [], None
    try:
        for request, feed in zip(requests, feeds, strict=True):
            _write(request, inputs, feed)
            request.start_async()
            started.append(request)
    except Exception as e:
        error = e
    for request in started:
        try:
            request.wait()
        except Exception as e:
            error = error or e
    if error is not None:
        raise error


def _meta(port: Any) -> TensorMeta:
    shape = tuple(None if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    return TensorMeta(port.get_any_name(), shape, np.dtype(port.get_element_type().to_dtype()).name)


class OpenVinoRunner(Runner):
    name = "openvino"

    def __init__(
        self,
        model: str | Path,
        device: str = "CPU",
        max_batch: int | None = None,
        threads: int | None = None,
        precision: str = "f32",
        has_native_bf16: Callable[[], bool] | None = None,
        hint: str = "LATENCY",
        streams: int | None = None,
        measure_batching: bool = False,
    ) -> None:
        super().__init__(max_batch)
        if hint not in PERFORMANCE_HINTS:
            raise UsageError(
                f"unknown OpenVINO performance hint {hint!r}; choose one of: {', '.join(PERFORMANCE_HINTS)}"
            )
        if streams is not None and streams < 1:
            raise UsageError(f"OpenVINO streams must be >= 1, got {streams}")
        self.model = Path(model)
        self.device = device
        self.threads = threads
        self.precision = precision  # f32, bf16, or int8 (an NNCF-quantized IR)
        self.has_native_bf16 = has_native_bf16
        self.precision_note: str | None = None
        self.hint = hint
        self.streams = streams
        #: ADAPTIVE: measure at activation whether batches beat single samples; where they do not, run
        #: batch 1 only (openvino_batching.py; ``measured`` holds what was measured)
        self.measure_batching = measure_batching
        self.measured: Any = None
        #: batches this runner takes at once (set at activation: 1 for LATENCY; ADAPTIVE queues
        #: QUEUED_PER_STREAM per stream)
        self.concurrency = 1
        #: batches that compute at once: OpenVINO's optimal number of infer requests (its streams)
        self.parallel = 1
        self._compiled: Any = None
        self._latency: Any = None  # ADAPTIVE: the batch-1 LATENCY compile, for a sample that runs alone
        self._single: Any = None  # ADAPTIVE: the batch-1 THROUGHPUT compile, for a sample beside others
        self._dynamic_gate: threading.BoundedSemaphore | None = None  # ADAPTIVE: one dynamic batch a stream
        #: idle infer requests, by compile ("latency", "streams_b1", "streams") and batch size
        self._requests: dict[tuple[str, int], list[Any]] = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        #: ADAPTIVE: batches run on each compile (batch-1 LATENCY, batch-1 streams, dynamic streams)
        self.runs = {"latency": 0, "streams_b1": 0, "streams": 0}
        #: infer requests created so far (each holds its own memory for the batch size it runs)
        self.requests_created = 0

    def _activate(self) -> None:
        try:
            import openvino as ov
        except ImportError as e:
            raise BackendUnavailableError(f"openvino is not importable ({e}); pip install openvino") from e
        core = ov.Core()
        if self.device not in core.available_devices:
            raise BackendUnavailableError(
                f"OpenVINO device {self.device!r} is not available (available: {core.available_devices})"
            )
        try:
            model = core.read_model(str(self.model))
        except Exception as e:
            raise ModelLoadError(f"OpenVINO could not read {self.model}: {e}") from e
        if self.max_batch == 1:  # batch 1 only: every compile static, ADAPTIVE's streams one compile
            model = batch_of_one(model)
        served, self.precision_note = resolve_precision(self.precision, self.has_native_bf16)
        if self.precision_note:
            log.warning("%s: %s", self.model, self.precision_note)
        # an int8 IR carries its quantized ops; everything around them runs at the stated f32
        compute = "f32" if served == "int8" else served
        adaptive = self.hint == "ADAPTIVE"
        config = compile_config(compute, self.threads, "THROUGHPUT" if adaptive else self.hint)
        if self.streams is not None:
            config["NUM_STREAMS"] = self.streams
        self._compiled = self._compile(core, model, config)
        self._inputs = [_meta(p) for p in self._compiled.inputs]
        self._outputs = [_meta(p) for p in self._compiled.outputs]
        self.parallel = self.concurrency = (
            1
            if self.hint == "LATENCY" and self.streams is None
            else max(1, int(self._compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        )
        if adaptive and self.parallel > 1:  # one stream only (one core): nothing to adapt between
            # one batch-1 copy for both batch-1 compiles (compile_model leaves it as it is); with
            # max_batch 1 the model is that copy already and the streams compile is the batch-1 one
            one = model if self.max_batch == 1 else batch_of_one(model)
            self._latency = self._compile(core, one, compile_config(compute, self.threads, "LATENCY"))
            self._single = self._compiled if one is model else self._compile(core, one, config)
            self._dynamic_gate = threading.BoundedSemaphore(self.parallel)
            self.concurrency = self.parallel * QUEUED_PER_STREAM
            if self.measure_batching and one is not model:
                self._measure_batching()
        self.served_precision = served

    def _measure_batching(self) -> None:
        from veo_edge.runtime.backends import openvino_batching

        self.measured = openvino_batching.measure(
            self._single, self._compiled, self._inputs, self.max_batch or 1, self.concurrency
        )
        self.measure_batching = False  # once: reactivated, it keeps the limit its runtime took from it
        if not self.measured.pays:  # batch 1 only: the dynamic compile goes, with its memory
            self._compiled, self.max_batch = self._single, 1
        log.info("%s: %s: batch limit %d", self.model, self.measured.describe(), self.max_batch)

    def measured_batch_limit(self) -> int | None:
        return None if self.measured is None else self.max_batch

    def _compile(self, core: Any, model: Any, config: dict[str, Any]) -> Any:
        compiled = core.compile_model(model, self.device, config)
        self.compiled_precision = compiled_precision(compiled)
        if self.compiled_precision != config["INFERENCE_PRECISION_HINT"]:
            raise BackendError(
                f"OpenVINO compiled {self.model} at {self.compiled_precision}, not the "
                f"{config['INFERENCE_PRECISION_HINT']} that was asked for"
            )
        return compiled

    def _deactivate(self) -> None:
        self._requests.clear()
        self._compiled = self._latency = self._single = self._dynamic_gate = None

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # idle infer requests are kept per compile and batch size: their tensors are reused, so steady
        # state allocates nothing new; concurrent calls (THROUGHPUT streams) each take their own
        batch = next(iter(feed.values())).shape[0]
        adaptive = self._latency is not None
        with self._lock:
            alone = adaptive and self._in_flight == 0
            self._in_flight += 1
            # ADAPTIVE: a sample alone on the LATENCY compile, beside others on a batch-1 stream
            kind = "streams" if not adaptive or batch > 1 else "latency" if alone else "streams_b1"
            if adaptive:
                self.runs[kind] += 1
        try:
            if kind != "streams" or not adaptive:
                compiled = {"latency": self._latency, "streams_b1": self._single}.get(kind, self._compiled)
                return self._run(kind, compiled, feed)
            with self._dynamic_gate:  # one dynamic batch per stream: their requests keep their memory
                if alone:  # a lone batch, split across the streams so that every core works on it
                    return self._run_split(feed, batch)
                return self._run(kind, self._compiled, feed)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _take(self, kind: str, batch: int, compiled: Any) -> Any:
        with self._lock:
            idle = self._requests.setdefault((kind, batch), [])
            if idle:
                return idle.pop()
            self.requests_created += 1
        return compiled.create_infer_request()

    def _give(self, kind: str, batch: int, request: Any) -> None:
        with self._lock:
            self._requests.setdefault((kind, batch), []).append(request)

    def _run(self, kind: str, compiled: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = next(iter(feed.values())).shape[0]
        request = self._take(kind, batch, compiled)
        try:
            _write(request, self._inputs, feed)
            request.infer()
            return {m.name: np.array(request.get_output_tensor(i).data) for i, m in enumerate(self._outputs)}
        except Exception as e:
            raise BackendError(f"OpenVINO inference failed: {e}") from e
        finally:
            self._give(kind, batch, request)

    def _parts(self, batch: int) -> list[tuple[int, int]]:
        """The rows (start, stop) of a lone batch's parts, one per stream."""
        bounds = np.linspace(0, batch, min(self.parallel, batch) + 1)
        return list(itertools.pairwise(int(b) for b in bounds))

    def _run_split(self, feed: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        """One batch as ``parallel`` parts, one per stream, run at once (as fast as the LATENCY
        compile runs the whole batch on every core, measured in the README)."""
        parts = self._parts(batch)
        requests = [self._take("streams", b - a, self._compiled) for a, b in parts]
        try:
            _run_at_once(
                requests, [{name: x[a:b] for name, x in feed.items()} for a, b in parts], self._inputs
            )
            return {
                m.name: np.concatenate([r.get_output_tensor(i).data for r in requests])
                for i, m in enumerate(self._outputs)
            }
        except Exception as e:
            raise BackendError(f"OpenVINO inference failed: {e}") from e
        finally:
            for request, (a, b) in zip(requests, parts, strict=True):
                self._give("streams", b - a, request)

    def warm_up(self, sizes: Sequence[int], in_flight: int = 1) -> int:
        """Create, and run once on zeros, every infer request the traffic can use for ``sizes``: on each
        compile, for each batch size, as many as can run at once (``in_flight``, the batcher's slots;
        ADAPTIVE: one on the batch-1 LATENCY compile, which runs a sample only alone, ``concurrency`` on
        the batch-1 streams compile, and 2 × ``parallel`` - 1 per size on the dynamic one: a lone batch
        split across the streams, one part each, while one batch per other stream starts beside it).
        Each compile's requests run at once, so that each stream meets each size. Afterwards serving
        creates no infer request and each size's first batch runs as fast as its later ones (measured
        in the README)."""
        self._require_active()
        compiles = [("streams", self._compiled, sizes, max(1, in_flight))]
        if self._latency is not None:
            ones = [1] if 1 in sizes else []
            # the dynamic compile runs batches of 2 and more, and the parts of lone ones split
            dynamic = {b for b in sizes if b > 1} | {z - a for b in sizes if b > 1 for a, z in self._parts(b)}
            compiles = [
                ("latency", self._latency, ones, 1),
                ("streams_b1", self._single, ones, self.concurrency),
                ("streams", self._compiled, sorted(dynamic), 2 * self.parallel - 1),
            ]
        before = self.requests_created
        for kind, compiled, batches, count in compiles:
            for b in batches:
                requests = [self._take(kind, b, compiled) for _ in range(count)]
                try:
                    _run_at_once(requests, [zeros_feed(self._inputs, b)] * count, self._inputs)
                except Exception as e:
                    raise BackendError(f"OpenVINO warm-up at batch {b} failed: {e}") from e
                finally:
                    for request in requests:
                        self._give(kind, b, request)
        return self.requests_created - before

    def describe(self) -> dict[str, Any]:
        import openvino as ov

        return {
            "backend": self.name,
            "version": ov.get_version(),
            "device": self.device,
            "precision": getattr(self, "served_precision", self.precision),
            "inference_precision_hint": getattr(self, "compiled_precision", None),
            **({"precision_note": self.precision_note} if self.precision_note else {}),
            "performance_hint": self.hint,
            "infer_requests_in_flight": self.concurrency,
            "streams": self.parallel,
            "infer_requests": self.requests_created,
            **({"adaptive_runs": dict(self.runs)} if self._latency is not None else {}),
            **({"batching": self.measured.to_dict()} if self.measured is not None else {}),
        }
