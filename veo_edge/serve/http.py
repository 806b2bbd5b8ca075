"""The KServe v2 / Triton HTTP routes as a plain ASGI application over :class:`InferenceService`.

uvicorn (see :mod:`veo_edge.serve.transport`) parses HTTP/1.1 and frames bodies (``Content-Length`` or
chunked); :mod:`veo_edge.serve.bodies` reads them within the per-request cap (413) and the cap on bytes
held across all connections (503), inflating gzip/deflate as they arrive. This module checks the access
policy before a body is read (:mod:`veo_edge.serve.control`: 401/403), routes by a fixed table (metrics
are labelled by route name, never by the path a client sent), resolves shared-memory tensors
(:mod:`veo_edge.serve.shm`), decodes large JSON heads in a worker process so the event loop keeps
answering probes, and writes JSON or binary-tensor responses. ``HEAD`` is answered like ``GET`` without
a body (uvicorn drops it).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from veo_edge.serve.bodies import BodyBudget, Disconnected, HttpError, read_body
from veo_edge.serve.canary_wire import BINARY
from veo_edge.serve.control import CONTROL_ROUTES, HTTP_GROUPS, AccessPolicy
from veo_edge.serve.decoder import Decoder
from veo_edge.serve.metrics import render
from veo_edge.serve.protocol import ProtocolError, encode_infer_response, parse_infer_request
from veo_edge.serve.shm import ShmRegistry
from veo_edge.serve.transport import Limits, error_body

log = logging.getLogger("veo_edge.serve")

_JSON = b"application/json"
_MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_REPO = r"/v2/repository/models/(?P<name>[^/]+)"
_SHM = r"/v2/(?P<kind>system|cuda)sharedmemory"
_REGION = r"/region/(?P<region>[^/]+)"
#: an infer request's refusal by the transport -> nv_inference_request_failure's reason (else INVALID);
#: 499: the client left before its answer; 500: an unexpected error in the server
_REASONS = {401: "UNAUTHORIZED", 403: "UNAUTHORIZED", 499: "CANCELED", 500: "OTHER", 503: "REJECTED"}
#: (route name, path pattern, methods); the route name is the metrics label
ROUTES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    (name, re.compile(f"^{pattern}$"), methods)
    for name, pattern, methods in [
        ("metrics", r"/metrics", ("GET",)),
        ("server_metadata", r"/v2", ("GET",)),
        ("server_live", r"/v2/health/live", ("GET",)),
        ("server_ready", r"/v2/health/ready", ("GET",)),
        ("stats_all", r"/v2/models/stats", ("GET",)),
        ("repository_index", r"/v2/repository/index", ("POST",)),
        ("repository_load", _REPO + r"/load", ("POST",)),
        ("repository_unload", _REPO + r"/unload", ("POST",)),
        ("model_infer", _MODEL + r"/infer", ("POST",)),
        ("model_ready", _MODEL + r"/ready", ("GET",)),
        ("model_config", _MODEL + r"/config", ("GET",)),
        ("model_stats", _MODEL + r"/stats", ("GET",)),
        ("model_canary", _MODEL + r"/canary", ("GET",)),
        ("model_metadata", _MODEL, ("GET",)),
        ("shm_status", _SHM + f"(?:{_REGION})?/status", ("GET",)),
        ("shm_register", _SHM + _REGION + "/register", ("POST",)),
        ("shm_unregister", _SHM + f"(?:{_REGION})?/unregister", ("POST",)),
    ]
]


def match_route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """(route name, path parameters); HttpError 404/405 for paths and methods the protocol lacks."""
    path = path.rstrip("/") or "/"
    for name, pattern, methods in ROUTES:
        m = pattern.match(path)
        if m is None:
            continue
        if method not in methods and not (method == "HEAD" and "GET" in methods):
            last = path.rsplit("/", 1)[-1]
            raise HttpError(
                405, f"{method} is not allowed on {path[:200]}: use {' or '.join(methods)} for /{last}"
            )
        return name, {k: v for k, v in m.groupdict().items() if v is not None}
    raise HttpError(404, f"no route for {method} {path[:200]}; see the Open Inference Protocol")


def _decode_json_object(body: Any, what: str) -> dict[str, Any]:
    body = bytes(body)
    if not body.strip():
        return {}
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise HttpError(400, f"{what} is not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise HttpError(400, f"{what} must be a JSON object")
    return obj


class HttpApp:
    """The ASGI callable. ``budget`` counts request-body bytes held now, across all connections."""

    def __init__(
        self,
        service: Any,
        limits: Limits,
        shm: ShmRegistry | None = None,
        access: AccessPolicy | None = None,
        decoder: ProcessPoolExecutor | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.service = service
        self.limits = limits
        self.shm = shm or ShmRegistry()
        self.access = access or AccessPolicy()
        self.counters = service.counters
        self.budget = budget or BodyBudget(limits)  # shared with gRPC's ModelInfer where both serve
        self.in_flight = 0
        self._decoder = Decoder(decoder)
        self._handlers: dict[str, Callable[..., Awaitable[tuple[int, list, bytes]]]] = {
            "metrics": self._metrics,
            "server_metadata": self._server_metadata,
            "server_live": self._live,
            "server_ready": self._ready,
            "stats_all": self._stats_all,
            "repository_index": self._repository_index,
            "repository_load": self._repository_load,
            "repository_unload": self._repository_unload,
            "model_infer": self._infer,
            "model_ready": self._model_ready,
            "model_config": self._model_config,
            "model_stats": self._model_stats,
            "model_canary": self._model_canary,
            "model_metadata": self._model_metadata,
            "shm_status": self._shm_status,
            "shm_register": self._shm_register,
            "shm_unregister": self._shm_unregister,
        }

    def count_rejection(self, status: int) -> None:
        """A request the transport rejected before routing (malformed, too large a head, too slow)."""
        self.counters.responses[("protocol", status)] += 1

    def prestart_decoder(self) -> None:
        """Start the JSON worker process now, so the first large request does not wait for it."""
        self._decoder.prestart()

    def close(self) -> None:
        self._decoder.close()

    # -- ASGI -----------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        self.in_flight += 1
        route, reserved, arrival = "unknown", 0, None
        try:
            try:
                route, params = match_route(scope["method"], scope["path"])
                self._authorize(scope, route)
                if route == "model_infer":  # announced before its body is read: a batch may wait for it
                    arrival = self.service.expect(params["name"])
                    params = {**params, "arrival": arrival}
                body, reserved = await read_body(scope, receive, self.limits, self.budget)
                status, headers, payload = await self._handlers[route](scope, params, body)
                close = False
            except HttpError as e:
                status, headers, payload, close = e.status, [], error_body(str(e)), e.close
                if route == "model_infer":  # refused before the service saw it: 401/403, 413, 503, ...
                    self.service.rejected(params["name"], "http", status, _REASONS.get(status, "INVALID"))
                if status == 401:
                    headers = [(b"www-authenticate", b'Bearer realm="veo-edge"')]
            except ProtocolError as e:
                status, headers, payload, close = e.status, [], error_body(str(e)), False
            except Disconnected:
                raise
            except Exception as e:  # a bug in a handler must not reach the client as a bare 500
                log.exception("handler failed on %s %s", scope["method"], scope["path"][:200])
                status, headers, close = 500, [], False
                payload = error_body(f"internal error: {type(e).__name__}: {e}")
                self._count_infer(route, params, 500)
            self.counters.responses[(route, status)] += 1
            await self._respond(send, status, headers, payload, close)
        except Disconnected:
            self.counters.responses[(route, 499)] += 1
            self._count_infer(route, params, 499)
        finally:
            if arrival is not None:
                arrival.done()
            self.budget.give(reserved)
            self.in_flight -= 1

    def _count_infer(self, route: str, params: dict, status: int) -> None:
        """Count an infer request that ended in ``status`` unless the service already counted it."""
        if route == "model_infer" and not params.get("counted"):
            self.service.rejected(params["name"], "http", status, _REASONS[status])

    def _authorize(self, scope: dict, route: str) -> None:
        """The access policy (:mod:`veo_edge.serve.control`), before a body is read: a refused request's
        body is never buffered (its connection closes)."""
        if not self.access.restricted and route not in CONTROL_ROUTES:
            return
        header = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                header = v.decode("latin-1")
        try:
            self.access.check(route, HTTP_GROUPS.get(route), header)
        except ProtocolError as e:
            raise HttpError(e.status, str(e), close=scope["method"] == "POST") from e

    @staticmethod
    async def _respond(send: Callable, status: int, headers: list, payload: bytes, close: bool) -> None:
        head = [(b"content-length", str(len(payload)).encode()), *headers]
        if not any(k == b"content-type" for k, _ in headers):
            head.append((b"content-type", _JSON))
        if close:
            head.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload})

    # -- handlers: (status, extra headers, payload) ---------------------------------------------
    @staticmethod
    def _json(status: int, obj: Any) -> tuple[int, list, bytes]:
        return status, [], json.dumps(obj, separators=(",", ":")).encode()

    async def _metrics(self, scope, params, body):
        payload, ctype = render(self.service.registry)
        return 200, [(b"content-type", ctype.encode())], payload

    async def _server_metadata(self, scope, params, body):
        meta = self.service.server_metadata()
        return self._json(200, {**meta, "extensions": sorted(meta["extensions"] + self.shm.extensions())})

    async def _live(self, scope, params, body):
        return self._json(200, self.service.live())

    async def _ready(self, scope, params, body):
        ready = self.service.readiness()
        return self._json(200 if ready["ready"] else 503, ready)

    async def _stats_all(self, scope, params, body):
        return self._json(200, self.service.statistics())

    async def _repository_index(self, scope, params, body):
        req = _decode_json_object(body, "the repository index request")
        return self._json(200, self.service.repository_index(ready_only=req.get("ready") is True))

    async def _repository_load(self, scope, params, body):
        req = _decode_json_object(body, "the load request")
        if req.get("parameters"):
            raise HttpError(
                400,
                f"load parameters {sorted(req['parameters'])} are not supported: this server loads its "
                "model from the build directory as built; rebuild to change it",
            )
        await self.service.load_model(params["name"])
        return 200, [], b""

    async def _repository_unload(self, scope, params, body):
        _decode_json_object(body, "the unload request")
        await self.service.unload_model(params["name"])
        return 200, [], b""

    async def _model_metadata(self, scope, params, body):
        return self._json(200, self.service.model_metadata(params["name"], params.get("version")))

    async def _model_ready(self, scope, params, body):
        ready = self.service.model_readiness(params["name"], params.get("version"))
        return self._json(200 if ready["ready"] else 503, ready)

    async def _model_config(self, scope, params, body):
        return self._json(200, self.service.model_config(params["name"], params.get("version")))

    async def _model_stats(self, scope, params, body):
        return self._json(200, self.service.statistics(params["name"], params.get("version")))

    async def _model_canary(self, scope, params, body):
        binary = any(k == b"accept" and BINARY.encode() in v for k, v in scope["headers"])
        payload, hlen = self.service.canary_body(params["name"], params.get("version"), binary)
        if hlen is None:
            return 200, [], payload
        return (
            200,
            [(b"content-type", BINARY.encode()), (b"inference-header-content-length", b"%d" % hlen)],
            payload,
        )

    async def _infer(self, scope, params, body):
        name, version = params["name"], params.get("version")
        try:
            model = self.service.model_spec(name, version)
        except ProtocolError as e:  # 404: no such model or version
            self.service.rejected(name, "http", e.status)
            raise
        hlen = None
        for k, v in scope["headers"]:
            if k == b"inference-header-content-length":
                hlen = v.decode("latin-1")
        try:
            json_size = int(hlen) if hlen is not None else len(body)
        except ValueError:
            json_size = 0
        try:
            if json_size > self.limits.offload_json_bytes:
                parsed = await self._decoder.decode(body, hlen, model)
            else:
                parsed = parse_infer_request(body, hlen, model)
            lease = self.shm.attach(parsed)  # shared-memory inputs become arrays; 400 for a bad region
        except ProtocolError as e:  # 400; 503: the decoding worker died twice
            self.service.rejected(name, "http", e.status, _REASONS.get(e.status, "INVALID"))
            raise
        try:
            try:
                outputs = await self.service.infer(name, version, parsed, params.get("arrival"))
            except ProtocolError:
                params["counted"] = True  # the service counts each outcome it answers
                raise
            params["counted"] = True
            labels = self.service.model_labels(name)
            write = lease.write if lease is not None else None
            chunks, out_hlen = encode_infer_response(model, parsed, outputs, labels, write)
        finally:
            if lease is not None:
                lease.release()
        payload = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if out_hlen is None:
            return 200, [], payload
        return (
            200,
            [
                (b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", str(out_hlen).encode()),
            ],
            payload,
        )

    # -- the shared-memory extension (veo_edge.serve.shm) ----------------------------------------
    async def _shm_status(self, scope, params, body):
        return self._json(200, self.shm.status(params["kind"], params.get("region")))

    async def _shm_register(self, scope, params, body):
        req = _decode_json_object(body, "the register request")
        name, kind = params["region"], params["kind"]
        size = req.get("byte_size")
        if not isinstance(size, int) or isinstance(size, bool):
            raise HttpError(400, f"the register request needs an integer 'byte_size', got {size!r}")
        if kind == "system":
            key, offset = req.get("key"), req.get("offset", 0)
            if not isinstance(key, str) or not isinstance(offset, int) or isinstance(offset, bool):
                raise HttpError(
                    400,
                    f"the register request needs a string 'key' (and, if given, an integer 'offset'); got "
                    f"key {key!r}, offset {offset!r}",
                )
            self.shm.register_system(name, key, offset, size)
        else:
            device = req.get("device_id", 0)
            if not isinstance(device, int) or isinstance(device, bool):
                raise HttpError(400, f"the register request needs an integer 'device_id', got {device!r}")
            self.shm.register_cuda(name, self.shm.b64_handle(req), device, size)
        return 200, [], b""

    async def _shm_unregister(self, scope, params, body):
        self.shm.unregister(params["kind"], params.get("region"))
        return 200, [], b""
