"""Who may call what: the model control mode and the API groups that need a bearer token.

As Triton's ``--model-control-mode none|explicit`` and its restricted API groups:

- ``none`` (the default): model load and unload (HTTP ``/v2/repository/models/NAME/load|unload``, gRPC
  ``RepositoryModelLoad|Unload``) answer 403; nobody who reaches a port can take a model away.
- ``explicit``: they are on, and the ``model-repository`` group (index, load, unload) needs the token.
- ``--restrict-api GROUP,...`` puts more groups behind the token: ``health``, ``metadata``,
  ``inference``, ``statistics``, ``shared-memory``, ``model-repository``. The rest stay open.

The token comes from a file (``--control-token-file``, or ``VEO_EDGE_CONTROL_TOKEN_FILE``: a mounted
secret) or from ``VEO_EDGE_CONTROL_TOKEN``, never from the image; a client sends it as
``Authorization: Bearer TOKEN`` (an HTTP header, or gRPC metadata ``authorization``). It is compared in
constant time (``hmac.compare_digest``); a missing or wrong one is 401 / ``UNAUTHENTICATED``.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from veo_edge.errors import UsageError
from veo_edge.serve.protocol import ProtocolError

TOKEN_ENV = "VEO_EDGE_CONTROL_TOKEN"
TOKEN_FILE_ENV = "VEO_EDGE_CONTROL_TOKEN_FILE"
MIN_TOKEN_CHARS = 16
MODES = ("none", "explicit")
GROUPS = ("health", "metadata", "inference", "statistics", "shared-memory", "model-repository")

#: HTTP route name -> API group (routes not listed, /metrics, stay open)
HTTP_GROUPS = {
    "server_live": "health",
    "server_ready": "health",
    "model_ready": "health",
    "server_metadata": "metadata",
    "model_metadata": "metadata",
    "model_config": "metadata",
    "model_canary": "metadata",
    "model_infer": "inference",
    "stats_all": "statistics",
    "model_stats": "statistics",
    "repository_index": "model-repository",
    "repository_load": "model-repository",
    "repository_unload": "model-repository",
    "shm_status": "shared-memory",
    "shm_register": "shared-memory",
    "shm_unregister": "shared-memory",
}
#: gRPC method -> API group
GRPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelConfig": "metadata",
    "ModelInfer": "inference",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    **{
        f"{kind}SharedMemory{op}": "shared-memory"
        for kind in ("System", "Cuda")
        for op in ("Status", "Register", "Unregister")
    },
}
CONTROL_ROUTES = {"repository_load", "repository_unload", "RepositoryModelLoad", "RepositoryModelUnload"}


@dataclass(frozen=True)
class AccessPolicy:
    model_control: str = "none"
    token: str | None = None
    #: groups whose calls need the token
    restricted: frozenset[str] = frozenset()

    def check(self, call: str, group: str | None, authorization: str | None) -> None:
        """Refuse ``call`` (a route name or gRPC method of ``group``): 403 for model control while it is
        off, 401 without the right bearer token where its group needs one."""
        if call in CONTROL_ROUTES and self.model_control != "explicit":
            raise ProtocolError(
                "model load/unload is off on this server (--model-control-mode none); restart it with "
                f"--model-control-mode explicit and a token ({TOKEN_FILE_ENV} or {TOKEN_ENV})",
                403,
            )
        if group not in self.restricted:
            return
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ProtocolError(
                f"the {group} API of this server needs a bearer token: send 'Authorization: Bearer TOKEN'",
                401,
            )
        assert self.token is not None
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise ProtocolError(f"the bearer token sent for the {group} API is not this server's", 401)


def load_token(path: Path | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The control token: from ``path`` (a mounted secret), else ``VEO_EDGE_CONTROL_TOKEN``; None if neither."""
    if path is not None and env.get(TOKEN_ENV):
        raise UsageError(f"both --control-token-file and {TOKEN_ENV} are set; give the token one way")
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read the control token file {path}: {e}") from e
        where = str(path)
    elif env.get(TOKEN_ENV):
        token, where = env[TOKEN_ENV].strip(), TOKEN_ENV
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise UsageError(
            f"the control token in {where} has {len(token)} characters or holds whitespace; use at least "
            f"{MIN_TOKEN_CHARS} without spaces, e.g. from `openssl rand -hex 32`"
        )
    return token


def make_policy(mode: str, token: str | None, restrict: Iterable[str] = ()) -> AccessPolicy:
    """The policy of ``serve --model-control-mode MODE --restrict-api GROUPS``; UsageError when it cannot hold."""
    if mode not in MODES:
        raise UsageError(f"--model-control-mode {mode!r} is not one of: {', '.join(MODES)}")
    groups = {g.strip() for g in restrict if g.strip()}
    unknown = sorted(groups - set(GROUPS))
    if unknown:
        raise UsageError(
            f"--restrict-api {', '.join(unknown)}: unknown group; choose from {', '.join(GROUPS)}"
        )
    if mode == "explicit":
        groups.add("model-repository")
    if groups and token is None:
        raise UsageError(
            f"{'--model-control-mode explicit' if mode == 'explicit' else '--restrict-api'} needs a token: "
            f"--control-token-file PATH ({TOKEN_FILE_ENV}) or {TOKEN_ENV} (e.g. `openssl rand -hex 32`)"
        )
    return AccessPolicy(mode, token, frozenset(groups))
