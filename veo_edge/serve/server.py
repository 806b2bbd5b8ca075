"""The server's lifetime: one :class:`~veo_edge.serve.app.InferenceService` per model (or a
:class:`~veo_edge.serve.repository.ModelSet` of them), the canary, the HTTP front end and the optional
gRPC and metrics listeners, signals, and the drain that answers every accepted request before exit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from veo_edge.serve.app import InferenceService, ServeOptions
from veo_edge.serve.http import HttpApp
from veo_edge.serve.images import ImageModels
from veo_edge.serve.metrics import start_metrics_server
from veo_edge.serve.repository import ModelSet
from veo_edge.serve.transport import HttpServer

log = logging.getLogger("veo_edge.serve")


async def serve_async(
    runtimes: Any,
    options: ServeOptions,
    on_listening: Any = None,
    make_runtime: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, then drain; returns the exit status (0 after a clean drain).

    ``runtimes``: one started runtime, or model name -> started runtime for several models (each its
    own service: runtime, batcher, readiness); ``make_runtime`` likewise (for repository loads)."""
    if not isinstance(runtimes, dict):
        runtimes, make_runtime = {options.model_name: runtimes}, {options.model_name: make_runtime}
    makers = make_runtime if isinstance(make_runtime, dict) else {}
    services = {
        name: InferenceService(rt, replace(options, model_name=name), makers.get(name))
        for name, rt in runtimes.items()
    }
    service: Any = next(iter(services.values())) if len(services) == 1 else ModelSet(services)
    service = ImageModels(service)  # encoded pictures in, <name>_image companions (serve/images.py)
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
