"""The inference service: what the Open Inference Protocol asks of a server, independent of the transport.

:class:`InferenceService` holds the model, its runtime, readiness, statistics, the model repository and
``infer`` on numpy arrays; the HTTP front end (:mod:`veo_edge.serve.http`) and any other (gRPC) call the
same methods. Errors a client caused or must see are :class:`~veo_edge.serve.protocol.ProtocolError`
with an HTTP status (a transport maps it to its own codes); :mod:`veo_edge.serve.outcomes` says which
the runtime's refusals and failures become.

Readiness (:mod:`veo_edge.serve.readiness`) = a runtime with an active backend, on which the golden canary
matched, and no backend failure since it last matched; the service re-checks in the background until the
canary matches again. The extensions' bodies (metadata, model configuration, statistics) are built in
:mod:`veo_edge.serve.extensions`; :func:`veo_edge.serve.server.serve_async` owns the server's lifetime:
canary, listen, signals, drain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from veo_edge import __version__
from veo_edge.errors import VeoEdgeError
from veo_edge.export.canary import CanaryResult
from veo_edge.serve import extensions, outcomes
from veo_edge.serve.alone import LoneRequests
from veo_edge.serve.canary_wire import encode_canary
from veo_edge.serve.health import build_identity
from veo_edge.serve.metrics import HttpCounters, ServeCollector, make_registry
from veo_edge.serve.options import ServeOptions
from veo_edge.serve.protocol import InferRequest, ModelSpec, ProtocolError, load_labels
from veo_edge.serve.readiness import ReadinessCheck, unloaded

log = logging.getLogger("veo_edge.serve")


class InferenceService:
    """One model served by one runtime: readiness, metadata, statistics, repository and inference."""

    def __init__(
        self,
        runtime: Any,
        options: ServeOptions,
        make_runtime: Callable[[], Any] | None = None,
        alone: LoneRequests | None = None,
    ) -> None:
        self.runtime: Any = runtime
        #: shared by every model of a server: the requests in progress anywhere (serve/alone.py)
        self.alone = alone or LoneRequests(options.lone_max_ms)
        self.options = options
        self.make_runtime = make_runtime
        self.build = runtime.build
        self.model = ModelSpec.from_manifest(self.build.manifest, options.model_name)
        self.labels = load_labels(self.build)
        self.counters = HttpCounters()
        self.registry = make_registry(
            ServeCollector(lambda: self.runtime, self.model, self.counters, self.is_ready)
        )
        self.draining = False
        self.check = ReadinessCheck(self.build)  # the canary: refused now when the build has no usable one
        self.unloaded = False
        self.infer_answered = 0
        self.started = time.time()
        self._canary_bodies: dict[tuple, tuple[bytes, int | None]] = {}  # (binary, backend, precision)
        self.identity = build_identity(self.build)  # its manifest's sha256: named in the model metadata
        self._monitor: asyncio.Task | None = None
        self._repo_lock: asyncio.Lock | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Run the canary (readiness) and start the background re-checker; call on the serving loop."""
        loop = asyncio.get_running_loop()
        self.check.wake = asyncio.Event()
        self._repo_lock = asyncio.Lock()
        await loop.run_in_executor(None, self.run_canary)
        if self.options.warmup:
            await loop.run_in_executor(None, self.warm_up)
        self._monitor = loop.create_task(
            self.check.recheck_loop(
                lambda: self.runtime, lambda: self.draining, self.options.recheck_interval_s
            )
        )

    async def close(self) -> None:
        """Stop the re-checker and drain the runtime (every accepted sample is answered)."""
        if self._monitor is not None:
            self._monitor.cancel()
        runtime = self.runtime
        if runtime is not None:
            timeout = self.options.drain_timeout_s
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: runtime.close(drain=True, timeout=timeout)
            )

    def warm_up(self) -> dict[str, Any] | None:
        """Warm the runtime (blocking; see :meth:`Runtime.warm_up`); a failure is logged, serving goes on."""
        runtime = self.runtime
        if runtime is None:
            return None
        try:
            w = runtime.warm_up()
        except VeoEdgeError as e:
            log.warning(
                "model %r: warm-up failed (%s); serving without it: the first batch of each size pays "
                "for its set-up",
                self.model.name,
                e,
            )
            return None
        described = runtime.describe()
        sizes, measured = w["batch_sizes"], described.get("batching")  # --batch-limit auto
        # what the backend holds from now on (the canary, run before, may have made one already):
        # the same count as the veo_edge_openvino_infer_requests gauge
        held = described.get("infer_requests", w["infer_requests"])
        log.info(
            "model %r: warmed batch sizes %d..%d on %s (%d infer requests held) in %.2f s%s",
            self.model.name,
            sizes[0],
            sizes[-1],
            w["backend"],
            held,
            w["seconds"],
            f"; batch limit {sizes[-1]}: {measured['summary']}" if measured else "",
        )
        return w

    # -- readiness (see veo_edge.serve.readiness) -----------------------------------------------
    def run_canary(self) -> CanaryResult | None:
        """Run the golden canary through the runtime (blocking); readiness follows its result."""
        return self.check.run_canary(self.runtime)

    def readiness(self) -> dict[str, Any]:
        """The readiness report: ``ready`` and, when not, ``reason`` (what a probe and a person need)."""
        return self.check.report(self.runtime, self.model.name, self.draining)

    def is_ready(self) -> bool:
        return bool(self.readiness()["ready"])

    def live(self) -> dict[str, Any]:
        state = self.runtime.state.to_dict() if self.runtime is not None else {}
        return {
            "live": True,
            "active_backend": state.get("active_backend"),
            "fallback": {"count": state.get("fallback_count", 0)},
        }

    # -- metadata -------------------------------------------------------------------------------
    def model_spec(self, name: str, version: str | None = None) -> ModelSpec:
        """The served model called ``name`` (and ``version``); a 404 ProtocolError otherwise."""
        if name != self.model.name:
            raise ProtocolError(f"unknown model {name!r}; this server serves {self.model.name!r}", 404)
        if version not in (None, "", self.model.version):
            raise ProtocolError(
                f"model {name!r} has no version {version!r}; it has version {self.model.version!r}", 404
            )
        return self.model

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "veo-edge", "version": __version__, "extensions": extensions.EXTENSIONS}

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        about = {"backend": self._backend() or "none", "manifest_sha256": self.identity}
        return extensions.model_metadata(self.model_spec(name, version), self._precision(), about)

    def _backend(self) -> str | None:
        runtime = self.runtime
        return runtime.state.to_dict().get("active_backend") if runtime is not None else None

    def _precision(self) -> str:
        """The precision the active backend computes at (the build's choice on the CPU), or "none"."""
        runtime = self.runtime
        return str((runtime.describe().get("precision") if runtime is not None else None) or "none")

    def model_readiness(self, name: str, version: str | None = None) -> dict[str, Any]:
        self.model_spec(name, version)
        return self.readiness()

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration, enough for tritonclient, perf_analyzer and model_analyzer."""
        m = self.model_spec(name, version)
        runtime = self.runtime
        backend = (runtime.state.to_dict().get("active_backend") if runtime is not None else None) or "none"
        delay_ms = float(getattr(runtime, "max_queue_delay_ms", 2.0)) if runtime is not None else 2.0
        limit = int(getattr(runtime, "max_batch", m.max_batch))  # serve --batch-limit
        return extensions.model_config(m, self.labels, backend, delay_ms, self._precision(), limit)

    def model_labels(self, name: str) -> list[str] | None:
        """The class labels of model ``name`` (the classification extension), when the build has them."""
        self.model_spec(name)
        return self.labels

    def canary_body(
        self, name: str, version: str | None = None, binary: bool = False
    ) -> tuple[bytes, int | None]:
        """The golden canary (for ``veo-edge healthcheck`` without a build directory) as JSON, or with
        ``binary`` in its binary form and the length of its header; cached. Its rule is that of the
        precision the active backend serves (an int8 build on ONNX Runtime: f32), both named in the body.
        With none active no rule is served, and nothing would answer the canary: 503, as infer answers."""
        self.model_spec(name, version)
        backend = self._backend()
        if backend is None:
            raise ProtocolError(self._no_backend(name), 503)
        precision = self._precision()
        key = (binary, backend, precision)
        if key not in self._canary_bodies:
            try:
                canary = self.check.canary_of(precision)
            except VeoEdgeError as e:
                raise ProtocolError(str(e), 404) from e
            about = {"backend": backend, "precision": precision}
            self._canary_bodies[key] = encode_canary(canary, binary, about)
        return self._canary_bodies[key]

    def _no_backend(self, name: str) -> str:
        if self.runtime is None:
            return unloaded(name)
        return (
            f"no backend is active for model {name!r}, so no canary rule is served and none would answer it "
            "(GET /v2/health/ready says why); retry when the model is ready"
        )

    # -- statistics -----------------------------------------------------------------------------
    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension, for one model or (``name=None``) all (see
        :func:`veo_edge.serve.extensions.statistics`)."""
        if name is not None:
            self.model_spec(name, version)
        if self.runtime is None:
            return {"model_stats": []}
        return extensions.statistics(self.model, self.runtime.stats(), self.counters.times)

    # -- model repository -----------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        ready = self.is_ready()
        if ready_only and not ready:
            return []
        entry = {"name": self.model.name, "version": self.model.version}
        if self.runtime is None:
            return [{**entry, "state": "UNAVAILABLE", "reason": "unloaded"}]
        return [
            {**entry, "state": "READY" if ready else "UNAVAILABLE", "reason": "" if ready else "not ready"}
        ]

    def _repo_model(self, name: str, action: str) -> None:
        if name != self.model.name:
            raise ProtocolError(
                f"cannot {action} model {name!r}: the repository holds only {self.model.name!r}", 400
            )

    async def load_model(self, name: str) -> None:
        """Load (or reload after an unload) the model: a fresh runtime, then the canary."""
        self._repo_model(name, "load")
        assert self._repo_lock is not None
        async with self._repo_lock:
            if self.runtime is not None:
                return
            if self.make_runtime is None:
                raise ProtocolError(f"model {name!r} cannot be reloaded by this server", 400)
            loop = asyncio.get_running_loop()
            try:
                runtime = await loop.run_in_executor(None, self.make_runtime)
            except VeoEdgeError as e:
                raise ProtocolError(f"failed to load {name!r}: {e}", 400) from e
            self.check.reset()
            self.runtime = runtime
            self.unloaded = False
            await loop.run_in_executor(None, self.run_canary)
            if self.options.warmup:
                await loop.run_in_executor(None, self.warm_up)
            log.info("model %r loaded (backend %s)", name, runtime.state.to_dict().get("active_backend"))

    async def unload_model(self, name: str) -> None:
        """Unload the model: answer what was accepted, release the backend; infers get 503 until load."""
        self._repo_model(name, "unload")
        assert self._repo_lock is not None
        async with self._repo_lock:
            runtime, self.runtime = self.runtime, None
            if runtime is None:
                return
            self.unloaded = True
            timeout = self.options.drain_timeout_s
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: runtime.close(drain=True, timeout=timeout)
            )
            log.info("model %r unloaded", name)

    # -- inference ------------------------------------------------------------------------------
    def expect(self, name: str) -> Any:
        """Announce to model ``name``'s batcher that a request is arriving (a transport that has begun
        receiving it): a batch forming meanwhile may wait for it, within the queue delay. Pass the
        result to :meth:`infer`; exit it (a context manager) when done. ``None`` when there is nothing
        to announce to."""
        runtime = self.runtime
        if name != self.model.name or runtime is None:
            return None
        try:
            return runtime.expect(1)
        except VeoEdgeError:  # closed or not started: infer says so
            return None

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        arrival: Any = None,
        protocol: str = "http",
    ) -> dict[str, np.ndarray]:
        """Run a parsed request; returns output name -> array (batch first). ProtocolError on failure.
        ``arrival``: what :meth:`expect` returned for this request, if the transport announced it;
        ``protocol``: the transport it came over, counted with its outcome (``/metrics``)."""
        began = self.alone.begin()
        try:
            outputs = await self._infer(name, version, request, arrival)
        except ProtocolError as e:
            self.counters.infer_requests[(protocol, e.status)] += 1
            raise
        finally:
            self.alone.end(self.model.name, began)
        self.counters.infer_requests[(protocol, 200)] += 1
        return outputs

    async def _infer(
        self, name: str, version: str | None, request: InferRequest, arrival: Any
    ) -> dict[str, np.ndarray]:
        began = time.perf_counter_ns()
        model = self.model_spec(name, version)
        runtime = self.runtime
        if runtime is None:
            self.counters.infer_rejected["UNAVAILABLE"] += 1
            raise ProtocolError(unloaded(name), 503)
        x = request.inputs[model.inputs[0].name]
        try:
            futures = self.alone.run(runtime, x, arrival, self.model.name)
            # all of the request's samples at once (or none), so that they can share one batch
            futures = futures or runtime.submit_many(x, arrival)
        except VeoEdgeError as e:
            raise outcomes.refused(e, self.counters.infer_rejected) from e
        try:
            results = await outcomes.answers(futures, self.options.infer_timeout_s, self.check)
        except ProtocolError as e:
            if e.status != 400:  # failed after its samples were submitted: in the model, or too late
                self.counters.times.failure += 1
            raise
        self.counters.times.answered(
            time.perf_counter_ns() - began, [f.timing for f in futures if hasattr(f, "timing")]
        )
        out = np.stack(results) if len(results) > 1 else results[0][None]
        self.infer_answered += 1
        return {model.outputs[0].name: out}
