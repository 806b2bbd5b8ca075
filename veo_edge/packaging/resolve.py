"""Which wheels an image installs, decided before any is downloaded: pip's resolver run for the image's
platform, Python and glibc (``pip install --dry-run --report``; pip reads only the wheels' metadata where
the index serves it, PEP 658), so that a package with no wheel for the platform stops the build naming it,
an optional one (``Target.optional_packages``) is left out with the reason, and an OpenVINO older than the
one that made the build's IR (what pip falls back to when the tags are too old) is refused. The wheelhouse
then downloads exactly the resolved ``name==version`` list.

pip is run as a program (``python -m pip``), the way pip is meant to be used: it has no Python API.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from veo_edge.errors import PackagingError
from veo_edge.targets import Target

#: resolved older than this machine's, the image could not load the IR this machine wrote
_MUST_NOT_BE_OLDER = ("openvino",)


@dataclass(frozen=True)
class Wheel:
    name: str  # canonical
    version: str
    filename: str
    url: str  # where the resolver found it (PyPI, a local mirror, an extra index)

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def pip_target_args(target: Target) -> list[str]:
    """pip options selecting binary wheels for the target's platform tags, Python and ABI."""
    py = target.python.replace(".", "")
    args = ["--only-binary=:all:"]
    for tag in target.wheel_platforms:
        args += ["--platform", tag]
    return [*args, "--python-version", target.python, "--implementation", "cp", "--abi", f"cp{py}"]


def _no_wheel(target: Target, stderr: str) -> PackagingError | None:
    m = re.search(r"No matching distribution found for ([^\s;]+)", stderr)
    if m is None:
        return None
    name = m.group(1)
    tags = target.wheel_platforms
    return PackagingError(
        f"{name} has no wheel for {target.platform}, Python {target.python} (glibc {target.glibc}: tags "
        f"{tags[0]} .. {tags[-1]}) on the package index; use a base image with a newer Python/glibc "
        f"(--base-image), or build on a machine where {name} has a wheel"
    )


def resolve(target: Target, requirements: list[str], only_index: str | None = None) -> list[Wheel]:
    """The wheels pip would install for ``requirements`` on the target (dependencies included).
    ``only_index``: from that index alone, without dependencies (pip's configuration files and its
    PIP_* settings ignored, so that no other index or local wheel folder can answer instead)."""
    env = None
    with tempfile.TemporaryDirectory(prefix="veo-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        cmd += ["--report", str(report), "--target", str(Path(tmp) / "t")]
        cmd += pip_target_args(target)
        if only_index:
            cmd += ["--index-url", only_index, "--no-deps", "--timeout", "15", "--retries", "1"]
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
        proc = subprocess.run(cmd + requirements, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            err = _no_wheel(target, proc.stderr)
            if err is not None and only_index:
                unreachable = re.search(
                    r"Failed to establish|Name or service not known|Could not fetch URL", proc.stderr
                )
                raise PackagingError(
                    f"{err.args[0].split(' on the package index')[0]} on {only_index}"
                    + (" (the index could not be reached)" if unreachable else "")
                )
            if err is not None:
                raise err
            tail = " | ".join(proc.stderr.strip().splitlines()[-4:])
            raise PackagingError(
                f"resolving the {target.name} runtime for {target.platform} failed (exit {proc.returncode}): "
                f"{tail}; is the package index reachable?"
            )
        items = json.loads(report.read_text())["install"]
    return [
        Wheel(
            canonicalize_name(i["metadata"]["name"]),
            i["metadata"]["version"],
            i["download_info"]["url"].rsplit("/", 1)[-1],
            i["download_info"]["url"],
        )
        for i in items
    ]


def _local_version(name: str) -> Version | None:
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def check_versions(target: Target, wheels: list[Wheel], say: Callable[[str], None]) -> None:
    """Refuse an OpenVINO older than this machine's (the IR's); say so for other older major versions."""
    for w in wheels:
        here = _local_version(w.name)
        if here is None or Version(w.version).major >= here.major:
            continue
        what = (
            f"{w.name} resolved to {w.version} for {target.platform}, Python {target.python}, older than "
            f"{here} here"
        )
        if w.name in _MUST_NOT_BE_OLDER:
            raise PackagingError(
                f"{what}: it may not load the IR this machine wrote. Its newer wheels need a newer glibc than "
                f"{target.glibc} (OpenVINO 2026's aarch64 wheel is manylinux_2_35): use a base image with a "
                "newer glibc (--base-image)"
            )
        say(f"wheelhouse: note: {what}")


def resolve_runtime(
    target: Target, requirements: list[str], say: Callable[[str], None]
) -> tuple[list[Wheel], list[str]]:
    """(the wheels, notes on what was left out): required packages first (a missing wheel stops the build
    naming it), then each optional one on top of them; one that cannot be had is left out, and the note
    says why. Where the target names an extra index (NVIDIA's Jetson index for orin), an optional package
    comes from that index alone: PyPI's aarch64 onnxruntime-gpu is built for ARM servers, not for Jetson;
    its dependencies then come from the usual index, next to the pinned ones."""
    optional = {canonicalize_name(n) for n in target.optional_packages}
    is_optional = lambda r: canonicalize_name(Requirement(r).name) in optional  # noqa: E731
    wheels = resolve(target, [r for r in requirements if not is_optional(r)])
    check_versions(target, wheels, say)
    notes = []
    for req in (r for r in requirements if is_optional(r)):
        try:
            want = req
            if target.extra_index_url:
                (found,) = resolve(target, [req], only_index=target.extra_index_url)
                want = f"{found.name} @ {found.url}"
            more = resolve(target, [want, *(w.pin for w in wheels)])
        except PackagingError as e:
            name = Requirement(req).name
            notes.append(
                f"{name} left out: {e}. The image installs without it; the CPU path does not need it"
            )
            more = _stand_in(target, name, wheels, notes)
            say(f"wheelhouse: {notes[-1]}")
        have = {w.name for w in wheels}
        wheels += [w for w in more if w.name not in have]
    return wheels, notes


def pinned(target: Target, name: str) -> str:
    """``name==version`` where this machine has ``name`` and runs the target's Python (the version the
    tests ran with), ``name`` otherwise (pip picks the newest the target's Python takes)."""
    if target.python != f"{sys.version_info[0]}.{sys.version_info[1]}":
        return name
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def _stand_in(target: Target, name: str, wheels: list[Wheel], notes: list[str]) -> list[Wheel]:
    """The wheels of what the target installs in place of optional ``name`` (none: nothing), the last
    note extended to say which."""
    stand_in = target.optional_stand_ins.get(name)
    if stand_in is None:
        return []
    try:
        more = resolve(target, [pinned(target, stand_in), *(w.pin for w in wheels)])
    except PackagingError as e:
        notes[-1] += f"; {stand_in} in its place could not be had either: {e}"
        return []
    version = next((w.version for w in more if w.name == canonicalize_name(stand_in)), "?")
    notes[-1] += f"; {stand_in} {version} (the CPU provider, auto's CPU standby) is installed in its place"
    return more


def download(target: Target, wheels: list[Wheel], dest: Path) -> None:
    """Exactly ``wheels``, from where the resolver found each (no index is asked again), into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest)]
    cmd += pip_target_args(target)
    proc = subprocess.run(cmd + [w.url for w in wheels], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise PackagingError(
            f"downloading the {target.name} runtime wheels for {target.platform} failed "
            f"(exit {proc.returncode}): {tail}; is the package index reachable?"
        )
