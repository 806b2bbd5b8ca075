"""Ship what the installed package reads from the source tree inside the wheel.

- The plugin specs live in ``plugins/<op>/spec.json`` (the C++ build reads them there); a non-editable
  install gets a copy in ``veo_edge/_plugin_specs/<op>/spec.json`` so that the graph surgery works
  without the source tree.
- The files image builds read (Dockerfiles, entrypoint, healthcheck, SELinux sources, plugin sources;
  the list is ``veo_edge/packaging/layout.py``) are copied into ``veo_edge/_image_sources/``, laid out
  as in the repository, so that ``veo-edge build --target`` works from ``pip install veo-edge``.

Everything else is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import FileError

ROOT = Path(__file__).resolve().parent


def _layout():
    """veo_edge/packaging/layout.py, loaded by path: the package cannot be imported while it is built."""
    spec = importlib.util.spec_from_file_location("_veo_edge_layout", ROOT / "veo_edge/packaging/layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithSources(build_py):
    def run(self) -> None:
        super().run()
        package = Path(self.build_lib) / "veo_edge"
        for spec in sorted(ROOT.glob("plugins/*/spec.json")):
            target = package / "_plugin_specs" / spec.parent.name / "spec.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(spec), str(target))
        layout = _layout()
        absent = layout.missing(ROOT)
        if absent:
            raise FileError(
                f"the veo-edge wheel carries the files image builds read, but {ROOT} lacks "
                f"{', '.join(absent)}; build the wheel from a full checkout of the repository"
            )
        for rel in layout.image_source_files(ROOT):
            target = package / layout.PACKAGED_DIR / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(ROOT / rel), str(target))


setup(cmdclass={"build_py": BuildPyWithSources})
