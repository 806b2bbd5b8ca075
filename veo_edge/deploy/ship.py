"""A deploy from start to end: verify the image by its ID, move exactly that ID, check the cache
volume, wire the pins and the control token, run it (one device or a swarm service).

Verification happens on the engine that holds the image (the local one, or the target when it was built
there) before anything moves or stops, and again on the target's own copy after the transfer
(:func:`verify_on_target`); everything after names the verified ID, so a tag moved in the meantime
changes nothing. The container's own check is pinned to the same signer
(``VEO_EDGE_TRUSTED_KEY``); ``--allow-unsigned`` deploys an unverified image loudly and tells the
container so (``VEO_EDGE_ALLOW_UNSIGNED=1``).

The model-control token (``--control-token-file``) never goes into an image or a spec: on one device it
is written into its own volume ``veo-edge-control-NAME`` (through a created, never started, container)
and mounted read-only; on a swarm it becomes a Swarm secret named by its content hash. The container
gets ``VEO_EDGE_MODEL_CONTROL_MODE=explicit`` and ``VEO_EDGE_CONTROL_TOKEN_FILE``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veo_edge.errors import DeployError, ImageNotFoundError, ImageTrustError, UsageError

CONTROL_DIR = "/run/secrets/veo-edge"
CONTROL_FILE = "control-token"


@dataclass(frozen=True)
class Trust:
    """What the deploy verified: the image ID everything after it names, and the pins for the container."""

    image_id: str
    verified: bool
    signed_by: str | None
    signature_tag: str | None
    warnings: list[str] = field(default_factory=list)
    #: verified on the target engine itself (built there): its copy needs no second look
    on_target: bool = False

    @property
    def env(self) -> dict[str, str]:
        if self.verified and self.signed_by:
            return {"VEO_EDGE_TRUSTED_KEY": self.signed_by}
        return {"VEO_EDGE_ALLOW_UNSIGNED": "1"}


def verify_for_deploy(
    local: Any,
    target: Any,
    image: str,
    key: str | None,
    signature: Path | None,
    allow_unsigned: bool,
) -> Trust:
    """Verify ``image`` where it is (the local engine, else the target); see :mod:`.imagetrust`."""
    from veo_edge.deploy.transfer import image_id
    from veo_edge.packaging import attest
    from veo_edge.packaging.imagetrust import verify_image

    holder = local if image_id(local, image) is not None else target
    if image_id(holder, image) is None:
        raise ImageNotFoundError(
            f"image {image!r} is on neither the local engine nor the target; build it first "
            "(veo-edge build --target ...) or check DOCKER_HOST"
        )
    report = verify_image(image, key, client=holder, signature=signature, allow_unsigned=allow_unsigned)
    sig = None
    if report["signature"] and report["signature"].startswith("signature image "):
        sig = report["signature"].removeprefix("signature image ")
    elif report["verified"]:
        sig = attest.signature_tag(attest.repo_of(image), report["image_id"])
    return Trust(
        report["image_id"], report["verified"], report["signed_by"], sig, report["warnings"], holder is target
    )


def verify_on_target(
    target: Any, trust: Trust, image: str, key: str | None, signature: Path | None, allow_unsigned: bool
) -> Trust:
    """Verify the target engine's own copy of ``trust.image_id`` as ``veo-edge verify`` does there: its
    signature and its files. The verified ID says nothing about the bytes the target holds when it had
    the image already (no transfer), or a layer of it (``docker load`` keeps a layer it has): a file
    changed in the device's store is only seen there. Returns ``trust`` with any new warnings; an
    unverified deploy (``--allow-unsigned`` of an image that did not verify) has nothing to re-check."""
    from veo_edge.packaging.imagetrust import verify_image

    if trust.on_target or not trust.verified:
        return trust
    try:
        report = verify_image(
            trust.image_id, key, client=target, signature=signature, allow_unsigned=allow_unsigned,
            signed_as=image,
        )  # fmt: skip
    except ImageTrustError as e:
        raise ImageTrustError(
            f"the target engine's copy of {image}: {e}; nothing was started or stopped: the device's image "
            "store was changed, find out how, then remove that image there (its containers first) and deploy "
            "again to send a clean copy"
        ) from e
    new = [w for w in report["warnings"] if w not in trust.warnings]
    return dataclasses.replace(trust, warnings=[*trust.warnings, *new], on_target=True)


def check_cache_volume(client: Any, trust: Trust, volume: str, mount: str) -> dict[str, Any] | None:
    """Refuse a cache volume on the target that holds planted files (None: not a veo-edge image)."""
    from veo_edge.packaging import cachecheck
    from veo_edge.packaging import manifest as im

    if not any(v.name == volume for v in client.volumes.list(filters={"name": volume})):
        return {"ok": True, "entries": 0, "volume": volume}
    from docker.errors import NotFound

    container = client.containers.create(
        trust.image_id,
        entrypoint=["/bin/true"],
        network_disabled=True,
        volumes={volume: {"bind": mount, "mode": "ro"}},
    )
    try:
        try:
            bits, _ = container.get_archive(f"{im.IMAGE_ROOT}/{im.TRUST_DIR}")
        except NotFound:
            return None
        trust_files = _tar_files(bits)
        if im.MANIFEST_FILE not in trust_files:
            return None
        bits, _ = container.get_archive(mount)
        items = cachecheck.scan_tar(bits, Path(mount).name)
    finally:
        container.remove(force=True, v=True)  # and the anonymous /cache volume the image declares
    report = im.check_cache(items, trust_files, f"cache volume {volume} on the target")
    return {**report, "volume": volume}


def _tar_files(chunks) -> dict[str, bytes]:
    """The regular files of a small archive, by member name."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def control_token_volume(client: Any, image_id: str, name: str, token_file: Path) -> tuple[str, dict]:
    """Write the token into the volume ``veo-edge-control-NAME`` (owned by the container's user, 0400);
    returns the volume and the environment that points the server at it."""
    data = _read_token(token_file)
    volume = f"veo-edge-control-{name}"
    client.volumes.create(volume)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(CONTROL_FILE)
        info.size, info.mode, info.uid, info.gid = len(data), 0o400, 10001, 10001
        tar.addfile(info, io.BytesIO(data))
    holder = client.containers.create(
        image_id, entrypoint=["/bin/true"], network_disabled=True, volumes={volume: {"bind": CONTROL_DIR}}
    )
    try:
        if not holder.put_archive(CONTROL_DIR, buf.getvalue()):
            raise DeployError(f"the target engine did not take the control token into volume {volume}")
    finally:
        holder.remove(force=True, v=True)
    return volume, _control_env(f"{CONTROL_DIR}/{CONTROL_FILE}")


