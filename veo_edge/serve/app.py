"""The inference service: what the Open Inference Protocol asks of a server, independent of the transport.

:class:`InferenceService` holds the model, its runtime, readiness, statistics, the model repository and
``infer`` on numpy arrays; the HTTP front end (:mod:`veo_edge.serve.http`) and any other (gRPC) call the
same methods. Errors a client caused or must see are :class:`~veo_edge.serve.protocol.ProtocolError`
with an HTTP status (a transport maps it to its own codes).

Readiness = a runtime with an active backend, on which the golden canary matched, and no backend failure
since it last matched; after a failure, a switch or a lost backend, the service re-checks in the
background (recovering earlier backends first) until the canary matches again.
``serve_async`` owns the server's lifetime: canary, listen, signals, drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from veo_edge import __version__
from veo_edge.errors import InputError, NoBackendError, OverloadedError, VeoEdgeError
from veo_edge.export.canary import Canary, CanaryResult, compare_canary
from veo_edge.runtime.batching import ClosedError
from veo_edge.serve.health import canary_to_json, load_canary
from veo_edge.serve.metrics import HttpCounters, ServeCollector, make_registry, start_metrics_server
from veo_edge.serve.protocol import CONFIG_TYPES, InferRequest, ModelSpec, ProtocolError, load_labels
from veo_edge.serve.transport import Limits

log = logging.getLogger("veo_edge.serve")

#: the protocol extensions this server implements, exactly (``GET /v2``)
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics"]


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    limits: Limits = field(default_factory=Limits)
    #: an infer request not answered within this many seconds gets a 504
    infer_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    #: while not ready after a failure, re-check (recover, canary) this often
    recheck_interval_s: float = 1.0
    #: KServe v2 gRPC port (Triton's 8001; 0: any free port; None: no gRPC)
    grpc_port: int | None = None
    #: a separate Prometheus port (Triton's 8002; 0: any free port; None: only /metrics on the HTTP port)
    metrics_port: int | None = None
    #: before serving (and after a repository load), warm every batch size: ``Runtime.warm_up``
    warmup: bool = False


class InferenceService:
    """One model served by one runtime: readiness, metadata, statistics, repository and inference."""

    def __init__(
        self, runtime: Any, options: ServeOptions, make_runtime: Callable[[], Any] | None = None
    ) -> None:
        self.runtime: Any = runtime
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
        # the golden canary is read (and verified) now: a build without a usable one is refused at start
        self.canary: Canary | None = load_canary(self.build)
        self.canary_result: CanaryResult | None = None
        self.canary_backend: str | None = None
        self.canary_error: str | None = None
        #: a backend error seen on a request since the canary last matched (readiness drops on it)
        self.backend_failure: str | None = None
        self.unloaded = False
        self.infer_answered = 0
        self.started = time.time()
        self._canary_json: bytes | None = None
        self._wake: asyncio.Event | None = None
        self._monitor: asyncio.Task | None = None
        self._repo_lock: asyncio.Lock | None = None
        self._last_reason: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Run the canary (readiness) and start the background re-checker; call on the serving loop."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._repo_lock = asyncio.Lock()
        await loop.run_in_executor(None, self.run_canary)
        if self.options.warmup:
            await loop.run_in_executor(None, self.warm_up)
        self._monitor = loop.create_task(self._recheck_loop())

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
        sizes = w["batch_sizes"]
        log.warning(
            "model %r: warmed batch sizes %d..%d on %s (%d infer requests) in %.2f s",
            self.model.name,
            sizes[0],
            sizes[-1],
            w["backend"],
            w["infer_requests"],
            w["seconds"],
        )
        return w

    # -- readiness ------------------------------------------------------------------------------
    def run_canary(self) -> CanaryResult | None:
        """Run the golden canary through the runtime (blocking); readiness follows its result."""
        runtime = self.runtime
        if runtime is None:
            return None
        backend = runtime.state.to_dict().get("active_backend")
        try:
            self.canary = self.canary or load_canary(self.build)
            out = runtime.infer(self.canary.input)
            self.canary_result = compare_canary(out, self.canary)
            self.canary_error = self.canary_result.reason
        except VeoEdgeError as e:
            self.canary_result, self.canary_error = None, str(e)
        self.canary_backend = backend
        if self.canary_error:
            if self.canary_error != self._last_reason:
                log.error("canary failed on %s: %s", backend, self.canary_error)
            self._last_reason = self.canary_error
        else:
            if self.backend_failure or self._last_reason:
                log.warning("canary matched on %s again: ready", backend)
            self.backend_failure = self._last_reason = None
        return self.canary_result

    def _needs_recheck(self, state: dict[str, Any]) -> bool:
        backend = state.get("active_backend")
        return bool(self.backend_failure or not backend or backend != self.canary_backend)

    def readiness(self) -> dict[str, Any]:
        """The readiness report: ``ready`` and, when not, ``reason`` (what a probe and a person need)."""
        runtime = self.runtime
        state = runtime.state.to_dict() if runtime is not None else {}
        backend = state.get("active_backend")
        reasons = []
        if self.draining:
            reasons.append("the server is shutting down")
        if runtime is None:
            reasons.append(
                f"model {self.model.name!r} is unloaded; POST /v2/repository/models/{self.model.name}/load"
            )
        else:
            if state.get("closed"):
                reasons.append("the runtime is closed")
            if not backend or not state.get("ready", True):
                reasons.append(f"no backend is active (skipped: {state.get('skipped')})")
            if self.backend_failure:
                reasons.append(f"a request failed on the backend ({self.backend_failure}); re-checking")
            if self.canary_error:
                reasons.append(f"canary failed on {self.canary_backend}: {self.canary_error}")
            elif self.canary_result is None:
                reasons.append("the canary has not run")
            elif backend and backend != self.canary_backend:
                reasons.append(
                    f"the canary ran on {self.canary_backend}, {backend} is active now: re-running it"
                )
            if self._needs_recheck(state) and self._wake is not None:
                self._wake.set()
        body: dict[str, Any] = {
            "ready": not reasons,
            "model": self.model.name,
            "active_backend": backend,
            "fallback": {
                "count": state.get("fallback_count", 0),
                "switches": state.get("switches", []),
                "skipped": state.get("skipped", []),
            },
            "canary": self.canary_result.to_dict() if self.canary_result else None,
        }
        if reasons:
            body["reason"] = "; ".join(reasons)
        return body

    def is_ready(self) -> bool:
        return bool(self.readiness()["ready"])

    def live(self) -> dict[str, Any]:
        state = self.runtime.state.to_dict() if self.runtime is not None else {}
        return {
            "live": True,
            "active_backend": state.get("active_backend"),
            "fallback": {"count": state.get("fallback_count", 0)},
        }

    def _backend_failed(self, reason: str) -> None:
        self.backend_failure = reason
        if self._wake is not None:
            self._wake.set()

    async def _recheck_loop(self) -> None:
        """While not ready because of a failure or a switch: recover earlier backends, re-run the canary."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.recheck_interval_s)
            self._wake.clear()
            runtime = self.runtime
            if runtime is None or self.draining or not self._needs_recheck(runtime.state.to_dict()):
                continue
            # a request failed on the active backend: try the earlier ones; none active: try any
            only_if_none = self.backend_failure is None
            await loop.run_in_executor(None, functools.partial(runtime.try_recover, only_if_none))
            await loop.run_in_executor(None, self.run_canary)
            await asyncio.sleep(self.options.recheck_interval_s)  # at most one re-check per interval

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
        return {"name": "veo-edge", "version": __version__, "extensions": EXTENSIONS}

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        m = self.model_spec(name, version)
        return {
            "name": m.name,
            "versions": [m.version],
            "platform": "veo-edge",
            "inputs": [t.to_metadata() for t in m.inputs],
            "outputs": [t.to_metadata() for t in m.outputs],
            "parameters": {"precision": self._precision()},
        }

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

        def tensor(t):  # dims without the batch axis, as Triton writes them when max_batch_size > 0
            entry = {
                "name": t.name,
                "data_type": CONFIG_TYPES[t.datatype],
                "format": "FORMAT_NONE",
                "dims": list(t.shape[1:]),
            }
            if t in m.outputs and self.labels:
                entry["label_filename"] = "labels.txt"
            return entry

        delay_ms = float(getattr(runtime, "max_queue_delay_ms", 2.0)) if runtime is not None else 2.0
        return {
            "name": m.name,
            "platform": "",
            "backend": f"veo-edge-{backend}",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": m.max_batch,
            "input": [tensor(t) for t in m.inputs],
            "output": [tensor(t) for t in m.outputs],
            "dynamic_batching": {
                "preferred_batch_size": [m.max_batch],
                "max_queue_delay_microseconds": int(delay_ms * 1000),
            },
            "parameters": {"precision": {"string_value": self._precision()}},
            "instance_group": [
                {"name": m.name, "kind": "KIND_GPU" if backend == "tensorrt" else "KIND_CPU", "count": 1}
            ],
        }

    def model_labels(self, name: str) -> list[str] | None:
        """The class labels of model ``name`` (the classification extension), when the build has them."""
        self.model_spec(name)
        return self.labels

    def canary_json(self, name: str, version: str | None = None) -> bytes:
        """The golden canary as JSON (for ``veo-edge healthcheck`` without a build directory); cached."""
        self.model_spec(name, version)
        if self._canary_json is None:
            try:
                canary = self.canary or load_canary(self.build)
            except VeoEdgeError as e:
                raise ProtocolError(str(e), 404) from e
            self._canary_json = json.dumps(canary_to_json(canary), separators=(",", ":")).encode()
        return self._canary_json

    # -- statistics -----------------------------------------------------------------------------
    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension (durations in ns), for one model or (``name=None``) all.

        Triton's convention: every request carries the whole time of the batch it ran in, so
        ``compute_infer.ns / compute_infer.count`` is the mean batch time a request saw, and
        ``batch_stats`` has, per executed batch size, the batches' count and total compute time."""
        if name is not None:
            self.model_spec(name, version)
        if self.runtime is None:
            return {"model_stats": []}
        s = self.runtime.stats()
        sizes = {int(k): int(v) for k, v in (s.get("batch_size_counts") or {}).items()}
        compute = {int(k): float(v) for k, v in (s.get("batch_compute_us") or {}).items()}

        def cn(count: int, us: float) -> dict[str, int]:
            return {"count": int(count), "ns": int(us * 1000)}

        ok, fail = s["requests_success"], s["requests_failure"]
        per_request_compute = sum(size * us for size, us in compute.items())
        return {
            "model_stats": [
                {
                    "name": self.model.name,
                    "version": self.model.version,
                    "last_inference": int(s.get("last_inference_ms", 0)),
                    "inference_count": sum(k * v for k, v in sizes.items()),
                    "execution_count": s["batches"],
                    "inference_stats": {
                        "success": cn(ok, s["request_us_total"]),
                        "fail": cn(fail, 0),
                        "queue": cn(ok, s["queue_us_total"]),
                        "compute_input": cn(ok, 0),
                        "compute_infer": cn(ok, per_request_compute),
                        "compute_output": cn(ok, 0),
                        "cache_hit": cn(0, 0),
                        "cache_miss": cn(0, 0),
                    },
                    "batch_stats": [
                        {
                            "batch_size": k,
                            "compute_input": cn(v, 0),
                            "compute_infer": cn(v, compute.get(k, 0.0)),
                            "compute_output": cn(v, 0),
                        }
                        for k, v in sorted(sizes.items())
                    ],
                }
            ]
        }

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
            self.canary_result = self.canary_backend = self.canary_error = None
            self.backend_failure = None
            self.runtime = runtime
            self.unloaded = False
            await loop.run_in_executor(None, self.run_canary)
            if self.options.warmup:
                await loop.run_in_executor(None, self.warm_up)
            log.warning("model %r loaded (backend %s)", name, runtime.state.to_dict().get("active_backend"))

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
            log.warning("model %r unloaded", name)

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
        self, name: str, version: str | None, request: InferRequest, arrival: Any = None
    ) -> dict[str, np.ndarray]:
        """Run a parsed request; returns output name -> array (batch first). ProtocolError on failure.
        ``arrival``: what :meth:`expect` returned for this request, if the transport announced it."""
        model = self.model_spec(name, version)
        runtime = self.runtime
        if runtime is None:
            self.counters.infer_rejected["UNAVAILABLE"] += 1
            raise ProtocolError(f"model {name!r} is unloaded; POST /v2/repository/models/{name}/load", 503)
        x = request.inputs[model.inputs[0].name]
        try:
            # all of the request's samples at once (or none), so that they can share one batch
            futures = runtime.submit_many(x, arrival)
        except OverloadedError as e:
            self.counters.infer_rejected["REJECTED"] += 1
            raise ProtocolError(f"overloaded: {e}", 503) from e
        except InputError as e:
            self.counters.infer_rejected["INVALID"] += 1
            raise ProtocolError(str(e), 400) from e
        except VeoEdgeError as e:  # closed runtime, no backend
            self.counters.infer_rejected["UNAVAILABLE"] += 1
            raise ProtocolError(f"the model cannot take requests now: {e}", 503) from e
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), self.options.infer_timeout_s
            )
        except asyncio.TimeoutError as e:
            raise ProtocolError(
                f"inference did not finish within {self.options.infer_timeout_s} s", 504
            ) from e
        except OverloadedError as e:
            raise ProtocolError(f"overloaded: {e}", 503) from e
        except InputError as e:
            raise ProtocolError(str(e), 400) from e
        except (ClosedError, NoBackendError) as e:
            self._backend_failed(str(e))
            raise ProtocolError(f"the model cannot take requests now: {e}", 503) from e
        except VeoEdgeError as e:
            self._backend_failed(f"{type(e).__name__}: {e}")
            raise ProtocolError(f"inference failed: {e}", 500) from e
        out = np.stack(results) if len(results) > 1 else results[0][None]
        self.infer_answered += 1
        return {model.outputs[0].name: out}


