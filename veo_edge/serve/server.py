"""The server's lifetime: its ports bound first (:mod:`veo_edge.serve.listen`: a taken port is one line
and exit 2, before any model loads), then one :class:`~veo_edge.serve.app.InferenceService` per model
(or a :class:`~veo_edge.serve.repository.ModelSet` of them), the canary, the HTTP front end and the
optional gRPC and metrics listeners, signals, and the drain that answers every accepted request before
exit; shared-memory regions are unmapped at the end. SIGTERM/SIGINT are caught from the start: one that
comes before HTTP serves stops the start-up at its next step (:class:`_StartStop`), releasing what was
made, and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from veo_edge.serve.alone import LoneRequests
from veo_edge.serve.app import InferenceService, ServeOptions
from veo_edge.serve.bodies import BodyBudget
from veo_edge.serve.decoder import start_decoder
from veo_edge.serve.http import HttpApp
from veo_edge.serve.images import ImageModels
from veo_edge.serve.listen import Listeners
from veo_edge.serve.repository import ModelSet
from veo_edge.serve.shm import ShmRegistry
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
    own service: runtime, batcher, readiness), or ``None``: made by ``make_runtime`` (model name ->
    maker) once the ports are bound; ``make_runtime`` also serves repository loads."""
    if runtimes is not None and not isinstance(runtimes, dict):
        runtimes, make_runtime = {options.model_name: runtimes}, {options.model_name: make_runtime}
    makers = make_runtime if isinstance(make_runtime, dict) else {}
    stop = _StartStop()  # before anything is bound or loaded: a signal from now on is an orderly stop
    decoder = start_decoder()  # before grpc is imported: its fork handlers would complain at the spawn
    shm = ShmRegistry(options.shared_memory)
    budget = BodyBudget(options.limits)  # --max-buffered-bytes: HTTP bodies and gRPC messages together
    listeners = Listeners()
    grpc_server = None
    try:
        await listeners.bind(options)
        stop.check("binding its ports")
        owned = runtimes is None
        if runtimes is None:
            runtimes = await _make_runtimes(makers, stop)
        try:
            if options.grpc_port is not None:
                from veo_edge.serve.grpc_server import GrpcServer

                grpc_server = GrpcServer(options.limits.max_body_bytes, shm, options.access, budget)
                await listeners.bind_grpc(options, grpc_server)
                stop.check("binding gRPC")
        except BaseException:
            for runtime in runtimes.values() if owned else ():
                runtime.close(drain=False)
            raise
        app_args = (options.limits, shm, options.access, decoder, budget)
        return await _serve(runtimes, makers, options, listeners, grpc_server, app_args, on_listening, stop)
    except _Stopped as e:
        log.info("veo-edge stops before it took a request: %s came while it was %s", stop.signal, e)
        return 0
    finally:
        stop.close()
        decoder.shutdown(wait=False, cancel_futures=True)
        await listeners.close()
        shm.close()


class _Stopped(Exception):
    """A signal came before HTTP served; the start-up step it stopped (for the log line)."""


