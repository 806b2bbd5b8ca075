"""Find the built TensorRT plugin library (``libveo_edge_plugins.so``) for the build manifest.

``$VEO_EDGE_PLUGIN_LIB`` first (an error if it is set but names no file), then ``build/plugins`` of the
repository (``make plugins`` builds it where TensorRT is installed). The build pipeline records the result
as the manifest artifact kind ``plugin_library``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from veo_edge.builddir import sha256_file
from veo_edge.nativelib import locate

LIB_NAME = "libveo_edge_plugins.so"
ENV_VAR = "VEO_EDGE_PLUGIN_LIB"
MANIFEST_KIND = "plugin_library"


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
    path = locate(
        LIB_NAME, ENV_VAR, search_dirs, "(built by `make plugins` where TensorRT is installed) or unset it"
    )
    return None if path is None else PluginLibrary.from_path(path)