async def serve_async(
    runtimes: Any,
    options: ServeOptions,
    on_listening: Any = None,
    make_runtime: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, then drain; returns the exit status (0 after a clean drain).

    ``runtimes``: one started runtime, or model name -> started runtime for several models (each its
    own service: runtime, batcher, readiness); ``make_runtime`` likewise (for repository loads)."""
    from dataclasses import replace

    from veo_edge.serve.http import HttpApp
    from veo_edge.serve.repository import ModelSet
    from veo_edge.serve.transport import HttpServer

    if not isinstance(runtimes, dict):
        runtimes, make_runtime = {options.model_name: runtimes}, {options.model_name: make_runtime}
    makers = make_runtime if isinstance(make_runtime, dict) else {}
    services = {
        name: InferenceService(rt, replace(options, model_name=name), makers.get(name))
        for name, rt in runtimes.items()
    }
    service: Any = next(iter(services.values())) if len(services) == 1 else ModelSet(services)
    await service.start()
    app = HttpApp(service, options.limits)
    app.prestart_decoder()
    server = HttpServer(app, options.limits, app.count_rejection)
    grpc_server = None
    if options.grpc_port is not None:
        from veo_edge.serve.grpc import GrpcServer

        grpc_server = GrpcServer(service, options.limits.max_body_bytes)
        grpc_port = await grpc_server.start(options.host, options.grpc_port)
        log.warning("veo-edge gRPC on %s:%d", options.host, grpc_port)
    if options.metrics_port is not None:
        metrics_port = start_metrics_server(service.registry, options.host, options.metrics_port)
        log.warning("veo-edge metrics on http://%s:%d/metrics", options.host, metrics_port)

    def listening(port: int) -> None:
        for name, svc in services.items():
            ready = svc.readiness()
            log.warning(
                "model %r: backend %s, ready: %s", name, ready["active_backend"], ready.get("reason", "yes")
            )
        log.warning("veo-edge serving %s on http://%s:%d", ", ".join(map(repr, services)), options.host, port)
        if on_listening is not None:
            on_listening(port)

    def drain() -> None:
        service.draining = True
        log.warning("draining: %d requests in flight", app.in_flight)

    try:
        await server.serve(options.host, options.port, options.drain_timeout_s, listening, drain)
    finally:
        app.close()
        if grpc_server is not None:
            await grpc_server.stop(options.drain_timeout_s)
    drained = app.in_flight == 0
    await service.close()
    log.warning("stopped: answered %d infer requests; drained cleanly: %s", service.infer_answered, drained)
    return 0 if drained else 1
