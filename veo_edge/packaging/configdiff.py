"""What changed in an image since it was signed: its config compared with the signed image's.

A changed image has a new ID, so no signature of its own; its repository's signature images name the
IDs that were signed (their ``io.veo-edge.signature.subject`` label). Where the engine still holds one of
those images, the two configs are compared field by field (Entrypoint, Cmd, each Env variable, User,
WorkingDir, Healthcheck, each label, ports, volumes, the layers), so a refusal can say *what* differs:
``Env LD_PRELOAD added``, ``Healthcheck changed``, ``1 layer added``. Nothing here is trusted: it only
words an error for an image that is refused anyway.
"""

from __future__ import annotations

from typing import Any

#: the config fields compared as a whole (Env and Labels are compared per variable / key)
FIELDS = ("Entrypoint", "Cmd", "User", "WorkingDir", "Healthcheck", "ExposedPorts", "Volumes",
          "StopSignal", "Shell", "OnBuild")  # fmt: skip


def _env(config: dict[str, Any]) -> dict[str, str]:
    return dict(e.partition("=")[::2] for e in config.get("Env") or [])


def _keyed(what: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = [f"{what} {k} added" for k in sorted(set(new) - set(old))]
    out += [f"{what} {k} removed" for k in sorted(set(old) - set(new))]
    out += [f"{what} {k} changed" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
    return out


def differences(signed: dict[str, Any], image: dict[str, Any]) -> list[str]:
    """What differs between two images' ``docker inspect`` attributes, in words."""
    old, new = signed.get("Config") or {}, image.get("Config") or {}
    out = [f"{f} changed" for f in FIELDS if (old.get(f) or None) != (new.get(f) or None)]
    out += _keyed("Env", _env(old), _env(new))
    out += _keyed("label", old.get("Labels") or {}, new.get("Labels") or {})
    a = (signed.get("RootFS") or {}).get("Layers") or []
    b = (image.get("RootFS") or {}).get("Layers") or []
    if b[: len(a)] == a and len(b) > len(a):
        out.append(f"{len(b) - len(a)} layer{'s' if len(b) - len(a) > 1 else ''} added")
    elif a != b:
        changed = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        where = f"layer {changed[0] + 1} of {len(b)} differs" if changed else f"{len(a)} -> {len(b)} layers"
        out.append(where + (" (the base image's)" if changed and changed[0] == 0 else ""))
    return out


def describe(client: Any, image: Any, signed_ids: list[str]) -> str:
    """``; compared with the signed image sha256:...: Env LD_PRELOAD added, ...`` for the signed image the
    engine holds that differs least from ``image``; "" when it holds none of them."""
    from docker.errors import ImageNotFound

    best: tuple[list[str], str] | None = None
    for sid in dict.fromkeys(signed_ids):
        try:
            attrs = client.images.get(sid).attrs
        except ImageNotFound:
            continue
        diff = differences(attrs, image.attrs)
        if best is None or len(diff) < len(best[0]):
            best = (diff, sid)
    if best is None:
        return ""
    diff, sid = best
    return f"; against the signed image {sid[:19]}: {', '.join(diff) or 'its config is the same (metadata only)'}"
