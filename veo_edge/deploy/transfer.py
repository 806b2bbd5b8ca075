"""Getting an image onto the target engine: nothing when it already has that image id, a registry push and
pull when ``--registry`` is given, else ``docker save`` from the local engine streamed straight into
``docker load`` on the target (no temporary file), with a progress bar."""

from __future__ import annotations

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

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "image_id": self.image_id, "method": self.method, "bytes": self.bytes}


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
    local: Any, target: Any, ref: str, registry: str | None = None, progress: Progress | None = None
) -> TransferResult:
    """Put ``ref`` (a tag or an id on the local engine) onto ``target``; returns how."""
    from docker.errors import APIError

    local_id = image_id(local, ref)
    if local_id is None:
        target_id = image_id(target, ref)
        if target_id is not None:  # built on the device itself: nothing to move
            return TransferResult(ref, target_id, "present")
        raise DeployError(
            f"image {ref!r} is on neither the local engine nor the target; build it first "
            "(veo-edge build --target ...) or check DOCKER_HOST"
        )
    if image_id(target, local_id) is not None:
        _tag_as(target, local_id, ref)
        return TransferResult(ref, local_id, "present")
    try:
        if registry:
            return _via_registry(local, target, ref, local_id, registry)
        return _stream(local, target, ref, local_id, progress)
    except APIError as e:
        raise DeployError(f"could not transfer {ref} to the target engine: {e.explanation or e}") from e


def _stream(local: Any, target: Any, ref: str, local_id: str, progress: Progress | None) -> TransferResult:
    total = local.images.get(local_id).attrs.get("Size")
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for chunk in local.api.get_image(ref, chunk_size=CHUNK):
            sent += len(chunk)
            if progress is not None:
                progress(sent, total)
            yield chunk

    for line in target.api.load_image(chunks()):
        if isinstance(line, dict) and line.get("error"):
            raise DeployError(f"the target engine could not load {ref}: {line['error']}")
    if image_id(target, local_id) is None:
        raise DeployError(f"the target engine loaded the stream of {ref} but has no image {local_id[:19]}")
    _tag_as(target, local_id, ref)
    return TransferResult(ref, local_id, "stream", sent)


def _via_registry(local: Any, target: Any, ref: str, local_id: str, registry: str) -> TransferResult:
    name = ref.split("/", 1)[-1] if "." in ref.split("/", 1)[0] or ":" in ref.split("/", 1)[0] else ref
    remote = f"{registry.rstrip('/')}/{name}"
    repo, tag = _repo_tag(remote)
    local.images.get(local_id).tag(repo, tag)
    for line in local.images.push(repo, tag=tag, stream=True, decode=True):
        if line.get("error"):
            raise DeployError(f"push of {repo}:{tag} to {registry} failed: {line['error']}")
    pulled = target.images.pull(repo, tag=tag)
    if pulled.id != local_id:
        raise DeployError(
            f"the target pulled {repo}:{tag} as {pulled.id[:19]}, not the local {local_id[:19]}: the registry "
            "holds another image under that tag"
        )
    _tag_as(target, local_id, ref)
    return TransferResult(ref, local_id, "registry")
