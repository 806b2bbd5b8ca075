"""The one native build every GPU check uses: ``build/plugins-gpu`` configured and built once (the memory
pool always, the kernels where nvcc is, the TensorRT plugin library where TensorRT's headers and library
are found: ``TensorRT_ROOT``), its ctest suite run, and the libraries exported through the variables the
runtime reads (``VEO_EDGE_MEMPOOL_LIB``, ``VEO_EDGE_PLUGIN_LIB``), so that the pool storm, the kernel sweep
and the TensorRT engine all load the same files and nothing falls back to an older ``build/plugins``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_DIR = REPO / "build" / "plugins-gpu"


@dataclass
class Built:
    path: Path
    mempool: Path
    kernels: Path | None  # None: no nvcc at configure time
    plugins: Path | None  # None: no TensorRT found (why_no_plugins says what CMake said)
    why_no_plugins: str | None
    ctest_ok: bool
    ctest_summary: str

    def lines(self) -> list[str]:
        plugins = str(self.plugins) if self.plugins else f"not built ({self.why_no_plugins})"
        return [
            f"build: {self.path}",
            f"  libveo_mempool.so      {self.mempool}",
            f"  libveo_kernels.so      {self.kernels or 'not built (no nvcc at configure time)'}",
            f"  libveo_edge_plugins.so {plugins}",
            f"  ctest: {self.ctest_summary} {'PASS' if self.ctest_ok else 'FAIL'}",
        ]


class BuildFailed(RuntimeError):
    pass


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildFailed(f"{what} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}")
    return r.stdout + r.stderr


def build(path: Path = DEFAULT_DIR, jobs: int | None = None) -> Built:
    """Configure, build every target and run ctest in ``path``; raises BuildFailed with CMake's output."""
    jobs = jobs or os.cpu_count() or 2
    configured = _run(
        ["cmake", "-S", str(REPO / "plugins"), "-B", str(path), "-DCMAKE_BUILD_TYPE=Release"],
        f"configuring {path}",
    )
    _run(["cmake", "--build", str(path), f"-j{jobs}"], f"building {path}")
    tests = subprocess.run(
        ["ctest", "--test-dir", str(path), "--output-on-failure", f"-j{jobs}"], capture_output=True, text=True
    )
    out = tests.stdout + tests.stderr
    summary = next((ln.strip() for ln in out.splitlines() if "tests passed" in ln), "no ctest summary")
    if tests.returncode != 0:
        print(out[-4000:])
    why = None
    for line in configured.splitlines():
        if "SKIPPING the TensorRT plugin glue" in line or "TensorRT NOT found" in line:
            why = line.split("veo-edge:", 1)[-1].strip()
            break
    present = lambda name: (path / name) if (path / name).is_file() else None  # noqa: E731
    mempool = present("libveo_mempool.so")
    if mempool is None:
        raise BuildFailed(f"{path} has no libveo_mempool.so after the build")
    return Built(
        path,
        mempool,
        present("libveo_kernels.so"),
        present("libveo_edge_plugins.so"),
        why or "TensorRT not found at configure time; set TensorRT_ROOT",
        tests.returncode == 0,
        summary,
    )


def export(built: Built) -> None:
    """Point the runtime (this process and the ``veo-edge`` it starts) at this build's libraries."""
    os.environ["VEO_EDGE_MEMPOOL_LIB"] = str(built.mempool)
    if built.plugins is not None:
        os.environ["VEO_EDGE_PLUGIN_LIB"] = str(built.plugins)
    else:
        os.environ.pop("VEO_EDGE_PLUGIN_LIB", None)
