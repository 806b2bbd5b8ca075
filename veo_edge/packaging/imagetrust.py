"""``veo-edge verify IMAGE`` and the deploy's check: is this image, by its ID, the one the trusted key
signed, and do its baked files still match the in-image manifest? Read through the engine; nothing of
the image runs.

Which key is trusted (the pin), first found: ``--key``/``--verify-key``, ``$VEO_EDGE_TRUSTED_KEY``, the
local key ``veo-edge build`` made on this machine (:mod:`.localkey`). Refused by default: an image with
no signature (no ``--signature`` file and no ``<repo>:sha256-<id>.sig`` image on the engine), one signed
by another key, one whose ID is not the signed ID (any change to its config or layers), and any check
without a pin. ``allow_unsigned`` turns each refusal into a warning in the report, for the caller to
print loudly.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from veo_edge.errors import ImageNotFoundError, ImageTrustError
from veo_edge.packaging import attest, localkey
from veo_edge.packaging import manifest as im

FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")


def check_key(key: str, flag: str = "--key") -> str:
    """A given trusted key as its fingerprint, or a :class:`UsageError` now: a full ``sha256:`` + 64 hex
    fingerprint, or a readable Ed25519 PEM public key file (a short or mistyped one is not a pin)."""
    from veo_edge.errors import UsageError

    key = str(key)
    if key.startswith("sha256:"):
        if not FINGERPRINT.fullmatch(key):
            raise UsageError(
                f"{flag} {key!r} is not a key fingerprint: expected sha256: and 64 lowercase hex digits (as "
                "`veo-edge image build` prints it), or a PEM public key file"
            )
        return key
    path = Path(key)
    if not path.is_file():
        raise UsageError(
            f"{flag} {key!r} is neither a sha256:<64 hex> fingerprint nor an existing file; pass the signing "
            "key's fingerprint or its PEM public key (KEY.pub.pem)"
        )
    try:
        return im.trusted_fingerprint(key, env=False) or key
    except ImageTrustError as e:
        raise UsageError(
            f"{flag} {key}: {e}; pass the signing key's PEM public key or its fingerprint"
        ) from e


def resolve_pin(explicit: str | None) -> tuple[str | None, str]:
    """The trusted key's fingerprint and where it came from (None, "none": no key anywhere)."""
    import os

    if explicit is not None:
        return check_key(explicit), f"--key {explicit}"
    if os.environ.get(im.TRUSTED_KEY_ENV):
        return im.trusted_fingerprint(None), f"${im.TRUSTED_KEY_ENV}"
    local = localkey.fingerprint()
    if local is not None:
        return local, f"the local key {localkey.public_path()}"
    return None, "none"


def _reader(client: Any, image: str, path: str = im.IMAGE_ROOT, volume: str | None = None):
    """A created, never started, container of ``image`` (with ``volume`` mounted read-only at ``path``)
    to read ``path`` from with ``get_archive``; the caller removes it."""
    import docker

    kw: dict[str, Any] = {"entrypoint": ["/bin/true"], "network_disabled": True}
    if volume is not None:
        kw["volumes"] = {volume: {"bind": path, "mode": "ro"}}
    try:
        container = client.containers.create(image, **kw)
    except docker.errors.ImageNotFound as e:
        raise ImageNotFoundError(
            f"image {image} is not in the engine; build or `docker load` it first"
        ) from e
    return container


def _scan_root(client: Any, image_id: str, ref: str, scan_from: Any = None):
    """The image root's entries and trust files, read through a created reader container of
    ``image_id`` (removed after), or through ``scan_from``, an existing container of it (its own layer
    included); None when it has no image root."""
    import docker

    container = scan_from or _reader(client, image_id)
    try:
        bits, _ = container.get_archive(im.IMAGE_ROOT)
        return im.scan_tar(bits, Path(im.IMAGE_ROOT).name)
    except docker.errors.NotFound:
        return None
    finally:
        if scan_from is None:
            container.remove(force=True, v=True)  # and the anonymous /cache volume the image declares


def scan_volume(client: Any, image_id: str, volume: str, mount: str):
    """The cache volume's items, read through a created container of the (verified) image."""
    from veo_edge.packaging import cachecheck

    if not any(v.name == volume for v in client.volumes.list()):
        return []
    container = _reader(client, image_id, mount, volume)
    try:
        bits, _ = container.get_archive(mount)
        return cachecheck.scan_tar(bits, Path(mount).name)
    finally:
        container.remove(force=True, v=True)  # and the anonymous /cache volume the image declares


def _what_changed(client: Any, img: Any, other_tags: list[str]) -> str:
    """The config fields that differ from the signed image's, where the engine still holds it."""
    from veo_edge.packaging import configdiff

    subjects = [(client.images.get(t).labels or {}).get(attest.LABEL_SUBJECT) for t in other_tags]
    return configdiff.describe(client, img, [s for s in subjects if s])


def _first_trusted(found: list[tuple[bytes, str]], image_id: str, pinned: str, source: str, refuse):
    """The first of ``found`` (envelope, where) that verifies by ``pinned`` and where it was; otherwise
    one refusal naming every signer found (a single signature keeps its own error)."""
    errors: list[str] = []
    for envelope, where in found:
        try:
            return attest.verify(envelope, image_id, pinned, f"{source} ({where})"), where
        except ImageTrustError as e:
            errors.append(str(e))
    if len(found) == 1:
        refuse(errors[0])
    else:
        signers = "; ".join(f"{where} by {attest.claimed_signer(env)}" for env, where in found)
        refuse(
            f"{source}: none of its {len(found)} signatures is by the trusted key {pinned} ({signers}); deploy "
            "only images your key signed (--key/--verify-key/$VEO_EDGE_TRUSTED_KEY), or rebuild it with that key"
        )
    return None, None


