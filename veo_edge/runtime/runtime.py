"""The runtime: one entry over TensorRT, ONNX Runtime and OpenVINO, with dynamic batching and automatic,
visible fallback that loses no request.

::

    with veo_edge.Runtime("vit-tiny").start() as rt:      # probes, activates the first usable backend
        logits = rt.infer(batch)                          # (N, *input_shape) -> (N, classes), synchronous
        fut = rt.submit(sample)                           # one sample through the dynamic batcher
        print(rt.state.to_dict(), rt.stats())

Selection: the policy's candidates (default tensorrt -> onnxruntime-cuda -> openvino -> onnxruntime) are
probed in order (:mod:`veo_edge.runtime.policy`), each skip recorded in ``state.skipped``; the first
usable one is active, the next a warmed standby. Retries, switches and their counts:
:mod:`veo_edge.runtime.fallback`; every request is answered exactly once. ``fallback=False``: only the
first candidate; a batch failed by a transient fault is run once more on it, then its failure is an error. Injected faults: ``faults`` or ``$VEO_EDGE_FAULTS``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError
from veo_edge.runtime.backends.base import Runner
from veo_edge.runtime.backends.openvino import PERFORMANCE_HINTS
from veo_edge.runtime.batching import Arrival, Batcher, BatcherStats, ClosedError
from veo_edge.runtime.fallback import Fallback
from veo_edge.runtime.faults import FaultPlan, parse_faults
from veo_edge.runtime.imports import start_import_checks
from veo_edge.runtime.inputs import InputCheck, check_options, warm_sizes
from veo_edge.runtime.policy import (
    BACKENDS,
    artifacts_of,
    make_runner,
    parse_memory_size,
    probe_candidate,
    resolve_max_batch,
    resolve_policy,
)
from veo_edge.runtime.recovery import RecoveryClock
from veo_edge.runtime.state import HISTORY, CandidateStatus, RuntimeState, SyncCounters, concurrency
from veo_edge.runtime.warmcheck import WarmCheck

__all__ = ["HISTORY", "CandidateStatus", "Runtime", "RuntimeState"]

log = logging.getLogger("veo_edge.runtime")


class Runtime:
    """Serve one build directory on the best backend this machine has (see the module docstring)."""

    def __init__(
        self,
        build_dir: str | Path | BuildDir,
        backend: str = "auto",
        *,
        fallback: bool = True,
        policy: Sequence[str] | None = None,
        max_queue_delay_ms: float = 2.0,
        max_queue: int = 256,
        gpu_memory_budget: int | str | None = None,
        faults: Mapping[str, Any] | str | None = None,
        threads: int | None = None,
        recover_interval_s: float | None = None,
        gpu: int = 0,
        concurrency: int | None = None,
        performance_hint: str = "LATENCY",
        fault_clock: Callable[[], float] | None = None,
        max_batch: int | str | None = None,
    ) -> None:
        self.build = build_dir if isinstance(build_dir, BuildDir) else BuildDir.open(build_dir)
        self.backend = backend
        self.fallback = fallback
        self.names, disabled = resolve_policy(backend, policy, fallback)
        self.faults = parse_faults(faults, BACKENDS)
        # the time rules' clock (default: monotonic seconds since now); a soak passes its run time
        self._fault_plan = FaultPlan(self.faults, clock=fault_clock)
        self.gpu_memory_budget = parse_memory_size(gpu_memory_budget)
        check_options(
            gpu=gpu,
            max_queue_delay_ms=max_queue_delay_ms,
            max_queue=max_queue,
            threads=threads,
            recover_interval_s=recover_interval_s,
            concurrency=concurrency,
            performance_hint=performance_hint,
            hints=PERFORMANCE_HINTS,
        )
        self.gpu = gpu  # the GPU the GPU backends use (TensorRT: cudaSetDevice; the probes: its free memory)
        self.max_queue_delay_ms = float(max_queue_delay_ms)
        self.max_queue = int(max_queue)
        self.threads = threads
        #: how often the recovery clock tries earlier backends and re-warms a healed standby (None: never)
        self.recover_interval_s = recover_interval_s
        self.concurrency = concurrency  # None: what the first active backend runs in parallel
        # OpenVINO: LATENCY, THROUGHPUT streams in parallel, or ADAPTIVE (both; see backends/openvino.py)
        self.performance_hint = performance_hint
        manifest = self.build.manifest
        #: the largest batch run on a backend (default: the build's; "auto": what the first backend
        #: measured worth batching, OpenVINO ADAPTIVE, else the build's); larger inputs run in parts of it
        self.max_batch, self._measure_batching = resolve_max_batch(max_batch, self.build.max_batch)
        self.input_shape = tuple(int(d) for d in manifest["input_shape"])
        self.input_name = manifest["inputs"][0]["name"]
        self.input_dtype = np.dtype(manifest["inputs"][0]["dtype"])
        self.output_name = manifest["outputs"][0]["name"]
        self._input = InputCheck(self.input_name, self.input_shape, self.input_dtype)

        # the active runner and its standby behind a gate, the history of skips and switches, the counters
        self._backends = Fallback(
            self.names,
            disabled,
            probe=lambda name: probe_candidate(name, self.build, self.gpu_memory_budget, gpu=self.gpu),
            make=self._make,
            fallback=fallback,
            where=str(self.build.path),
            check=WarmCheck(self.build, self.input_name, self.output_name),
            retry_after_s=recover_interval_s,
        )
        self._state_lock = threading.Lock()
        self._sync = SyncCounters()
        self._last_inference_ms = 0
        self._batcher: Batcher | None = None
        self._started = False
        self._closed = False
        self._recovery: RecoveryClock | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Runtime:
        """Verify the artifacts the candidates load against the manifest (once; a tampered build raises
        :class:`~veo_edge.errors.ArtifactMismatchError`), probe the candidates in order, activate the first
        usable one, start the batcher."""
        with self._backends.gate:
            if self._closed:
                raise ClosedError("this runtime was closed; create a new Runtime")
            if self._started:
                return self
            # later backends' packages imported in children meanwhile: one that crashes costs only itself
            start_import_checks(self.names[1:])
            self.build.verify(sorted({k for n in self.names for k in artifacts_of(n, self.build)}))
            self._backends.activate_from(0)
            if self._backends.runner is not None:  # max_batch "auto": what the backend measured, if it did
                self.max_batch = self._backends.runner.measured_batch_limit() or self.max_batch
            self._backends.prepare_standby()
            self._batcher = Batcher(
                self._run_batch,
                self.input_shape,
                self.input_dtype,
                self.max_batch,
                self.max_queue_delay_ms,
                self.max_queue,
                slots=self.concurrency or concurrency(self._backends.runner),
            )
            self._started = True
            if self.recover_interval_s is not None:
                self._recovery = RecoveryClock(self.recover_interval_s, self._recover_tick).start()
        return self

    def warm_up(self, sizes: Sequence[int] | None = None) -> dict[str, Any]:
        """Run every batch size (default ``1..max_batch``) once on the active backend, on every infer
        request the batcher can use for it, before traffic: the first batch of each size then runs as
        fast as the later ones, and the process holds from now on the memory it will keep (without it,
        resident memory grows for as long as batch sizes first appear: 312 to 501 MiB on vit-tiny,
        ADAPTIVE; README). Nothing runs meanwhile. A standby was warmed at the largest batch when it
        was activated, and warms the other sizes as it serves. Returns what was warmed: backend, batch sizes, infer requests created, seconds."""
        self._require_open()
        sizes = warm_sizes(sizes, self.max_batch)
        start = time.perf_counter()
        created = self._backends.warm_up(sizes)  # exclusive: no batch runs, no switch meanwhile
        if self._batcher is not None:
            self._batcher.warm_up()
        report = {
            "backend": self.active_backend,
            "batch_sizes": sizes,
            "infer_requests": created,
            "seconds": round(time.perf_counter() - start, 3),
        }
        log.info(
            "warmed %s: batch sizes %d..%d, %d infer requests, %.2f s",
            report["backend"],
            sizes[0],
            sizes[-1],
            created,
            report["seconds"],
        )
        return report

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; answer everything accepted (``drain``) or reject it; release the backend."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        if self._recovery is not None:
            self._recovery.stop(timeout)
        if self._batcher is not None:
            self._batcher.close(drain=drain, timeout=timeout)
            if self._batcher.alive:  # timed out while draining: it releases nothing
                log.warning("runtime closed with requests still running after %ss", timeout)
                return
        self._backends.deactivate()

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inference --------------------------------------------------------------------------------
    def infer(self, x: np.ndarray, *, counted: bool = True) -> np.ndarray:
        """Run a batch ``(N, *input_shape)`` synchronously; batches above ``max_batch`` are split.
        ``counted=False``: a check of the server's own (its canary), left out of :meth:`stats`, as
        Triton leaves its model warm-up out of its statistics (faults and switches still count)."""
        self._require_open()
        self._input.batch(x)
        outs = []
        for i in range(0, x.shape[0], self.max_batch):
            chunk = np.ascontiguousarray(x[i : i + self.max_batch])
            start = time.perf_counter_ns()
            ok = False
            try:
                outs.append(self._run_batch(chunk, counted))
                ok = True
            finally:
                if counted:
                    with self._state_lock:
                        self._sync.count(len(chunk), (time.perf_counter_ns() - start) / 1e3, ok)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def run_canary(self, x: np.ndarray) -> tuple[np.ndarray, str, str | None]:
        """The golden canary ``x`` (batch 1) run as :meth:`infer` with ``counted=False`` runs it, and who
        answered: (output, backend, the precision it computes at). The backend is the active one, or,
        when that one failed the batch, the one its retry ran on: the answer is that backend's."""
        self._require_open()
        self._input.batch(x)
        answered: list[Any] = []
        out = self._backends.run({self.input_name: np.ascontiguousarray(x)}, self.output_name, answered)
        return out, answered[0], answered[1]

    def submit(self, sample: np.ndarray, arrival: Arrival | None = None) -> Future:
        """Queue one sample (``input_shape`` or ``(1, *input_shape)``) for the dynamic batcher."""
        return self._batcher.submit(self._one(sample), arrival)

    def submit_many(self, x: np.ndarray, arrival: Arrival | None = None) -> list[Future]:
        """Queue the samples of a batch ``(N, *input_shape)`` at once, all or none (a full queue raises
        :class:`OverloadedError` and queues nothing); one future per sample."""
        self._require_open()
        self._input.many(x)
        assert self._batcher is not None
        return self._batcher.submit_many(list(x), arrival)

    def run_alone(self, sample: np.ndarray, arrival: Arrival | None = None) -> Future | None:
        """One sample run on the calling thread when the batcher is idle (nothing queued, running or
        announced but ``arrival``) and the backends steady (:meth:`Fallback.steady`): its resolved
        future; ``None``: :meth:`submit` it."""
        x = self._one(sample)
        return self._batcher.run_alone(x, arrival) if self._backends.steady() else None

    def _one(self, sample: np.ndarray) -> np.ndarray:
        """``sample`` checked, shaped ``input_shape``."""
        self._require_open()
        return self._input.sample(sample)

    def expect(self, n: int = 1) -> Arrival:
        """Announce ``n`` samples being received (a forming batch may wait); pass it to :meth:`submit`."""
        self._require_open()
        assert self._batcher is not None
        return self._batcher.expect(n)

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError("the runtime is closed and accepts no more requests; create a new Runtime")
        if not self._started:
            raise UsageError("the runtime is not started; call start() or use it in a with-block")

    # -- selection and fallback -------------------------------------------------------------------
    def _make(self, name: str) -> Runner:
        gpu_options = {"gpu": self.gpu} if name == "tensorrt" else {}
        runner = make_runner(
            name,
            self.build,
            threads=self.threads,
            performance_hint=self.performance_hint,
            gpu_memory_budget=self.gpu_memory_budget,
            max_batch=self.max_batch,
            measure_batching=self._measure_batching and not self._started,
            **gpu_options,
        )
        return self._fault_plan.wrap(runner, name)

    def _run_batch(self, x: np.ndarray, counted: bool = True) -> np.ndarray:
        """Run one batch on the active backend (switching on its failure, see :class:`Fallback`)."""
        out = self._backends.run({self.input_name: x}, self.output_name)
        if counted:  # its time is counted by its caller (the batcher, or infer) with its size
            with self._state_lock:
                self._last_inference_ms = int(time.time() * 1000)
        return out

    def _recover_tick(self) -> None:
        """The recovery clock's work: back to a candidate ahead when one may be usable again, then a
        standby where a healed one can be warmed."""
        if self._backends.recovery_due() and not self._closed and self._started:
            self._backends.recover(backoff=True)
        if not self._closed:
            self._backends.prepare_standby()

    def try_recover(self, only_if_none_active: bool = False) -> bool:
        """Back to a candidate ahead of the active one (the GPU after an OOM), or any when all failed;
        True if moved. ``only_if_none_active``: not while one is active (decided under the gate)."""
        if self._closed or not self._started:
            return False
        return self._backends.recover(only_if_none_active)

    def reject(self, backend: str, reason: str) -> str | None:
        """``backend`` answered the golden canary wrongly: traffic moves off it, or, a standby, it is
        dropped (:meth:`Fallback.reject`); returns the backend active after."""
        return self._backends.reject(backend, reason)

    # -- observation ------------------------------------------------------------------------------
    @property
    def active_backend(self) -> str | None:
        return self._backends.active_backend

    @property
    def standby_backend(self) -> str | None:
        return self._backends.standby_backend

    @property
    def state(self) -> RuntimeState:
        return self._backends.state(started=self._started, closed=self._closed)

    def injected_faults(self) -> dict[str, int]:
        """Faults injected so far by the fault configuration, ``"entry: error rule"`` -> count."""
        return self._fault_plan.injected()

    def describe(self) -> dict[str, Any]:
        """The active runner's own description (versions, device, providers)."""
        runner = self._backends.runner
        return runner.describe() if runner is not None else {"backend": None}

    def stats(self) -> dict[str, Any]:
        """Cumulative counters for metrics (times in microseconds)."""
        b = self._batcher.stats() if self._batcher is not None else BatcherStats()
        counters = self._backends.counters()  # faults, retries, switches, standby
        with self._state_lock:
            out = self._sync.add(b)
            last = self._last_inference_ms
        target = getattr(self._backends.runner, "inner", self._backends.runner)
        pool = target.pool_stats() if target is not None and hasattr(target, "pool_stats") else None
        return {
            **out,
            "pending": self._batcher.pending if self._batcher is not None else 0,
            **counters,
            "last_inference_ms": last,
            "active_backend": self.active_backend,
            "memory_pool": pool,
        }
