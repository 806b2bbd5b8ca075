"""The servers a soak drives over the Open Inference Protocol (see :mod:`veo_edge.soak.targets`): KServe v2
over HTTP (binary tensors, the server's ``/metrics`` or ``--metrics-url`` scraped) and over gRPC
(``grpc://HOST:PORT``; metrics only from ``--metrics-url``). Only URLs: a server with another stack works
unchanged."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from typing import Any

import numpy as np

from veo_edge.errors import UsageError
from veo_edge.soak.targets import RequestError, RequestTimeout, check_output

_DTYPES = {"FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT8": "i1", "UINT8": "u1", "INT32": "<i4"}


def _io_of(meta: dict[str, Any]) -> tuple[str, str, str, tuple[int, ...]]:
    """(input name, datatype, output name, per-sample shape) from KServe v2 model metadata."""
    inp = meta["inputs"][0]
    if inp["datatype"] not in _DTYPES:
        raise UsageError(
            f"input {inp['name']!r} has datatype {inp['datatype']}, the soak sends {sorted(_DTYPES)}"
        )
    return inp["name"], inp["datatype"], meta["outputs"][0]["name"], tuple(int(d) for d in inp["shape"][1:])


class _ServerTarget:
    """What the HTTP and gRPC targets share: the model they drive, its tensors (from the server's
    KServe v2 model metadata) and one connection per load thread."""

    url: str

    def __init__(self, model_name: str | None, timeout_s: float, metrics_url: str | None = None) -> None:
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.metrics_url = metrics_url
        self._local = threading.local()
        self.input_name = ""
        self.datatype = "FP32"
        self.output_name: str | None = None
        self.max_batch: int | None = None  # the model config's max_batch_size, where the server gives one
        #: why the server's memory will not be sampled (the leak check is then skipped), or None
        self.memory_note: str | None = None

    @property
    def name(self) -> str:
        return self.url

    @property
    def metrics_source(self) -> str | None:
        """Where :meth:`observe` reads the server's metrics: ``metrics_url`` (HTTP adds its own)."""
        return self.metrics_url

    def _take_metadata(
        self, meta: dict[str, Any], config: dict[str, Any] | None
    ) -> tuple[tuple[int, ...], np.dtype]:
        self.input_name, self.datatype, self.output_name, shape = _io_of(meta)
        try:  # 0 or absent: the server states no batch limit
            self.max_batch = int((config or {}).get("max_batch_size") or 0) or None
        except (TypeError, ValueError):
            self.max_batch = None
        return shape, np.dtype(_DTYPES[self.datatype])

    def _check_memory(self) -> None:
        """Scrape the server's metrics once, as the sampler will: a ``--metrics-url`` that does not answer
        is refused; the default ``/metrics`` not answering, or a source without the process's resident
        memory, becomes :attr:`memory_note`."""
        source = self.metrics_source
        if source is None:
            self.memory_note = (
                "gRPC carries no /metrics, so the server's memory is not sampled and the leak check is "
                "skipped; give --metrics-url http://HOST:PORT/metrics (the server's HTTP or --metrics-port)"
            )
            return
        seen = self.observe()
        if "scrape_error" in seen and self.metrics_url is not None:
            raise UsageError(
                f"cannot read --metrics-url ({seen['scrape_error']}); give the server's Prometheus endpoint, "
                "e.g. http://HOST:8002/metrics"
            )
        if "scrape_error" in seen:
            why = seen["scrape_error"]
        elif "rss" not in seen:
            why = f"{source} has no process_resident_memory_bytes"
        else:
            return
        self.memory_note = (
            f"the server's memory is not sampled ({why}), so the leak check is skipped; give "
            "--metrics-url with the server's Prometheus endpoint (Triton's: http://HOST:8002/metrics)"
        )


def scrape_url(url: str, timeout_s: float) -> dict[str, Any]:
    """A Prometheus text endpoint read into the sampler's fields (:func:`~veo_edge.soak.promtext.scrape`),
    or ``{"scrape_error": why}``."""
    import urllib.error
    import urllib.request

    from veo_edge.soak.promtext import scrape

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return scrape(r.read().decode(errors="replace"))
    except urllib.error.HTTPError as e:
        return {"scrape_error": f"{url} answered HTTP {e.code}"}
    except (OSError, ValueError) as e:  # refused, timed out, not Prometheus text
        return {"scrape_error": f"{url}: {type(e).__name__}: {e}"}


