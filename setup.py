"""Ship the plugin specs inside the wheel.

The specs live in ``plugins/<op>/spec.json`` (the C++ build reads them there); a non-editable install
gets a copy in ``veo_edge/_plugin_specs/<op>/spec.json`` so that the graph surgery works without the
source tree. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithSpecs(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for spec in sorted(root.glob("plugins/*/spec.json")):
            target = Path(self.build_lib) / "veo_edge" / "_plugin_specs" / spec.parent.name / "spec.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(spec), str(target))


setup(cmdclass={"build_py": BuildPyWithSpecs})
