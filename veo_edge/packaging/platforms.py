"""Which machine an image is for: the platform (``linux/amd64``, ``linux/arm64``), the Python and glibc
of the base image (read from the image itself, so the wheelhouse matches what the image runs: 3.10 on
L4T r36, 3.11 on Debian bookworm), and what of a build can be served there.

Reading the base image runs ``python3`` in a throw-away container of it (under QEMU user emulation for a
foreign platform: binfmt_misc with ``qemu-aarch64`` registered; see docs/images.md). Where no engine is
reachable or the engine does not hold the image, the target's declared values stand, and the progress
says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from veo_edge.errors import PackagingError, UsageError
from veo_edge.targets import Target

#: prints "<major>.<minor>" and glibc's "glibc 2.36" on two lines
_PROBE = "import os, sys; print('%d.%d' % sys.version_info[:2]); print(os.confstr('CS_GNU_LIBC_VERSION'))"

#: what the OpenVINO CPU plugin runs on ARM here: f32 (bf16 builds serve their f32 IR there, see below)
ARM_PLATFORMS = ("linux/arm64",)


@dataclasses.dataclass(frozen=True)
class BaseFacts:
    python: str  # "3.11"
    glibc: str  # "2.36"
    source: str  # where the values come from, for the progress and the context


def declared(target: Target, why: str) -> BaseFacts:
    return BaseFacts(target.python, target.glibc, f"declared for target {target.name} ({why})")


def parse_probe(output: str, image: str) -> BaseFacts:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[-1].startswith("glibc "):
        raise PackagingError(
            f"could not read Python and glibc from base image {image} (python3 printed {output.strip()!r}); "
            "the base needs python3 on glibc"
        )
    return BaseFacts(lines[-2], lines[-1].split()[1], f"read from {image}")


def probe_base(client: Any, image: str, platform: str) -> BaseFacts:
    """Python and glibc of ``image`` for ``platform``, read by running ``python3`` in it (never pulled)."""
    import docker

    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise PackagingError(f"base image {image} is not in the engine; load or pull it first") from None
    arch = img.attrs.get("Architecture", "")
    want = platform.split("/", 1)[1]
    if arch and arch != want:
        raise PackagingError(
            f"base image {image} is {img.attrs.get('Os', 'linux')}/{arch}, not {platform}; tag an image of "
            f"that platform as {image} (docker build --platform {platform}; `docker import` records the "
            "engine's own architecture)"
        )
    try:
        out = client.containers.run(
            image, ["python3", "-c", _PROBE], entrypoint=[], platform=platform, remove=True,
            network_disabled=True, user="0",
        )  # fmt: skip
    except docker.errors.APIError as e:
        hint = (
            "; is QEMU registered with binfmt_misc for this platform (docs/images.md)?"
            if want != _engine_arch(client)
            else ""
        )
        raise PackagingError(f"could not run python3 in base image {image} for {platform}: {e}{hint}") from e
    return parse_probe(out.decode(errors="replace"), image)


def _engine_arch(client: Any) -> str:
    arch = str(client.info().get("Architecture", ""))
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch)


def base_facts(
    target: Target, image: str, platform: str, client: Any | None, say: Callable[[str], None]
) -> BaseFacts:
    """The base image's facts when ``client`` can read them, else the target's declared values
    (``client`` None: ``--context-only``, which asks no engine)."""
    if client is None:
        facts = declared(target, "--context-only asks no Docker engine to read the base image")
    else:
        try:
            facts = probe_base(client, image, platform)
        except PackagingError as e:
            if "not in the engine" not in str(e):
                raise
            facts = declared(target, str(e))
    say(f"base: Python {facts.python}, glibc {facts.glibc}, {facts.source}")
    return facts


def for_platform(target: Target, platform: str | None, facts: BaseFacts | None = None) -> Target:
    """``target`` for ``platform`` (default: its own) with the base's Python and glibc."""
    platform = platform or target.platform
    if platform not in target.supported_platforms:
        raise UsageError(
            f"target {target.name} is not built for {platform}; it is built for "
            f"{', '.join(target.supported_platforms)}"
        )
    changes: dict[str, Any] = {"platform": platform}
    if facts is not None:
        changes.update(python=facts.python, glibc=facts.glibc)
    return dataclasses.replace(target, **changes)


def check_servable(manifest: dict[str, Any], platform: str) -> str | None:
    """Refuse a build whose CPU artifact an ARM image cannot serve; a note when it serves another one.

    OpenVINO's ARM CPU plugin runs f32 here. A bf16 build carries its f32 IR (bf16 is only a compile hint,
    and the runtime falls back to f32 where the CPU reports no native BF16), so it is served at f32; an
    int8 build's served IR is NNCF-quantized, which is not what ARM runs: refused, with the way out."""
    if platform not in ARM_PLATFORMS:
        return None
    served = str((manifest.get("cpu_precision") or {}).get("served", {}).get("openvino", "f32"))
    if served == "int8":
        raise UsageError(
            f"this build serves an int8 OpenVINO IR on the CPU; an image for {platform} serves f32 (OpenVINO's "
            "ARM CPU plugin): rebuild with --cpu-precision f32 (or bf16, which runs its f32 IR there) for "
            f"{platform}, and keep the int8 build for x86-64"
        )
    if served == "bf16":
        return (
            f"this build serves bf16 where the CPU has native BF16; on {platform} it serves its f32 IR, at f32 "
            "where the CPU reports no BF16 (Orin's Cortex-A78AE)"
        )
    return None
