"""Runtime test helpers: the CPU-only guard and a seeded reference on the build's plain ONNX."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from veo_edge import nativelib
from veo_edge.runtime import mempool


@pytest.fixture(scope="session")
def cpu_only() -> None:
    """Skip where an NVIDIA GPU is visible: the tests that use this pin the CPU machine's skip reasons."""
    from veo_edge.runtime.probes import probe_gpu

    if probe_gpu().ok:
        pytest.skip("an NVIDIA GPU is visible; these tests pin the skip reasons of a CPU-only machine")


@pytest.fixture(scope="session")
def pool_lib() -> Path:
    """The built libveo_mempool.so; builds it into build/plugins with cmake when it is missing."""
    lib = nativelib.DEFAULT_BUILD_DIR / mempool.LIB_NAME
    if not lib.is_file():
        if shutil.which("cmake") is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{lib} is missing and cmake is not installed; CI must build it (`make plugins`)")
            pytest.skip(f"{lib} is missing and cmake is not installed; run `make plugins`")
        build = str(nativelib.DEFAULT_BUILD_DIR)
        src = str(nativelib.REPO_ROOT / "plugins")
        subprocess.run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release"], check=True)
        subprocess.run(["cmake", "--build", build, "--target", "veo_mempool", "-j2"], check=True)
    return lib


@pytest.fixture
def backend_log():
    """The messages the TensorRT backend logs during the test, read from a handler on its own logger.

    pytest's caplog, at the root logger, saw none of them in a full run after the int8 builds (NNCF's
    import swaps the process's logger class; the exact path was not pinned down), while a handler on
    the backend's own logger sees every one."""
    import logging

    from veo_edge.runtime.backends import tensorrt_engine

    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = _Collect(logging.DEBUG)
    tensorrt_engine.log.addHandler(handler)
    try:
        yield messages
    finally:
        tensorrt_engine.log.removeHandler(handler)
