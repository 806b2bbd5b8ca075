"""Take a release off an engine: ``veo-edge deploy remove NAME`` (one device) or ``--swarm`` (a service).

One device: the release ``NAME`` is stopped with its stop timeout (the server drains what it accepted),
then removed with the kept ``NAME-previous`` and what an interrupted deploy or rollback left
(``NAME-outgoing``, ``NAME-rollback``), each with its anonymous volumes. The model-control token's volume
(``veo-edge-control-NAME``) goes too: a secret is not left behind. The engine-cache volume
(``veo-edge-cache-NAME`` or ``--cache-volume``) is kept, as a later deploy of NAME reuses it, unless
``volumes`` says to remove it (also after the containers went: ``veo-edge-cache-NAME`` then).

A swarm: the service is removed, then, once its tasks' containers are gone, its control-token secrets
(labelled with NAME) and, with ``volumes``, the cache volume on the engine asked (a manager: other nodes'
volumes are theirs to remove).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from veo_edge.deploy.device import (
    OUTGOING_SUFFIX,
    PARKED_SUFFIX,
    PREVIOUS_SUFFIX,
    _get,
    check_name,
    service_hint,
)
from veo_edge.deploy.runopts import LABEL_DEPLOY
from veo_edge.errors import DeployError

CACHE_VOLUME = "veo-edge-cache-{}"
CONTROL_VOLUME = "veo-edge-control-{}"


def _named_volumes(container: Any) -> list[str]:
    """The named volumes ``container`` mounts (anonymous ones go with it: ``remove(v=True)``)."""
    mounts = container.attrs.get("Mounts") or []
    return [m["Name"] for m in mounts if m.get("Type") == "volume" and m.get("Name") and len(m["Name"]) != 64]


def remove_release(client: Any, name: str, volumes: bool = False, stop_timeout: int = 30) -> dict[str, Any]:
    """Remove the release ``name`` from one device (see the module docstring); what was removed and
    kept. No container of ``name`` at all is a :class:`DeployError`."""
    check_name(name)
    found = [
        (suffix, c)
        for suffix in ("", PREVIOUS_SUFFIX, OUTGOING_SUFFIX, PARKED_SUFFIX)
        if (c := _get(client, name + suffix)) is not None
    ]
    mounted = {v for _, c in found for v in _named_volumes(c)}
    cache = CACHE_VOLUME.format(name)
    if volumes:  # a release removed before without --volumes: its default cache volume, alone
        mounted |= {cache} if _volume_exists(client, cache) else set()
    if not found and not mounted:
        raise DeployError(
            f"no release named {name} on that engine (no container {name} or {name}-previous)"
            f"{service_hint(client, name)}"
        )
    removed = []
    for suffix, c in found:
        if not suffix:  # the serving release: stopped as a deploy stops it, so it drains
            with contextlib.suppress(Exception):
                c.stop(timeout=stop_timeout)
        c.remove(force=True, v=True)
        removed.append(name + suffix)
    control = CONTROL_VOLUME.format(name)
    gone_volumes = _remove_volumes(client, {control} | (mounted if volumes else set()))
    kept = sorted(v for v in mounted - set(gone_volumes) if v != control)
    return {"name": name, "removed": removed, "removed_volumes": gone_volumes, "kept_volumes": kept}


def _volume_exists(client: Any, name: str) -> bool:
    from docker.errors import NotFound

    try:
        client.volumes.get(name)
    except NotFound:
        return False
    return True


def _remove_volumes(client: Any, names: set[str]) -> list[str]:
    from docker.errors import NotFound

    gone = []
    for v in sorted(names):
        try:
            client.volumes.get(v).remove()
        except NotFound:
            continue
        gone.append(v)
    return gone


def remove_service(client: Any, name: str, volumes: bool = False, timeout: float = 60.0) -> dict[str, Any]:
    """Remove the swarm service ``name`` (see the module docstring); what was removed and kept. What a
    removal before left (its secrets, its cache volume with ``volumes``) is removed without a service."""
    from docker.errors import APIError, NotFound

    from veo_edge.deploy.swarm import check_manager

    check_name(name)
    check_manager(client)
    cache = CACHE_VOLUME.format(name)
    secrets = client.secrets.list(filters={"label": f"{LABEL_DEPLOY}={name}"})
    removed = []
    try:
        client.services.get(name).remove()
        removed.append(f"service {name}")
    except NotFound:
        if not secrets and not (volumes and _volume_exists(client, cache)):
            raise DeployError(f"no service named {name} on that swarm") from None
    deadline = time.monotonic() + timeout
    # sparse: no inspect of each, which would 404 for a task container the swarm removes meanwhile
    while client.containers.list(
        all=True, sparse=True, filters={"label": f"com.docker.swarm.service.name={name}"}
    ):
        if time.monotonic() > deadline:
            raise DeployError(
                f"service {name} is removed, but its tasks' containers were still there after {timeout:g} s; "
                f"its secrets and volumes are left: run `veo-edge deploy remove {name} --swarm` again"
            )
        time.sleep(0.5)
    gone_secrets = []
    for secret in secrets:
        with contextlib.suppress(APIError):  # still in use (a task on another node not yet gone)
            secret.remove()
            gone_secrets.append(secret.name)
    gone = _remove_volumes(client, {cache}) if volumes else []
    kept = [cache] if not volumes and _volume_exists(client, cache) else []
    return {
        "name": name,
        "removed": removed,
        "removed_secrets": sorted(gone_secrets),
        "removed_volumes": gone,
        "kept_volumes": kept,
    }
