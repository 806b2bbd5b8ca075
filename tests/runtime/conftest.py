"""Runtime test helpers: the CPU-only guard and a seeded reference on the build's plain ONNX."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_only() -> None:
    """Skip where an NVIDIA GPU is visible: the tests that use this pin the CPU machine's skip reasons."""
    from veo_edge.runtime.probes import probe_gpu

    if probe_gpu().ok:
        pytest.skip("an NVIDIA GPU is visible; these tests pin the skip reasons of a CPU-only machine")
