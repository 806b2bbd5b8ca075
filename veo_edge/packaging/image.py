"""Building, sealing, saving and verifying images through the Docker SDK (``docker`` from PyPI).

An image is made in two builds: the context's Dockerfile (the engine's output streamed line by line into
the progress display), then a last layer, ``trust/``, with the manifest of every file the first build
baked under ``/opt/veo-edge`` (read back from the engine), its DSSE signature and the public key (for
the in-container check, which cannot see the image's config), and the labels that name the manifest's
sha256 and the key's fingerprint. Then the image itself is signed: its ID, by :mod:`.attest`, beside it
(a ``<repo>:sha256-<id>.sig`` signature image and a detached file in the context); ``veo-edge verify
IMAGE`` is :mod:`.imagetrust`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.errors import (
    EngineUnreachableError,
    ImageBuildError,
    ImageNotFoundError,
    ImageTrustError,
    PackagingError,
)
from veo_edge.packaging import attest, signing
from veo_edge.packaging import manifest as im
from veo_edge.packaging.context import Context

Progress = Callable[[str], None]
ENGINE_HINT = "start a Docker engine or set DOCKER_HOST to one"
LABEL_MANIFEST = "io.veo-edge.manifest.sha256"
LABEL_KEY = "io.veo-edge.signing-key.fingerprint"


# an image reference, as distribution's reference grammar has it (the Docker SDK has no validator):
# [REGISTRY/]NAME[:TAG][@DIGEST], the registry a host with a dot or a port, or localhost
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(
    rf"{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_REGISTRY = re.compile(
    r"(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
)
_IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")


def check_reference(ref: str, flag: str, image_id: bool = False) -> None:
    """A :class:`UsageError` now for a name Docker would refuse only after the work (``flag`` names
    where it came from; ``image_id``: an image ID is accepted too)."""
    from veo_edge.errors import UsageError

    head, _, rest = ref.partition("/")
    if image_id and _IMAGE_ID.fullmatch(ref):
        return
    if rest and ("." in head or ":" in head or head == "localhost"):  # the first part is a registry
        ok = _REGISTRY.fullmatch(head) and _NAME.fullmatch(rest)
    else:
        ok = _NAME.fullmatch(ref)
    if not ok:
        raise UsageError(
            f"{flag} {ref!r} is not an image reference Docker takes: [REGISTRY/]NAME[:TAG], the name in "
            "lowercase letters, digits and . _ - separators, e.g. veo-edge/vit-tiny:1"
        )


def check_registry(registry: str) -> None:
    """``--registry``: a registry host[:port], as an image reference starts (not a URL, no path)."""
    from veo_edge.errors import UsageError

    if not _REGISTRY.fullmatch(registry):
        hint = "; leave out the scheme" if "://" in registry else ""
        raise UsageError(
            f"--registry {registry!r} is not a registry address: HOST[:PORT], e.g. registry.local:5000 or "
            f"127.0.0.1:5000{hint}"
        )


def check_image_flags(image: str | None, base_image: str | None) -> None:
    """``--image`` and ``--base-image`` checked before any build work (:func:`check_reference`)."""
    for flag, ref in (("--image", image), ("--base-image", base_image)):
        if ref:
            check_reference(ref, flag)


def refuse_plain_tcp() -> None:
    """DOCKER_HOST=tcp://... without DOCKER_TLS_VERIFY=1 is a Docker engine on unencrypted, unauthenticated
    TCP (root on that machine for anyone who reaches it, and images that anyone on the way can swap):
    refused, as ``deploy --to tcp://`` refuses it."""
    from veo_edge.errors import InsecureEngineError

    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("tcp://") and os.environ.get("DOCKER_TLS_VERIFY", "") in ("", "0"):
        raise InsecureEngineError(
            f"refusing DOCKER_HOST={host} without TLS: a Docker engine on plain TCP gives root on that machine "
            "to anyone who can reach it; serve it with dockerd --tlsverify and set DOCKER_TLS_VERIFY=1 and "
            "DOCKER_CERT_PATH, or use unix:// or ssh://"
        )


