"""The repository files an image is made from, and where a wheel carries them.

``veo-edge build --target`` and ``veo-edge image`` read the Dockerfiles, the entrypoint, the healthcheck,
the SELinux sources and (GPU targets) the plugin sources from the repository's top level, where people
look for them. A wheel carries a copy of exactly these files in ``veo_edge/_image_sources/``, laid out as
in the repository (setup.py copies them there), so that an install without the source tree builds the
same contexts. ``pyproject.toml`` goes along: the SBOM's root component is read from it.

setup.py loads this file by its path (it cannot import veo_edge while building it), so it imports only
the standard library.
"""

from __future__ import annotations

from pathlib import Path

#: the folder inside the ``veo_edge`` package that holds a wheel's copy
PACKAGED_DIR = "_image_sources"

SELINUX_SOURCES = (
    "veo_edge.te",
    "veo_edge.fc",
    "veo_edge.if",
    "README.md",
    "refpolicy-compat.spt",
    "container-selinux/container.if",
    "container-selinux/LICENSE",
    "container-selinux/README.md",
)

#: single files, relative to the repository root
FILES = (
    "pyproject.toml",
    "Dockerfile.jetson",
    "packaging/Dockerfile",
    "packaging/entrypoint.sh",
    "healthcheck/healthcheck.sh",
    *(f"packaging/selinux/{name}" for name in SELINUX_SOURCES),
)

#: the tree the GPU builder stage compiles (``COPY plugins /src/plugins``)
PLUGINS = "plugins"
#: what of it the builder reads: sources, CMake files, the specs, the header generator, the linker
#: version scripts (not the READMEs or the developer scripts in tools/*.sh)
_PLUGIN_SUFFIXES = frozenset({".h", ".cuh", ".cpp", ".cu", ".json", ".py", ".map"})
#: not for the image: the host tests, and build folders a developer may have made inside plugins/
_PLUGIN_SKIP_DIRS = frozenset({"tests", "__pycache__", "CMakeFiles"})


def _is_build_dir(d: Path) -> bool:
    return d.name in _PLUGIN_SKIP_DIRS or d.name.startswith((".", "build")) or (d / "CMakeCache.txt").exists()


def plugin_files(root: Path) -> list[str]:
    """The files of ``root/plugins`` the builder stage needs, relative to ``root``, sorted."""
    found = []
    stack = [Path(root) / PLUGINS]
    while stack:
        d = stack.pop()
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p.is_dir():
                if not _is_build_dir(p):
                    stack.append(p)
            elif p.name == "CMakeLists.txt" or p.suffix in _PLUGIN_SUFFIXES:
                found.append(p.relative_to(root).as_posix())
    return sorted(found)


def image_source_files(root: Path) -> list[str]:
    """Every file a wheel carries for image builds, relative to ``root`` (a checkout)."""
    return [*FILES, *plugin_files(root)]


def missing(root: Path) -> list[str]:
    """Which of the files image builds read are absent under ``root`` (empty: ``root`` has them all)."""
    required = [*FILES, f"{PLUGINS}/CMakeLists.txt"]
    return [rel for rel in required if not (Path(root) / rel).is_file()]