def control_token_secret(client: Any, name: str, token_file: Path) -> tuple[Any, dict]:
    """A Swarm secret holding the token (named by its sha256: secrets are immutable); the reference a
    service mounts and the environment that points the server at it."""
    import docker.types as t
    from docker.errors import NotFound

    data = _read_token(token_file)
    secret_name = f"veo-edge-control-{name}-{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        secret = client.secrets.get(secret_name)
    except NotFound:
        secret = client.secrets.create(name=secret_name, data=data, labels={"io.veo-edge.deploy.name": name})
    ref = t.SecretReference(
        secret.id, secret_name, filename=CONTROL_FILE, uid="10001", gid="10001", mode=0o400
    )
    return ref, _control_env(f"/run/secrets/{CONTROL_FILE}")


def _read_token(path: Path) -> bytes:
    try:
        data = Path(path).read_bytes().strip()
    except OSError as e:
        raise UsageError(f"--control-token-file {path} cannot be read ({e})") from e
    if len(data) < 16:
        raise UsageError(f"--control-token-file {path} holds {len(data)} bytes; use a token of 16 or more")
    return data


def _control_env(path: str) -> dict[str, str]:
    return {"VEO_EDGE_MODEL_CONTROL_MODE": "explicit", "VEO_EDGE_CONTROL_TOKEN_FILE": path}


def facts_for(client: Any, image_id: str, ref: str, target: str | None):
    """The image's facts read by its ID on the target, named ``ref`` for people."""
    from veo_edge.deploy.profiles import ImageFacts

    return dataclasses.replace(ImageFacts.read(client, image_id, target), ref=ref)
