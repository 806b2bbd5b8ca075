"""The CycloneDX SBOM of the image's Python environment, made by cyclonedx-bom (``cyclonedx-py``) from
the wheelhouse's ``requirements.lock``: the image installs exactly that list (``--no-index --no-deps
--require-hashes``), so each component's version and wheel sha256 are those of the installed one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from veo_edge.errors import PackagingError

SBOM_NAME = "sbom.cdx.json"


def make_sbom(lock: Path, pyproject: Path, out: Path) -> Path:
    try:
        import cyclonedx_py  # noqa: F401
    except ImportError as e:
        raise PackagingError(
            "cyclonedx-bom is not installed; image builds need it for the SBOM: pip install 'veo-edge[image]'"
        ) from e
    cmd = [
        sys.executable,
        "-m",
        "cyclonedx_py",
        "requirements",
        "--pyproject",
        str(pyproject),
        "--mc-type",
        "application",
        "--output-reproducible",
        "--of",
        "JSON",
        "-o",
        str(out),
        str(lock),
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "0")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PackagingError(
            f"cyclonedx-py failed on {lock} (exit {proc.returncode}): {proc.stderr.strip()[-400:]}"
        )
    return out
