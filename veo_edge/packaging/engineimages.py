"""What an image build leaves on the engine and takes from it: the ``docker save`` archive of the image
with its signature image, and the dangling stage images of a failed or interrupted build, removed (a
finished build's are its cache: kept, and said)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veo_edge.errors import ImageBuildError
from veo_edge.packaging.image import Progress


def save_image(client, tag: str, dest: Path, say: Progress, signature_tag: str | None = None) -> Path:
    """``docker save`` of ``tag`` and, when given, its signature image ``signature_tag`` in the same
    archive (both named, so ``docker load`` restores both tags and ``veo-edge verify`` then finds the
    signature on an air-gapped engine), written atomically.

    The SDK's ``Image.save`` takes one image; the Engine API's ``GET /images/get?names=A&names=B`` takes
    several, and is asked through the SDK's own HTTP session (``APIClient`` is a ``requests.Session``)."""
    import docker
    import requests

    names = [tag] + ([signature_tag] if signature_tag else [])
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    say(f"image: saving {' and its signature image '.join(names)} to {dest}")
    try:
        for name in names:
            client.images.get(name)  # a missing one is an ImageNotFound, not a 404 in the stream
        api = client.api
        url = f"{api.base_url}/v{api.api_version}/images/get"
        with api.get(url, params={"names": names}, stream=True) as res, open(part, "wb") as f:
            res.raise_for_status()
            for chunk in res.iter_content(1 << 20):
                f.write(chunk)
        part.rename(dest)
    except (OSError, docker.errors.APIError, requests.RequestException) as e:
        part.unlink(missing_ok=True)
        raise ImageBuildError(f"saving {', '.join(names)} to {dest} failed: {e}") from e
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return dest


#: a step's resulting image in the classic builder's output (`` ---> 3f2a...``), and a RUN step's container
_STEP_IMAGE = re.compile(r"^---> ([0-9a-f]{12,64})$")
_RUNNING = re.compile(r"^---> Running in ([0-9a-f]{12,64})$")


@dataclass
class BuildTrace:
    """What a classic ``docker build`` said it made: each step's image (``made``, from the cache or not)
    and each RUN step's container (``running``)."""

    made: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)

    def see(self, line: str) -> None:
        if m := _STEP_IMAGE.match(line):
            self.made.append(m.group(1))
        elif m := _RUNNING.match(line):
            self.running.append(m.group(1))


def _short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def _image_of(container: Any) -> str:
    return _short(container.attrs.get("ImageID") or container.attrs.get("Image") or "")


def _ours(client: Any, trace: BuildTrace) -> tuple[list[str], set[str]]:
    """The IDs of the dangling images of this build: one of its steps, or (after an interrupt, when the
    engine went on a step or two without telling) descended from one of its untagged steps (never from
    the base or another tagged image); and those untagged steps' short IDs. Read from the engine's image
    summaries (``APIClient.images``: ParentId, RepoTags), one request each."""
    everything = client.api.images(all=True)
    parent = {_short(i["Id"]): _short(i.get("ParentId") or "") for i in everything}
    tagged = {
        _short(i["Id"]) for i in everything if any(t != "<none>:<none>" for t in i.get("RepoTags") or [])
    }
    created = {m[:12] for m in trace.made} - tagged
    out = []
    for img in client.api.images(filters={"dangling": True}):
        node, seen = _short(img["Id"]), set()
        while node and node not in seen:
            seen.add(node)
            if node in created:
                out.append(img["Id"])
                break
            node = parent.get(node, "")
    return out, created


def drop_stage_images(client: Any, trace: BuildTrace, say: Progress, settle: bool = False) -> None:
    """Remove the images this build left dangling: the classic builder leaves the last image of every
    stage but the target untagged (the venv stage: ~560 MB for cpu) and, on a failure, the last step it
    finished. After an interrupt (``settle``) the engine goes on with the step it runs, and may start the
    next, before it notices the client has gone: this waits (up to a minute) until no container runs on
    one of this build's images and the set of its dangling images has not changed for 3 s. Dangling
    images of other builds stay."""
    import time

    import docker

    if not trace.made:
        return
    try:
        ours, created = _ours(client, trace)
        deadline, last, since = time.monotonic() + 60, None, time.monotonic()
        while settle and time.monotonic() < deadline:
            ids = {_short(i) for i in ours} | created
            steps = set(trace.running)
            live = client.containers.list(all=True, sparse=True)  # sparse: no inspect of one that goes
            busy = [c for c in live if _image_of(c) in ids or c.id[:12] in steps]
            now = set(ours)
            if now != last:
                last, since = now, time.monotonic()
            elif not busy and time.monotonic() - since >= 3:
                break
            time.sleep(0.5)
            ours, created = _ours(client, trace)
    except docker.errors.APIError:
        return
    freed = 0
    for image_id in ours:
        try:
            size = int(client.images.get(image_id).attrs.get("Size") or 0)
            client.images.remove(image_id)  # and its untagged parents of the same stage
            freed += size
        except docker.errors.APIError:
            continue
    if ours:
        say(f"image: removed {len(ours)} dangling stage image(s) of this build ({freed / 1e6:.0f} MB)")


def say_stage_images(client: Any, trace: BuildTrace, say: Progress) -> None:
    """Say which untagged stage images a finished build left: the classic builder's cache (the venv
    stage, ~560 MB for cpu), which a rebuild of the same context takes instead of installing again."""
    import docker

    try:
        ours, _ = _ours(client, trace)
        size = sum(int(client.images.get(i).attrs.get("Size") or 0) for i in ours)
    except docker.errors.APIError:
        return
    if ours:
        say(
            f"image: {len(ours)} untagged stage image(s) of this build kept as its build cache ({size / 1e6:.0f} "
            "MB; a rebuild of the same context takes them; `docker image prune` removes them)"
        )
