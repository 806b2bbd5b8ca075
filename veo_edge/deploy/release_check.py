"""Before ``deploy rollback`` starts the kept ``NAME-previous`` again: is it a release that ``veo-edge
deploy`` made, run the way deploy runs one, of an image the trusted key signed whose files are intact?

Anything with the name ``NAME-previous`` on the engine would otherwise be started as the release. So the
kept container is checked as a deploy checks a new one, and refused (:class:`ImageTrustError`, exit 43)
with every reason on one line, before the running release is touched:

- its image, by ID, verified on that engine as ``veo-edge verify`` does (the signature against the
  trusted key, the files against the in-image manifest, read through the kept container itself, so a
  change in its own layer counts too), unless ``--allow-unsigned``;
- its run options: made by deploy for ``NAME`` (label ``io.veo-edge.deploy.name``), the image's own
  entrypoint and command, every capability dropped, a read-only root, not privileged, no bind mounts,
  devices or host namespaces besides the network, no security option but ``no-new-privileges`` and an
  SELinux type; and the relaxable ones (``--user``, ``--cap-add``, ``--allow-privilege-escalation``,
  ``--pids-limit``) as the rollback command's flags say, with deploy's defaults;
- the container's own pins: ``VEO_EDGE_TRUSTED_KEY`` the verified signer, no ``VEO_EDGE_ALLOW_UNSIGNED``
  and none of :data:`veo_edge.deploy.runopts.CODE_ENV` (``LD_PRELOAD``, ``PYTHONPATH``, ...) (unless
  ``--allow-unsigned``);
- the cache volume it mounts, for planted files (:func:`veo_edge.deploy.ship.check_cache_volume`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from veo_edge.deploy.runopts import (
    LABEL_DEPLOY,
    LABEL_IMAGE,
    NO_NEW_PRIVILEGES,
    RunOptions,
    code_env,
    hardening,
)
from veo_edge.errors import ImageNotFoundError, ImageTrustError, UsageError

#: no-new-privileges as a deploy sets it (runopts.NO_NEW_PRIVILEGES) and as the engine also accepts it
_NNP = (NO_NEW_PRIVILEGES, NO_NEW_PRIVILEGES.removesuffix(":true"))
#: (the cgroup namespace is left out: "host" is Docker's default on cgroup v1 hosts)
_HOST_NAMESPACES = ("PidMode", "IpcMode", "UTSMode", "UsernsMode")


def _caps(caps) -> set[str]:
    return {str(c).strip().upper().removeprefix("CAP_") for c in caps or ()}


def option_problems(attrs: dict, image_config: dict, name: str, least: dict[str, Any]) -> list[str]:
    """What in the kept container's ``attrs`` (``docker inspect``) a deploy of ``name`` with the
    least-privilege flags ``least`` (user, cap_add, privilege_escalation, pids_limit) would not have set:
    the hardening :func:`veo_edge.deploy.runopts.hardening` gives those flags, and what deploy never sets."""
    config, host = attrs.get("Config") or {}, attrs.get("HostConfig") or {}
    want = hardening(RunOptions(**least))
    out = []
    made_for = (config.get("Labels") or {}).get(LABEL_DEPLOY)
    if made_for != name:
        out.append(f"veo-edge deploy did not make it for {name} (label {LABEL_DEPLOY}: {made_for or 'none'})")
    for key in ("Entrypoint", "Cmd"):
        if (config.get(key) or None) != (image_config.get(key) or None):
            out.append(f"its {key.lower()} {config.get(key)} is not the image's {image_config.get(key)}")
    if host.get("Privileged"):
        out.append("it is privileged")
    if not _caps(want["cap_drop"]) <= _caps(host.get("CapDrop")):
        out.append(f"it keeps Linux capabilities (no cap_drop {' '.join(want['cap_drop'])})")
    extra = _caps(host.get("CapAdd")) - _caps(want.get("cap_add"))
    if extra:
        out.append(f"it adds capabilities {', '.join(sorted(extra))} (pass --cap-add for each to accept)")
    if want["read_only"] and not host.get("ReadonlyRootfs"):
        out.append("its root filesystem is writable")
    opts = host.get("SecurityOpt") or []
    if NO_NEW_PRIVILEGES in want["security_opt"] and not any(o in _NNP for o in opts):
        out.append("it lacks no-new-privileges (pass --allow-privilege-escalation to accept)")
    odd = [o for o in opts if o not in _NNP and not o.startswith("label=type:")]
    if odd:
        out.append(f"it has the security options {', '.join(odd)}")
    user = config.get("User") or ""
    if user != want["user"]:
        out.append(f"it runs as user {user}, not {want['user']} (pass --user {user} to accept)" if user
                   else f"it runs as the image's user, not {want['user']}")  # fmt: skip
    pids = want.get("pids_limit")
    if pids and (host.get("PidsLimit") or 0) != pids:
        out.append(f"its pids limit is {host.get('PidsLimit') or 'none'}, not {pids} "
                   f"(pass --pids-limit {host.get('PidsLimit') or 0} to accept)")  # fmt: skip
    binds = [m.get("Source") for m in attrs.get("Mounts") or [] if m.get("Type") != "volume"]
    if binds:
        out.append(f"it bind-mounts host paths ({', '.join(map(str, binds))})")
    if host.get("Devices"):
        out.append(f"it has host devices ({', '.join(d.get('PathOnHost', '?') for d in host['Devices'])})")
    shared = [k for k in _HOST_NAMESPACES if host.get(k) == "host"]
    if shared:
        out.append(f"it shares the host's {', '.join(shared)}")
    return out


def _layer_changes(container: Any, attrs: dict) -> list[str]:
    """What the container's own layer changed (``docker diff``), but for the directories the engine made
    to mount its volumes and its /tmp on (the contents under a mount are not in the layer)."""
    mounts = [m.get("Destination", "") for m in attrs.get("Mounts") or []]
    mounts += list(((attrs.get("HostConfig") or {}).get("Tmpfs") or {}).keys())
    out = []
    for c in container.diff() or []:
        path = c.get("Path", "")
        if not any(m == path or m.startswith(path.rstrip("/") + "/") for m in mounts):
            out.append(path)
    return out


def _env(attrs: dict) -> dict[str, str]:
    pairs = ((e.partition("=")[0], e.partition("=")[2]) for e in (attrs.get("Config") or {}).get("Env") or [])
    return dict(pairs)


def pin_problems(attrs: dict, report: dict[str, Any], allow_unsigned: bool) -> list[str]:
    """The container's own check must be pinned to the signer just verified, and not switched off."""
    from veo_edge.packaging import manifest as im

    if allow_unsigned:
        return []
    env, out = _env(attrs), []
    if env.get(im.ALLOW_UNSIGNED_ENV) is not None:
        out.append(f"its environment sets {im.ALLOW_UNSIGNED_ENV}={env[im.ALLOW_UNSIGNED_ENV]} (its own "
                   "signature check is off; pass --allow-unsigned to accept)")  # fmt: skip
    code = code_env(env)
    if code:
        out.append(f"its environment sets {', '.join(code)} (other code than the signed image's would run; "
                   "pass --allow-unsigned to accept)")  # fmt: skip
    if report["verified"] and env.get(im.TRUSTED_KEY_ENV) != report["signed_by"]:
        out.append(f"its {im.TRUSTED_KEY_ENV} is {env.get(im.TRUSTED_KEY_ENV) or 'unset'}, not the signer "
                   f"{report['signed_by']}")  # fmt: skip
    return out


