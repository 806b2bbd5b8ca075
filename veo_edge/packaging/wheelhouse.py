"""The wheelhouse of an image: veo-edge's own wheel and the wheels of the target's runtime packages
(and their dependencies) for the target's Python and platform, with ``requirements.lock`` pinning each
by version and sha256. The image installs from it with ``--no-index --no-deps --require-hashes``, so the
image build needs nothing from the network beyond its base image and installs exactly this list.

veo-edge's own wheel is the running install's (:mod:`veo_edge.packaging.ownwheel`: built from the
checkout, or packed again from an installed wheel's files). No torch and no build tools: the runtime
packages are what ``serve``/``healthcheck``/``engine build`` import (``veo_edge.targets``); veo-edge
itself is installed without its declared dependencies, because the exporter's (onnx, onnxruntime,
onnx-graphsurgeon, safetensors) are not needed where nothing is exported. Versions are pinned to this machine's where it has the package and the target's Python is
this machine's, i.e. the versions the tests ran with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from veo_edge.errors import PackagingError
from veo_edge.packaging import resolve
from veo_edge.packaging.ownwheel import build_own_wheel
from veo_edge.targets import Target

LOCK_NAME = "requirements.lock"


def runtime_requirements(target: Target) -> list[str]:
    """Each runtime package of the target, pinned to this machine's version where it runs the target's
    Python (:func:`~veo_edge.packaging.resolve.pinned`; the lock then pins what was taken)."""
    return [resolve.pinned(target, name) for name in target.runtime_packages]


def write_lock(dest: Path, notes: list[str] | None = None) -> Path:
    """``requirements.lock``: every wheel in ``dest`` as ``name==version --hash=sha256:...``; ``notes``
    (what was left out, and why) head it as comments, so the image says so too."""
    from veo_edge.builddir import sha256_file

    lines = []
    seen: dict[str, str] = {}
    for whl in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(whl.name)
        key = canonicalize_name(name)
        if key in seen:
            raise PackagingError(
                f"the wheelhouse {dest} holds two wheels of {name}: {seen[key]} and {whl.name}"
            )
        seen[key] = whl.name
        lines.append(f"{key}=={version} --hash=sha256:{sha256_file(whl)}")
    lock = dest / LOCK_NAME
    lock.write_text(
        "# veo-edge image wheelhouse: installed with --no-index --no-deps --require-hashes\n"
        + "".join(f"# {note}\n" for note in notes or ())
        + "\n".join(lines)
        + "\n"
    )
    return lock


def build_wheelhouse(
    target: Target, dest: Path, download: bool = True, progress: Callable[[str], None] | None = None
) -> Path:
    """Fill ``dest`` with the image's wheels and return its lock file. ``download=False`` makes only
    veo-edge's wheel (structure checks of contexts whose platform's wheels are not needed here). The
    runtime is resolved for the target's platform first (:mod:`veo_edge.packaging.resolve`): a package
    with no wheel there stops the build naming it; an optional one is left out and the lock says so."""
    say = progress or (lambda _m: None)
    dest.mkdir(parents=True, exist_ok=True)
    build_own_wheel(dest)
    notes: list[str] = []
    if download:
        wheels, notes = resolve.resolve_runtime(target, runtime_requirements(target), say)
        say(f"wheelhouse: {len(wheels)} wheels for {target.platform}, Python {target.python}, downloading")
        resolve.download(target, wheels, dest)
    return write_lock(dest, notes)
