"""Where the repository-level files an image is made from live: ``packaging/Dockerfile``,
``Dockerfile.jetson``, ``packaging/entrypoint.sh``, ``packaging/selinux/``, ``healthcheck/`` and
``plugins/`` (the builder stage compiles it). They are read from the veo-edge source tree this package
runs from (a checkout with ``pip install -e``)."""

from __future__ import annotations

from pathlib import Path

from veo_edge.errors import PackagingError

REPO_ROOT = Path(__file__).resolve().parents[2]
_MARKERS = ("pyproject.toml", "packaging/Dockerfile", "Dockerfile.jetson", "packaging/entrypoint.sh")


def source_root() -> Path:
    missing = [m for m in _MARKERS if not (REPO_ROOT / m).is_file()]
    if missing:
        raise PackagingError(
            f"image builds need the veo-edge source tree (missing under {REPO_ROOT}: {', '.join(missing)}); "
            "install veo-edge from a checkout with `pip install -e .` to build images"
        )
    return REPO_ROOT