class _StartStop:
    """SIGTERM/SIGINT from the start of serving: before HTTP serves, one is noted and the start-up stops
    at its next :meth:`check`; once the HTTP server exists it is handed on (``forward``: its drain)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.forward: Callable[[], None] | None = None
        self.install()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if self.forward is not None:
            self.forward()
        elif self.signal is None:
            self.signal = signal.Signals(sig).name
            log.info("draining: %s came as the server starts; it stops before serving", self.signal)

    def check(self, step: str) -> None:
        if self.signal is not None:
            raise _Stopped(step)


async def _make_runtimes(makers: dict[str, Callable[[], Any]], stop: _StartStop) -> dict[str, Any]:
    """Each model's runtime (each its own batcher and readiness), off the loop; on a failure or a signal
    the ones made are closed."""
    loop, runtimes = asyncio.get_running_loop(), {}
    try:
        for name, make in makers.items():
            log.debug("model %r: loading", name)  # INFO made a failed start two lines of stderr
            runtimes[name] = await loop.run_in_executor(None, make)
            stop.check(f"loading model {name!r}")
    except BaseException:
        for runtime in runtimes.values():
            runtime.close(drain=False)
        raise
    return runtimes


async def _serve(runtimes, makers, options, listeners, grpc_server, app_args, on_listening, stop) -> int:
    alone = LoneRequests(options.lone_max_ms)  # one for the server: requests in progress anywhere
    services = {
        name: InferenceService(rt, replace(options, model_name=name), makers.get(name), alone)
        for name, rt in runtimes.items()
    }
    service: Any = next(iter(services.values())) if len(services) == 1 else ModelSet(services)
    service = ImageModels(service)  # encoded pictures in, <name>_image companions (serve/images.py)
    app = HttpApp(service, *app_args)
    try:
        await service.start()
        stop.check("warming up")
        listeners.serve_metrics(service.registry)
        if grpc_server is not None:
            await grpc_server.start(service)
            log.info("veo-edge gRPC on %s:%d", options.host, grpc_server.port)
        if listeners.metrics is not None:
            log.info("veo-edge metrics on http://%s:%d/metrics", options.host, listeners.metrics_port)
        stop.check("starting gRPC and metrics")
    except BaseException:
        if grpc_server is not None:  # RPCs it accepted are answered first
            await grpc_server.stop(options.drain_timeout_s)
        app.close()
        await service.close()
        raise
    server = HttpServer(app, options.limits, app.count_rejection)
    stop.forward = server.stop  # a signal from here on is the HTTP server's drain

    def listening(port: int) -> None:
        if service.draining:  # a signal came as it started: its drain was logged, so no ready line now
            log.info("veo-edge stops before it took a request: the drain began as it started")
            if on_listening is not None:
                on_listening(port)
            return
        for name, svc in services.items():
            ready = svc.readiness()
            skipped = "; ".join(
                f"{s['backend']}: {s['reason']}" for s in ready["fallback"]["skipped"] if s.get("reason")
            )
            asked, active = runtimes[name].backend, ready["active_backend"]
            # an explicitly chosen backend that did not start is fallback a person asked not to need: said
            # at WARNING, where alerting looks (--no-fallback makes it an error instead)
            fell_back = asked != "auto" and active is not None and active != asked
            # traffic moved at start (the first backend failed its canary): said where alerting looks too
            switched = "; ".join(f"{s['from']}: {s['reason']}" for s in ready["fallback"]["switches"])
            level = logging.WARNING if fell_back or switched else logging.INFO
            log.log(
                logging.ERROR if "reason" in ready else level,
                "model %r: backend %s%s, %s%s%s",
                name,
                active or "none",
                f" (fell back from --backend {asked}; --no-fallback refuses to)" if fell_back else "",
                f"not ready: {ready['reason']}" if "reason" in ready else "ready: yes",
                f" (switched away from {switched})" if switched else "",
                f" (skipped {skipped})" if skipped else "",
            )
        log.info("veo-edge serving %s on http://%s:%d", ", ".join(map(repr, services)), options.host, port)
        if on_listening is not None:
            on_listening(port)

    def drain() -> None:
        service.draining = True
        grpc_calls = grpc_server.in_flight if grpc_server is not None else 0
        log.info("draining: %d requests in flight", app.in_flight + grpc_calls)

    try:
        await server.serve(listeners.http, options.drain_timeout_s, listening, drain)
    finally:
        stop.forward = lambda: None  # the drain has begun: a signal now changes nothing
        stop.install()  # (uvicorn removed its handlers, which would leave the default: killed, 143)
        app.close()
        if grpc_server is not None:
            await grpc_server.stop(options.drain_timeout_s)
    drained = app.in_flight == 0 and (grpc_server is None or grpc_server.cut_off == 0)
    await service.close()
    log.info("stopped: answered %d infer requests; drained cleanly: %s", service.infer_answered, drained)
    return 0 if drained else 1
