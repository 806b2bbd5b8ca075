"""The healthcheck's golden build directory (``--build-dir``, or ``VEO_EDGE_BUILD_DIR`` in the image's
probe and ``healthcheck --url`` without the flag): its errors name it by where it came from, and say how
to check without it (the server's own canary)."""

from __future__ import annotations

from pathlib import Path

from veo_edge.builddir import MANIFEST_NAME, BuildDir
from veo_edge.errors import BuildDirError


def named(path: str | Path, source: str) -> tuple[str, str]:
    """``path`` as an error names it (``--build-dir DIR`` or ``VEO_EDGE_BUILD_DIR=DIR``), and how to
    do without it (leave the flag out, unset the variable)."""
    if source == "--build-dir":
        return f"--build-dir {path}", "leave --build-dir out"
    return f"{source}={path}", f"unset {source}"


def open_golden(build_dir: str | Path, source: str) -> BuildDir:
    """The golden build directory ``build_dir``, given by ``source``; one that is missing or no build
    directory is a :class:`BuildDirError` (exit 7) naming ``source``."""
    path = Path(build_dir)
    what = None
    if not path.is_dir():
        what = "is a file, not a build directory" if path.exists() else "does not exist"
    elif not (path / MANIFEST_NAME).is_file():
        what = f"has no {MANIFEST_NAME} (it is not a veo-edge build directory)"
    if what is not None:
        given, drop = named(path, source)
        raise BuildDirError(
            f"{given} {what}; give the server's own build directory, or {drop} to use the server's canary"
        )
    return BuildDir.open(path)