class HttpTarget(_ServerTarget):
    """A KServe v2 server (``veo-edge serve``, Triton): ``POST /v2/models/NAME/infer`` with binary
    tensors, ``/metrics`` scraped for the server's memory, fallbacks and pool."""

    kind = "http"

    def __init__(
        self, url: str, model_name: str | None = None, timeout_s: float = 30.0, metrics_url: str | None = None
    ) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise UsageError(
                f"--url {url!r} is not an http://HOST:PORT address; expected e.g. http://127.0.0.1:8000"
            )
        self.url = f"http://{parsed.netloc}"
        self.host, self.port = parsed.hostname, parsed.port or 80
        super().__init__(model_name, timeout_s, metrics_url)

    @property
    def metrics_source(self) -> str | None:
        return self.metrics_url or f"{self.url}/metrics"

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return conn

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict | None = None,
        timeout: float | None = None,
    ):
        reused = getattr(self._local, "conn", None) is not None
        conn = self._conn()
        timeout = self.timeout_s if timeout is None else timeout
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
            self._drop()
            if reused:  # the server closed an idle keep-alive connection: once more on a new one
                return self._request(method, path, body, headers, timeout)
            raise RequestError(f"{method} {path}: {type(e).__name__}: {e}") from e
        except TimeoutError as e:
            self._drop()
            raise RequestTimeout(f"{method} {path}: no answer within {timeout:.3g} s") from e
        except (OSError, http.client.HTTPException) as e:
            self._drop()
            raise RequestError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if resp.getheader("connection", "").lower() == "close":
            self._drop()
        return resp.status, resp, data

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def open(self) -> tuple[tuple[int, ...], np.dtype]:
        try:
            status, _, body = self._request("GET", "/v2/health/ready")
        except RequestError as e:
            raise UsageError(
                f"cannot reach the server at {self.url} ({e}); start it with `veo-edge serve`"
            ) from e
        if status != 200:
            raise UsageError(
                f"the server at {self.url} is not ready (HTTP {status}); wait for /v2/health/ready"
            )
        if self.model_name is None:
            self.model_name = json.loads(body or b"{}").get("model")
            if not self.model_name:
                raise UsageError(f"the server at {self.url} does not name its model; pass --model-name")
        status, _, body = self._request("GET", f"/v2/models/{self.model_name}")
        if status != 200:
            raise UsageError(f"the server at {self.url} has no model {self.model_name!r} (HTTP {status})")
        meta = json.loads(body)
        status, _, body = self._request("GET", f"/v2/models/{self.model_name}/config")
        opened = self._take_metadata(meta, json.loads(body) if status == 200 else None)
        self._check_memory()
        return opened

    def alive(self) -> str | None:
        """None when the server answers its liveness probe (``/v2/health/live``), else why not."""
        try:
            status, _, _ = self._request("GET", "/v2/health/live", timeout=min(self.timeout_s, 2.0))
        except RequestError as e:
            return str(e)
        return None if status == 200 else f"GET /v2/health/live answered HTTP {status}"

    def call(self, batch: np.ndarray, timeout_s: float | None = None) -> None:
        data = np.ascontiguousarray(batch).tobytes()
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": self.input_name,
                        "datatype": self.datatype,
                        "shape": list(batch.shape),
                        "parameters": {"binary_data_size": len(data)},
                    }
                ],
                "outputs": [{"name": self.output_name, "parameters": {"binary_data": True}}],
            }
        ).encode()
        status, resp, body = self._request(
            "POST",
            f"/v2/models/{self.model_name}/infer",
            head + data,
            {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
            timeout_s,
        )
        if status != 200:
            kind = RequestTimeout if status in (408, 504) else RequestError
            raise kind(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        n = int(resp.getheader("inference-header-content-length") or len(body))
        try:
            out = json.loads(body[:n])["outputs"][0]
            dtype = np.dtype(_DTYPES[out["datatype"]])
            arr = np.frombuffer(body[n:], dtype=dtype).reshape(out["shape"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RequestError(f"malformed answer ({type(e).__name__}: {e})") from e
        check_output(arr, batch.shape[0])

    def observe(self) -> dict[str, Any]:
        from veo_edge.soak.promtext import scrape

        if self.metrics_url is not None:
            return scrape_url(self.metrics_url, self.timeout_s)
        try:
            status, _, body = self._request("GET", "/metrics")
        except RequestError as e:
            return {"scrape_error": str(e)}
        if status != 200:
            return {"scrape_error": f"/metrics answered HTTP {status}"}
        return scrape(body.decode(errors="replace"))

    def close(self) -> None:
        self._drop()


class GrpcTarget(_ServerTarget):
    """A KServe v2 gRPC server (``veo-edge serve --grpc-port``, Triton's 8001): ``ModelInfer`` with raw
    tensor contents through ``tritonclient.grpc``. gRPC carries no ``/metrics``: the server's memory and
    fallbacks are sampled from ``metrics_url`` (the server's HTTP or metrics port) when given."""

    kind = "grpc"

    def __init__(
        self, url: str, model_name: str | None = None, timeout_s: float = 30.0, metrics_url: str | None = None
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "grpc" or not parsed.hostname or not parsed.port:
            raise UsageError(
                f"--url {url!r} is not a grpc://HOST:PORT address; expected e.g. grpc://127.0.0.1:8001"
            )
        self.url = f"grpc://{parsed.netloc}"
        self.address = parsed.netloc
        super().__init__(model_name, timeout_s, metrics_url)

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            import tritonclient.grpc as grpcclient

            client = self._local.client = grpcclient.InferenceServerClient(self.address)
        return client

    def open(self) -> tuple[tuple[int, ...], np.dtype]:
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            ready = client.is_server_ready(client_timeout=self.timeout_s)
        except InferenceServerException as e:
            raise UsageError(
                f"cannot reach the server at {self.url} ({e}); start it with `veo-edge serve`"
            ) from e
        if not ready:
            raise UsageError(f"the server at {self.url} is not ready; wait for its readiness")
        if self.model_name is None:
            try:
                models = [m.name for m in client.get_model_repository_index().models]
            except InferenceServerException as e:  # a server without the repository extension over gRPC
                raise UsageError(
                    f"the server at {self.url} does not list its models ({e.message()}); pass --model-name"
                ) from e
            # a model's NAME_image companion (encoded pictures into NAME) is not another model
            models = [m for m in models if not (m.endswith("_image") and m.removesuffix("_image") in models)]
            if len(models) != 1:
                raise UsageError(f"the server at {self.url} serves {models}; pass --model-name")
            self.model_name = models[0]
        try:
            meta = client.get_model_metadata(self.model_name, as_json=True)
        except InferenceServerException as e:
            raise UsageError(f"the server at {self.url} has no model {self.model_name!r} ({e})") from e
        try:
            config = client.get_model_config(self.model_name, as_json=True).get("config")
        except InferenceServerException:
            config = None
        opened = self._take_metadata(meta, config)
        self._check_memory()
        return opened

    def alive(self) -> str | None:
        """None when the server answers its liveness probe (``ServerLive``), else why not."""
        from tritonclient.utils import InferenceServerException

        try:
            live = self._client().is_server_live(client_timeout=min(self.timeout_s, 2.0))
        except InferenceServerException as e:
            return f"gRPC {e.status() or 'error'}: {e.message()}"
        return None if live else "ServerLive answered not live"

    def call(self, batch: np.ndarray, timeout_s: float | None = None) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inp = grpcclient.InferInput(self.input_name, list(batch.shape), self.datatype)
        inp.set_data_from_numpy(np.ascontiguousarray(batch))
        try:
            result = self._client().infer(
                self.model_name,
                [inp],
                outputs=[grpcclient.InferRequestedOutput(self.output_name)],
                client_timeout=self.timeout_s if timeout_s is None else timeout_s,
            )
        except InferenceServerException as e:
            status = str(e.status() or "")
            kind = RequestTimeout if "DEADLINE_EXCEEDED" in status else RequestError
            raise kind(f"gRPC {status or 'error'}: {e.message()}") from e
        out = result.as_numpy(self.output_name)
        if out is None:
            raise RequestError(f"malformed answer: no output {self.output_name!r}")
        check_output(out, batch.shape[0])

    def observe(self) -> dict[str, Any]:
        return scrape_url(self.metrics_url, self.timeout_s) if self.metrics_url is not None else {}

    def close(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None
