"""Health: the golden canary comparison, and the probe behind ``veo-edge healthcheck``.

The canary is a fixed input and its expected float32 output recorded at build time (manifest
``canary``: ``input``, ``expected``, ``atol``, ``min_cosine``). A backend is healthy when its output for
that input is within ``atol`` (max abs error) of the expected one and their cosine is at least
``min_cosine``. The server runs it at start (readiness), the probe runs it through the server or, in
local mode, through an in-process runtime.

Each kind of failure has its own exception and exit code (documented in ``veo-edge healthcheck --help``):
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from veo_edge.builddir import MANIFEST_NAME, BuildDir, sha256_file
from veo_edge.errors import ArtifactMismatchError, BuildDirError, UsageError, VeoEdgeError
from veo_edge.export.canary import Canary, compare_canary, golden_canary
from veo_edge.serve.canary_wire import BINARY, canary_from_binary, canary_from_json
from veo_edge.serve.golden import named, open_golden
from veo_edge.serve.protocol.client import decode_infer_response, encode_infer_request

#: the suffix of a model's companion that takes encoded pictures (``veo_edge.serve.images``)
PICTURES_SUFFIX = "_image"


class HealthError(VeoEdgeError):
    """The service is not healthy."""

    exit_code = 1


class ServerDownError(HealthError):
    """Nothing answers at the URL, or the process is not live."""

    exit_code = 20


class NotReadyError(HealthError):
    """The server answers but is not ready (no active backend, failed canary, unknown model)."""

    exit_code = 21


class CanaryMismatchError(HealthError):
    """The canary inference failed or its output is not within tolerance of the golden output."""

    exit_code = 22


class WrongBuildError(CanaryMismatchError):
    """The golden canary given (``--build-dir``) is not from the build the server serves."""


class HealthTimeoutError(HealthError):
    """The check did not finish within its timeout."""

    exit_code = 23


class UnauthorizedError(HealthError):
    """The server's health, metadata or inference API needs a bearer token (``--restrict-api``) that the
    check did not send, or not the right one."""

    exit_code = 24


EXIT_CODES = {
    "healthy": 0,
    "down": ServerDownError.exit_code,
    "not ready": NotReadyError.exit_code,
    "canary mismatch": CanaryMismatchError.exit_code,
    "timeout": HealthTimeoutError.exit_code,
    "unauthorized": UnauthorizedError.exit_code,
    "build modified": ArtifactMismatchError.exit_code,
}


def load_canary(build: BuildDir, precision: str | None = None) -> Canary:
    """The build's golden canary with the rule of ``precision`` (see
    :func:`veo_edge.export.canary.golden_canary`); a missing or unusable one is a
    :class:`CanaryMismatchError`, a file that differs from the manifest an :class:`ArtifactMismatchError`."""
    try:
        return golden_canary(build, precision)
    except ArtifactMismatchError:
        raise
    except BuildDirError as e:
        raise CanaryMismatchError(str(e)) from e


def build_identity(build: BuildDir) -> str:
    """The sha256 of ``build``'s manifest: what tells two builds apart (of one model at two precisions
    too); the server names it in its model metadata (``parameters.manifest_sha256``)."""
    return sha256_file(build.path / MANIFEST_NAME)


def _same_build(build: BuildDir, params: dict[str, Any], url: str, source: str = "--build-dir") -> None:
    """Refuse a golden build directory that is not the build the server serves: its canary rule is not
    the served one (an int8 build's loose rule passed a server of an f32 build). ``source``: where the
    directory came from (``--build-dir``, or the environment variable that named it)."""
    served, mine = params.get("manifest_sha256"), build_identity(build)
    if served and served != mine:  # a server that does not name its build (Triton, older) is not checked
        given, drop = named(build.path, source)
        raise WrongBuildError(
            f"{given} is not the build the server at {url} serves (manifest sha256 "
            f"{mine[:12]}..., the server's {served[:12]}...): its golden canary and rule are not the served "
            f"model's; give the server's own build directory, or {drop} to use the server's canary"
        )


def _served(params: dict[str, Any]) -> dict[str, Any]:
    """What the server says it serves the model on (model metadata ``parameters``): backend, precision."""
    return {k: params[k] for k in ("backend", "precision") if k in params}


def _served_precision(params: dict[str, Any]) -> str | None:
    """The precision the server says its active backend computes at (None: it does not say)."""
    precision = params.get("precision")
    return str(precision) if precision and precision != "none" else None


# -- the probe ---------------------------------------------------------------------------------------

#: how many times the probe asks for the canary's answer before a mismatch is one (see check_server)
ASKS = 3


def _with_deadline(fn: Any, timeout: float, what: str) -> Any:
    """Run ``fn`` in a daemon thread; :class:`HealthTimeoutError` if it is not done within ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, name="veo-edge-healthcheck", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise HealthTimeoutError(f"{what} did not finish within {timeout:g} s (--timeout)")
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Client:
    def __init__(self, url: str, deadline: float, token: str | None = None) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            hint = {
                "grpc": "; the healthcheck speaks HTTP: give the server's HTTP port",
                "https": "; the healthcheck speaks plain HTTP (serve has no TLS): use http://",
            }.get(parts.scheme, "")
            raise UsageError(
                f"--url {url!r} is not an http://host:port URL{hint}, e.g. http://127.0.0.1:8000"
            )
        self.url = url
        self.host, self.port = parts.hostname, parts.port or 80
        # a path before the API (a proxy's); the API's own /v2, given by habit, is not part of it
        self.prefix = parts.path.rstrip("/").removesuffix("/v2")
        self.deadline = deadline
        self.token = token  # sent as the bearer token a --restrict-api server asks for

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers with lower-case names, body)."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise HealthTimeoutError(f"no time left for {method} {path} (--timeout)")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=remaining)
        headers = {**(headers or {}), **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        try:
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            status, got, data = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        except TimeoutError as e:
            raise HealthTimeoutError(f"{method} {self.url}{path} timed out (--timeout)") from e
        except (http.client.BadStatusLine, http.client.LineTooLong) as e:  # its raw bytes say nothing
            raise ServerDownError(
                f"something answers at {self.url}, but not in HTTP/1.1 (a gRPC port answers in HTTP/2); "
                "give the server's HTTP port, e.g. --url http://127.0.0.1:8000"
            ) from e
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise ServerDownError(f"no server answers at {self.url}: {e}") from e
        finally:
            conn.close()
        if status == 401:
            from veo_edge.serve.control import TOKEN_ENV, TOKEN_FILE_ENV

            raise UnauthorizedError(
                f"{method} {self.url}{path} answered 401: {_error_of(data)}; "
                + (
                    "the token given is not this server's"
                    if self.token
                    else f"give the server's token with --token-file PATH, {TOKEN_FILE_ENV} or {TOKEN_ENV}"
                )
            )
        return status, got, data


def _kserve_json(url: str, path: str, body: bytes) -> Any:
    """A KServe v2 answer's JSON; one that is not JSON means the URL is some other server."""
    try:
        return json.loads(body)
    except ValueError as e:
        raise ServerDownError(
            f"{url} answers, but not as a KServe v2 server (GET {path} gave no JSON: {body[:40]!r}); "
            "give the server's HTTP port (not its --metrics-port), e.g. --url http://127.0.0.1:8000"
        ) from e


def _error_of(body: bytes) -> str:
    """What a refusal says: its ``error``, a readiness body's ``reason``, else the start of the body."""
    try:
        answer = json.loads(body)
        return str(answer.get("error") or answer.get("reason") or answer)[:500]
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def check_server(
    url: str,
    build_dir: str | None = None,
    model_name: str | None = None,
    timeout: float = 10.0,
    token: str | None = None,
    build_dir_from: str = "--build-dir",
) -> dict[str, Any]:
    """Live, ready, then a canary inference through the server; the report dict, or a HealthError.

    The golden canary comes from ``build_dir`` when given, else from the server's
    ``/v2/models/{name}/canary`` (the one it read from its own build directory). ``token``: the bearer
    token of a server whose health, metadata or inference API is restricted (``--restrict-api``).
    ``build_dir_from``: where ``build_dir`` came from, as its errors name it (``--build-dir``, or the
    environment variable ``VEO_EDGE_BUILD_DIR``)."""

    def run() -> dict[str, Any]:
        client = _Client(url, time.monotonic() + timeout, token)
        status, _, body = client.request("GET", "/v2/health/live")
        if status != 200:
            raise ServerDownError(f"{url} is not live (HTTP {status}): {_error_of(body)}")
        status, _, body = client.request("GET", "/v2/health/ready")
        if status != 200:
            raise NotReadyError(f"{url} is not ready (HTTP {status}): {_error_of(body)}")
        build = open_golden(build_dir, build_dir_from) if build_dir else None
        name = model_name or (build.model_name if build else None)
        if name is None:
            status, _, body = client.request("GET", "/v2/health/ready")
            # veo-edge serve names its model there; Triton answers an empty body
            ready = _kserve_json(url, "/v2/health/ready", body) if body.strip() else {}
            name = ready.get("model") if isinstance(ready, dict) else None
            if not name:  # a repository of several models names them all: which one is the caller's
                served = ready.get("models") if isinstance(ready, dict) else None
                names = ", ".join(sorted(served)) if isinstance(served, dict) else ""
                raise UsageError(
                    f"the server at {url} serves "
                    + (f"several models ({names})" if names else "no model it names")
                    + "; pass --model-name"
                )
        status, _, body = client.request("GET", f"/v2/models/{name}/ready")
        if status != 200:
            raise NotReadyError(f"model {name!r} is not ready at {url} (HTTP {status}): {_error_of(body)}")

        def metadata_of(model: str, why: str) -> dict[str, Any]:
            status, _, body = client.request("GET", f"/v2/models/{model}")
            meta = _kserve_json(url, f"/v2/models/{model}", body) or {}
            if status != 200 or not meta.get("inputs"):
                raise NotReadyError(f"{why} (HTTP {status})")
            return meta

        asked = name
        meta = metadata_of(name, f"the server at {url} gave no inputs for model {name!r}")
        if meta["inputs"][0].get("datatype") == "BYTES" and name.endswith(PICTURES_SUFFIX):
            # a <model>_image companion takes encoded pictures, the canary is a tensor: it runs through
            # <model>, the same runtime (only the picture decoding is not exercised)
            name = name[: -len(PICTURES_SUFFIX)]
            meta = metadata_of(
                name,
                f"model {asked!r} takes encoded pictures and the server has no model {name!r} to run the "
                "canary tensor on",
            )

        def rule(params: dict[str, Any]) -> Canary:
            """The golden canary by the rule of the precision the server serves (f32 after a fallback)."""
            if build is not None:
                _same_build(build, params, url, build_dir_from)
                return load_canary(build, _served_precision(params))
            status, headers, body = client.request(
                "GET", f"/v2/models/{name}/canary", headers={"Accept": BINARY}
            )
            if status == 503:  # no backend active (or unloaded) since it said ready: not ready now
                raise NotReadyError(f"model {name!r} is not ready at {url} (HTTP 503): {_error_of(body)}")
            if status != 200:
                raise CanaryMismatchError(f"the server has no canary for {name!r}: {_error_of(body)}")
            hlen = headers.get("inference-header-content-length")
            # a server before the binary form ignores the Accept header and answers JSON
            return (
                canary_from_binary(body, hlen)
                if hlen is not None
                else canary_from_json(_kserve_json(url, f"/v2/models/{name}/canary", body))
            )

        def infer(canary: Canary) -> np.ndarray:
            body, hlen = encode_infer_request({meta["inputs"][0]["name"]: canary.input.astype(np.float32)})
            status, headers, resp = client.request(
                "POST",
                f"/v2/models/{name}/infer",
                body,
                {"Inference-Header-Content-Length": str(hlen), "Content-Type": "application/octet-stream"},
            )
            if status != 200:
                raise CanaryMismatchError(f"canary inference failed (HTTP {status}): {_error_of(resp)}")
            return next(
                iter(decode_infer_response(resp, headers.get("inference-header-content-length")).values())
            )

        params = meta.get("parameters") or {}
        canary = rule(params)
        result = compare_canary(infer(canary), canary)
        for _ in range(ASKS - 1):
            # a wrong answer may be right for another precision: the backend switched between the rule
            # and the answer (the rule is read again), or a transient fault's retry ran on the standby
            # of another precision. A broken backend answers wrongly every time.
            if result.ok:
                break
            why = f"the server at {url} gave no inputs for model {name!r}"
            now = metadata_of(name, why).get("parameters") or {}
            if _served(now) != _served(params):
                params = now
                canary = rule(params)
            result = compare_canary(infer(canary), canary)
        if not result.ok:
            raise CanaryMismatchError(f"{result.reason} (model {name!r} at {url})")
        report = {"healthy": True, "url": url, "model": name, "canary": result.to_dict()}
        report |= _served(params)
        if asked != name:
            report |= {
                "asked": asked,
                "note": f"{asked!r} takes encoded pictures: the canary ran on {name!r}",
            }
        return report

    return _with_deadline(run, timeout, f"the healthcheck of {url}")


def check_local(build_dir: str, timeout: float = 60.0, backend: str = "auto") -> dict[str, Any]:
    """First-boot check without a server: start a runtime on the build and run the canary."""

    def run() -> dict[str, Any]:
        from veo_edge.runtime.runtime import Runtime

        build = BuildDir.open(build_dir)
        canary = load_canary(build)
        rt = Runtime(build, backend=backend).start()
        try:
            state = rt.state.to_dict()
            if not state.get("active_backend"):
                raise NotReadyError(f"no backend could start on {build_dir}: {state.get('skipped')}")
            canary = load_canary(build, rt.describe().get("precision"))  # the tolerance of what runs
            out = rt.infer(canary.input)
        finally:
            rt.close()
        result = compare_canary(out, canary)
        if not result.ok:
            raise CanaryMismatchError(f"{result.reason} (build {build_dir}, {state['active_backend']})")
        return {
            "healthy": True,
            "build_dir": str(build_dir),
            "backend": state["active_backend"],
            "canary": result.to_dict(),
        }

    return _with_deadline(run, timeout, f"the local healthcheck of {build_dir}")
