"""Where the repository-level files an image is made from live: ``packaging/Dockerfile``,
``Dockerfile.jetson``, ``packaging/entrypoint.sh``, ``packaging/selinux/``, ``healthcheck/`` and
``plugins/`` (the builder stage compiles it); the list is :mod:`veo_edge.packaging.layout`.

Running from a checkout (``pip install -e .``, or the source tree on ``sys.path``) they are read from
the checkout, so an edit shows in the next context. An installed wheel reads the copy it carries in
``veo_edge/_image_sources/`` (same layout, made by setup.py)."""

from __future__ import annotations

from pathlib import Path

from veo_edge.errors import PackagingError
from veo_edge.packaging import layout

#: the repository root when this package runs from a checkout
REPO_ROOT = Path(__file__).resolve().parents[2]
#: the copy a wheel carries
PACKAGED_ROOT = Path(__file__).resolve().parents[1] / layout.PACKAGED_DIR


def from_checkout() -> bool:
    """True when this package runs from a veo-edge source tree (editable install or ``sys.path``)."""
    return not layout.missing(REPO_ROOT)


def source_root() -> Path:
    """The root the image files are read from: the checkout, else the wheel's copy."""
    if from_checkout():
        return REPO_ROOT
    absent = layout.missing(PACKAGED_ROOT)
    if not absent:
        return PACKAGED_ROOT
    raise PackagingError(
        "image builds need veo-edge's image sources (Dockerfiles, entrypoint, healthcheck, SELinux "
        f"policy, plugin sources), but this install has neither a checkout at {REPO_ROOT} nor the copy "
        f"a wheel carries at {PACKAGED_ROOT} (missing there: {', '.join(absent)}); reinstall veo-edge "
        "from its wheel (`pip install --force-reinstall veo-edge`) or from a checkout (`pip install -e .`)"
    )


def revision() -> str:
    """The git commit the image sources come from (``org.opencontainers.image.revision``), with ``-dirty``
    when the checkout has uncommitted changes to tracked files; ``unknown`` outside a git checkout (an
    installed wheel)."""
    import subprocess

    if not from_checkout():
        return "unknown"
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=30).returncode  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty == 1 else head or "unknown"