def connect(timeout: int = 600, building: bool = False):
    """A Docker SDK client for DOCKER_HOST (or the default socket), checked with a ping; ``building``:
    the refusal also offers an image build's --context-only."""
    refuse_plain_tcp()
    try:
        import docker
    except ImportError as e:
        raise PackagingError(
            "the Docker SDK is not installed; image builds need it: pip install 'veo-edge[image]'"
        ) from e
    where = engine_name()
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as e:
        hint = ENGINE_HINT + (", or pass --context-only to stop before the engine" if building else "")
        raise EngineUnreachableError(f"no Docker engine answers at {where} ({e}); {hint}") from e
    client.veo_edge_engine = where
    return client


def engine_name(client: Any = None) -> str:
    """The engine as the user named it: DOCKER_HOST's value, as :func:`connect` recorded it on its client
    (the SDK's base_url says http+docker://localhost for any unix socket); a client made elsewhere: its
    base_url."""
    if client is not None:
        return getattr(client, "veo_edge_engine", None) or client.api.base_url
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else "the default socket (DOCKER_HOST is not set)"


def ensure_base(client: Any, base: str, platform: str | None, say: Progress) -> str:
    """The base image in the engine before any build work: pulled when absent, or one line at once
    when it cannot be (the build would only fail at its first FROM, the context assembled for nothing).
    Returns its image ID."""
    import docker

    try:
        return client.images.get(base).id
    except docker.errors.ImageNotFound:
        pass
    say(f"base: {base} is not in the engine at {engine_name(client)}; pulling it")
    try:
        return client.images.pull(base, platform=platform).id
    except docker.errors.APIError as e:
        reason = (e.explanation or str(e)).strip().splitlines()[0]
        raise ImageBuildError(
            f"the base image {base} is not in the engine at {engine_name(client)} and could not be pulled ({reason}); "
            "`docker pull` or `docker load` it there, or pass --base-image with an image the engine has "
            "(docs/images.md)"
        ) from e


#: an ANSI escape sequence (colours, cursor moves) in the engine's output: kept out of logs and pipes
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def default_tag(ctx: Context) -> str:
    return f"veo-edge/{ctx.model['name']}:{ctx.build_args['VEO_EDGE_VERSION']}-{ctx.target.name}"


def _stream(chunks, say: Progress, what: str, trace: Any = None) -> str:
    """Follow the engine's build output (ANSI escapes removed); the image id, or an ImageBuildError with
    the last lines. ``trace`` (:class:`.engineimages.BuildTrace`) records each step's image and each RUN
    step's container, for :func:`.engineimages.drop_stage_images`."""
    tail: list[str] = []
    image_id = None
    for chunk in chunks:
        if "error" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
            last = " | ".join(tail[-4:])
            raise ImageBuildError(f"{what} failed: {detail.strip()} (last output: {last})")
        for raw in chunk.get("stream", "").splitlines():
            line = _ANSI.sub("", raw).strip()
            if line:
                tail.append(line)
                say(line)
                if trace is not None:
                    trace.see(line)
        aux = chunk.get("aux")
        if isinstance(aux, dict) and "ID" in aux:
            image_id = aux["ID"]
    if image_id is None:
        raise ImageBuildError(
            f"{what}: the engine reported no image id (last output: {' | '.join(tail[-4:])})"
        )
    return image_id


def _read_root(client, image: str) -> tuple[dict[str, im.Entry], dict[str, bytes]]:
    """``/opt/veo-edge`` of ``image``, read through a created (never started) container."""
    import docker

    try:
        container = client.containers.create(image, entrypoint=["/bin/true"], network_disabled=True)
    except docker.errors.ImageNotFound as e:
        raise ImageNotFoundError(
            f"image {image} is not in the engine; build or `docker load` it first"
        ) from e
    try:
        bits, _ = container.get_archive(im.IMAGE_ROOT)
        return im.scan_tar(bits, Path(im.IMAGE_ROOT).name)
    except docker.errors.NotFound as e:
        raise ImageTrustError(f"image {image} has no {im.IMAGE_ROOT}; it is not a veo-edge image") from e
    finally:
        container.remove(force=True, v=True)  # and the anonymous /cache volume the image declares


@dataclass
class BuiltImage:
    tag: str
    id: str
    size: int
    manifest: dict[str, Any]
    labels: dict[str, str]
    saved: Path | None = None
    #: the signature over the image ID: the signature image's tag and the detached file
    signature_tag: str | None = None
    signature_file: Path | None = None


