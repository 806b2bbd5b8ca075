"""Getting the verified image onto the target engine, by its ID, never by re-reading a tag.

Nothing moves when the target already has that image ID. With ``--registry`` the image is pushed and
the target pulls it **by digest** (``repo@sha256:...``, the digest the push reported), so the registry
cannot hand back another image under the tag; the pulled image's ID must be the verified one. Otherwise
``docker save`` of the ID on the local engine is streamed straight into ``docker load`` on the target
(no temporary file), with a progress bar. The image's signature image (``<repo>:sha256-<id>.sig``)
goes along the same way, so the target engine and the registry keep the signature beside the image.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from veo_edge.errors import DeployError

CHUNK = 1 << 20

#: progress callback: (bytes so far, total bytes or None)
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class TransferResult:
    image: str
    image_id: str
    method: str  # "present" | "stream" | "registry"
    bytes: int = 0
    #: with a registry: ``repo@sha256:...``, the reference the target pulled (and services should name)
    digest_ref: str | None = None
    signature: str | None = None  # the signature image the target now has, if any

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "image_id": self.image_id,
            "method": self.method,
            "bytes": self.bytes,
            "digest_ref": self.digest_ref,
            "signature": self.signature,
        }


def image_id(client: Any, ref: str) -> str | None:
    """The id of ``ref`` on an engine, or None when the engine does not have it."""
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref).id
    except ImageNotFound:
        return None


def _repo_tag(ref: str) -> tuple[str, str]:
    """``registry:5000/name:tag`` -> (``registry:5000/name``, ``tag``), as the Docker SDK splits it."""
    from docker.utils import parse_repository_tag

    repo, tag = parse_repository_tag(ref)
    return repo, tag or "latest"


def _tag_as(client: Any, image_id_: str, ref: str) -> None:
    """Make ``ref`` name ``image_id_`` on ``client`` (a load by id, or a pull by digest, leaves no tag)."""
    if ref.startswith("sha256:") or "@" in ref:  # an id or a digest names the content, not a tag
        return
    client.images.get(image_id_).tag(*_repo_tag(ref))


def transfer_image(
    local: Any,
    target: Any,
    ref: str,
    registry: str | None = None,
    progress: Progress | None = None,
    verified_id: str | None = None,
    signature_tag: str | None = None,
) -> TransferResult:
    """Put the image ``verified_id`` (named ``ref`` on the local engine) onto ``target``; returns how.
    ``verified_id`` None: whatever ``ref`` names now (an unverified deploy)."""
    from docker.errors import APIError

    local_id = image_id(local, verified_id or ref)
    if local_id is None:
        target_id = image_id(target, verified_id or ref)
        if target_id is not None:  # built (and verified) on the device itself: nothing to move
            return TransferResult(ref, target_id, "present")
        raise DeployError(
            f"image {ref!r} is on neither the local engine nor the target; build it first "
            "(veo-edge build --target ...) or check DOCKER_HOST"
        )
    try:
        if registry:
            return _via_registry(local, target, ref, local_id, registry, signature_tag)
        sig = _stream_signature(local, target, signature_tag)
        if image_id(target, local_id) is not None:
            _tag_as(target, local_id, ref)
            return TransferResult(ref, local_id, "present", signature=sig)
        moved = _stream(local, target, local_id, progress)
    except APIError as e:
        raise DeployError(f"could not transfer {ref} to the target engine: {e.explanation or e}") from e
    _tag_as(target, local_id, ref)
    return TransferResult(ref, local_id, "stream", moved, signature=sig)


def _load(local: Any, target: Any, name: str, progress: Progress | None) -> int:
    total = local.images.get(name).attrs.get("Size")
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for chunk in local.api.get_image(name, chunk_size=CHUNK):
            sent += len(chunk)
            if progress is not None:
                progress(sent, total)
            yield chunk

    for line in target.api.load_image(chunks()):
        if isinstance(line, dict) and line.get("error"):
            raise DeployError(f"the target engine could not load {name}: {line['error']}")
    return sent


def _stream(local: Any, target: Any, local_id: str, progress: Progress | None) -> int:
    sent = _load(local, target, local_id, progress)
    if image_id(target, local_id) is None:
        raise DeployError(f"the target engine loaded the stream of {local_id[:19]} but has no such image")
    return sent


def _stream_signature(local: Any, target: Any, signature_tag: str | None) -> str | None:
    if signature_tag is None or image_id(local, signature_tag) is None:
        return None
    if image_id(target, signature_tag) != image_id(local, signature_tag):
        _load(local, target, signature_tag, None)  # named: docker load restores its tag
    return signature_tag


def _push(local: Any, repo: str, tag: str, registry: str) -> str:
    """Push ``repo:tag``; the manifest digest the registry acknowledged."""
    digest = None
    for line in local.images.push(repo, tag=tag, stream=True, decode=True):
        if line.get("error"):
            raise DeployError(f"push of {repo}:{tag} to {registry} failed: {line['error']}")
        aux = line.get("aux")
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = aux["Digest"]
    if digest is None:
        raise DeployError(f"the registry {registry} acknowledged no digest for {repo}:{tag}")
    return digest


def _remote(ref: str, registry: str) -> str:
    first = ref.split("/", 1)[0]
    name = ref.split("/", 1)[-1] if ("/" in ref and ("." in first or ":" in first)) else ref
    return f"{registry.rstrip('/')}/{name}"


def push(
    local: Any, ref: str, local_id: str, registry: str, signature_tag: str | None
) -> tuple[str, str | None]:
    """Push the image ``local_id`` (and its signature image) to ``registry``; returns the digest
    reference (``repo@sha256:...``) and the signature image's remote tag."""
    repo, tag = _repo_tag(_remote(ref, registry))
    made = image_id(local, f"{repo}:{tag}") is None  # the registry's tag, made here for the push
    local.images.get(local_id).tag(repo, tag)
    try:
        digest = _push(local, repo, tag, registry)
    except DeployError:
        if made:  # a failed push leaves no stray tag on the build host
            with contextlib.suppress(Exception):
                local.images.remove(f"{repo}:{tag}", noprune=True)
        raise
    sig = None
    if signature_tag is not None and image_id(local, signature_tag) is not None:
        sig_tag = signature_tag.rsplit(":", 1)[1]
        local.images.get(signature_tag).tag(repo, sig_tag)
        _push(local, repo, sig_tag, registry)
        sig = f"{repo}:{sig_tag}"
    return f"{repo}@{digest}", sig


def _via_registry(
    local: Any, target: Any, ref: str, local_id: str, registry: str, signature_tag: str | None
) -> TransferResult:
    from docker.errors import APIError, NotFound

    pinned, sig = push(local, ref, local_id, registry, signature_tag)
    if sig is not None:
        target.images.pull(sig)
    try:
        pulled = target.images.pull(pinned)
    except (APIError, NotFound) as e:
        raise DeployError(
            f"the target engine refused {pinned} from {registry}: {getattr(e, 'explanation', None) or e}; "
            "what the registry served is not what was pushed (a digest mismatch): check the registry"
        ) from e
    if pulled.id != local_id:
        raise DeployError(
            f"the target pulled {pinned} as image {pulled.id[:19]}, not the verified {local_id[:19]}: "
            "refusing to run it"
        )
    _tag_as(target, local_id, ref)
    return TransferResult(ref, local_id, "registry", digest_ref=pinned, signature=sig)