def _signed_as(attrs: dict) -> str | None:
    """The reference the release was deployed as (its label), when it is one Docker accepts."""
    from veo_edge.packaging.image import check_reference

    ref = ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_IMAGE)
    try:
        check_reference(ref or "", "IMAGE", image_id=True)
    except UsageError:
        return None
    return ref


def _image_config(client: Any, image_id: str, kept: str, name: str) -> dict:
    """The kept release's image config; its image removed from the engine (``docker rmi -f``, a prune):
    :class:`ImageNotFoundError` with what to do, before anything is touched."""
    from docker.errors import ImageNotFound

    try:
        return client.images.get(image_id).attrs.get("Config") or {}
    except ImageNotFound as e:
        raise ImageNotFoundError(
            f"the image {image_id[:19]} of the kept release {kept} is gone from that engine (removed or "
            f"pruned), so it cannot be checked or started; nothing was stopped, {name} runs as before; "
            f"deploy the release you want with `veo-edge deploy IMAGE --name {name}`, and remove the kept "
            f"one with `docker rm {kept}`"
        ) from e


def check_previous(
    client: Any,
    container: Any,
    name: str,
    key: str | None,
    signature: Path | None,
    allow_unsigned: bool,
    least: dict[str, Any],
) -> dict[str, Any]:
    """Refuse the kept release ``container`` of ``name`` unless a deploy could have made it (module
    docstring); returns the image's verify report (its ``warnings``: what ``allow_unsigned`` let by)."""
    from veo_edge.deploy.ship import Trust, check_cache_volume
    from veo_edge.packaging.imagetrust import verify_image

    container.reload()
    attrs, image_id = container.attrs, container.attrs.get("Image", "")
    where = f"the kept release {container.name.lstrip('/')} ({image_id[:19]})"
    image_config = _image_config(client, image_id, container.name.lstrip("/"), name)
    problems = option_problems(attrs, image_config, name, least)
    changed = _layer_changes(container, attrs)
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        problems.append(f"its own layer was changed ({', '.join(changed[:3])}{more})")
    report: dict[str, Any] = {"verified": False, "signed_by": None, "warnings": []}
    if not problems:
        try:
            report = verify_image(image_id, key, client=client, signature=signature,
                                  allow_unsigned=allow_unsigned, signed_as=_signed_as(attrs),
                                  scan_from=container)  # fmt: skip
        except ImageTrustError as e:
            problems.append(str(e))
        else:
            problems += pin_problems(attrs, report, allow_unsigned)
    if not problems:
        trust = Trust(image_id, report["verified"], report["signed_by"], None)
        for m in attrs.get("Mounts") or []:
            if m.get("Type") == "volume" and str(m.get("Name", "")).startswith("veo-edge-cache-"):
                try:
                    check_cache_volume(client, trust, m["Name"], m["Destination"])
                except ImageTrustError as e:
                    problems.append(str(e))
    if problems:
        raise ImageTrustError(
            f"refusing to roll back to {where}: {'; '.join(problems)}; nothing was stopped, {name} runs as "
            f"before; deploy the release you want with `veo-edge deploy IMAGE --name {name}` (it verifies "
            "it), or remove the kept one with `docker rm`"
        )
    return report


def previous_release_check(
    client: Any, name: str, key: str | None, signature: Path | None, allow_unsigned: bool, least: dict
) -> tuple[Callable[[Any], Any], dict[str, Any]]:
    """The ``check`` for :func:`veo_edge.deploy.device.rollback`, and the dict its report lands in."""
    seen: dict[str, Any] = {}

    def check(container: Any) -> None:
        seen.update(check_previous(client, container, name, key, signature, allow_unsigned, least))

    return check, seen