def build_image(
    ctx: Context,
    tag: str | None = None,
    sign_key: Path | None = None,
    save: Path | None = None,
    progress: Progress | None = None,
    client=None,
) -> BuiltImage:
    """Build ``ctx`` into ``tag``, seal it with the (signed) manifest, optionally ``docker save`` it."""
    import docker

    say = progress or (lambda _m: None)
    private = signing.load_private_key(sign_key) if sign_key is not None else None  # fail before building
    client = client or connect()
    tag = tag or default_tag(ctx)
    say(f"image: building {tag} (stage {ctx.stage}) with the engine at {engine_name(client)}")
    ensure_base(client, ctx.build_args["BASE_IMAGE"], ctx.target.platform, say)
    from veo_edge.packaging.engineimages import BuildTrace, drop_stage_images, say_stage_images

    trace = BuildTrace()
    done = False
    try:
        first = _stream(
            client.api.build(
                path=str(ctx.path),
                dockerfile="Dockerfile",
                target=ctx.stage,
                buildargs=ctx.build_args,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                platform=ctx.target.platform,  # a foreign one runs the RUN steps under QEMU
            ),
            say,
            f"docker build of {ctx.path}",
            trace,
        )
        say("image: manifest of every file baked under /opt/veo-edge")
        entries, _ = _read_root(client, first)
        info = {
            "target": ctx.target.name,
            "model": ctx.model,
            "veo_edge_version": ctx.build_args["VEO_EDGE_VERSION"],
            "base_image": ctx.build_args["BASE_IMAGE"],
            "build_args": ctx.build_args,
        }
        if private is not None:
            info["signing_key"] = signing.fingerprint(private.public_key())
        raw = im.make_manifest(entries, info)
        with tempfile.TemporaryDirectory(prefix="veo-seal-") as tmp:
            trust = Path(tmp) / "trust"
            trust.mkdir()
            (trust / Path(im.MANIFEST_FILE).name).write_bytes(raw)
            seal_labels = {LABEL_MANIFEST: hashlib.sha256(raw).hexdigest()}
            if private is not None:
                say(f"image: signing the manifest (DSSE, Ed25519, key {info['signing_key']})")
                envelope = signing.sign(raw, private)
                (trust / Path(im.SIGNATURE_FILE).name).write_text(json.dumps(envelope, indent=1) + "\n")
                (trust / Path(im.PUBKEY_FILE).name).write_bytes(signing.public_pem(private.public_key()))
                seal_labels[LABEL_KEY] = info["signing_key"]
            for p in trust.iterdir():
                p.chmod(0o644)
            label_lines = " \\\n      ".join(f'{k}="{v}"' for k, v in seal_labels.items())
            (Path(tmp) / "Dockerfile").write_text(
                f"FROM {first}\nCOPY trust {im.IMAGE_ROOT}/trust\nLABEL {label_lines}\n"
            )
            final = _stream(
                client.api.build(
                    path=tmp,
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    decode=True,
                    platform=ctx.target.platform,
                ),
                say,
                "sealing the image (trust layer)",
            )
            for p in trust.iterdir():  # next to the image as well as inside it
                shutil.copy2(p, ctx.path / p.name)
        sig_tag = sig_file = None
        if private is not None:
            # the signature of what runs: the final image's ID (its config: entrypoint, env, user,
            # labels, every layer), beside the image, never inside it (attest.py)
            repo = attest.repo_of(tag)
            envelope = attest.sign_image(final, repo, raw, info, private)
            sig_file = ctx.path / attest.SIGNATURE_FILE
            sig_file.write_bytes(envelope)
            sig_tag = attest.store_signature_image(client, repo, final, envelope)
            say(f"image: signed image ID {final} -> {sig_tag} and {sig_file}")
    except docker.errors.APIError as e:
        raise ImageBuildError(
            f"the Docker engine refused the build of {ctx.path}: {e.explanation or e}"
        ) from e
    else:
        done = True
    finally:
        if not done:  # the engine builds on while the connection is open: close it, so that it stops
            client.api.close()
            drop_stage_images(client, trace, say, settle=True)
        else:  # a finished build's stage images are its cache: kept, and said
            say_stage_images(client, trace, say)
    img = client.images.get(final)
    built = BuiltImage(
        tag=tag,
        id=final,
        size=int(img.attrs["Size"]),
        manifest=json.loads(raw),
        labels=dict(img.labels),
        signature_tag=sig_tag,
        signature_file=sig_file,
    )
    if save is not None:
        from veo_edge.packaging.engineimages import save_image

        built.saved = save_image(client, tag, Path(save), say, sig_tag)
    return built
