"""The KServe v2 / Triton HTTP routes as a plain ASGI application over :class:`InferenceService`.

uvicorn (see :mod:`veo_edge.serve.transport`) parses HTTP/1.1 and frames bodies (``Content-Length`` or
chunked); this module reads them within the per-request cap (413) and a global cap on the bytes held
across all connections (503), inflates gzip/deflate bodies, routes by a fixed table (metrics are
labelled by route name, never by the path a client sent), decodes large JSON heads in a worker process
so the event loop keeps answering probes, and writes JSON or binary-tensor responses. ``HEAD`` is
answered like ``GET`` without a body (uvicorn drops it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from veo_edge.serve.metrics import render
from veo_edge.serve.protocol import ProtocolError, encode_infer_response, parse_infer_request
from veo_edge.serve.transport import Limits, error_body

log = logging.getLogger("veo_edge.serve")

_JSON = b"application/json"
_MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_REPO = r"/v2/repository/models/(?P<name>[^/]+)"
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
    ]
]


class HttpError(Exception):
    """Answered with ``status``; ``close`` when the request's body was not read (the connection closes)."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class _Disconnected(Exception):
    pass


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


def _decode_json_object(body: bytes, what: str) -> dict[str, Any]:
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
    """The ASGI callable. ``buffered`` counts request-body bytes held now, across all connections."""

    def __init__(self, service: Any, limits: Limits) -> None:
        self.service = service
        self.limits = limits
        self.counters = service.counters
        self.buffered = 0
        self.in_flight = 0
        self._decoder: ProcessPoolExecutor | None = None
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
        }

    def count_rejection(self, status: int) -> None:
        """A request the transport rejected before routing (malformed, too large a head, too slow)."""
        self.counters.responses[("protocol", status)] += 1

    def prestart_decoder(self) -> None:
        """Start the JSON worker process now, so the first large request does not wait for it."""
        self._decoder_pool().submit(int)

    def _decoder_pool(self) -> ProcessPoolExecutor:
        if self._decoder is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")  # never fork a process holding backend threads
            self._decoder = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        return self._decoder

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)
            self._decoder = None

    # -- ASGI -----------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        self.in_flight += 1
        route, reserved, arrival = "unknown", 0, None
        try:
            try:
                route, params = match_route(scope["method"], scope["path"])
                if route == "model_infer":  # announced before its body is read: a batch may wait for it
                    arrival = self.service.expect(params["name"])
                    params = {**params, "arrival": arrival}
                body, reserved = await self._read_body(scope, receive, route)
                status, headers, payload = await self._handlers[route](scope, params, body)
                close = False
            except HttpError as e:
                status, headers, payload, close = e.status, [], error_body(str(e)), e.close
            except ProtocolError as e:
                status, headers, payload, close = e.status, [], error_body(str(e)), False
            except _Disconnected:
                raise
            except Exception as e:  # a bug in a handler must not reach the client as a bare 500
                log.exception("handler failed on %s %s", scope["method"], scope["path"][:200])
                status, headers, close = 500, [], False
                payload = error_body(f"internal error: {type(e).__name__}: {e}")
            self.counters.responses[(route, status)] += 1
            await self._respond(send, status, headers, payload, close)
        except _Disconnected:
            self.counters.responses[(route, 499)] += 1
        finally:
            if arrival is not None:
                arrival.done()
            self.buffered -= reserved
            self.in_flight -= 1

    @staticmethod
    async def _respond(send: Callable, status: int, headers: list, payload: bytes, close: bool) -> None:
        head = [(b"content-length", str(len(payload)).encode()), *headers]
        if not any(k == b"content-type" for k, _ in headers):
            head.append((b"content-type", _JSON))
        if close:
            head.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload})

    # -- bodies ---------------------------------------------------------------------------------
    def _reserve(self, n: int, held: int, check_only: bool = False) -> None:
        """Count ``n`` more bytes of a body (``held`` already counted) against the global cap; 503 over it.

        Bytes are counted as they arrive, never as declared, so connections that announce large bodies
        and send nothing cannot lock the budget; a declared length that cannot fit now is refused at
        once (``check_only``), before its bytes are read."""
        limits = self.limits
        if self.buffered + n > limits.max_buffered_bytes:
            raise HttpError(
                503,
                f"the server holds {self.buffered} bytes of request bodies and this request needs {held + n}; "
                f"the limit across all connections is {limits.max_buffered_bytes} (--max-buffered-bytes); "
                "retry later",
                close=True,
            )
        if not check_only:
            self.buffered += n

    async def _read_body(self, scope: dict, receive: Callable, route: str) -> tuple[bytes, int]:
        """The whole (inflated) body and the bytes reserved for it in the global budget."""
        headers = scope["headers"]
        length = encoding = None
        for k, v in headers:
            if k == b"content-length":
                length = int(v)  # llhttp accepts only digits, and only one Content-Length
            elif k == b"content-encoding":
                encoding = v.decode("latin-1").strip().lower()
        limit = self.limits.max_body_bytes
        if length is not None and length > limit:
            raise HttpError(
                413,
                f"the request body has {length} bytes, the limit is {limit} (--max-request-bytes)",
                close=True,
            )
        if scope["method"] in ("GET", "HEAD") and not length:
            return b"", 0
        reserved = 0
        try:
            if length:
                self._reserve(length, 0, check_only=True)
            body, more, parts = b"", True, None
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise _Disconnected
                chunk, more = msg.get("body", b""), msg.get("more_body", False)
                if chunk:
                    held = len(parts) if parts is not None else len(body)
                    if not length and held + len(chunk) > limit:  # chunked: the size shows as it arrives
                        raise HttpError(
                            413, f"the chunked request body exceeds {limit} bytes (--max-request-bytes)", True
                        )
                    self._reserve(len(chunk), held)
                    reserved += len(chunk)
                if parts is not None:
                    parts += chunk
                elif more:
                    parts = bytearray(chunk)
                else:
                    body = chunk  # the common case: the whole body in one message, no copy
            if parts is not None:
                body = bytes(parts)
            if encoding not in (None, "", "identity"):
                body, reserved = await self._inflate(body, encoding, reserved)
        except BaseException:
            self.buffered -= reserved
            raise
        return body, reserved

    async def _inflate(self, body: bytes, encoding: str, reserved: int) -> tuple[bytes, int]:
        if encoding not in ("gzip", "deflate"):
            raise HttpError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
        limit = self.limits.max_body_bytes

        def inflate() -> bytes:
            d = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)
            try:
                out = d.decompress(body, limit + 1)
            except zlib.error as e:
                raise HttpError(400, f"the {encoding} request body is corrupt: {e}") from e
            if len(out) > limit:
                raise HttpError(413, f"the decompressed request body exceeds the {limit}-byte limit")
            if not d.eof:
                raise HttpError(400, f"the {encoding} request body is truncated")
            return out

        # zlib releases the GIL: large bodies inflate on a thread while the loop serves others
        out = inflate() if len(body) < (256 << 10) else await asyncio.to_thread(inflate)
        self._reserve(len(out), reserved)
        return out, reserved + len(out)

    # -- handlers: (status, extra headers, payload) ---------------------------------------------
    @staticmethod
    def _json(status: int, obj: Any) -> tuple[int, list, bytes]:
        return status, [], json.dumps(obj, separators=(",", ":")).encode()

    async def _metrics(self, scope, params, body):
        payload, ctype = render(self.service.registry)
        return 200, [(b"content-type", ctype.encode())], payload

    async def _server_metadata(self, scope, params, body):
        return self._json(200, self.service.server_metadata())

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
        return 200, [], self.service.canary_json(params["name"], params.get("version"))

    async def _infer(self, scope, params, body):
        name, version = params["name"], params.get("version")
        model = self.service.model_spec(name, version)
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
                parsed = await self._decode_off_loop(body, hlen, model)
            else:
                parsed = parse_infer_request(body, hlen, model)
        except ProtocolError:
            self.service.counters.infer_rejected["INVALID"] += 1
            raise
        outputs = await self.service.infer(name, version, parsed, params.get("arrival"))
        chunks, out_hlen = encode_infer_response(model, parsed, outputs, self.service.model_labels(name))
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

    async def _decode_off_loop(self, body: bytes, hlen: str | None, model: Any):
        """Parse in a worker process: json.loads holds the GIL, so a thread would still stall the loop."""
        if self._decoder is None:
            import multiprocessing

            self._decoder = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decoder, parse_infer_request, body, hlen, model)
