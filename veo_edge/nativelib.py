"""Where the native libraries that ``make plugins`` builds are found: ``$<ENV_VAR>`` first (an error when
it is set but names no file), then the search directories (default: ``build/plugins`` of the repository).
Shared by the memory-pool binding and the TensorRT plugin-library lookup."""

from __future__ import annotations

import os
from pathlib import Path

from veo_edge.errors import BackendUnavailableError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "plugins"


def locate(lib_name: str, env_var: str, search_dirs: list[Path] | None, env_hint: str) -> Path | None:
    """The library's path, or None when no search directory holds it. ``env_hint`` ends the error for a
    wrong ``env_var`` ("point it at <lib> ...")."""
    env = os.environ.get(env_var)
    if env:
        path = Path(env)
        if not path.is_file():
            raise BackendUnavailableError(
                f"{env_var} is set to {env}, which is not a file; point it at {lib_name} {env_hint}"
            )
        return path
    for d in search_dirs if search_dirs is not None else [DEFAULT_BUILD_DIR]:
        candidate = Path(d) / lib_name
        if candidate.is_file():
            return candidate
    return None
