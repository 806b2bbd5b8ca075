"""Accuracy of the CPU backends through the Runtime against PyTorch, on the build's canary and on a few
hundred seeded inputs. Tolerances come from PyTorch's own float32-vs-float64 error (export/parity.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import veo_edge
from veo_edge.builddir import BuildDir
from veo_edge.export.parity import TorchReference, compare, seeded_inputs

SAMPLES = 384


@pytest.fixture(scope="module")
def torch_reference() -> TorchReference:
    from veo_edge.models import create_model

    return TorchReference(create_model("vit-nano", seed=0).module)  # what the build used


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_cpu_backend_matches_pytorch(nano_build: Path, torch_reference: TorchReference, backend: str) -> None:
    build = BuildDir.open(nano_build)
    x = seeded_inputs((3, 32, 32), SAMPLES, seed=4242)
    ref64, out32 = torch_reference(x)
    baseline = float(np.abs(out32 - ref64).max())
    canary_x = np.load(build.artifact("canary_input"))
    canary_ref, _ = torch_reference(canary_x)
    with veo_edge.Runtime(nano_build, backend=backend) as rt:
        got = rt.infer(x)
        canary = rt.infer(canary_x)
    stats = compare(backend, got, ref64, baseline)
    print(
        f"\n{backend}: {SAMPLES} samples, top-1 agreement {stats.top1_agreement:.2%} "
        f"({stats.ambiguous} ambiguous), max abs error {stats.max_abs:.3g} (tolerance {stats.tolerance:.3g}, "
        f"torch fp32 baseline {baseline:.3g}), min cosine {stats.min_cosine:.7f}; "
        f"canary max abs {np.abs(canary - canary_ref).max():.3g}"
    )
    assert stats.passed, stats.summary()
    assert float(np.abs(canary - canary_ref).max()) <= build.manifest["canary"]["atol"]
