"""The inference service: Open Inference Protocol routes over a :class:`~veo_edge.runtime.runtime.Runtime`.

Each sample of an infer request is one ``Runtime.submit``; the runtime's dynamic batcher groups samples
across requests. Readiness = an active backend and a canary that matched on it; liveness = the process
answers. ``run_server`` owns the event loop, the signals and the drain on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from veo_edge import __version__
from veo_edge.errors import InputError, OverloadedError, VeoEdgeError
from veo_edge.export.canary import Canary, CanaryResult, compare_canary
from veo_edge.serve.health import canary_to_json, load_canary
from veo_edge.serve.http import HttpServer, Limits, Request, Response
from veo_edge.serve.metrics import HttpCounters, ServeCollector, make_registry, render
from veo_edge.serve.protocol import (
    CONFIG_TYPES,
    ModelSpec,
    ProtocolError,
    encode_infer_response,
    parse_infer_request,
)

log = logging.getLogger("veo_edge.serve")

_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/[a-z]+)?$")
EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _json(status: int, obj: Any) -> Response:
    return Response(status, [json.dumps(obj, separators=(",", ":")).encode()])


def _error(status: int, message: str) -> Response:
    return Response(status, [error_body(status, message)])


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    limits: Limits = field(default_factory=Limits)
    #: an infer request not answered within this many seconds gets a 504
    infer_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0


class InferenceService:
    """Routes, readiness and metrics for one model served by one runtime."""

    def __init__(self, runtime: Any, options: ServeOptions) -> None:
        self.runtime = runtime
        self.options = options
        self.model = ModelSpec.from_manifest(runtime.build.manifest, options.model_name)
        self.counters = HttpCounters()
        self.registry = make_registry(ServeCollector(runtime, self.model, self.counters, self.is_ready))
        self.http = HttpServer(self.handle, error_body, options.limits)
        # the golden canary is read (and verified) now: a build without a usable one is refused at start
        self.canary: Canary | None = load_canary(runtime.build)
        self.canary_result: CanaryResult | None = None
        self.canary_backend: str | None = None
        self.canary_error: str | None = None
        self.infer_answered = 0
        self._recheck: threading.Thread | None = None
        self.started = time.time()

    # -- readiness ------------------------------------------------------------------------------
    def run_canary(self) -> CanaryResult | None:
        """Run the golden canary through the runtime (blocking); readiness follows its result."""
        backend = self.runtime.state.to_dict().get("active_backend")
        try:
            self.canary = self.canary or load_canary(self.runtime.build)
            out = self.runtime.infer(self.canary.input)
            self.canary_result = compare_canary(out, self.canary)
            self.canary_error = self.canary_result.reason
        except VeoEdgeError as e:
            self.canary_result, self.canary_error = None, str(e)
        self.canary_backend = backend
        if self.canary_error:
            log.error("canary failed on %s: %s", backend, self.canary_error)
        return self.canary_result

    def readiness(self) -> dict[str, Any]:
        state = self.runtime.state.to_dict()
        backend = state.get("active_backend")
        reasons = []
        if self.http.draining:
            reasons.append("the server is shutting down")
        if state.get("closed"):
            reasons.append("the runtime is closed")
        if not backend or not state.get("ready", True):
            reasons.append(f"no backend is active (skipped: {state.get('skipped')})")
        if self.canary_error:
            reasons.append(f"canary failed on {self.canary_backend}: {self.canary_error}")
        elif self.canary_result is None:
            reasons.append("the canary has not run")
        elif backend and backend != self.canary_backend:
            reasons.append(f"the canary ran on {self.canary_backend}, {backend} is active now: re-running it")
            self._recheck_canary()
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

    def _recheck_canary(self) -> None:
        """After a fallback switch, verify the new backend with the canary (in the background)."""
        if self._recheck is None or not self._recheck.is_alive():
            self._recheck = threading.Thread(target=self.run_canary, name="veo-edge-canary", daemon=True)
            self._recheck.start()

    def is_ready(self) -> bool:
        return bool(self.readiness()["ready"])

    # -- routing --------------------------------------------------------------------------------
    async def handle(self, req: Request) -> Response:
        endpoint, response = await self._route(req)
        self.counters.responses[(endpoint, response.status)] += 1
        return response

    async def _route(self, req: Request) -> tuple[str, Response]:
        path = req.path.rstrip("/") or "/"
        if path == "/metrics":
            if req.method != "GET":
                return "metrics", _error(405, "use GET /metrics")
            body, ctype = render(self.registry)
            return "metrics", Response(200, [body], content_type=ctype)
        if path == "/v2":
            return "server", self._get(req) or _json(
                200, {"name": "veo-edge", "version": __version__, "extensions": EXTENSIONS}
            )
        if path == "/v2/health/live":
            state = self.runtime.state.to_dict()
            return "live", self._get(req) or _json(
                200,
                {
                    "live": True,
                    "active_backend": state.get("active_backend"),
                    "fallback": {"count": state.get("fallback_count", 0)},
                },
            )
        if path == "/v2/health/ready":
            ready = self.readiness()
            return "ready", self._get(req) or _json(200 if ready["ready"] else 503, ready)
        m = _MODEL_ROUTE.match(path)
        if m is None:
            return "other", _error(
                404, f"no route for {req.method} {req.path}; see the Open Inference Protocol"
            )
        name, version, action = m.group(1), m.group(2), m.group(3) or ""
        endpoint = action.lstrip("/") or "model"
        if name != self.model.name:
            return endpoint, _error(404, f"unknown model {name!r}; this server serves {self.model.name!r}")
        if version not in (None, "", self.model.version):
            return endpoint, _error(
                404, f"model {name!r} has no version {version!r}; it has version {self.model.version!r}"
            )
        if action == "/infer":
            if req.method != "POST":
                return endpoint, _error(405, "use POST for /infer")
            return endpoint, await self._infer(req)
        handler = {
            "": self._metadata,
            "/ready": self._model_ready,
            "/config": self._config,
            "/stats": self._stats,
            "/canary": self._canary,
        }.get(action)
        if handler is None:
            return "other", _error(404, f"no route for {req.method} {req.path}")
        return endpoint, self._get(req) or handler()

    @staticmethod
    def _get(req: Request) -> Response | None:
        return None if req.method == "GET" else _error(405, f"use GET for {req.path}")

    # -- model endpoints ------------------------------------------------------------------------
    def _metadata(self) -> Response:
        m = self.model
        return _json(
            200,
            {
                "name": m.name,
                "versions": [m.version],
                "platform": "veo-edge",
                "inputs": [t.to_metadata() for t in m.inputs],
                "outputs": [t.to_metadata() for t in m.outputs],
            },
        )

    def _model_ready(self) -> Response:
        ready = self.readiness()
        return _json(200 if ready["ready"] else 503, ready)

    def _config(self) -> Response:
        """Triton's model configuration, enough for tritonclient and perf_analyzer."""
        m = self.model
        backend = self.runtime.state.to_dict().get("active_backend") or "none"

        def tensor(t):  # dims without the batch axis, as Triton writes them when max_batch_size > 0
            return {
                "name": t.name,
                "data_type": CONFIG_TYPES[t.datatype],
                "format": "FORMAT_NONE",
                "dims": list(t.shape[1:]),
            }

        delay_us = int(float(getattr(self.runtime, "max_queue_delay_ms", 2.0)) * 1000)
        return _json(
            200,
            {
                "name": m.name,
                "platform": "",
                "backend": f"veo-edge-{backend}",
                "version_policy": {"latest": {"num_versions": 1}},
                "max_batch_size": m.max_batch,
                "input": [tensor(t) for t in m.inputs],
                "output": [tensor(t) for t in m.outputs],
                "dynamic_batching": {
                    "preferred_batch_size": [m.max_batch],
                    "max_queue_delay_microseconds": delay_us,
                },
                "instance_group": [
                    {"name": m.name, "kind": "KIND_GPU" if backend == "tensorrt" else "KIND_CPU", "count": 1}
                ],
            },
        )

    def _stats(self) -> Response:
        """Triton's statistics extension, from the runtime's counters (durations in ns)."""
        s = self.runtime.stats()
        sizes = {int(k): int(v) for k, v in (s.get("batch_size_counts") or {}).items()}

        def cn(count: int, us: float) -> dict[str, int]:
            return {"count": int(count), "ns": int(us * 1000)}

        ok, fail = s["requests_success"], s["requests_failure"]
        return _json(
            200,
            {
                "model_stats": [
                    {
                        "name": self.model.name,
                        "version": self.model.version,
                        "inference_count": sum(k * v for k, v in sizes.items()),
                        "execution_count": s["batches"],
                        "inference_stats": {
                            "success": cn(ok, s["request_us_total"]),
                            "fail": cn(fail, 0),
                            "queue": cn(ok, s["queue_us_total"]),
                            "compute_input": cn(ok, 0),
                            "compute_infer": cn(ok, s["compute_us_total"]),
                            "compute_output": cn(ok, 0),
                            "cache_hit": cn(0, 0),
                            "cache_miss": cn(0, 0),
                        },
                        "batch_stats": [
                            {"batch_size": k, "compute_infer": cn(v, 0)} for k, v in sorted(sizes.items())
                        ],
                    }
                ]
            },
        )

    def _canary(self) -> Response:
        try:
            canary = self.canary or load_canary(self.runtime.build)
        except VeoEdgeError as e:
            return _error(404, str(e))
        return _json(200, canary_to_json(canary))

    # -- inference ------------------------------------------------------------------------------
    async def _infer(self, req: Request) -> Response:
        try:
            parsed = parse_infer_request(
                req.body, req.headers.get("inference-header-content-length"), self.model
            )
        except ProtocolError as e:
            self.counters.infer_rejected["INVALID"] += 1
            return _error(e.status, str(e))
        x = parsed.inputs[self.model.inputs[0].name]
        futures = []
        try:
            for i in range(parsed.batch):
                futures.append(self.runtime.submit(x[i]))
        except OverloadedError as e:
            for f in futures:
                f.cancel()
            self.counters.infer_rejected["REJECTED"] += 1
            return _error(503, f"overloaded: {e}")
        except InputError as e:
            self.counters.infer_rejected["INVALID"] += 1
            return _error(400, str(e))
        except VeoEdgeError as e:  # closed runtime, no backend
            self.counters.infer_rejected["UNAVAILABLE"] += 1
            return _error(503, f"the model cannot take requests now: {e}")
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), self.options.infer_timeout_s
            )
        except asyncio.TimeoutError:
            return _error(504, f"inference did not finish within {self.options.infer_timeout_s} s")
        except OverloadedError as e:
            return _error(503, f"overloaded: {e}")
        except InputError as e:
            return _error(400, str(e))
        except VeoEdgeError as e:
            return _error(500, f"inference failed: {e}")
        out = np.stack(results) if len(results) > 1 else results[0][None]
        chunks, hlen = encode_infer_response(self.model, parsed, {self.model.outputs[0].name: out})
        self.infer_answered += 1
        if hlen is None:
            return Response(200, chunks)
        return Response(
            200,
            chunks,
            content_type="application/octet-stream",
            headers=[("Inference-Header-Content-Length", str(hlen))],
        )


async def serve_async(runtime: Any, options: ServeOptions, on_listening: Any = None) -> int:
    """Serve until SIGTERM/SIGINT, then drain; returns the exit status (0 after a clean drain)."""
    loop = asyncio.get_running_loop()
    service = InferenceService(runtime, options)
    await loop.run_in_executor(None, service.run_canary)
    port = await service.http.start(options.host, options.port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = service.readiness()
    log.warning(
        "veo-edge serving %r on http://%s:%d (backend %s, ready: %s)",
        service.model.name,
        options.host,
        port,
        ready["active_backend"],
        ready.get("reason", "yes"),
    )
    if on_listening is not None:
        on_listening(port)
    await stop.wait()
    log.warning("draining: %d requests in flight", service.http.in_flight)
    drained = await service.http.drain(options.drain_timeout_s)
    await loop.run_in_executor(None, lambda: runtime.close(drain=True, timeout=options.drain_timeout_s))
    log.warning("stopped: answered %d infer requests; drained cleanly: %s", service.infer_answered, drained)
    return 0 if drained else 1
