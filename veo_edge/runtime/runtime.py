"""The runtime: one entry over TensorRT, ONNX Runtime and OpenVINO, with dynamic batching and automatic,
visible fallback that loses no request.

::

    with veo_edge.Runtime("vit-tiny").start() as rt:      # probes, activates the first usable backend
        logits = rt.infer(batch)                          # (N, *input_shape) -> (N, classes), synchronous
        fut = rt.submit(sample)                           # one sample through the dynamic batcher
        print(rt.state.to_dict(), rt.stats())

Selection: the candidates of the policy (default tensorrt -> onnxruntime-cuda -> openvino) are probed in
order (see :mod:`veo_edge.runtime.policy`); every skip is recorded with its reason in ``state.skipped``.
Mid-run fallback: when the active backend fails on a batch (CUDA out of memory, device lost, any
backend error), that same batch is re-run on the next usable candidate and the runtime stays there; the
switch is logged and recorded in ``state.switches``. Every request is answered exactly once. With
``fallback=False`` only the first candidate is eligible and its failures are errors. Faults can be
injected through ``faults`` or ``$VEO_EDGE_FAULTS`` (see :mod:`veo_edge.runtime.faults`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.errors import (
    BackendError,
    BackendUnavailableError,
    InputError,
    ModelLoadError,
    NoBackendError,
    UsageError,
    VeoEdgeError,
)
from veo_edge.runtime.backends.base import Runner, TensorMeta
from veo_edge.runtime.backends.openvino import PERFORMANCE_HINTS
from veo_edge.runtime.batching import Arrival, Batcher, BatcherStats, ClosedError
from veo_edge.runtime.faults import FaultPlan, parse_faults
from veo_edge.runtime.policy import (
    BACKENDS,
    artifacts_of,
    make_runner,
    parse_memory_size,
    probe_candidate,
    resolve_policy,
)

log = logging.getLogger("veo_edge.runtime")

#: how many skips and switches the runtime's state keeps (the newest); counters are not capped
HISTORY = 256


def _short(reason: str, limit: int = 120) -> str:
    """The first line of a reason, cut at ``limit`` characters (the full one goes to the details)."""
    line = reason.strip().splitlines()[0] if reason.strip() else reason
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass(frozen=True)
class CandidateStatus:
    name: str
    status: str  # untried | active | standby | skipped | failed | disabled
    reason: str | None = None


@dataclass(frozen=True)
class RuntimeState:
    """A snapshot of the runtime's backend selection and fallback history."""

    active_backend: str | None
    candidates: list[CandidateStatus]
    skipped: list[dict[str, str]]
    switches: list[dict[str, Any]]
    fallback_count: int
    ready: bool
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Counters(BatcherStats):
    """Counters of the synchronous ``infer`` path, in the batcher's form so the two can be added."""

    def add(self, other: BatcherStats) -> dict[str, Any]:
        sizes = dict(self.batch_size_counts)
        for k, v in other.batch_size_counts.items():
            sizes[k] = sizes.get(k, 0) + v
        dicts = ("batch_size_counts", "close_reasons")
        out = {k: getattr(self, k) + getattr(other, k) for k in vars(self) if k not in dicts}
        out["max_wait_us"] = max(self.max_wait_us, other.max_wait_us)
        # the synchronous path forms no batches: only the batcher's batches have close reasons
        return {
            **out,
            "batch_size_counts": dict(sorted(sizes.items())),
            "close_reasons": dict(other.close_reasons),
        }


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
    ) -> None:
        self.build = build_dir if isinstance(build_dir, BuildDir) else BuildDir.open(build_dir)
        self.backend = backend
        self.fallback = fallback
        self.names, disabled = resolve_policy(backend, policy, fallback)
        self.faults = parse_faults(faults, BACKENDS)
        # the time rules' clock (default: monotonic seconds since now); a soak passes its run time
        self._fault_plan = FaultPlan(self.faults, clock=fault_clock)
        self.gpu_memory_budget = parse_memory_size(gpu_memory_budget)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise UsageError(f"gpu must be a device index >= 0, got {gpu!r}")
        self.gpu = gpu  # the GPU the GPU backends use (TensorRT: cudaSetDevice; the probes: its free memory)
        if max_queue_delay_ms < 0 or max_queue < 1:
            raise UsageError(
                f"max_queue_delay_ms must be >= 0 and max_queue >= 1, got {max_queue_delay_ms} and {max_queue}"
            )
        self.max_queue_delay_ms = float(max_queue_delay_ms)
        self.max_queue = int(max_queue)
        self.threads = threads
        self.recover_interval_s = recover_interval_s
        if concurrency is not None and concurrency < 1:
            raise UsageError(f"concurrency must be >= 1 (batches in flight at once), got {concurrency}")
        self.concurrency = concurrency  # None: what the first active backend runs in parallel
        if performance_hint not in PERFORMANCE_HINTS:
            raise UsageError(
                f"unknown performance hint {performance_hint!r}; choose one of: {', '.join(PERFORMANCE_HINTS)}"
            )
        # OpenVINO: LATENCY, THROUGHPUT streams in parallel, or ADAPTIVE (both; see backends/openvino.py)
        self.performance_hint = performance_hint
        manifest = self.build.manifest
        self.max_batch = self.build.max_batch
        self.input_shape = tuple(int(d) for d in manifest["input_shape"])
        self.input_name = manifest["inputs"][0]["name"]
        self.input_dtype = np.dtype(manifest["inputs"][0]["dtype"])
        self.output_name = manifest["outputs"][0]["name"]

        # batches run on the runner under the gate's shared side, at most the runner's concurrency at
        # once (_slots); activation, switching and closing take its exclusive side
        self._exec_lock = _Gate()
        self._slots = threading.BoundedSemaphore(1)
        self._state_lock = threading.Lock()
        self._runner: Runner | None = None
        self._active: int | None = None  # index into self.names
        self._status = {n: CandidateStatus(n, "untried") for n in self.names}
        for n in disabled:
            self._status[n] = CandidateStatus(n, "disabled", "fallback is off (--no-fallback)")
        # bounded histories: a runtime that probes for recovery for days must not grow without limit
        self._skipped: deque[dict[str, str]] = deque(maxlen=HISTORY)
        self._switches: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._fallback_count = 0  # failures switched away from, counted beyond the history's length
        self._sync = _Counters()
        #: batch size -> total compute time (us) of the batches of that size, both paths (Triton batch_stats)
        self._batch_compute_us: dict[int, float] = {}
        self._last_inference_ms = 0
        self._batcher: Batcher | None = None
        self._started = False
        self._closed = False
        self._last_recover = 0.0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Runtime:
        """Verify the artifacts the candidates load against the manifest (once; a tampered build raises
        :class:`~veo_edge.errors.ArtifactMismatchError`), probe the candidates in order, activate the first
        usable one, start the batcher."""
        with self._exec_lock:
            if self._closed:
                raise ClosedError("this runtime was closed; create a new Runtime")
            if self._started:
                return self
            self.build.verify(sorted({k for n in self.names for k in artifacts_of(n, self.build)}))
            self._activate_from(0)
            self._batcher = Batcher(
                self._run_batch,
                self.input_shape,
                self.input_dtype,
                self.max_batch,
                self.max_queue_delay_ms,
                self.max_queue,
                slots=self.concurrency or _concurrency(self._runner),
            )
            self._started = True
        return self

    def warm_up(self, sizes: Sequence[int] | None = None) -> dict[str, Any]:
        """Run every batch size (default ``1..max_batch``) once on the active backend, on every infer
        request the batcher can use for it, before traffic: the first batch of each size then runs as
        fast as the later ones, and the process holds from now on the memory it will keep (without it,
        resident memory grows for as long as batch sizes first appear: 312 to 501 MiB on vit-tiny,
        ADAPTIVE; README). Nothing runs meanwhile. A backend activated later by a fallback warms as it
        serves. Returns what was warmed: backend, batch sizes, infer requests created, seconds."""
        self._require_open()
        if sizes is None:
            sizes = range(1, self.max_batch + 1)
        sizes = sorted(set(int(b) for b in sizes))
        if not sizes or not 1 <= sizes[0] <= sizes[-1] <= self.max_batch:
            raise UsageError(f"warm-up batch sizes must lie in 1..{self.max_batch} (the build's --max-batch)")
        start = time.perf_counter()
        with self._exec_lock:  # exclusive: no batch runs, no backend switches while warming
            runner = self._runner
            if runner is None:
                raise NoBackendError("no backend is active to warm up; see runtime.state")
            created = runner.warm_up(sizes, _concurrency(runner))
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
        if self._batcher is not None:
            self._batcher.close(drain=drain, timeout=timeout)
            if self._batcher.alive:  # timed out while draining: it releases nothing
                log.warning("runtime closed with requests still running after %ss", timeout)
                return
        with self._exec_lock:
            if self._runner is not None:
                self._runner.deactivate()
                self._runner = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inference --------------------------------------------------------------------------------
    def infer(self, x: np.ndarray) -> np.ndarray:
        """Run a batch ``(N, *input_shape)`` synchronously; batches above ``max_batch`` are split."""
        self._require_open()
        if not isinstance(x, np.ndarray):
            raise InputError(f"input is a {type(x).__name__}, expected a numpy array")
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape or not x.shape[0]:
            meta = TensorMeta(self.input_name, (None, *self.input_shape), self.input_dtype.name)
            raise InputError(
                f"input {self.input_name!r} has shape {tuple(x.shape)}, expected {meta.describe()} "
                "(N >= 1 is the batch axis)"
            )
        self._check_dtype(x)
        outs = []
        for i in range(0, x.shape[0], self.max_batch):
            chunk = np.ascontiguousarray(x[i : i + self.max_batch])
            start = time.perf_counter_ns()
            ok = False
            try:
                outs.append(self._run_batch(chunk))
                ok = True
            finally:
                self._count_sync(len(chunk), (time.perf_counter_ns() - start) / 1e3, ok)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def submit(self, sample: np.ndarray, arrival: Arrival | None = None) -> Future:
        """Queue one sample (``input_shape`` or ``(1, *input_shape)``) for the dynamic batcher."""
        self._require_open()
        if not isinstance(sample, np.ndarray):
            raise InputError(f"sample is a {type(sample).__name__}, expected a numpy array")
        shape = tuple(sample.shape)
        if shape not in (self.input_shape, (1, *self.input_shape)):
            raise InputError(
                f"sample has shape {shape}, expected one sample of shape {self.input_shape} "
                f"(or (1, {', '.join(map(str, self.input_shape))})); use infer() for batches"
            )
        self._check_dtype(sample)
        assert self._batcher is not None
        return self._batcher.submit(sample.reshape(self.input_shape), arrival)

    def submit_many(self, x: np.ndarray, arrival: Arrival | None = None) -> list[Future]:
        """Queue the samples of a batch ``(N, *input_shape)`` at once, all or none (a full queue raises
        :class:`OverloadedError` and queues nothing); one future per sample."""
        self._require_open()
        if not isinstance(x, np.ndarray):
            raise InputError(f"input is a {type(x).__name__}, expected a numpy array")
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape or not x.shape[0]:
            raise InputError(
                f"input has shape {tuple(x.shape)}, expected (N, {', '.join(map(str, self.input_shape))}) "
                "with N >= 1"
            )
        self._check_dtype(x)
        assert self._batcher is not None
        return self._batcher.submit_many(list(x), arrival)

    def expect(self, n: int = 1) -> Arrival:
        """Announce ``n`` samples a transport has begun to receive, so that a partial batch may wait for
        them (within the queue delay); pass the result to :meth:`submit` or exit it as a context."""
        self._require_open()
        assert self._batcher is not None
        return self._batcher.expect(n)

    def _check_dtype(self, x: np.ndarray) -> None:
        if x.dtype != self.input_dtype:
            raise InputError(
                f"input has dtype {x.dtype}, expected {self.input_dtype}; convert it with "
                f".astype(np.{self.input_dtype})"
            )

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError("the runtime is closed and accepts no more requests; create a new Runtime")
        if not self._started:
            raise UsageError("the runtime is not started; call start() or use it in a with-block")

    def _count_sync(self, n: int, us: float, ok: bool) -> None:
        with self._state_lock:
            s = self._sync
            s.batches += 1
            s.batch_size_counts[n] = s.batch_size_counts.get(n, 0) + 1
            if ok:
                s.requests_success += n
            else:
                s.requests_failure += n
            s.request_us_total += us * n
            s.compute_us_total += us

    # -- selection and fallback -------------------------------------------------------------------
    def _make(self, name: str) -> Runner:
        gpu_options = {"gpu": self.gpu} if name == "tensorrt" else {}
        runner = make_runner(
            name,
            self.build,
            threads=self.threads,
            performance_hint=self.performance_hint,
            gpu_memory_budget=self.gpu_memory_budget,
            **gpu_options,
        )
        return self._fault_plan.wrap(runner, name)

    def _set_status(self, name: str, status: str, reason: str | None = None) -> None:
        with self._state_lock:
            self._status[name] = CandidateStatus(name, status, reason)

    def _try(self, index: int) -> Runner | None:
        """Probe and activate candidate ``index``; ``None`` (and a recorded skip) when it cannot run."""
        name = self.names[index]
        verdict = probe_candidate(name, self.build, self.gpu_memory_budget, gpu=self.gpu)
        reason = verdict.reason
        runner = None
        if verdict.ok:
            try:
                runner = self._make(name).activate()
            except (BackendUnavailableError, BackendError, ModelLoadError) as e:
                reason = str(e)
        if runner is None:
            reason = reason or "unusable (no reason given)"
            log.info("backend %s skipped: %s", name, reason)
            with self._state_lock:
                self._skipped.append({"backend": name, "reason": reason})
                self._status[name] = CandidateStatus(name, "skipped", reason)
        return runner

    def _activate_from(self, first: int, failure: str | None = None) -> None:
        """Activate the first usable candidate at or after ``first``; raise :class:`NoBackendError`."""
        for i in range(first, len(self.names)):
            runner = self._try(i)
            if runner is not None:
                self._use(runner, i)
                log.info("backend %s active", self.names[i])
                return
        names = self.names[first:]
        skipped = [dict(s) for s in self._skipped if s["backend"] in names]
        latest = {s["backend"]: s["reason"] for s in skipped}
        tried = "; ".join(f"{n}: {_short(latest[n])}" for n in names if n in latest)
        hint = (
            "Fallback is off (--no-fallback): allow it, or fix the first backend; "
            if not self.fallback
            else ""
        )
        error = NoBackendError(
            f"no backend can run build {self.build.path}"
            + (f" after {_short(failure)}" if failure else "")
            + f" (tried {', '.join(names) or 'none'}): {tried or 'none left'}; {hint}"
            "--json or --debug shows each backend's full reason, `veo-edge doctor` what this machine has"
        )
        error.details = {"tried": names, "skipped": [{"backend": n, "reason": latest[n]} for n in latest]}
        raise error

    def _use(self, runner: Runner, index: int) -> None:
        """Make ``runner`` the active one (under the exclusive side of the gate)."""
        self._runner, self._active = runner, index
        self._slots = threading.BoundedSemaphore(_concurrency(runner))
        self._set_status(self.names[index], "active")

    def _run_batch(self, x: np.ndarray) -> np.ndarray:
        """Run one batch on the active backend; on a backend failure switch to the next and re-run it.

        Several batches may run at once (the batcher's slots), up to the runner's own concurrency."""
        self._maybe_recover()
        start = time.perf_counter_ns()
        while True:
            with self._exec_lock.shared():
                runner, index, slots = self._runner, self._active, self._slots
                if runner is None or index is None:
                    raise NoBackendError(
                        "no backend is active (all failed or the runtime is closed); see runtime.state"
                    )
                try:
                    with slots:
                        out = runner.infer({self.input_name: x})[self.output_name]
                    us = (time.perf_counter_ns() - start) / 1e3
                    with self._state_lock:
                        n = len(x)
                        self._batch_compute_us[n] = self._batch_compute_us.get(n, 0.0) + us
                        self._last_inference_ms = int(time.time() * 1000)
                    return out
                except (InputError, UsageError):
                    raise
                except VeoEdgeError as e:
                    error: Exception = e
                except Exception as e:  # a runner bug or a library error it did not wrap
                    error = BackendError(f"{self.names[index]} failed: {type(e).__name__}: {e}")
            if not self.fallback or index + 1 >= len(self.names):
                raise error
            with self._exec_lock:
                if self._runner is runner:  # not yet switched away by a concurrent batch
                    self._switch(index, error)

    def _switch(self, index: int, error: Exception) -> None:
        failed = self.names[index]
        reason = f"{type(error).__name__}: {error}"
        assert self._runner is not None
        try:
            self._runner.deactivate()
        except Exception as e:  # a dead device may fail to release; the switch goes on
            log.warning("deactivating %s after its failure raised %s", failed, e)
        self._runner, self._active = None, None
        self._set_status(failed, "failed", reason)
        self._activate_from(index + 1, failure=f"{failed} failed ({reason})")
        to = self.names[self._active]  # type: ignore[index]
        with self._state_lock:
            self._switches.append({"from": failed, "to": to, "reason": reason, "at": time.time()})
            self._fallback_count += 1
        log.warning("backend %s failed (%s); switched to %s and re-ran the batch", failed, reason, to)

    def _maybe_recover(self) -> None:
        if self.recover_interval_s is None or not self._switches:
            return
        now = time.monotonic()
        if now - self._last_recover >= self.recover_interval_s:
            self._last_recover = now
            self.try_recover()

    def try_recover(self, only_if_none_active: bool = False) -> bool:
        """Try to return to a candidate ahead of the active one (e.g. the GPU after an OOM), or to any
        candidate when every one had failed; True if moved. ``only_if_none_active``: do nothing while a
        backend is active (decided under the lock, so a switch in progress is waited for)."""
        with self._exec_lock:
            if self._closed or not self._started:
                return False
            if only_if_none_active and self._active is not None:
                return False
            upto = len(self.names) if self._active is None else self._active
            for i in range(upto):
                if self._status[self.names[i]].status == "disabled":
                    continue
                runner = self._try(i)
                if runner is None:
                    continue
                old = "none" if self._active is None else self.names[self._active]
                if self._runner is not None:
                    self._runner.deactivate()
                if self._active is not None:
                    self._set_status(old, "standby")
                self._use(runner, i)
                with self._state_lock:
                    self._switches.append(
                        {"from": old, "to": self.names[i], "reason": "recovered", "at": time.time()}
                    )
                log.warning("backend %s usable again; switched back from %s", self.names[i], old)
                return True
        return False

    # -- observation ------------------------------------------------------------------------------
    @property
    def active_backend(self) -> str | None:
        return None if self._active is None else self.names[self._active]

    @property
    def state(self) -> RuntimeState:
        with self._state_lock:
            return RuntimeState(
                active_backend=self.active_backend,
                candidates=list(self._status.values()),
                skipped=[dict(s) for s in self._skipped],
                switches=[dict(s) for s in self._switches],
                fallback_count=self._fallback_count,
                ready=self._started and not self._closed and self._runner is not None,
                closed=self._closed,
            )

    def injected_faults(self) -> dict[str, int]:
        """Faults injected so far by the fault configuration, ``"entry: error rule"`` -> count."""
        return self._fault_plan.injected()

    def describe(self) -> dict[str, Any]:
        """The active runner's own description (versions, device, providers)."""
        runner = self._runner
        return runner.describe() if runner is not None else {"backend": None}

    def stats(self) -> dict[str, Any]:
        """Cumulative counters for metrics (times in microseconds)."""
        b = self._batcher.stats() if self._batcher is not None else BatcherStats()
        with self._state_lock:
            out = self._sync.add(b)
            switches = self._fallback_count
            compute = dict(sorted(self._batch_compute_us.items()))
            last = self._last_inference_ms
        pool = None
        runner = self._runner
        target = getattr(runner, "inner", runner)
        if target is not None and hasattr(target, "pool_stats"):
            pool = target.pool_stats()
        return {
            **out,
            "pending": self._batcher.pending if self._batcher is not None else 0,
            "fallback_switches": switches,
            "batch_compute_us": compute,
            "last_inference_ms": last,
            "active_backend": self.active_backend,
            "memory_pool": pool,
        }


def _concurrency(runner: Runner | None) -> int:
    """How many batches ``runner`` runs in parallel (its ``concurrency``; 1 when it does not say)."""
    target = getattr(runner, "inner", runner)
    return max(1, int(getattr(target, "concurrency", 1) or 1))


class _Gate:
    """Shared (batches running) / exclusive (activation, switch, close) access to the active runner.

    The exclusive side is re-entrant for its owner and is also the gate's context manager; a thread that
    holds it may take the shared side too. The standard library has no reader-writer lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._owner: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def shared(self):
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._owner is not None:
                    self._cond.wait()
                self._readers += 1
        try:
            yield
        finally:
            if self._owner != me:
                with self._cond:
                    self._readers -= 1
                    self._cond.notify_all()

    def __enter__(self) -> _Gate:
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._owner is not None:
                    self._cond.wait()
                self._owner = me
                while self._readers:
                    self._cond.wait()
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()
