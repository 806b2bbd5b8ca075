"""Find the built TensorRT plugin library (``libveo_edge_plugins.so``) for the build manifest.

``$VEO_EDGE_PLUGIN_LIB`` first (an error if it is set but names no file), then ``build/plugins`` of the
repository (``make plugins`` builds it where TensorRT is installed). The build pipeline records the result
as the manifest artifact kind ``plugin_library``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from veo_edge.builddir import sha256_file
from veo_edge.errors import BackendUnavailableError

LIB_NAME = "libveo_edge_plugins.so"
ENV_VAR = "VEO_EDGE_PLUGIN_LIB"
MANIFEST_KIND = "plugin_library"
DEFAULT_BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "plugins"


@dataclass(frozen=True)
class PluginLibrary:
    path: Path
    sha256: str
    bytes: int

    @classmethod
    def from_path(cls, path: Path) -> PluginLibrary:
        path = Path(path).resolve()
        return cls(path=path, sha256=sha256_file(path), bytes=path.stat().st_size)

    def to_manifest(self) -> dict[str, str | int]:
        return {"path": str(self.path), "sha256": self.sha256, "bytes": self.bytes}


def find_plugin_library(search_dirs: list[Path] | None = None) -> PluginLibrary | None:
    """The plugin library, or None when it is not built (TensorRT absent: the ONNX reference path serves)."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not path.is_file():
            raise BackendUnavailableError(
                f"{ENV_VAR} is set to {env}, which is not a file; point it at {LIB_NAME} "
                "(built by `make plugins` where TensorRT is installed) or unset it"
            )
        return PluginLibrary.from_path(path)
    for d in search_dirs if search_dirs is not None else [DEFAULT_BUILD_DIR]:
        candidate = Path(d) / LIB_NAME
        if candidate.is_file():
            return PluginLibrary.from_path(candidate)
    return None