def verify_image(
    image: str,
    trusted_key: str | None = None,
    client: Any = None,
    signature: Path | None = None,
    allow_unsigned: bool = False,
    cache_volume: str | None = None,
    cache_mount: str = "/cache",
    veo_edge_only: bool = False,
    signed_as: str | None = None,
    scan_from: Any = None,
) -> dict[str, Any]:
    """The report of ``image``'s signature (over its ID), its baked files and, with ``cache_volume``,
    that volume; raises :class:`ImageTrustError` on the first refusal (unless ``allow_unsigned``).
    ``veo_edge_only`` (``veo-edge verify``): an image with no /opt/veo-edge is refused even with
    ``allow_unsigned``, there being nothing to verify; a deploy's --allow-unsigned takes any image.
    ``signed_as``: the reference the image was deployed as, whose repository holds its signature image
    (for an ``image`` given by ID that may have lost its tags); ``scan_from``: read the files through
    this existing container of the image (a release about to be started again) instead of a new one."""
    import docker

    from veo_edge.packaging.image import check_reference, connect

    check_reference(image, "IMAGE", image_id=True)  # the engine's answer would be an APIError 400
    client = client or connect()
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise ImageNotFoundError(
            f"image {image} is not in the engine; build or `docker load` it first"
        ) from e
    source = f"image {image} ({img.id[:19]})"
    warnings: list[str] = []

    def refuse(message: str) -> None:
        if not allow_unsigned:
            err = ImageTrustError(message)
            err.details = {"source": source, "image_id": img.id, "pinned_key": pinned, "pinned_from": pin_from,
                           "signatures": [where for _, where in found]}  # fmt: skip
            raise err
        # accepted knowingly: the warning says what is wrong, not to pass the flag that was passed
        warnings.append(message.removesuffix(", or pass --allow-unsigned to accept it knowingly"))

    pinned, pin_from = resolve_pin(trusted_key)
    if signature is not None:
        try:
            found = [(Path(signature).read_bytes(), f"--signature {signature}")]
        except OSError as e:
            raise ImageTrustError(f"--signature {signature} cannot be read ({e})") from e
    else:
        found = attest.find_signatures(client, signed_as or image, img)
    verified = used = None
    if not found:
        others = attest.other_signatures(client, signed_as or image, img)
        changed = (
            f"; {attest.repo_of(signed_as or image)} has signatures for other image IDs only ({others[0]}...): "
            f"this image was changed after it was signed{_what_changed(client, img, others)}"
            if others
            else ""
        )
        refuse(
            f"{source} is unsigned: no signature image "
            f"{attest.signature_tag(attest.repo_of(signed_as or image), img.id)} "
            f"on the engine and no --signature file{changed}; build it with `veo-edge build --target ...` "
            "(it signs), or pass --allow-unsigned to accept it knowingly"
        )
    elif pinned is None:
        refuse(
            f"{source}: no trusted key to check its signature against; pass --key KEY.pub.pem|sha256:..., "
            f"set {im.TRUSTED_KEY_ENV}, or build on this machine (which makes the local key)"
        )
    else:
        verified, used = _first_trusted(found, img.id, pinned, source, refuse)
    signer = verified.signed_by if verified else None

    scanned = _scan_root(client, img.id, image, scan_from)
    report: dict[str, Any] = {"source": source, "image_id": img.id, "ok": True, "files": 0, "bytes": 0}
    if scanned is None:
        message = (
            f"{source} has no {im.IMAGE_ROOT}: it is not a veo-edge image, so nothing in it can be verified; "
            "build one with `veo-edge image build BUILD_DIR --target ...`"
        )
        if veo_edge_only:  # not even --allow-unsigned: "0 files, every sha256 matches" would be a lie
            raise ImageTrustError(message)
        refuse(message)
    else:
        entries, trust = scanned
        # the in-image manifest: signed by the same key as the image; unverified (allowed), by its own key
        own = None
        if im.MANIFEST_FILE in trust:
            try:
                own = json.loads(trust[im.MANIFEST_FILE]).get("signing_key")
            except (ValueError, AttributeError):
                own = None
        if signer is not None and own is not None and own != signer:  # re-signed beside, not inside
            refuse(
                f"{source}: its image ID is signed by the trusted key {signer} ({used}), but the manifest "
                f"baked in it is signed by {own}, so the container's own check would refuse that pin; "
                f"trust {own} or rebuild the image with the trusted key"
            )
        manifest_key = signer if signer is not None and (own is None or own == signer) else own
        report.update(im.check(entries, trust, source, manifest_key, allow_unsigned=allow_unsigned))
        raw = trust[im.MANIFEST_FILE]
        if verified is not None and verified.manifest_sha256 != hashlib.sha256(raw).hexdigest():
            refuse(f"{source}: the in-image manifest is not the one the image signature names")
        if cache_volume is not None:
            items = scan_volume(client, img.id, cache_volume, cache_mount)
            report["cache"] = im.check_cache(items, trust, f"volume {cache_volume}")
            report["cache"]["volume"] = cache_volume
        report["in_image_manifest"] = json.loads(raw).get("schema")
    report.update(
        signed_by=signer,
        pinned_key=pinned,
        pinned_from=pin_from,
        signature=used,
        signatures=[where for _, where in found],
        warnings=warnings,
        verified=verified is not None,
    )
    return report
